"""Splitting step periods into time categories: shared by the host planes (analyses/steps.py) and the
TPU chips (analyses/chips.py), which steps.py also calls, so that neither imports the other for them."""

from __future__ import annotations

import numpy as np

from tpuprof.analyses.timeline import Spans
from tpuprof.models.profile import Step


def split_layers(a, b, layers: list[tuple[str, Spans]], rest: str | None) -> dict[str, np.ndarray]:
    """Time of [a, b) per category: each layer takes what the layers before it did not."""
    result: dict[str, np.ndarray] = {}
    covered = Spans.empty()
    previous = np.zeros(len(a), dtype=np.int64)
    for category, spans in layers:
        covered = covered | spans
        now = covered.measure(a, b)
        result[category] = result.get(category, 0) + (now - previous)
        previous = now
    if rest:
        result[rest] = result.get(rest, 0) + ((b - a) - previous)
    return result


def make_steps(a, b, parts: dict[str, np.ndarray], numbers=None, batches=None) -> list[Step]:
    steps = []
    for i in range(len(a)):
        values = {f"{k}_ps": int(max(v[i], 0)) for k, v in parts.items()}
        steps.append(Step(number=int(numbers[i]) if numbers is not None else i, start_ps=int(a[i]),
                          duration_ps=int(b[i] - a[i]), batches=int(batches[i]) if batches is not None else 1,
                          **values))
    return steps


def complement_within(busy: Spans, wanted: Spans, a, b) -> Spans:
    """The parts of WANTED that fall where BUSY is not, clipped to the step periods."""
    if not len(wanted.starts) or not len(a):
        return Spans.empty()
    lo, hi = int(np.min(a)), int(np.max(b))
    gaps = Spans(np.concatenate([[lo], busy.ends]), np.concatenate([busy.starts, [hi]]))
    return gaps.intersect(wanted)
