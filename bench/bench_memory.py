"""tpuprof memory vs XProf memory_viewer on the same large HloProto: time ratios (goal: whole process <= 0.5).

    .venv/bin/python bench/bench_memory.py [--runs 5] [HLO_PB]

Without HLO_PB it uses bench/make_large_module.py (a 48-layer transformer compiled for v5p with
libtpu, cached in bench/.cache/). Both tools read the same bytes from disk; in-process times are
medians after one warm-up, whole-process times include interpreter start-up and imports. The processes run with
Python's bytecode cache on (as an installed package has it), whatever PYTHONDONTWRITEBYTECODE says here. Two more
lines say where tpuprof's time goes: the process CPU of the memory command called without the CLI in front
(tpuprof.commands.memory; the CLI's start-up is typer's), and its stages in one such process.
"""

from __future__ import annotations

import argparse
import json
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
# The same work as OURS_WITHOUT_CLI, with the process's CPU time printed after each stage.
OURS_STAGES = """
import time
interpreter = time.process_time()
import io, json, sys
from contextlib import redirect_stdout
from pathlib import Path
from tpuprof.analyses import memory as analysis
from tpuprof.commands import memory
from tpuprof.renderers.formats import print_document
from tpuprof.results import MemoryResult
from tpuprof.sources import hlo_dump
imports = time.process_time()
from tpuprof import protos
protos.hlo_pb2(), protos.buffer_view_classes()
protobuf = time.process_time()
path = Path(sys.argv[1])
with analysis._collector_paused():  # as the command runs them
    view = hlo_dump.read_buffer_definers(path)
    read = time.process_time()
    result = analysis.from_hlo_proto(view, str(path), whole_module=False)
    analysed = time.process_time()
memory.describe_and_advise(result, 15)
with redirect_stdout(io.StringIO()):
    print_document(MemoryResult(str(path), [result], 15), "json")
marks = [0, interpreter, imports, protobuf, read, analysed, time.process_time()]
print(json.dumps({name: (end - start) * 1000 for name, start, end in zip(
    ("interpreter", "imports", "protobuf", "read", "analysis", "shapes, advice, JSON"), marks, marks[1:])}))
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


def _stages_process(hlo_pb: Path, env: dict) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", OURS_STAGES, str(hlo_pb)], check=True, capture_output=True,
                          text=True, cwd=ROOT, env=env)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hlo_pb", nargs="?", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    hlo_pb = args.hlo_pb or large_module()

    from xprof.convert import raw_to_tool_data

    from tpuprof.commands import memory as command
    from tpuprof.documents_memory import document
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
            document(command.module_memories(hlo_pb, top=15), 15)

        def theirs():
            raw_to_tool_data.xspace_to_tool_data([str(xplane)], "memory_viewer", {"module_name": "bench"})

        ours_s = median_time(ours, args.runs)
        theirs_s = median_time(theirs, args.runs)
        print(f"in-process     tpuprof {ours_s * 1000:8.1f} ms   xprof {theirs_s * 1000:8.1f} ms   "
              f"ratio {ours_s / theirs_s:.2f}")

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
        stages = [_stages_process(hlo_pb, env) for _ in range(args.runs)]
        print("  of which " + ", ".join(f"{name} {min(run[name] for run in stages):.0f}" for name in stages[0])
              + " ms (CPU at checkpoints in one process, the fastest of the runs)")
        print(f"goal: whole-process ratio <= 0.5: {'met' if ours_c / theirs_c <= 0.5 else 'NOT met'} (CPU time)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
