"""`tpuprof oom` on a 1 GB training log with one OOM near its end: wall time and peak memory.

XProf has no reader for OOM logs, so the reference is `grep` finding the same message (a plain C scan of
the file): the ratio says how close the streamed search comes to the disk/scan floor.

    .venv/bin/python bench/bench_oom_log.py [--gib 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MESSAGE = ROOT / "tests" / "fixtures" / "oom" / "seed_tds_tpu_training_one_hot.txt"


def make_log(path: Path, size: int) -> int:
    """Ordinary step logging, the seed OOM message at 95 %, a traceback, more logging. Returns its line."""
    lines = b"".join(
        b"I1121 10:%02d:%02d.%06d 140213 train.py:%d] step %d loss=%.4f lr=3.0e-04 tokens/s=%d\n"
        % (i // 60 % 60, i % 60, i * 7919 % 10**6, 40 + i % 9, i, 2.0 + (i % 97) / 100, 90000 + i % 5000)
        for i in range(20000))
    message = MESSAGE.read_bytes()
    written = 0
    line = 0
    with open(path, "wb") as out:
        while written < size * 0.95:
            out.write(lines)
            written += len(lines)
            line += 20000
        out.write(message + b"Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n")
        oom_line = line + 1
        while written < size:
            out.write(lines)
            written += len(lines)
    return oom_line


def timed(cmd: list[str]) -> tuple[float, str, int, int]:
    """Wall seconds, stdout, exit code and the child's own peak RSS in KiB (wait4, not RUSAGE_CHILDREN)."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return seconds, out.read().decode(), child.returncode, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuprof_oom_bench_") as folder:
        log = Path(folder) / "train.log"
        oom_line = make_log(log, int(args.gib * (1 << 30)))
        size = log.stat().st_size
        print(f"log: {size / (1 << 30):.2f} GiB, OOM message at line {oom_line:,}")
        # Warm the page cache so both tools read from memory, not from the disk.
        with open(log, "rb") as warm:
            while warm.read(64 << 20):
                pass

        seconds, out, code, peak_kib = timed([sys.executable, "-m", "tpuprof", "oom", str(log), "--json"])
        doc = json.loads(out) if code == 0 else {}
        assert code == 0 and doc.get("hlo_temp_bytes") == int(round(19.46 * (1 << 30))), (code, out[:500])
        # The message's headline is the fixture's third line (source header, code fence, headline).
        print(f"tpuprof oom: {seconds:.2f} s ({size / seconds / 1e6:,.0f} MB/s), peak RSS {peak_kib / 1024:.0f} MiB, "
              f"found line {doc.get('line_number'):,} (expected {oom_line + 2:,})")
        if shutil.which("grep"):
            grep_seconds, _, _, _ = timed(["grep", "-n", "-m", "1", "Ran out of memory", str(log)])
            print(f"grep -m1 (C scan, reference floor): {grep_seconds:.2f} s; tpuprof/grep = {seconds / grep_seconds:.1f}x")
        print("XProf: no OOM-log reader to compare with.")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
