"""Is the capture long enough to judge by? A verdict from 2 or 4 steps is a guess: say so, and how long a
capture would hold enough steps."""

from __future__ import annotations

import math

from tpuprof.analyses import pod
from tpuprof.analyses.summary import ProfileSummary

MIN_STEPS = 5  # below this, one slow or fast step moves every share by 20 % or more
WANTED_STEPS = 20


def capture_seconds_for(steps: int, mean_step_ms: float) -> float:
    """Seconds of capture that hold STEPS whole steps: one more step start than steps, since a step runs to
    the next one's start (the last step seen is left out)."""
    return (steps + 1) * mean_step_ms / 1000


def few_steps_warning(report: ProfileSummary) -> str | None:
    """One sentence when a host has fewer than MIN_STEPS measured steps (None otherwise, or with no step)."""
    counts = [len(h.steps) for h in report.hosts if h.steps]
    if not counts or min(counts) >= MIN_STEPS or not report.mean_ms:
        return None
    fewest = min(counts)
    where = "" if len(report.hosts) == 1 else " on the host with the fewest"
    seconds = math.ceil(capture_seconds_for(WANTED_STEPS, report.mean_ms))
    return (f"Only {fewest} step{'s' if fewest != 1 else ''} measured{where}: the shares and the verdict rest on "
            f"too few steps to trust. At {report.mean_ms:.1f} ms per step, a {seconds} s capture would hold "
            f"{WANTED_STEPS} (`tpuprof capture --duration {seconds}s`).")


def mixed_programs_warning(report: ProfileSummary) -> str | None:
    """One sentence when the hosts' steps are runs of different programs: files of different jobs given together
    make no pod, and their steps average into figures of neither."""
    programs = pod.programs(report.hosts)
    if len(programs) < 2:
        return None
    named = "; ".join(f"`{program}` on {', '.join(hosts)}" for program, hosts in programs.items())
    return (f"The hosts' steps are runs of different programs ({named}): captures of different jobs make no pod, "
            "and the step figures average them; analyze each on its own.")
