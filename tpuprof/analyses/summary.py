"""All hosts' profiles -> one report: step statistics, breakdown, verdict, stragglers, top ops, roofline."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tpuprof.analyses import input_pipeline, pod
from tpuprof.analyses.roofline import OpRoofline, ProgramRoofline, Roof, op_roofline, program_roofline, roof_for
from tpuprof.models.profile import CATEGORIES, Device, HostProfile, Op, Stage, median, percentile
from tpuprof.sources.xplane import RunChoice
from tpuprof.units import fmt_bytes

# XProf's input-pipeline thresholds (op_stats_to_input_pipeline_analysis): share of step time waiting for input.
HIGHLY_INPUT_BOUND = 20.0
MODERATELY_INPUT_BOUND = 5.0
# Beyond these shares the step is mainly the host's per-step overhead, compilation, host transfers or
# collectives (the same 20 % as XProf's "highly input-bound").
HOST_OVERHEAD_BOUND = 20.0
COMPILE_BOUND = 20.0
HOST_TRANSFER_BOUND = 20.0
COLLECTIVE_BOUND = 20.0
STRAGGLER_RATIO = 1.10  # a host whose median step is 10 % above the hosts' median
# Chips of one program run in lock step, so their step times match; the slow chip is the one doing more of
# its own work (the others wait for it in collectives or at the next step): named beyond 5 % more.
SLOW_CHIP_RATIO = 1.05
# The compute part of a step is "memory-bound" when most of its compute time is in HBM-bound ops.
MEMORY_BOUND_SHARE = 0.5

VERDICTS = {"input": "highly input-bound", "host_transfer": "host-transfer-bound", "collective": "collective-bound",
            "host_overhead": "host-overhead-bound", "compile": "compile-bound"}
THRESHOLDS = {"input": HIGHLY_INPUT_BOUND, "host_transfer": HOST_TRANSFER_BOUND, "collective": COLLECTIVE_BOUND,
              "host_overhead": HOST_OVERHEAD_BOUND, "compile": COMPILE_BOUND}


@dataclass
class SlowChip:
    host: str
    chip: str
    work_ms: float  # median of its own work per step (compute, host transfers, other)
    fastest_ms: float  # the least-busy chip's


@dataclass
class ProfileSummary:
    """What `tpuprof analyze` makes of a profile: its hosts' steps, their breakdown, the verdict."""

    hosts: list[HostProfile]
    step_count: int = 0
    mean_ms: float = 0.0
    median_ms: float = 0.0
    p90_ms: float = 0.0
    breakdown_percent: dict[str, float] = field(default_factory=dict)
    breakdown_ms_per_step: dict[str, float] = field(default_factory=dict)
    verdict: str = "unknown"
    verdict_reason: str = ""
    verdict_ops: list[Op] = field(default_factory=list)  # the ops behind the bound, largest first
    bottleneck_stage: Stage | None = None
    stages: list[Stage] = field(default_factory=list)
    stragglers: list[tuple[str, float, float]] = field(default_factory=list)  # host, its median, all hosts' median
    slow_chips: list[SlowChip] = field(default_factory=list)
    top_ops: list[Op] = field(default_factory=list)
    device_ops: list[Op] = field(default_factory=list)  # every device op, by time per step
    chip_steps: int = 0  # steps summed over every chip of every host
    roof: Roof | None = None
    roofline: ProgramRoofline | None = None
    op_rooflines: dict[tuple[str, str], OpRoofline] = field(default_factory=dict)  # (program, hlo_op) ->
    suggestions: list[dict] = field(default_factory=list)
    run: RunChoice | None = None  # the run read from a logdir, and how many others it holds
    warnings: list[str] = field(default_factory=list)  # what limits trust in the figures (too few steps)
    pod: pod.Pod | None = None  # several hosts: per-host figures, clock alignment, stragglers by delay

    @property
    def input_bound_percent(self) -> float:
        return self.breakdown_percent.get("input", 0.0)

    @property
    def batches_per_step(self) -> float:
        steps = [s for h in self.hosts for s in h.steps]
        return int(round(median([s.batches for s in steps]))) if steps else 1

    @property
    def devices(self) -> list[tuple[str, Device]]:
        return [(h.host, d) for h in self.hosts for d in h.devices]

    def ms_per_step(self, op: Op) -> float | None:
        """An op's self time per step inside the measured steps: a device op's per chip (averaged over chips), a
        host op's per host step, where every host measured its steps itself (else None: only the whole
        capture's time is known, which holds parts of steps outside the measured ones)."""
        if op.where == "device":
            return op.step_self_ps / 1e9 / self.chip_steps if self.chip_steps else None
        if self.step_count and all(h.host_ops_in_steps for h in self.hosts):
            return op.step_self_ps / 1e9 / self.step_count
        return None

    def rates(self, op: Op) -> OpRoofline | None:
        return self.op_rooflines.get((op.program, op.hlo_op))


