"""`tpuprof analyze` time and peak memory against the size of one host's file, next to XProf's tools.

    nice -n 10 .venv/bin/python bench/bench_analyze_scale.py [--sizes 0.05,0.5,1,2,4] [--sources v6e,keras]
                                                         [--xprof-limit-gb 4] [--no-xprof] [--folder /tmp]

Each file is copies of a real capture concatenated, which is itself a valid XSpace (its repeated `planes` field
appends): `v6e` is the real 4-chip v6e capture of tests/real_data.py (every copy's 4 TPU planes are analysed: 4 GB
is ~4,700 copies, ~19,000 chips), `keras` the sample TF capture `tf_tiny_spe64` (tpuprof reads a host's first
`/host:CPU` plane: the copies after it are walked over, not analysed). Files are built in --folder and deleted after.

Every run is a child process: time is its wall time, peak RSS its `ru_maxrss` (os.wait4). XProf's `overview_page`
and `input_pipeline_analyzer` (xprof.convert.raw_to_tool_data.xspace_to_tool_data) read a copy in a folder of
their own (XProf writes a cache file beside its input); a size is skipped for XProf when its peak RSS,
extrapolated linearly from the sizes measured before, would pass --xprof-limit-gb (this machine is shared).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

XPROF = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], sys.argv[2], {})
assert data, "no output"
"""


def source(name: str, scratch: Path) -> Path:
    if name == "keras":
        return next((ROOT / "sample_profiles" / "captures" / "tf_tiny_spe64").rglob("*.xplane.pb"))
    from helpers.real_data import REAL_TPU_CAPTURES, real_artefact

    return real_artefact(REAL_TPU_CAPTURES["v6e_4_host_offload"], scratch / "real")


def build(capture: Path, size_bytes: float, into: Path) -> int:
    """Copies of CAPTURE concatenated into INTO up to SIZE_BYTES; the number of copies."""
    data = capture.read_bytes()
    count = max(1, round(size_bytes / len(data)))
    into.parent.mkdir(parents=True, exist_ok=True)
    with open(into, "wb") as handle:
        for _ in range(count):
            handle.write(data)
    return count


def measure(args: list[str], cwd: Path) -> tuple[float, float, bool]:
    """(seconds, peak RSS in GB, succeeded) of a child process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as log:  # not a pipe: XProf logs more than a pipe holds, and would block on it
        process = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        log.seek(0)
        error = log.read().decode(errors="replace")
    if status:
        print(f"  failed: {' '.join(args[-2:])}: {error.strip()[-300:]}", file=sys.stderr)
    return elapsed, usage.ru_maxrss * 1024 / 1e9, status == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.05,0.5,1,2,4", help="file sizes in GB")
    parser.add_argument("--sources", default="v6e,keras")
    parser.add_argument("--xprof-limit-gb", type=float, default=4.0)
    parser.add_argument("--no-xprof", action="store_true", help="time tpuprof only")
    parser.add_argument("--folder", default=tempfile.gettempdir())
    options = parser.parse_args()
    sizes = [float(s) for s in options.sizes.split(",")]
    python = sys.executable
    rows = ["| capture | file GB | copies | tpuprof s | tpuprof peak RSS GB | RSS / file | "
            "XProf overview_page s / GB | XProf input_pipeline_analyzer s / GB |",
            "|---|---|---|---|---|---|---|---|"]
    print("\n".join(rows), flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="tpuprof-scale-", dir=options.folder))
    try:
        for name in options.sources.split(","):
            capture = source(name, scratch)
            xprof_gb_per_gb: dict[str, float] = {}
            for size in sizes:
                path = scratch / "host" / "host.xplane.pb"
                copies = build(capture, size * 1e9, path)
                file_gb = path.stat().st_size / 1e9
                seconds, rss, ok = measure([python, "-m", "tpuprof", "analyze", str(path), "--json"], ROOT)
                cells = [name, f"{file_gb:.2f}", str(copies), f"{seconds:.1f}" if ok else "failed", f"{rss:.2f}",
                         f"{rss / file_gb:.2f}"]
                for tool in ("overview_page", "input_pipeline_analyzer"):
                    expected = xprof_gb_per_gb.get(tool, 0) * file_gb
                    if options.no_xprof:
                        cells.append("not run")
                        continue
                    if expected > options.xprof_limit_gb:
                        cells.append(f"skipped (~{expected:.0f} GB expected)")
                        continue
                    folder = scratch / f"xprof-{tool}"
                    folder.mkdir()
                    shutil.copy(path, folder / path.name)
                    try:
                        seconds, peak, ok = measure([python, "-c", XPROF, str(folder / path.name), tool], folder)
                    finally:
                        shutil.rmtree(folder)
                    xprof_gb_per_gb[tool] = max(xprof_gb_per_gb.get(tool, 0), peak / file_gb)
                    cells.append(f"{seconds:.1f} / {peak:.2f}" if ok else f"failed ({peak:.2f} GB)")
                path.unlink()
                print("| " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
