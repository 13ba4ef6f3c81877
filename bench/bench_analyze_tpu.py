"""tpuprof analyze vs XProf overview_page on real public TPU captures: time ratio, largest capture first.

    .venv/bin/python bench/bench_analyze_tpu.py [--runs 5]

The captures are found by tests/real_data.py (they are not in the repository; see
sample_profiles/real/README.md). XProf writes a cache file (ALL_HOSTS.op_stats*) beside the capture it
reads, so every XProf run gets a fresh copy. In-process times are medians after one warm-up; whole-process
times include interpreter start-up and imports (tpuprof's CLI with --json and with tables; XProf two ways: its
converter called from a minimal Python script, the least a process can do to get overview_page, and the
`xprof get_overview` command XProf 2.24 ships, what a user types), run interleaved, with bytecode compiled once
as for an installed package. Two floors are timed beside them: an interpreter that does nothing, and one that only
imports numpy, which tpuprof's analyses are written in: no numpy-based tool can start faster than the second.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from timing import median_time  # noqa: E402  (bench/ is on sys.path when run as a script)

XPROF_PROCESS = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "overview_page", {})
sys.stdout.write(data if isinstance(data, str) else data.decode())
"""


def captures(scratch: Path) -> list[tuple[str, Path]]:
    import pytest
    from helpers.real_data import REAL_TPU_CAPTURES, real_artefact

    found = []
    for name, artefact in REAL_TPU_CAPTURES.items():
        try:
            found.append((name, real_artefact(artefact, scratch / name)))
        except pytest.skip.Exception as reason:
            print(f"{name}: skipped ({reason})")
    return sorted(found, key=lambda item: item[1].stat().st_size, reverse=True)


def bench(name: str, path: Path, runs: int, scratch: Path) -> None:
    from xprof.convert import raw_to_tool_data

    from tpuprof.commands import analyze

    def fresh_copy() -> str:
        folder = Path(tempfile.mkdtemp(dir=scratch))
        shutil.copy(path, folder / path.name)
        return str(folder / path.name)

    def fresh_logdir() -> list[str]:
        """The `xprof` command reads a session (a run folder under plugins/profile) and caches its results
        there: each run gets a new one."""
        logdir = Path(tempfile.mkdtemp(dir=scratch))
        run = logdir / "plugins" / "profile" / "run"
        run.mkdir(parents=True)
        shutil.copy(path, run / "host0.xplane.pb")
        return ["--session_id=run", f"--logdir={logdir}"]

    def run_xprof() -> float:
        copy = fresh_copy()
        started = time.perf_counter()
        raw_to_tool_data.xspace_to_tool_data([copy], "overview_page", {})
        return time.perf_counter() - started

    report = analyze.profile_summary(str(path))
    print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, {len(report.devices)} chip(s), {report.step_count} steps, "
          f"{len(report.device_ops)} device ops, verdict {report.verdict}")
    ours = median_time(lambda: analyze.profile_summary(str(path)), runs)
    run_xprof()  # warm-up
    theirs = statistics.median(run_xprof() for _ in range(runs))
    print(f"  in-process:    tpuprof analyze {ours * 1e3:.0f} ms, XProf overview_page {theirs * 1e3:.0f} ms, "
          f"ratio {ours / theirs:.2f}")

    # Both processes as an installed package runs them: bytecode compiled once (pip writes .pyc at install; a
    # PYTHONDONTWRITEBYTECODE=1 environment would make tpuprof's modules compile on every run and XProf's not,
    # its Python being already compiled in site-packages), kept in the scratch folder, not the clone.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")

    cpu: dict[str, list[float]] = {"json": [], "tables": [], "xprof": [], "xprof_cli": [], "python": [], "numpy": []}

    def whole(command: list[str], key: str | None = None) -> float:
        """Wall seconds; the process's CPU seconds (user + system) go to cpu[key]: on a shared machine the wall
        time follows the load, the CPU time much less."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if key is not None:
            cpu[key].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return wall

    commands = {
        "json": [sys.executable, "-m", "tpuprof", "analyze", str(path), "--json"],
        "tables": [sys.executable, "-m", "tpuprof", "analyze", str(path)],
    }
    for command in commands.values():
        whole(command)  # warm-up: compiles the bytecode, fills the page cache
    xprof_cli = [str(Path(sys.executable).parent / "xprof"), "get_overview"]
    whole(xprof_cli + fresh_logdir())  # warm-up
    floors = {"python": [sys.executable, "-c", "pass"], "numpy": [sys.executable, "-c", "import numpy"]}
    times: dict[str, list[float]] = {key: [] for key in cpu}
    for _ in range(runs):  # interleaved, so that load from other processes hits every side alike
        for key, command in {**commands, **floors}.items():
            times[key].append(whole(command, key))
        times["xprof"].append(whole([sys.executable, "-c", XPROF_PROCESS, fresh_copy()], "xprof"))
        times["xprof_cli"].append(whole(xprof_cli + fresh_logdir(), "xprof_cli"))
    median = {key: statistics.median(values) for key, values in times.items()}
    cpu_median = {key: statistics.median(values) for key, values in cpu.items()}
    for key in ("json", "tables"):
        for xprof, label in (("xprof", "XProf overview_page (converter script)"), ("xprof_cli", "xprof get_overview")):
            print(f"  whole process: tpuprof analyze ({key}) {median[key]:.2f} s, {label} {median[xprof]:.2f} s, "
                  f"ratio {median[key] / median[xprof]:.2f}; CPU {cpu_median[key]:.2f} s vs "
                  f"{cpu_median[xprof]:.2f} s, ratio {cpu_median[key] / cpu_median[xprof]:.2f}")
    for key, label in (("python", "python -c pass"), ("numpy", "python -c 'import numpy'")):
        print(f"  floor: {label} {median[key]:.3f} s, CPU {cpu_median[key]:.3f} s, ratio to the converter script "
              f"{median[key] / median['xprof']:.2f} (CPU {cpu_median[key] / cpu_median['xprof']:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-analyze-tpu-"))
    try:
        found = captures(scratch)
        if not found:
            print("no real TPU capture available: see sample_profiles/real/README.md")
            return 0
        for name, path in found:
            bench(name, path, args.runs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
