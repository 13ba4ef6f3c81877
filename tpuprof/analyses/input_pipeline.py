"""tf.data stages from the iterator events (`Iterator::Root::Prefetch::BatchV2::...::Map`).

Each stage's events nest on the thread that runs them (a stage calls its input's GetNext), so the
time a stage spends itself is its duration minus its nested stages'. Python inside a map
(`tf.py_function`) runs on tf.data's private threads as `EagerPyFunc` events; we credit that time to
the map stages that were running meanwhile.
"""

from __future__ import annotations

import re

import numpy as np

from tpuprof.analyses.timeline import Line, Spans, distinct, self_times
from tpuprof.models.profile import Stage

ITERATOR = "Iterator::"
PY_FUNCTION = re.compile(r"^EagerPyFunc|^PyFunc")
# Stages whose own time is waiting for the stages below them, never the bottleneck itself.
WAITING_KINDS = {"Root", "Prefetch", "PrefetchDataset", "ModelDataset", "MaxIntraOpParallelism",
                 "PrivateThreadPool", "Options"}
FILE_KINDS = re.compile(r"TFRecord|TextLine|FixedLengthRecord|SSTable|ArrayRecord|Interleave|FlatMap")


def stage_kind(name: str) -> str:
    return re.sub(r"\[\d+\]$", "", name.rsplit("::", 1)[-1])


def stages(plane, lines: list[Line]) -> list[Stage]:
    iterator_ids = {k for k, m in plane.event_metadata.items() if m.name.startswith(ITERATOR)}
    py_ids = {k for k, m in plane.event_metadata.items() if PY_FUNCTION.match(m.name)}
    if not iterator_ids:
        return []
    py_parts = []
    for line in lines:
        idx = line.select(py_ids)
        if len(idx):
            py_parts.append((line.start[idx], line.end[idx]))
    py_spans = Spans(np.concatenate([p[0] for p in py_parts]), np.concatenate([p[1] for p in py_parts])) \
        if py_parts else Spans.empty()

    totals: dict[int, list[int]] = {}  # metadata id -> [count, total, self, python]
    for line in lines:
        idx = line.select(iterator_ids)
        if not len(idx):
            continue
        start, end, mid = line.start[idx], line.end[idx], line.mid[idx]
        own = self_times(start, end)
        python = py_spans.measure(start, end)
        for key in distinct(mid):
            mask = mid == key
            entry = totals.setdefault(key, [0, 0, 0, 0])
            entry[0] += int(mask.sum())
            entry[1] += int((end[mask] - start[mask]).sum())
            entry[2] += int(own[mask].sum())
            entry[3] += int(python[mask].sum())
    result = []
    for key, (count, total, own, python) in totals.items():
        name = plane.event_metadata[key].name
        kind = stage_kind(name)
        result.append(Stage(name=name, kind=kind, count=count, total_ps=total, self_ps=own,
                            py_function_ps=python if "Map" in kind else 0))
    result.sort(key=lambda s: s.self_ps, reverse=True)
    return result


def without_epochs(name: str) -> str:
    """`...ForeverRepeat[24]::ParallelMapV2` -> `...ForeverRepeat::ParallelMapV2`: one stage over all epochs."""
    return re.sub(r"\[\d+\]", "", name)


def merged(all_stages: list[Stage]) -> list[Stage]:
    """Stages summed over the `[n]` indices that `repeat()` epochs and interleave inputs add to iterator
    names, so a map that runs over several epochs in the capture counts once, whole; largest own time first."""
    result: dict[str, Stage] = {}
    for stage in all_stages:
        name = without_epochs(stage.name)
        into = result.setdefault(name, Stage(name, stage.kind, 0, 0, 0, 0))
        into.count += stage.count
        into.total_ps += stage.total_ps
        into.self_ps += stage.self_ps
        into.py_function_ps += stage.py_function_ps
    return sorted(result.values(), key=lambda s: s.self_ps, reverse=True)


def bottleneck(all_stages: list[Stage]) -> Stage | None:
    """The stage that spends the most time itself (waiting stages such as Prefetch excluded)."""
    candidates = [s for s in merged(all_stages) if s.kind not in WAITING_KINDS and s.self_ps > 0]
    return candidates[0] if candidates else None


def producer_pace(all_stages: list[Stage]) -> tuple[Stage, float] | None:
    """The stage the outermost `prefetch` fills its buffer from, and the time it took per batch delivered, in ms
    (its time over the capture / the Root's calls, one per batch). A prefetch's thread gets one element at a time:
    the steps cannot take batches faster than that pace unless the pipeline gets faster. None without a prefetch
    (the pipeline then runs on the training thread, where its time is input wait already)."""
    stages = merged(all_stages)
    batches = sum(s.count for s in stages if s.kind == "Root")
    prefetches = [s for s in stages if s.kind in ("Prefetch", "PrefetchDataset")]
    if not batches or not prefetches:
        return None
    outer = min(prefetches, key=lambda s: s.name.count("::"))
    depth = outer.name.count("::") + 1
    children = [s for s in stages if s.name.startswith(outer.name + "::") and s.name.count("::") == depth]
    if len(children) != 1 or not children[0].total_ps:
        return None
    return children[0], children[0].total_ps / 1e9 / batches
