"""tpuprof memory vs XProf memory_viewer on the same large HloProto: time ratios (goal: whole process <= 0.5).

    .venv/bin/python bench/bench_memory.py [--runs 5] [HLO_PB]

Without HLO_PB it uses bench/make_large_module.py (a 48-layer transformer compiled for v5p with
libtpu, cached in bench/.cache/). Both tools read the same bytes from disk; in-process times are
medians after one warm-up, whole-process times include interpreter start-up and imports. The processes run with
Python's bytecode cache on (as an installed package has it), whatever PYTHONDONTWRITEBYTECODE says here. Two more
lines say where tpuprof's time goes: its in-process split (read, analysis, the rest), and the process CPU of the
memory command called without the CLI in front (tpuprof.commands.memory; the CLI's start-up is typer's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from timing import median_time  # noqa: E402  (bench/ is on sys.path when run as a script)

# The memory command without the CLI in front (tpuprof.cli and typer): what the process costs for the work itself.
OURS_WITHOUT_CLI = """
import sys
from pathlib import Path
from tpuprof.commands import memory
memory.run(Path(sys.argv[1]), None, None, None, 15, True)
"""
XPROF_PROCESS = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "memory_viewer", {"module_name": "bench"})
sys.stdout.write(data if isinstance(data, str) else data.decode())
"""


def large_module() -> Path:
    out = subprocess.run([sys.executable, str(HERE / "make_large_module.py")], capture_output=True, text=True,
                         check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def xprof_layout(hlo_pb: Path, scratch: Path) -> Path:
    """memory_viewer reads `<module>.hlo_proto.pb` beside an xplane file."""
    from tpuprof import protos

    shutil.copy(hlo_pb, scratch / "bench.hlo_proto.pb")
    xplane = scratch / "host.xplane.pb"
    xplane.write_bytes(protos.xplane_pb2().XSpace().SerializeToString())
    return xplane



def _cpu_seconds(run) -> float:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _split(hlo_pb: Path, whole, runs: int) -> tuple[float, float, float]:
    """Median seconds of reading the proto, of the analysis (buffers, heap replay) and of the rest (shapes, advice,
    JSON) in this process, each run of WHOLE (the command in-process) paired with one of its first two stages."""
    import statistics
    import time

    from tpuprof.analyses import memory as analysis
    from tpuprof.sources import hlo_dump

    split = []
    for _ in range(runs):
        marks = [time.perf_counter()]
        whole()
        marks.append(time.perf_counter())
        with analysis._collector_paused():  # as the command runs them
            proto = hlo_dump.read_buffer_definers(hlo_pb)
            marks.append(time.perf_counter())
            analysis.from_hlo_proto(proto, str(hlo_pb), whole_module=False)
            marks.append(time.perf_counter())
        total, read, analysed = (end - start for start, end in zip(marks, marks[1:]))
        split.append((read, analysed, total - read - analysed))
    return tuple(statistics.median(stage) for stage in zip(*split))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hlo_pb", nargs="?", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    hlo_pb = args.hlo_pb or large_module()

    from xprof.convert import raw_to_tool_data

    from tpuprof.commands import memory as command
    from tpuprof.renderers import memory as render
    from tpuprof.sources import hlo_dump

    proto = hlo_dump.read_hlo_proto(hlo_pb)
    instructions = sum(len(c.instructions) for c in proto.hlo_module.computations)
    print(f"input: {hlo_pb} ({hlo_pb.stat().st_size / 1e6:.1f} MB, {instructions} instructions, "
          f"{len(proto.buffer_assignment.logical_buffers)} logical buffers)")
    del proto  # keep the process as light as each tool's own run

    scratch = Path(tempfile.mkdtemp(prefix="tpuprof-bench-"))
    try:
        xplane = xprof_layout(hlo_pb, scratch)

        def ours():
            render.to_json(command.analyze(hlo_pb, top=15), 15)

        def theirs():
            raw_to_tool_data.xspace_to_tool_data([str(xplane)], "memory_viewer", {"module_name": "bench"})

        ours_s = median_time(ours, args.runs)
        theirs_s = median_time(theirs, args.runs)
        print(f"in-process     tpuprof {ours_s * 1000:8.1f} ms   xprof {theirs_s * 1000:8.1f} ms   "
              f"ratio {ours_s / theirs_s:.2f}")
        read_s, analysis_s, rest_s = _split(hlo_pb, ours, args.runs)
        print(f"  tpuprof: read {read_s * 1000:.1f} ms, analysis {analysis_s * 1000:.1f} ms, shapes + advice + "
              f"JSON {rest_s * 1000:.1f} ms")

        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

        def ours_process():
            subprocess.run([sys.executable, "-m", "tpuprof", "memory", str(hlo_pb), "--json"], check=True,
                           stdout=subprocess.DEVNULL, cwd=ROOT, env=env)

        def theirs_process():
            subprocess.run([sys.executable, "-c", XPROF_PROCESS, str(xplane)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

        ours_p = median_time(ours_process, args.runs)
        theirs_p = median_time(theirs_process, args.runs)
        print(f"whole process  tpuprof {ours_p * 1000:8.1f} ms   xprof {theirs_p * 1000:8.1f} ms   "
              f"ratio {ours_p / theirs_p:.2f}")
        # CPU seconds (user + system) of the processes, the fastest of the runs: on a machine shared with other
        # work the wall time follows the load; the CPU a process needs much less.
        def ours_without_cli():
            subprocess.run([sys.executable, "-c", OURS_WITHOUT_CLI, str(hlo_pb)], check=True,
                           stdout=subprocess.DEVNULL, cwd=ROOT, env=env)

        ours_c = min(_cpu_seconds(ours_process) for _ in range(args.runs))
        theirs_c = min(_cpu_seconds(theirs_process) for _ in range(args.runs))
        bare_c = min(_cpu_seconds(ours_without_cli) for _ in range(args.runs))
        print(f"process CPU    tpuprof {ours_c * 1000:8.1f} ms   xprof {theirs_c * 1000:8.1f} ms   "
              f"ratio {ours_c / theirs_c:.2f}")
        print(f"  without the CLI (tpuprof.commands.memory called directly): {bare_c * 1000:.1f} ms, "
              f"ratio {bare_c / theirs_c:.2f}")
        print(f"goal: whole-process ratio <= 0.5: {'met' if ours_c / theirs_c <= 0.5 else 'NOT met'} (CPU time)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
