"""Build a synthetic pod capture from a real one-host capture: N hosts, shifted clocks, one host slowed.

    .venv/bin/python bench/pod_capture.py SOURCE OUT [--hosts 16] [--slow-host 5] [--slow 0.25]
        [--clock-spread-ms 40] [--lose-host 9 --lose-steps 3] [--runs 2] [--seed 0]

SOURCE is a `<host>.xplane.pb` (or a folder holding one): sample_profiles/captures/jax_compute, or a real v6e
capture from tests/real_data.py. Every host is a real XSpace file made of SOURCE's events:

- its clock is shifted: every line's timestamp moves by the host's offset (drawn uniformly within
  +-clock-spread-ms, host 0 unshifted), as hosts whose clocks disagree;
- the slowed host's whole timeline is stretched by (1 + slow) from its first event (event offsets, durations and the
  chips' own `device_offset_ps` / `device_duration_ps`), so each of its steps takes (1 + slow) times as long;
- the lossy host's TPU planes lose every event from the start of the LOSE_STEPS-th last execution of the
  step program on, as when the profiler's device buffer fills before the capture ends (jax-ml/jax#23446).

The ground truth is these parameters; `Pod.truth()` (and OUT/truth.json) states them per host. With --runs 2
the hosts are split over two run folders (as a capture from several machines can land), to be named together.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUN_NAMES = ("2026_01_01_00_00_00", "2026_01_01_00_00_01")
DEVICE_TIME_STATS = ("device_offset_ps", "device_duration_ps")


@dataclass
class Pod:
    folder: str  # OUT/plugins/profile (holding one run folder, or two with --runs 2)
    runs: list[str]  # the run folders
    hosts: list[str]  # host names, in order
    offsets_ps: list[int]  # each host's clock shift
    slow_host: int | None
    slow: float
    lose_host: int | None
    lose_steps: int
    files: list[str] = field(default_factory=list)

    def truth(self) -> dict:
        return asdict(self)


def _source_file(source: Path) -> Path:
    if source.is_file():
        return source
    found = sorted(source.rglob("*.xplane.pb"))
    if len(found) != 1:
        raise SystemExit(f"{source}: expected one .xplane.pb, found {len(found)}")
    return found[0]


def _stretch(space, factor: float) -> None:
    """Every timeline time t becomes t0 + factor * (t - t0), t0 the capture's first event: event offsets and
    durations, and the chips' device times."""
    t0 = min(line.timestamp_ns * 1000 + min(e.offset_ps for e in line.events)
             for plane in space.planes for line in plane.lines if len(line.events))

    def moved(origin: int, offset: int) -> int:
        return t0 + round(factor * (origin + offset - t0)) - origin

    for plane in space.planes:
        device_ids = {key for key, meta in plane.stat_metadata.items() if meta.name in DEVICE_TIME_STATS}
        for line in plane.lines:
            origin = line.timestamp_ns * 1000
            for event in line.events:
                event.offset_ps = moved(origin, event.offset_ps)
                event.duration_ps = round(factor * event.duration_ps)
                for stat in event.stats:
                    if stat.metadata_id in device_ids:
                        kind = stat.WhichOneof("value")
                        value = getattr(stat, kind)
                        # device_offset_ps is, like offset_ps, relative to the line's timestamp.
                        new = moved(origin, value) if "offset" in plane.stat_metadata[stat.metadata_id].name \
                            else round(factor * value)
                        setattr(stat, kind, new)


def _busiest_program_starts(plane) -> list[int]:
    """Start times of the executions of the chip's busiest program (its steps), in order."""
    for line in plane.lines:
        if line.name == "XLA Modules" and len(line.events):
            totals: dict[int, int] = {}
            for event in line.events:
                totals[event.metadata_id] = totals.get(event.metadata_id, 0) + event.duration_ps
            busiest = max(totals, key=totals.get)
            origin = line.timestamp_ns * 1000
            return sorted(origin + e.offset_ps for e in line.events if e.metadata_id == busiest)
    return []


def _lose_device_steps(space, steps: int) -> None:
    """Drop every TPU event from the start of the STEPS-th last step execution on (the earliest over chips)."""
    tpu = [p for p in space.planes if p.name.startswith("/device:TPU:")]
    starts = [_busiest_program_starts(p) for p in tpu]
    if not tpu or not all(len(s) > steps for s in starts):
        raise SystemExit("--lose-steps needs a TPU capture with more step executions than that on every chip")
    cut = min(s[-steps] for s in starts)
    for plane in tpu:
        for line in plane.lines:
            origin = line.timestamp_ns * 1000
            kept = [e for e in line.events if origin + e.offset_ps < cut]
            del line.events[:]
            line.events.extend(kept)


def build(source: Path, out: Path, hosts: int = 16, slow_host: int | None = 5, slow: float = 0.25,
          clock_spread_ms: float = 40.0, lose_host: int | None = None, lose_steps: int = 0, runs: int = 1,
          seed: int = 0) -> Pod:
    from tpuprof.protos import xplane_pb2

    data = _source_file(Path(source)).read_bytes()
    rng = random.Random(seed)
    offsets = [0] + [round(rng.uniform(-clock_spread_ms, clock_spread_ms) * 1e6) * 1000 for _ in range(hosts - 1)]
    folder = Path(out) / "plugins" / "profile"
    run_dirs = [folder / name for name in RUN_NAMES[:runs]]
    for run in run_dirs:
        run.mkdir(parents=True, exist_ok=False)  # never write over an earlier pod
    pod = Pod(folder=str(folder), runs=[str(r) for r in run_dirs], hosts=[], offsets_ps=offsets,
              slow_host=slow_host, slow=slow, lose_host=lose_host, lose_steps=lose_steps)
    for i in range(hosts):
        space = xplane_pb2().XSpace.FromString(data)
        if i == slow_host:
            _stretch(space, 1.0 + slow)
        if i == lose_host:
            _lose_device_steps(space, lose_steps)
        shift_ns = offsets[i] // 1000
        for plane in space.planes:
            for line in plane.lines:
                line.timestamp_ns += shift_ns
        name = f"host_{i:03d}"
        path = run_dirs[i * runs // hosts] / f"{name}.xplane.pb"
        path.write_bytes(space.SerializeToString())
        pod.hosts.append(name)
        pod.files.append(str(path))
    (Path(out) / "truth.json").write_text(json.dumps(pod.truth(), indent=1))
    return pod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--slow-host", type=int, default=5)
    parser.add_argument("--slow", type=float, default=0.25, help="the slowed host's steps take (1 + SLOW) x as long")
    parser.add_argument("--clock-spread-ms", type=float, default=40.0)
    parser.add_argument("--lose-host", type=int, default=None)
    parser.add_argument("--lose-steps", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, choices=(1, 2))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pod = build(args.source, args.out, args.hosts, args.slow_host, args.slow, args.clock_spread_ms, args.lose_host,
                args.lose_steps, args.runs, args.seed)
    print(f"{len(pod.files)} hosts in {', '.join(pod.runs)}; truth in {args.out / 'truth.json'}")


if __name__ == "__main__":
    main()
