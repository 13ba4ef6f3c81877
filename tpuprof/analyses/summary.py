"""All hosts' profiles -> one report: step statistics, breakdown, verdict, stragglers, top ops."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from tpuprof.analyses import input_pipeline
from tpuprof.models.profile import CATEGORIES, HostProfile, Op, Stage

# XProf's input-pipeline thresholds (op_stats_to_input_pipeline_analysis): share of step time waiting for input.
HIGHLY_INPUT_BOUND = 20.0
MODERATELY_INPUT_BOUND = 5.0
# Beyond these shares the step is mainly the host's per-step overhead or compilation.
HOST_OVERHEAD_BOUND = 20.0
COMPILE_BOUND = 20.0
STRAGGLER_RATIO = 1.10  # a host whose median step is 10 % above the hosts' median


@dataclass
class Report:
    hosts: list[HostProfile]
    step_count: int = 0
    mean_ms: float = 0.0
    median_ms: float = 0.0
    p90_ms: float = 0.0
    breakdown_percent: dict[str, float] = field(default_factory=dict)
    breakdown_ms_per_step: dict[str, float] = field(default_factory=dict)
    verdict: str = "unknown"
    verdict_reason: str = ""
    bottleneck_stage: Stage | None = None
    stages: list[Stage] = field(default_factory=list)
    stragglers: list[tuple[str, float, float]] = field(default_factory=list)  # host, its median, all hosts' median
    top_ops: list[Op] = field(default_factory=list)
    suggestions: list[dict] = field(default_factory=list)

    @property
    def input_bound_percent(self) -> float:
        return self.breakdown_percent.get("input", 0.0)

    @property
    def batches_per_step(self) -> float:
        steps = [s for h in self.hosts for s in h.steps]
        return int(round(statistics.median([s.batches for s in steps]))) if steps else 1


def _merge_stages(hosts: list[HostProfile]) -> list[Stage]:
    merged: dict[str, Stage] = {}
    for host in hosts:
        for stage in host.stages:
            into = merged.setdefault(stage.name, Stage(stage.name, stage.kind, 0, 0, 0, 0))
            into.count += stage.count
            into.total_ps += stage.total_ps
            into.self_ps += stage.self_ps
            into.py_function_ps += stage.py_function_ps
    return sorted(merged.values(), key=lambda s: s.self_ps, reverse=True)


def _merge_ops(hosts: list[HostProfile], top: int) -> list[Op]:
    merged: dict[tuple[str, str, str], Op] = {}
    for host in hosts:
        for op in host.ops:
            into = merged.setdefault((op.where, op.name, op.kind), Op(op.name, op.kind, op.where, 0, 0))
            into.count += op.count
            into.self_ps += op.self_ps
    ops = sorted(merged.values(), key=lambda o: o.self_ps, reverse=True)
    if top <= 0:  # --top 0: all of them
        return ops
    # Device ops first when there are any: on a TPU job they are the step's compute.
    device = [o for o in ops if o.where == "device"]
    host = [o for o in ops if o.where == "host"]
    return (device[:top] + host[: max(top - len(device[:top]), top // 3)]) if device else host[:top]


def summarize(hosts: list[HostProfile], top: int = 10) -> Report:
    report = Report(hosts=hosts)
    steps = [s for h in hosts for s in h.steps]
    report.stages = _merge_stages(hosts)
    report.bottleneck_stage = input_pipeline.bottleneck(report.stages)
    report.top_ops = _merge_ops(hosts, top)
    if not steps:
        notes = "; ".join(sorted({n for h in hosts for n in h.notes})) or "no steps found"
        report.verdict_reason = f"No step found in the capture ({notes})."
        return report
    durations = np.array([s.duration_ps for s in steps], dtype=np.float64) / 1e9
    report.step_count = len(steps)
    report.mean_ms = float(durations.mean())
    report.median_ms = float(np.median(durations))
    report.p90_ms = float(np.percentile(durations, 90))
    total = float(durations.sum()) * 1e9
    for category in CATEGORIES:
        spent = sum(getattr(s, f"{category}_ps") for s in steps)
        report.breakdown_percent[category] = round(100.0 * spent / total, 1) if total else 0.0
        report.breakdown_ms_per_step[category] = spent / 1e9 / len(steps)

    share = report.breakdown_percent
    # The largest stall decides; XProf's input thresholds grade the input-bound verdicts.
    if share["input"] >= HIGHLY_INPUT_BOUND and share["input"] >= share["host_overhead"]:
        report.verdict = "highly input-bound"
    elif share["host_overhead"] >= HOST_OVERHEAD_BOUND and share["host_overhead"] >= share["compile"]:
        report.verdict = "host-overhead-bound"
    elif share["input"] >= HIGHLY_INPUT_BOUND:
        report.verdict = "highly input-bound"
    elif share["compile"] >= COMPILE_BOUND:
        report.verdict = "compile-bound"
    elif share["input"] >= MODERATELY_INPUT_BOUND:
        report.verdict = "moderately input-bound"
    else:
        report.verdict = "compute-bound"
    report.verdict_reason = (
        f"{share['input']:.1f}% of step time waiting for input, {share['compute']:.1f}% compute, "
        f"{share['host_overhead']:.1f}% host overhead (launch, return, between steps), "
        f"{share['compile']:.1f}% compile "
        f"(XProf thresholds: input >= {HIGHLY_INPUT_BOUND:.0f}% highly, >= {MODERATELY_INPUT_BOUND:.0f}% "
        "moderately input-bound)."
    )

    medians = {h.host: h.median_step_ms() for h in hosts if h.steps}
    if len(medians) > 1:
        middle = statistics.median(medians.values())
        report.stragglers = [(host, value, middle) for host, value in medians.items()
                             if middle and value >= STRAGGLER_RATIO * middle]
    return report
