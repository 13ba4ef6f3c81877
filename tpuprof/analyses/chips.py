"""TPU chips (`/device:TPU:N` planes): each chip's steps, where its step time goes, and its ops' times.

A chip's steps come from its `Steps` line (one event per step), else from the executions of its busiest
program on `XLA Modules`. A step period runs from one step's start to the next one's, so the device's idle
gap before the next program belongs to it; the last program execution has no next start and is left out
(its idle gap cannot be measured), unless it is the only one. Chips of one host run the same steps at the
same time: their steps are aligned by start time, and only the steps every chip ran are kept.

Inside a step period, with this priority (nested events go to the first layer that claims them):
  input         - infeed ops;
  host_transfer - ops that copy between host memory (`S(5)`, pinned host) and HBM, outfeed, host send/recv;
  collective    - all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all, their -start/-done,
                  and `barrier-cores` (a program waiting for the other chips, on the `XLA TraceMe` line);
  compute       - every other op on `XLA Ops` (MXU and vector work, Pallas and other custom calls);
  other         - a program running with no op on the timeline;
  compile       - device idle while the host compiles;
  input         - device idle while the host waits for data;
  host_overhead - the rest of the device's idle time: launching programs, the Python loop between steps.

Op times per step are per chip: an op's self time inside the kept step periods, summed over chips, divided by
the steps summed over chips (so 4 chips running a 200 ms copy each step show 200 ms, not 800 ms).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from tpuprof import targets
from tpuprof.analyses import top_ops
from tpuprof.analyses.step_split import complement_within, make_steps, split_layers
from tpuprof.analyses.timeline import TIME_LIMIT_PS, Line, Spans, distinct, read_line, self_times
from tpuprof.models.profile import Device, Op, Step, median

TPU_PLANE = re.compile(r"^/device:TPU:(\d+)$")
PROGRAM = re.compile(r"^(.*)\((\d+)\)$")
# Steps of two chips are the same step when they start within this share of the median step of each other.
ALIGN_TOLERANCE = 0.5
# Op events of the chips kept in memory between the two passes of `analyze` (with their op metadata and device clock,
# about 150 bytes each: 4M is ~0.6 GB); past it a chip
# is read again from the file.
KEPT_EVENTS = int(os.environ.get("TPUPROF_KEPT_EVENTS", 4_000_000))


class DeviceClock:
    """Maps the trace's timeline times to the chip's own clock.

    TPU op events carry `device_offset_ps`/`device_duration_ps`, the device's own measurement; their timeline
    offsets are the host's conversion, which can stretch one op and squeeze the next (on a real v6e capture a
    194 ms copy shows as 299 ms, the next as 97 ms). XProf measures ops on the device clock, and so do we. Lines
    without device times (programs, steps, the host's events) are moved onto the device clock by interpolating
    between the ops' two clocks.
    """

    def __init__(self, timeline: np.ndarray, device: np.ndarray):
        order = np.argsort(timeline, kind="stable")
        self.timeline, self.device = timeline[order].astype(np.float64), device[order].astype(np.float64)

    def __call__(self, times: np.ndarray) -> np.ndarray:
        times = np.asarray(times, dtype=np.int64)
        if not len(self.timeline) or not times.size:
            return times
        mapped = np.interp(times.astype(np.float64), self.timeline, self.device)
        # Outside the ops' range, keep the nearest op's offset between the clocks.
        mapped = np.where(times < self.timeline[0], times + (self.device[0] - self.timeline[0]), mapped)
        mapped = np.where(times > self.timeline[-1], times + (self.device[-1] - self.timeline[-1]), mapped)
        return np.round(mapped).astype(np.int64)

    def line(self, line: Line | None) -> Line | None:
        if line is None:
            return None
        return Line(line.name, self(line.start), np.maximum(self(line.end), self(line.start)), line.mid,
                    line.origin_ps)

    def spans(self, spans: Spans) -> Spans:
        return Spans(self(spans.starts), self(spans.ends)) if len(spans.starts) else spans


DEVICE_TIMES = ("device_offset_ps", "device_duration_ps")  # the device's own times of an op event (stats)


def _on_device_clock(plane, ops: Line) -> tuple[Line, DeviceClock | None]:
    """The op line with device times where the events carry them, and the timeline -> device clock map."""
    from tpuprof.sources import xplane

    values = ops.int_stats
    if set(values) != set(DEVICE_TIMES):
        return ops, None
    offset, duration = values["device_offset_ps"], values["device_duration_ps"]
    limit = TIME_LIMIT_PS  # device times past it would overflow int64 below: such a stat is damaged
    has = (offset != xplane.MISSING) & (duration != xplane.MISSING) & (duration >= 0) & (duration <= limit) \
        & (offset >= -limit) & (offset <= limit)
    has &= np.abs(np.where(has, offset, 0) + ops.origin_ps) <= limit - np.where(has, duration, 0)
    if not has.any():
        return ops, None
    start = np.where(has, offset + ops.origin_ps, ops.start)
    end = np.where(has, start + np.maximum(duration, 0), ops.end)
    clock = DeviceClock(np.concatenate([ops.start[has], ops.end[has]]), np.concatenate([start[has], end[has]]))
    return Line(ops.name, start, end, ops.mid, ops.origin_ps, first_stats=ops.first_stats), clock


@dataclass
class Chip:
    """One chip's timeline, read once."""

    plane: object
    id: str
    device_type: str
    capture_peak_tflops: float | None
    ops: Line | None
    modules: Line | None
    steps_line: Line | None
    infos: dict[int, top_ops.DeviceOpInfo]
    own: np.ndarray  # self time of each op event
    barriers: Spans  # `barrier-cores` on `XLA TraceMe`: a program waiting for the other chips
    clock: DeviceClock | None = None  # timeline -> device clock (None: the capture has only timeline times)

    def to_device(self, spans: Spans) -> Spans:
        return self.clock.spans(spans) if self.clock is not None else spans

    @property
    def kind(self) -> str:
        return targets.from_device_type(self.device_type) or self.device_type

    def program_names(self) -> dict[str, str]:
        """program id -> module name (`jit_train_step`), from the `XLA Modules` line's event names."""
        names = {}
        for meta in self.plane.event_metadata.values():
            match = PROGRAM.match(meta.name)
            if match:
                names[match.group(2)] = match.group(1)
        return names


def _plane_stats(plane) -> dict[str, object]:
    names = {k: m.name for k, m in plane.stat_metadata.items()}
    result = {}
    for stat in plane.stats:
        kind = stat.WhichOneof("value")
        result[names.get(stat.metadata_id, "")] = names.get(stat.ref_value, "") if kind == "ref_value" else \
            getattr(stat, kind) if kind else None
    return result


def read_chip(stream) -> Chip | None:
    """One TPU plane (a sources.xspace_stream.PlaneStream): only the lines the analysis uses are read."""
    plane = stream.header
    lines = {line.name: line for line in stream.lines() if line.has_events}
    if "XLA Ops" not in lines and "XLA Modules" not in lines:
        return None
    stats = _plane_stats(plane)
    device_times = {meta.name: key for key, meta in plane.stat_metadata.items() if meta.name in DEVICE_TIMES}
    ops = read_line(lines["XLA Ops"], int_stats=device_times if len(device_times) == len(DEVICE_TIMES) else None,
                    first_stats=True) if "XLA Ops" in lines else None
    infos = top_ops.device_op_infos(plane)
    clock = None
    if ops is not None:
        top_ops.fill_from_events(plane, ops, infos)
        ops, clock = _on_device_clock(plane, ops)
    modules = read_line(lines["XLA Modules"]) if "XLA Modules" in lines else None
    steps_line = read_line(lines["Steps"]) if "Steps" in lines else None
    barriers = Spans.empty()
    if "XLA TraceMe" in lines:
        barrier_ids = {k for k, m in plane.event_metadata.items() if m.name == "barrier-cores"}
        traceme = read_line(lines["XLA TraceMe"], keep=barrier_ids)
        barriers = Spans(traceme.start, traceme.end)
    if clock is not None:
        modules, steps_line, barriers = clock.line(modules), clock.line(steps_line), clock.spans(barriers)
    peak = stats.get("peak_teraflops_per_second")
    return Chip(plane=plane, id=plane.name.removeprefix("/device:"),
                device_type=str(stats.get("device_type_string") or ""),
                capture_peak_tflops=float(peak) if isinstance(peak, (int, float)) and peak else None,
                ops=ops, modules=modules, steps_line=steps_line, infos=infos, barriers=barriers,
                own=self_times(ops.start, ops.end) if ops is not None else np.zeros(0, np.int64), clock=clock)


def step_markers(chip: Chip) -> tuple[np.ndarray, np.ndarray, str, bool] | None:
    """(starts, ends, how they were found, whether the last one is a whole step) of one chip's steps."""
    if chip.steps_line is not None:
        order = np.argsort(chip.steps_line.start)
        return chip.steps_line.start[order], chip.steps_line.end[order], "the device `Steps` line", True
    if chip.modules is None:
        return None
    modules = chip.modules
    # The training program is the one that takes the most device time.
    totals: dict[int, int] = {}
    for mid, duration in zip(modules.mid.tolist(), (modules.end - modules.start).tolist()):
        totals[mid] = totals.get(mid, 0) + duration
    busiest = max(totals, key=totals.get)
    idx = np.flatnonzero(modules.mid == busiest)
    idx = idx[np.argsort(modules.start[idx])]
    name = chip.plane.event_metadata[busiest].name
    return modules.start[idx], modules.end[idx], f"executions of program `{name}`", False


def periods(starts: np.ndarray, ends: np.ndarray, last_is_whole: bool) -> tuple[np.ndarray, np.ndarray]:
    """Step i runs from its start to step i+1's; the last one to its own end when that is a whole step,
    else it is left out (the device's idle gap after it is not in the capture)."""
    if not len(starts):
        return starts, ends
    b = np.empty_like(ends)
    b[:-1] = starts[1:]
    b[-1] = ends[-1]
    a, b = starts, np.maximum(b, starts)
    if not last_is_whole and len(a) > 1:
        a, b = a[:-1], b[:-1]
    return a, b


def align(chip_starts: list[np.ndarray]) -> list[np.ndarray]:
    """For each chip, the indices of its steps that every chip ran, in the same order for every chip."""
    reference = chip_starts[0]
    if len(chip_starts) == 1 or not len(reference):
        return [np.arange(len(s)) for s in chip_starts]
    step = float(median(np.diff(reference).tolist())) if len(reference) > 1 else float("inf")
    matches = []  # per chip: reference index -> own index
    for starts in chip_starts:
        own = {}
        if len(starts):
            nearest = np.clip(np.searchsorted(reference, starts), 1, max(len(reference) - 1, 1))
            for i, (s, n) in enumerate(zip(starts.tolist(), nearest.tolist())):
                candidates = [c for c in (n - 1, n) if 0 <= c < len(reference)]
                best = min(candidates, key=lambda c: abs(reference[c] - s))
                if abs(reference[best] - s) <= ALIGN_TOLERANCE * step and best not in own:
                    own[best] = i
        matches.append(own)
    common = sorted(set.intersection(*(set(m) for m in matches)))
    return [np.array([m[r] for r in common], dtype=np.int64) for m in matches]


def split(chip: Chip, a: np.ndarray, b: np.ndarray, host_wait: Spans, host_compile: Spans) -> list[Step]:
    """One chip's step periods split into categories."""
    layers = []
    if chip.ops is not None:
        ops = chip.ops
        by_category: dict[str, set[int]] = {}
        for key, info in chip.infos.items():
            by_category.setdefault(info.category, set()).add(key)
        for category in ("input", "host_transfer", "collective"):
            idx = ops.select(by_category.get(category, set()))
            spans = Spans(ops.start[idx], ops.end[idx])
            layers.append((category, spans | chip.barriers if category == "collective" else spans))
        op_spans = Spans(ops.start, ops.end)
        layers.append(("compute", op_spans))
    else:
        op_spans = Spans(chip.modules.start, chip.modules.end)
        layers.append(("compute", op_spans))
    program = Spans(chip.modules.start, chip.modules.end) if chip.modules is not None else op_spans
    layers.append(("other", program))
    busy = program | op_spans
    # Device idle while the host compiles is compile; while the host waits for data, input.
    layers.append(("compile", complement_within(busy, chip.to_device(host_compile), a, b)))
    layers.append(("input", complement_within(busy, chip.to_device(host_wait), a, b)))
    return make_steps(a, b, split_layers(a, b, layers, rest="host_overhead"))


def chip_ops(chip: Chip, a: np.ndarray, b: np.ndarray, programs: dict[str, str]) -> dict[tuple[str, str], Op]:
    """One chip's device ops, keyed by (program, HLO op): whole-capture and in-step times and counts."""
    rows: dict[tuple[str, str], Op] = {}
    ops = chip.ops
    if ops is None or not len(ops.mid):
        return rows
    if len(a):
        k = np.searchsorted(a, ops.start, side="right") - 1
        in_step = (k >= 0) & (ops.start < b[np.maximum(k, 0)])
    else:
        in_step = np.zeros(len(ops.mid), dtype=bool)
    for key in distinct(ops.mid):
        mask = ops.mid == key
        info = chip.infos.get(key)
        if info is None:  # an event whose metadata id names nothing (a damaged capture): nothing to call it
            continue
        program = programs.get(info.program, info.program)
        op = rows.get((program, info.hlo_op))
        if op is None:
            op = rows[(program, info.hlo_op)] = Op(
                name=info.framework_op, kind=info.hlo_category, where="device", count=0, self_ps=0,
                hlo_op=info.hlo_op, category=info.category, program=program, flops=info.flops,
                model_flops=info.model_flops, bytes_accessed=info.bytes_accessed, hbm_bytes=info.hbm_bytes,
                flops_source=info.flops_source, shape=info.shape, transfer=info.transfer,
                async_start=info.async_start)
        op.count += int(mask.sum())
        op.self_ps += int(chip.own[mask].sum())
        op.step_count += int((mask & in_step).sum())
        op.step_self_ps += int(chip.own[mask & in_step].sum())
    return rows


def mean_steps(per_chip: list[list[Step]]) -> list[Step]:
    """The chips' aligned steps averaged position by position (one host's view of each step)."""
    count = min(len(steps) for steps in per_chip)
    fields = [f for f in Step.__dataclass_fields__ if f.endswith("_ps") and f != "start_ps"]
    result = []
    for i in range(count):
        group = [steps[i] for steps in per_chip]
        values = {f: int(round(sum(getattr(s, f) for s in group) / len(group))) for f in fields}
        result.append(Step(number=group[0].number, start_ps=group[0].start_ps, **values))
    return result


@dataclass
class ChipsResult:
    devices: list[Device]
    steps: list[Step]  # averaged over chips
    ops: list[Op]  # summed over chips
    chip_steps: int
    source: str
    matmul_ps: int
    matmul_f32_ps: int
    executions: int = 0  # step markers (programs run) on the chip that ran the most, the unmeasured last one too
    last_event_ps: int = 0  # when the chips' last event ends (device clock)


def _events(chip: Chip) -> int:
    return sum(len(line.mid) for line in (chip.ops, chip.modules, chip.steps_line) if line is not None)


def chips_of_host(planes, host_wait: Spans, host_compile: Spans) -> ChipsResult | None:
    """Every TPU chip of one host, or None when no chip has steps. PLANES: one callable per TPU plane that reads it
    (a sources.xspace_stream.PlaneStream).

    Two passes: the chips' step periods must all be known to align them before any chip's steps are split. Chips
    are kept in memory from the first pass up to KEPT_EVENTS events in all; the others are read again from the
    file in the second, so memory holds one chip's events however many planes the capture has."""
    kept, budget = [], KEPT_EVENTS
    executions = last_event = 0  # the most step markers on a chip; when the chips' last event ends
    for read in planes:
        chip = read_chip(read())
        if chip is not None:
            last_event = max([last_event] + [int(line.end.max()) for line in (chip.ops, chip.modules)
                                             if line is not None and len(line.end)])
        marks = step_markers(chip) if chip is not None else None
        if marks is None or not len(marks[0]):
            continue
        executions = max(executions, len(marks[0]))
        starts, ends, source, whole = marks
        a, b = periods(starts, ends, whole)
        budget -= _events(chip)
        kept.append((chip if budget >= 0 else read, a, b, source))
        del chip
    if not kept:
        return None
    indices = align([a for _, a, _, _ in kept])
    devices, per_chip, merged = [], [], {}
    matmul = wide = 0
    for (chip, a, b, source), idx in zip(kept, indices):
        if not isinstance(chip, Chip):
            chip = read_chip(chip())
        a, b = a[idx], b[idx]
        steps = split(chip, a, b, host_wait, host_compile)
        for number, step in enumerate(steps):
            step.number = number
        device = Device(id=chip.id, kind=chip.kind, device_type=chip.device_type, steps=steps,
                        capture_peak_tflops=chip.capture_peak_tflops)
        if chip.ops is not None and len(chip.ops.start):
            # XProf's overview_page: busy = the ops' self times, idle = the rest of the time from the first
            # program or op event to the last (on the offload capture this gives XProf's 86.5%, the ops line's
            # extent alone 86.6%).
            lines = [line for line in (chip.ops, chip.modules) if line is not None and len(line.start)]
            device.op_busy_ps = int(chip.own.sum())
            device.op_span_ps = int(max(line.end.max() for line in lines) - min(line.start.min() for line in lines))
        device.program_runs = len(chip.modules.start) if chip.modules is not None else 0
        devices.append(device)
        per_chip.append(steps)
        for key, op in chip_ops(chip, a, b, chip.program_names()).items():
            into = merged.get(key)
            if into is None:
                merged[key] = op
            else:
                for name in ("count", "self_ps", "step_count", "step_self_ps"):
                    setattr(into, name, getattr(into, name) + getattr(op, name))
        if chip.ops is not None:
            total, f32 = top_ops.matmul_precision_of(chip.infos, chip.ops.mid, chip.own)
            matmul, wide = matmul + total, wide + f32
    source = kept[0][3]
    return ChipsResult(executions=executions, last_event_ps=last_event,
                       devices=devices, steps=mean_steps(per_chip) if all(per_chip) else [],
                       ops=list(merged.values()), chip_steps=sum(len(s) for s in per_chip), source=source,
                       matmul_ps=matmul, matmul_f32_ps=wide)
