"""`tpuprof trace` on a 1 GB capture: 3 steps exported in bounded memory (peak RSS next to the file size).

    .venv/bin/python bench/bench_trace.py [--gb 1.0] [--capture XPLANE_PB]

The large capture is COPIES of a sample capture laid end to end in one XSpace: every line holds the events of
every copy, each copy shifted in time by the capture's span, so the timeline is one long run of steps (the
copies' lines are not separate lines). It is written line by line (each line's content to a scratch file, then
the planes with their lengths), so making it needs little memory either, and cached in bench/.cache/trace/.
The export runs as its own process (`tpuprof trace ... --steps`, the default window: the median step and one
either side), measured by /usr/bin/time's maximum resident set size.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache" / "trace"
DEFAULT = next((ROOT / "sample_profiles" / "captures" / "jax_compute").rglob("*.xplane.pb"))
sys.path.insert(0, str(ROOT))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    return _varint(number << 3 | 2) + _varint(length)


def concatenated(source: Path, target_bytes: float, out: Path) -> Path:
    from tpuprof.protos import xplane_pb2

    pb = xplane_pb2()
    space = pb.XSpace.FromString(source.read_bytes())
    per_copy = sum(line.ByteSize() for p in space.planes for line in p.lines)  # the part that is copied
    copies = max(1, math.ceil(target_bytes / per_copy))
    ends = [line.timestamp_ns * 1000 + e.offset_ps + e.duration_ps for p in space.planes for line in p.lines
            for e in line.events]
    starts = [line.timestamp_ns * 1000 + e.offset_ps for p in space.planes for line in p.lines for e in line.events]
    span_ps = max(ends) - min(starts) + 1_000_000  # + 1 us between copies
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tpuprof-bench-trace-"))
    try:
        with open(out, "wb") as target:
            for plane in space.planes:
                header = pb.XPlane()
                header.CopyFrom(plane)
                del header.lines[:]
                header_bytes = header.SerializeToString()
                line_files = []
                for index, line in enumerate(plane.lines):
                    line_header = pb.XLine()
                    line_header.CopyFrom(line)
                    del line_header.events[:]
                    events = pb.XLine()
                    events.events.extend(line.events)
                    offsets = [e.offset_ps for e in events.events]
                    path = scratch / f"line{index}"
                    with open(path, "wb") as handle:
                        handle.write(line_header.SerializeToString())
                        for copy in range(copies):
                            shift = copy * span_ps
                            for event, offset in zip(events.events, offsets):
                                event.offset_ps = offset + shift
                            handle.write(events.SerializeToString())  # a run of `events` records
                    line_files.append(path)
                sizes = [p.stat().st_size for p in line_files]
                plane_size = len(header_bytes) + sum(len(_field(3, s)) + s for s in sizes)
                target.write(_field(1, plane_size) + header_bytes)
                for path, size in zip(line_files, sizes):
                    target.write(_field(3, size))
                    with open(path, "rb") as handle:
                        shutil.copyfileobj(handle, target, 16 << 20)
                    path.unlink()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the concatenated capture")
    parser.add_argument("--capture", type=Path, default=DEFAULT, help="the capture to copy")
    parser.add_argument("--analyze", action="store_true", help="also measure `tpuprof analyze` on the same file")
    args = parser.parse_args()
    large = CACHE / f"{args.capture.stem.removesuffix('.xplane')}_{args.gb:g}gb" / "host.xplane.pb"
    if not large.exists() or large.stat().st_size < args.gb * 0.9e9:
        started = time.perf_counter()
        concatenated(args.capture, args.gb * 1e9, large)
        print(f"made {large} ({large.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s")
    output = Path(tempfile.mkdtemp(prefix="tpuprof-bench-trace-")) / "steps.pftrace"
    stdout, seconds, peak_mb = measure(["trace", str(large), "-o", str(output)])
    print(stdout)
    steps = re.search(r"steps ([\d-]+)", stdout).group(1)
    print(f"capture {large.stat().st_size / 1e9:.2f} GB -> steps {steps}: trace {output.stat().st_size / 1e3:.1f} kB "
          f"in {seconds:.0f} s, peak RSS {peak_mb:.0f} MB")
    shutil.rmtree(output.parent, ignore_errors=True)
    if args.analyze:  # the first of trace's two passes is analyze's step analysis: its own peak, for comparison
        _, seconds, peak_mb = measure(["analyze", str(large), "--json"])
        print(f"tpuprof analyze on the same capture: {seconds:.0f} s, peak RSS {peak_mb:.0f} MB")


def measure(arguments: list[str]) -> tuple[str, float, float]:
    """A tpuprof command as its own process: (stdout, seconds, peak RSS in MB) from /usr/bin/time."""
    command = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "tpuprof", *arguments]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    if result.returncode:
        sys.exit(f"tpuprof {arguments[0]} failed: {result.stderr}")
    seconds, peak_kb = result.stderr.strip().splitlines()[-1].split()
    return result.stdout.strip(), float(seconds), int(peak_kb) / 1024

if __name__ == "__main__":
    main()
