"""Fuzz tpuprof's parsers: `make fuzz MINUTES=N` (or `python tests/fuzz/run.py --minutes N`).

Every target (layout strings, OOM text, buffer-assignment text, HLO text, HloProto, xplane.pb, the --json
documents of report and diff) gets an equal share of the time, one worker process at a time (the machine is
shared: run it under `nice`). Crashes, hangs and memory blow-ups are saved under out/fuzz/<target>/ with the
reason beside each input; `--replay FILE --target NAME` runs one saved input in this process with its traceback.
Exit code 1 when anything but a clean run or a one-sentence UserError came out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402
from targets import TARGETS  # noqa: E402


def load(names: list[str]) -> dict:
    loaded = {}
    for name in names:
        target = TARGETS[name]()
        started = time.perf_counter()
        target.load()
        print(f"{name}: {len(target.samples)} samples loaded in {time.perf_counter() - started:.1f} s", flush=True)
        loaded[name] = target
    return loaded


def fuzz(names: list[str], seed: int, seconds_each: float | None, inputs_each: int | None, timeout: float,
         memory_mb: int, crashes: Path | None, verbose: bool = True) -> list[harness.Stats]:
    targets = load(names)
    worker = harness.Worker(targets, timeout=timeout, memory_mb=memory_mb)
    results = []
    try:
        for name, target in targets.items():
            stats = harness.campaign(target, worker, seed, seconds=seconds_each, inputs=inputs_each, crashes=crashes,
                                     progress=(lambda s: print("  ..." + s.line(), flush=True)) if verbose else None)
            print(stats.line(), flush=True)
            for key, (count, saved, detail) in sorted(stats.classes.items()):
                print(f"  {count:6d} x {key}  [{saved}]\n         {detail.strip().splitlines()[-1][:300] if detail.strip() else ''}")
            results.append(stats)
    finally:
        worker.stop()
    return results


def replay(name: str, path: Path) -> int:
    import tempfile
    import traceback

    target = load([name])[name]
    with tempfile.TemporaryDirectory() as folder:
        outcome = harness.run_one(target, path.read_bytes(), Path(folder))
    print(f"{outcome.status} {outcome.key} ({outcome.seconds:.2f} s)\n{outcome.detail}")
    del traceback
    return 0 if outcome.status in harness.GOOD else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, help="Total time, shared equally by the targets.")
    parser.add_argument("--inputs", type=int, help="Inputs per target (with --minutes: whichever ends first).")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="Only these targets (repeatable).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0, help="Seconds one input may take: longer is a hang.")
    parser.add_argument("--memory-mb", type=int, default=1536, help="Address space one input may add: more is a blow-up.")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "fuzz", help="Where crashing inputs are saved.")
    parser.add_argument("--replay", type=Path, help="Run one saved input (with --target) and show what happened.")
    args = parser.parse_args()
    names = args.target or list(TARGETS)
    if args.replay:
        return replay(names[0], args.replay)
    if args.minutes is None and args.inputs is None:
        parser.error("give --minutes or --inputs")
    seconds_each = args.minutes * 60 / len(names) if args.minutes is not None else None
    results = fuzz(names, args.seed, seconds_each, args.inputs, args.timeout, args.memory_mb, args.out)
    total = sum(s.inputs for s in results)
    bad = sum(s.bad for s in results)
    print(f"total: {total} inputs in {sum(s.seconds for s in results):.0f} s, {bad} crashes, hangs or memory blow-ups "
          f"(seed {args.seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
