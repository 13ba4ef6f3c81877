"""Time to a first answer of `preflight --model` (not part of the test suite), and that answer's error.

    nice .venv/bin/python bench/bench_preflight_fast.py [--before TREE] [--model llama3.1-70b] [--tpu v6e-256]

Runs, each with an empty compile cache (a fresh XDG_CACHE_HOME) so every compile is paid:
  - fast:   this tree's default: stopped before code generation when the compiler's memory layout alone cannot
            fit, else compiled to the end;
  - before: the tree at --before, if given (e.g. a commit whose default compiled further);
  - full:   this tree with --full (compiled to the end), the reference the first answer's error is measured against
            (--no-full: skip it; the before run, if any, is then the reference).
Prints the wall time of each, the memory per chip and step time each reports, and the first answer's error against
the full compile (memory per chip with and without what it held for the code). The published Llama 3.1 70B v6e-256
recipe's settings by default (tpu-recipes training/trillium/Llama3.1-70B-MaxText/v6e-256: seq 8192, 5 sequences per
chip, host offload of the layer input and q/k/v).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, args: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(tree), "XDG_CACHE_HOME": cache}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tpuprof", "preflight", *args, "--json"], cwd=tree, env=env,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree}: preflight failed: {done.stderr.strip()[-500:]}")
    return seconds, json.loads(done.stdout)["targets"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another tree to time (e.g. a worktree of an older commit)")
    parser.add_argument("--model", default="llama3.1-70b")
    parser.add_argument("--tpu", default="v6e-256")
    parser.add_argument("--seq", default="8192")
    parser.add_argument("--batch-per-chip", default="5")
    parser.add_argument("--remat", default="offload")
    parser.add_argument("--no-full", action="store_true", help="skip this tree's --full run (the before run, on "
                        "the same step, is then the reference)")
    options = parser.parse_args()
    args = ["--model", options.model, "--tpu", options.tpu, "--seq", options.seq,
            "--batch-per-chip", options.batch_per_chip, "--remat", options.remat]
    print(f"{options.model} on {options.tpu}, seq {options.seq}, {options.batch_per_chip} per chip, "
          f"remat {options.remat}; empty cache each run")
    print(f"{'run':<28} {'seconds':>8} {'GiB/chip':>9} {'step ms':>9}  how", flush=True)
    runs = [("fast (default)", ROOT, args)]
    if options.before:
        runs.append((f"before ({options.before})", options.before, args))
    if not options.no_full:
        runs.append(("full (--full)", ROOT, [*args, "--full"]))
    rows = {}
    for label, tree, arguments in runs:  # each row printed as it comes: the full compiles take many minutes
        seconds, target = run(tree, arguments)
        rows[label] = target
        how = (target.get("fast") or {}).get("method", "every layer compiled")
        print(f"{label:<28} {seconds:8.1f} {target['required_bytes'] / 2**30:9.2f} "
              f"{(target.get('estimate') or {}).get('step_ms', float('nan')):9.1f}  {how}", flush=True)
    fast = rows["fast (default)"]
    full = rows.get("full (--full)") or rows.get(f"before ({options.before})")
    if full is not None:
        held = (fast.get("fast") or {}).get("codegen_allowance_bytes", 0)
        print(f"first answer's error against the full compile: memory per chip "
              f"{fast['required_bytes'] / full['required_bytes'] - 1:+.2%} "
              f"({(fast['required_bytes'] - held) / full['required_bytes'] - 1:+.2%} without the {held / 2**20:.0f} "
              f"MiB held for the code), step time {fast['estimate']['step_ms'] / full['estimate']['step_ms'] - 1:+.2%}")


if __name__ == "__main__":
    main()