def _merge_stages(hosts: list[HostProfile]) -> list[Stage]:
    """Every host's tf.data stages as one list, each stage once over all hosts and repeat() epochs."""
    return input_pipeline.merged([stage for host in hosts for stage in host.stages])


SUMMED = ("count", "self_ps", "step_self_ps", "step_count")


def _merge_ops(hosts: list[HostProfile]) -> tuple[list[Op], list[Op]]:
    """(device ops by time per step, host ops by self time), summed over hosts; device ops keep one row
    per HLO instruction and program, host ops one per framework op and type."""
    from dataclasses import replace

    device: dict[tuple, Op] = {}
    host: dict[tuple, Op] = {}
    for profile in hosts:
        for op in profile.ops:
            key = (op.program, op.hlo_op) if op.where == "device" else (op.name, op.kind)
            into = (device if op.where == "device" else host)
            if key not in into:
                into[key] = replace(op)
            else:
                for name in SUMMED:
                    setattr(into[key], name, getattr(into[key], name) + getattr(op, name))
    by_step = sorted(device.values(), key=lambda o: (o.step_self_ps, o.self_ps), reverse=True)
    return by_step, sorted(host.values(), key=lambda o: o.self_ps, reverse=True)


def _top(device: list[Op], host: list[Op], top: int) -> list[Op]:
    if top <= 0:  # --top 0: all of them
        return device + host
    # Device ops first when there are any: on a TPU job they are the step's compute.
    return (device[:top] + host[: max(top - len(device[:top]), top // 3)]) if device else host[:top]


def _slow_chips(hosts: list[HostProfile]) -> list[SlowChip]:
    found = []
    for host in hosts:
        work = {d.id: d.median_work_ms() for d in host.devices if d.steps}
        if len(work) < 2 or not min(work.values()):
            continue
        slowest = max(work, key=work.get)
        if work[slowest] >= SLOW_CHIP_RATIO * min(work.values()):
            found.append(SlowChip(host.host, slowest, work[slowest], min(work.values())))
    return found


def _shape_list(ops: list[Op]) -> str:
    shapes: dict[str, int] = {}
    for op in ops:
        shape = op.shape.split("{")[0] or op.hlo_op
        shapes[shape] = shapes.get(shape, 0) + 1
    return ", ".join(f"{n} x {shape}" if n > 1 else shape for shape, n in shapes.items())


def _weighty(report: ProfileSummary, ops: list[Op], most: int = 5) -> list[Op]:
    """The ops (largest first) that each take at least 1 % of the step: the ones behind a bound."""
    return [o for o in ops if (report.ms_per_step(o) or 0) >= 0.01 * report.mean_ms][:most]


def _host_transfer_reason(report: ProfileSummary) -> str:
    per_step = report.breakdown_ms_per_step["host_transfer"]
    ops = [o for o in report.device_ops if o.category == "host_transfer" and o.step_count]
    report.verdict_ops = _weighty(report, ops)
    steps = max(report.chip_steps, 1)
    parts = []
    for direction, words in (("to_device", "from host memory into HBM"), ("to_host", "from HBM to host memory")):
        copies = [o for o in ops if o.transfer == direction and not o.async_start]
        if copies:
            moved = sum(o.bytes_accessed * o.step_count for o in copies) / steps
            parts.append(f"{_shape_list(copies)} {words} ({fmt_bytes(int(moved))} per step)")
    waited = [o for o in report.verdict_ops if o.transfer and not o.async_start and o.bytes_accessed]
    rate = ""
    if waited:
        biggest = waited[0]
        rates = report.rates(biggest)
        if rates and rates.bytes_per_s:
            rate = (f"; a waited-for copy ({biggest.hlo_op}) moves {fmt_bytes(int(biggest.bytes_accessed))} at "
                    f"{rates.bytes_per_s / 1e9:.1f} GB/s")
            if rates.percent_of_roof is not None and report.roof:
                rate += f", {rates.percent_of_roof:.0f}% of the host link ({report.roof.host_link})"
    pinned = " (pinned host memory, S(5))" if any(o.transfer for o in ops) else ""
    what = "; ".join(parts) if parts else _shape_list(report.verdict_ops)
    return (f"{report.breakdown_percent['host_transfer']:.1f}% of step time ({per_step:.1f} ms of "
            f"{report.mean_ms:.1f} ms per step) waits for copies between the host{pinned} and the chip: {what}{rate}.")


def _ops_reason(report: ProfileSummary, category: str, what: str) -> str:
    ops = _weighty(report, [o for o in report.device_ops if o.category == category])
    report.verdict_ops = ops
    named = ", ".join(f"{o.hlo_op} {o.shape.split('{')[0]} ({report.ms_per_step(o):.2f} ms)" for o in ops[:3])
    return (f"{report.breakdown_percent[category]:.1f}% of step time "
            f"({report.breakdown_ms_per_step[category]:.1f} ms of {report.mean_ms:.1f} ms per step) {what}"
            + (f": {named}." if named else "."))


def _compute_split(report: ProfileSummary) -> tuple[float, list[Op]]:
    """(share of device compute time in HBM-bound ops, those ops largest first) from the roofline."""
    compute = [o for o in report.device_ops if o.category == "compute" and o.step_self_ps]
    total = sum(o.step_self_ps for o in compute)
    memory = [o for o in compute if (report.rates(o) or OpRoofline(*[None] * 6)).bound == "HBM"]
    return (sum(o.step_self_ps for o in memory) / total if total else 0.0), memory


def _verdict(report: ProfileSummary) -> None:
    share = report.breakdown_percent
    candidates = [(share[c], c) for c in THRESHOLDS if share.get(c, 0.0) >= THRESHOLDS[c]]
    shares = (f"{share['input']:.1f}% of step time waiting for input, {share['compute']:.1f}% compute, "
              + (f"{share['host_transfer']:.1f}% host transfers, " if share["host_transfer"] else "")
              + (f"{share['collective']:.1f}% collectives, " if share["collective"] else "")
              + f"{share['host_overhead']:.1f}% host overhead (launch, return, between steps), "
              f"{share['compile']:.1f}% compile (XProf thresholds: input >= {HIGHLY_INPUT_BOUND:.0f}% highly, "
              f">= {MODERATELY_INPUT_BOUND:.0f}% moderately input-bound).")
    lead = ""
    if candidates:
        bound = max(candidates)[1]
        report.verdict = VERDICTS[bound]
        if bound == "host_transfer":
            lead = _host_transfer_reason(report)
        elif bound == "collective":
            lead = _ops_reason(report, "collective", "waits for collectives between chips")
    elif share["input"] >= MODERATELY_INPUT_BOUND:
        report.verdict = "moderately input-bound"
    else:
        memory_share, memory_ops = _compute_split(report)
        if memory_share >= MEMORY_BOUND_SHARE:
            report.verdict = "memory-bound"
            report.verdict_ops = _weighty(report, memory_ops)
            named = ", ".join(f"{o.hlo_op} ({report.ms_per_step(o):.2f} ms, "
                              f"{report.rates(o).percent_of_roof:.0f}% of HBM bandwidth)" for o in memory_ops[:3])
            lead = (f"{100 * memory_share:.0f}% of device compute time is in ops limited by HBM bandwidth, not "
                    f"FLOPs: {named}.")
        else:
            report.verdict = "compute-bound"
            report.verdict_ops = _weighty(report, [o for o in report.device_ops if o.category == "compute"])
    report.verdict_reason = (lead + " " if lead else "") + shares[0].upper() + shares[1:]


def summarize(hosts: list[HostProfile], top: int = 10) -> ProfileSummary:
    report = ProfileSummary(hosts=hosts)
    steps = [s for h in hosts for s in h.steps]
    report.stages = _merge_stages(hosts)
    report.bottleneck_stage = input_pipeline.bottleneck(report.stages)
    report.device_ops, host_ops = _merge_ops(hosts)
    report.top_ops = _top(report.device_ops, host_ops, top)
    report.chip_steps = sum(h.chip_steps for h in hosts)
    kinds = [d.kind for h in hosts for d in h.devices]
    if kinds:
        report.roof = roof_for(kinds[0])
        report.op_rooflines = {(o.program, o.hlo_op): op_roofline(o, report.roof) for o in report.device_ops}
    if not steps:
        notes = "; ".join(sorted({n for h in hosts for n in h.notes})) or "no steps found"
        report.verdict_reason = f"No step found in the capture ({notes})."
        return report
    durations = np.array([s.duration_ps for s in steps], dtype=np.float64) / 1e9
    report.step_count = len(steps)
    report.mean_ms = float(durations.mean())
    report.median_ms = float(median(durations.tolist()))
    report.p90_ms = float(percentile(durations.tolist(), 90))
    total = float(durations.sum()) * 1e9
    for category in CATEGORIES:
        spent = sum(getattr(s, f"{category}_ps") for s in steps)
        report.breakdown_percent[category] = round(100.0 * spent / total, 1) if total else 0.0
        report.breakdown_ms_per_step[category] = spent / 1e9 / len(steps)
    if report.roof is not None and report.chip_steps:
        report.roofline = program_roofline(report.device_ops, report.chip_steps, report.mean_ms, report.roof)
    _verdict(report)

    medians = {h.host: h.median_step_ms() for h in hosts if h.steps}
    if len(medians) > 1:
        middle = median(medians.values())
        report.stragglers = [(host, value, middle) for host, value in medians.items()
                             if middle and value >= STRAGGLER_RATIO * middle]
    report.slow_chips = _slow_chips(hosts)
    report.pod = pod.build(hosts)
    return report
