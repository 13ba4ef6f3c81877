"""tpuprof analyze vs XProf input_pipeline_analyzer on the same large capture: time ratio (goal <= 0.5).

    .venv/bin/python bench/bench_analyze.py [--runs 3] [--min-mb 40] [XPLANE_PB]

Without XPLANE_PB it captures the tiny Keras job with 64 steps per call (hundreds of thousands of
tf.data and executor events per second) long enough for a file of at least --min-mb MB, with
tpuprof's capture, and caches it in bench/.cache/. XProf writes a cache file (ALL_HOSTS.op_stats*)
beside the capture it reads, so every XProf run gets a fresh copy. In-process times are medians
after one warm-up; whole-process times include interpreter start-up and imports.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache" / "analyze"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from timing import median_time  # noqa: E402  (bench/ is on sys.path when run as a script)

XPROF_PROCESS = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "input_pipeline_analyzer", {})
sys.stdout.write(data if isinstance(data, str) else data.decode())
"""


def large_capture(min_mb: float) -> Path:
    existing = sorted(CACHE.rglob("*.xplane.pb"))
    if existing and existing[-1].stat().st_size >= min_mb * 1e6:
        return existing[-1]
    from helpers.jobs import start_job

    from tpuprof.sources.capture import TraceOptions, capture

    shutil.rmtree(CACHE, ignore_errors=True)
    job = start_job("tf_keras_job.py", "--tiny", "--steps-per-execution", "64", seconds=300)
    try:
        time.sleep(2)
        duration_ms = 4000
        while True:
            result = capture([job.address], str(CACHE), TraceOptions(duration_ms=duration_ms))
            path = Path(result.hosts[0].path)
            if path.stat().st_size >= min_mb * 1e6:
                return path
            shutil.rmtree(CACHE, ignore_errors=True)
            duration_ms = int(duration_ms * min_mb * 1e6 / max(path.stat().st_size, 1) * 1.2)
    finally:
        job.stop()



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xplane", nargs="?", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--min-mb", type=float, default=40.0)
    args = parser.parse_args()
    path = args.xplane or large_capture(args.min_mb)
    print(f"capture: {path} ({path.stat().st_size / 1e6:.1f} MB)")

    from xprof.convert import raw_to_tool_data

    from tpuprof.commands import analyze

    scratch = Path(tempfile.mkdtemp(prefix="bench-analyze-"))

    def fresh_copy() -> str:
        folder = Path(tempfile.mkdtemp(dir=scratch))
        shutil.copy(path, folder / path.name)
        return str(folder / path.name)

    def run_xprof():
        copy = fresh_copy()
        started = time.perf_counter()
        raw_to_tool_data.xspace_to_tool_data([copy], "input_pipeline_analyzer", {})
        return time.perf_counter() - started

    try:
        report = analyze.profile_summary(str(path))
        print(f"tpuprof: {report.step_count} steps, verdict {report.verdict}, "
              f"input {report.input_bound_percent:.1f}%")
        ours = median_time(lambda: analyze.profile_summary(str(path)), args.runs)
        run_xprof()  # warm-up
        theirs = statistics.median(run_xprof() for _ in range(args.runs))
        print(f"in-process:    tpuprof analyze {ours:.2f} s, XProf input_pipeline_analyzer {theirs:.2f} s, "
              f"ratio {ours / theirs:.2f} (goal <= 0.5)")

        def whole(command: list[str]) -> float:
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
            return time.perf_counter() - started

        ours_p = statistics.median(whole([sys.executable, "-m", "tpuprof", "analyze", str(path), "--json"])
                                   for _ in range(args.runs))
        theirs_p = statistics.median(whole([sys.executable, "-c", XPROF_PROCESS, fresh_copy()])
                                     for _ in range(args.runs))
        print(f"whole process: tpuprof analyze {ours_p:.2f} s, XProf input_pipeline_analyzer {theirs_p:.2f} s, "
              f"ratio {ours_p / theirs_p:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
