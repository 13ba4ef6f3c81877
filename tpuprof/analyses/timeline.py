"""Timeline arithmetic on XPlane events: lines as numpy arrays, unions of time spans, self times.

An XPlane line stores events as (offset_ps from the line's timestamp_ns, duration_ps, metadata_id);
names live once per plane in `event_metadata`. We turn each line into three int64 arrays once and
select events by metadata id (few distinct names), so a capture of millions of events is scanned in
numpy rather than event by event in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np


@dataclass
class Line:
    name: str
    start: np.ndarray  # absolute ps
    end: np.ndarray
    mid: np.ndarray  # event metadata ids
    events: object  # the proto's repeated events, for the rare look at stats
    origin_ps: int = 0  # the line's timestamp: event offsets are relative to it

    def select(self, ids) -> np.ndarray:
        """Indices of the events whose metadata id is in IDS."""
        if not len(ids) or not len(self.mid):
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.isin(self.mid, np.fromiter(ids, np.int64, len(ids))))


_OFFSET, _DURATION, _METADATA = attrgetter("offset_ps"), attrgetter("duration_ps"), attrgetter("metadata_id")
# Every time is kept in int64 picoseconds. Within +-2**61 ps (26 days) of the capture's start, any sum or difference
# of two times still fits: numpy would otherwise wrap around silently (a RuntimeWarning and wrong durations).
TIME_LIMIT_PS = 2**61


def read_line(line) -> Line:
    events = line.events
    n = len(events)
    # map(attrgetter) keeps the per-event loop in C: the one Python-speed step of the whole analysis.
    offset = np.fromiter(map(_OFFSET, events), np.int64, n)
    duration = np.fromiter(map(_DURATION, events), np.int64, n)
    mid = np.fromiter(map(_METADATA, events), np.int64, n)
    origin = int(line.timestamp_ns) * 1000
    name = line.name or line.display_name or str(line.id)
    if abs(origin) > TIME_LIMIT_PS or not (_within(offset) and _within(duration)):
        _out_of_range(name)
    start = offset + origin  # no overflow: each term is within 2**61
    end = start + duration
    if not (_within(start) and _within(end)):
        _out_of_range(name)
    return Line(name, start, end, mid, events, origin)


def distinct(values: np.ndarray) -> list[int]:
    """The sorted distinct values (metadata ids) of an integer array. Plain np.unique(values) imports numpy.ma
    on its first call to rule out a masked array (20-45 ms of a 0.3 s start); with the counts asked for, numpy
    skips that check."""
    return np.unique(values, return_counts=True)[0].tolist()


def _within(values: np.ndarray) -> bool:
    return not len(values) or (int(values.min()) >= -TIME_LIMIT_PS and int(values.max()) <= TIME_LIMIT_PS)


def _out_of_range(line_name: str) -> None:
    from tpuprof.errors import UserError

    raise UserError(f"the capture's line {line_name[:80]!r} has event times more than 26 days from its start "
                    "(int64 picoseconds would overflow): the xplane.pb is damaged or not normalised.")


class Spans:
    """A union of [start, end) spans; `measure(a, b)` is how much of [a, b) it covers (vectorised)."""

    def __init__(self, starts, ends):
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        if len(starts):
            # Merge overlaps: a span starts a new group when it begins after every earlier end.
            running_end = np.maximum.accumulate(ends)
            new_group = np.empty(len(starts), dtype=bool)
            new_group[0] = True
            new_group[1:] = starts[1:] > running_end[:-1]
            group = np.cumsum(new_group) - 1
            merged_starts = starts[new_group]
            merged_ends = np.zeros(len(merged_starts), dtype=np.int64)
            np.maximum.at(merged_ends, group, ends)
            starts, ends = merged_starts, merged_ends
        self.starts, self.ends = starts, ends
        lengths = ends - starts
        self._before = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    @classmethod
    def empty(cls) -> "Spans":
        return cls([], [])

    def __or__(self, other: "Spans") -> "Spans":
        return Spans(np.concatenate([self.starts, other.starts]), np.concatenate([self.ends, other.ends]))

    def intersect(self, other: "Spans") -> "Spans":
        """Where both unions cover: a sweep over both sets of merged boundaries (depth 2 = both)."""
        if not len(self.starts) or not len(other.starts):
            return Spans.empty()
        points = np.concatenate([self.starts, self.ends, other.starts, other.ends])
        steps = np.concatenate([np.ones(len(self.starts)), -np.ones(len(self.ends)),
                                np.ones(len(other.starts)), -np.ones(len(other.ends))]).astype(np.int64)
        order = np.lexsort((steps, points))  # at equal times, ends (-1) before starts: touching spans do not overlap
        points, depth = points[order], np.cumsum(steps[order])
        inside = depth == 2
        return Spans(points[:-1][inside[:-1]], points[1:][inside[:-1]])

    @property
    def total(self) -> int:
        return int(self._before[-1])

    def _covered_until(self, t: np.ndarray) -> np.ndarray:
        index = np.searchsorted(self.starts, t, side="right") - 1
        safe = np.maximum(index, 0)
        inside = np.minimum(t - self.starts[safe], self.ends[safe] - self.starts[safe]) if len(self.starts) else 0
        value = self._before[safe] + inside
        return np.where(index >= 0, value, 0)

    def measure(self, a, b) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        if not len(self.starts):
            return np.zeros(np.shape(a), dtype=np.int64)
        return self._covered_until(b) - self._covered_until(a)


def self_times(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Duration minus the time of directly nested events (events on one line nest like a call stack)."""
    order = np.lexsort((-end, start))
    result = (end - start).astype(np.int64)
    stack: list[int] = []
    s = start.tolist()
    e = end.tolist()
    for i in order.tolist():
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack and e[i] <= e[stack[-1]]:
            result[stack[-1]] -= e[i] - s[i]
        stack.append(i)
    return result


def top_level(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of the events not nested inside an earlier event of the same selection."""
    if not len(start):
        return np.zeros(0, dtype=bool)
    order = np.lexsort((-end, start))
    ends_sorted = end[order]
    running = np.maximum.accumulate(ends_sorted)
    outer = np.ones(len(order), dtype=bool)
    outer[1:] = ends_sorted[1:] > running[:-1]
    mask = np.zeros(len(start), dtype=bool)
    mask[order[outer]] = True
    return mask
