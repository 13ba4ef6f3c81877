"""Many hosts as one pod: each host's steps, the hosts' clocks aligned, and who the pod waits for.

- Steps of different hosts are the same step when they carry the same step number (`step_num` stats, or
  the step's position in the capture when the capture numbers none, as for TPU device steps).
- Clock offsets: each host's clock is set against a reference host (the one with the most steps) by the
  median difference of matching step starts. A synchronous step starts on every host right after the
  previous step's collective, so the starts agree up to the jitter of that hand-off; the residual (the
  median distance left between a host's shifted starts and the reference's) says how well they agree.
- Stragglers: a synchronous step's collective starts when the last host arrives. A host's own time in a
  step is its step time less the time it waited in collectives; the host that is last delays everyone by
  its own time minus the next slowest host's. Hosts are ranked by that delay summed over the matched steps.
  This needs no clock alignment (the hosts start each step together because the collective makes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tpuprof.models.profile import HostProfile, median

COMPACT_HOSTS = 64  # from this many hosts on, a compact table (slowest, median, fastest, outliers)
# An outlier's median step is this many median absolute deviations from the pod's median, and at least this share
# of it away (hosts of a pod can agree to the microsecond: a 1 % difference is then not worth naming).
OUTLIER_MADS = 3.0
OUTLIER_SHARE = 0.05
MOST_STRAGGLERS = 5


@dataclass
class PodHost:
    host: str
    steps: int
    median_ms: float
    input_ms: float  # per step, mean over its steps
    host_overhead_ms: float
    collective_ms: float
    clock_offset_ms: float | None = None  # its clock minus the reference host's (None: no step in common)
    residual_ms: float | None = None  # median |shifted start - reference start| over the matched steps
    delay_ms: float = 0.0  # how much it delayed the collective, summed over the matched steps
    last_steps: int = 0  # matched steps in which it was the last host to arrive
    steps_without_device: int = 0  # host step calls with no device execution in the capture
    device_stops_early_ms: float | None = None  # device events end this long before the host's steps


@dataclass
class Pod:
    hosts: list[PodHost]
    reference: str  # the host whose clock the offsets are measured against
    matched_steps: int  # step numbers every aligned host ran
    residual_ms: float | None  # the largest host residual
    stragglers: list[PodHost] = field(default_factory=list)  # ranked by delay_ms, largest first
    compact: dict[str, list[PodHost]] | None = None  # 64+ hosts: slowest, median, fastest, outliers
    alignment: str = "matching step starts (same step number), median difference"
    # Why the hosts are not one job (then no clock is aligned and no host holds the others up), or None.
    not_one_job: str | None = None

    def host(self, name: str) -> PodHost:
        return next(h for h in self.hosts if h.host == name)


def _per_step_ms(profile: HostProfile, category: str) -> float:
    return profile.total(category) / 1e9 / len(profile.steps) if profile.steps else 0.0


def _row(profile: HostProfile) -> PodHost:
    return PodHost(host=profile.host, steps=len(profile.steps), median_ms=round(profile.median_step_ms(), 3),
                   input_ms=_per_step_ms(profile, "input"), host_overhead_ms=_per_step_ms(profile, "host_overhead"),
                   collective_ms=_per_step_ms(profile, "collective"),
                   steps_without_device=profile.steps_without_device,
                   device_stops_early_ms=profile.device_stops_early_ps / 1e9 if profile.device_stops_early_ps
                   else None)


def _align(rows: dict[str, PodHost], profiles: list[HostProfile]) -> tuple[str, list[int]]:
    """Clock offsets against the reference host; the step numbers every aligned host ran."""
    with_steps = [p for p in profiles if p.steps]
    reference = max(with_steps, key=lambda p: len(p.steps))  # first of equals: the file order decides
    ref_start = {s.number: s.start_ps for s in reference.steps}
    common = set(ref_start)
    for profile in with_steps:
        starts = {s.number: s.start_ps for s in profile.steps}
        shared = sorted(set(starts) & set(ref_start))
        if not shared:
            continue  # no step in common: not aligned, left out of the straggler ranking
        differences = np.array([starts[n] - ref_start[n] for n in shared], dtype=np.float64)
        offset = float(median(differences.tolist()))
        row = rows[profile.host]
        row.clock_offset_ms = offset / 1e9
        row.residual_ms = float(median(np.abs(differences - offset).tolist())) / 1e9
        common &= set(shared)
    if sum(rows[p.host].clock_offset_ms is not None for p in with_steps) < 2:  # only the reference with itself
        rows[reference.host].clock_offset_ms = rows[reference.host].residual_ms = None
        return reference.host, []
    return reference.host, sorted(common)


def _delays(rows: dict[str, PodHost], profiles: list[HostProfile], numbers: list[int]) -> None:
    aligned = [p for p in profiles if rows[p.host].clock_offset_ms is not None]
    if len(aligned) < 2 or not numbers:
        return
    index = {n: i for i, n in enumerate(numbers)}
    own = np.zeros((len(aligned), len(numbers)))
    for h, profile in enumerate(aligned):
        for step in profile.steps:
            if step.number in index:
                own[h, index[step.number]] = step.duration_ps - step.collective_ps
    order = np.argsort(own, axis=0, kind="stable")
    last, second = order[-1], order[-2]
    columns = np.arange(len(numbers))
    delay = own[last, columns] - own[second, columns]  # how much sooner the collective starts without it
    for h, profile in enumerate(aligned):
        mine = last == h
        rows[profile.host].delay_ms = float(delay[mine].sum()) / 1e9
        rows[profile.host].last_steps = int(mine.sum())


def _compact(rows: list[PodHost]) -> dict[str, list[PodHost]]:
    by_median = sorted((r for r in rows if r.steps), key=lambda r: (r.median_ms, r.host))
    if not by_median:
        return {"slowest": [], "median": [], "fastest": [], "outliers": []}
    medians = np.array([r.median_ms for r in by_median])
    middle = float(median(medians.tolist()))
    spread = float(median(np.abs(medians - middle).tolist()))
    limit = max(OUTLIER_MADS * spread, OUTLIER_SHARE * middle)
    outliers = [r for r in by_median if abs(r.median_ms - middle) > limit]
    return {"slowest": [by_median[-1]], "median": [by_median[len(by_median) // 2]], "fastest": [by_median[0]],
            "outliers": sorted(outliers, key=lambda r: -abs(r.median_ms - middle))}


# A program's fingerprint (`jit_f(12190760917235803885)`) changes with every compile of one function.
_FINGERPRINT = re.compile(r"\(\d{6,}\)")


def programs(profiles: list[HostProfile]) -> dict[str, list[str]]:
    """The programs whose runs are the hosts' steps (TPU steps found as a program's executions): name -> hosts."""
    found: dict[str, list[str]] = {}
    for profile in profiles:
        match = re.search(r"executions of program `([^`]+)`", profile.step_source or "")
        if profile.steps and match:
            found.setdefault(_FINGERPRINT.sub("", match.group(1)), []).append(profile.host)
    return found


def not_one_job(profiles: list[HostProfile]) -> str | None:
    """What in the capture shows that the hosts are not one synchronous job, or None.

    The clock offsets and delays rest on the hosts starting each step together because a collective makes them;
    hosts that run different programs, or TPU hosts none of whose chips ran a collective, wait for no one: their
    step starts agree by chance, and the step numbers matched are unrelated steps."""
    reasons = []
    stepped = [p for p in profiles if p.steps]
    ran = programs(stepped)
    if len(ran) > 1:
        reasons.append("the hosts' steps are runs of different programs ("
                       + "; ".join(f"`{name}` on {', '.join(hosts)}" for name, hosts in ran.items()) + ")")
    if stepped and all(p.platform == "tpu" for p in profiles) and not any(p.total("collective") for p in stepped):
        reasons.append("no chip of any host ran a collective (0 ms per step on every host): no step waits for "
                       "another host")
    return "; ".join(reasons) or None


def build(profiles: list[HostProfile]) -> Pod | None:
    """The pod view of several hosts (None for one host, or when no host has steps)."""
    if len(profiles) < 2 or not any(p.steps for p in profiles):
        return None
    rows = {p.host: _row(p) for p in profiles}
    unrelated = not_one_job(profiles)
    if unrelated:
        ordered = [rows[p.host] for p in profiles]
        return Pod(hosts=ordered, reference="", matched_steps=0, residual_ms=None, alignment="none: not one job",
                   not_one_job=unrelated, compact=_compact(ordered) if len(ordered) >= COMPACT_HOSTS else None)
    reference, numbers = _align(rows, profiles)
    _delays(rows, profiles, numbers)
    ordered = [rows[p.host] for p in profiles]
    residuals = [r.residual_ms for r in ordered if r.residual_ms is not None]
    ranked = sorted((r for r in ordered if r.delay_ms > 0), key=lambda r: (-r.delay_ms, r.host))
    return Pod(hosts=ordered, reference=reference, matched_steps=len(numbers),
               residual_ms=max(residuals) if residuals else None, stragglers=ranked[:MOST_STRAGGLERS],
               compact=_compact(ordered) if len(ordered) >= COMPACT_HOSTS else None)
