"""Timeline arithmetic on XPlane events: lines as numpy arrays, unions of time spans, self times.

An XPlane line stores events as (offset_ps from the line's timestamp_ns, duration_ps, metadata_id);
names live once per plane in `event_metadata`. We turn each line into three int64 arrays once and
select events by metadata id (few distinct names), so a capture of millions of events is scanned in
numpy rather than event by event in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Line:
    name: str
    start: np.ndarray  # absolute ps
    end: np.ndarray
    mid: np.ndarray  # event metadata ids
    origin_ps: int = 0  # the line's timestamp: event offsets are relative to it
    # Only what the analyses look at, kept while the events stream by (the events themselves are not kept):
    stats: dict[int, list] = field(default_factory=dict)  # event index -> its raw stats, for the events asked for
    first_stats: dict[int, list] = field(default_factory=dict)  # metadata id -> raw stats of its first event
    int_stats: dict[str, np.ndarray] = field(default_factory=dict)  # stat name -> value per event (int_stat_values)

    def select(self, ids) -> np.ndarray:
        """Indices of the events whose metadata id is in IDS."""
        if not len(ids) or not len(self.mid):
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(member(self.mid, ids))

    def event_stats(self, index: int) -> list:
        """The XStat messages of event INDEX (kept only for the events `read_line` was asked to keep them for)."""
        from tpuprof.sources.xplane import event_stats

        return event_stats(_Stats(self.stats.get(index, [])))


@dataclass
class _Stats:
    stats: list


# Every time is kept in int64 picoseconds. Within +-2**61 ps (26 days) of the capture's start, any sum or difference
# of two times still fits: numpy would otherwise wrap around silently (a RuntimeWarning and wrong durations).
TIME_LIMIT_PS = 2**61


def read_line(line, keep=None, stats_for=(), int_stats: dict[str, int] | None = None,
              first_stats: bool = False) -> Line:
    """A streamed line (sources.xspace_stream.LineStream) as arrays, read batch by batch.

    keep: metadata ids of the events to keep (None: all); stats_for: ids whose events keep their raw stats;
    int_stats: {name: stat id} of integer stats read for every kept event; first_stats: keep the raw stats of each
    metadata id's first event. Only the arrays and these stats outlive a batch."""
    keep_ids = None if keep is None else set(keep)
    stats_ids = set(stats_for) if len(stats_for) else None
    origin = int(line.timestamp_ns) * 1000
    name = line.label
    if abs(origin) > TIME_LIMIT_PS:
        _out_of_range(name)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    stats: dict[int, list] = {}
    first: dict[int, list] = {}
    ints: dict[str, list[np.ndarray]] = {key: [] for key in (int_stats or {})}
    kept = 0
    for batch in line.event_batches():
        mid = batch.metadata_id
        index = None if keep_ids is None else np.flatnonzero(member(mid, keep_ids))
        offset, duration = batch.times(index)  # only the kept events' times are read
        if index is not None:
            mid = mid[index]
        if not (_within(offset) and _within(duration)):
            _out_of_range(name)
        if int_stats:
            for key, values in batch.int_stats(int_stats, index).items():
                ints[key].append(values)
        if stats_ids is not None and len(mid):
            for i in np.flatnonzero(member(mid, stats_ids)).tolist():
                stats[kept + i] = batch.stats(i if index is None else int(index[i]))
        if first_stats:
            ids, at = np.unique(mid, return_index=True)
            for key, i in zip(ids.tolist(), at.tolist()):
                if key not in first:
                    first[key] = batch.stats(i if index is None else int(index[i]))
        start = offset + origin  # no overflow: each term is within 2**61
        parts.append((start, start + duration, mid))
        kept += len(mid)
        del batch
    start, end, mid = (np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in range(3))
    if not (_within(start) and _within(end)):
        _out_of_range(name)
    return Line(name, start, end, mid, origin, stats, first,
                {key: np.concatenate(values) if values else np.zeros(0, np.int64) for key, values in ints.items()})


# Up to this many values, a lookup in a Python set beats np.isin, which costs about 25 us a call whatever the size
# (a host plane has a hundred lines, most of a few hundred events).
_SET_LOOKUP = 256


def member(values: np.ndarray, ids) -> np.ndarray:
    """np.isin(VALUES, IDS) for integer VALUES and a set (or any collection) of ints IDS."""
    if len(values) <= _SET_LOOKUP:
        ids = ids if isinstance(ids, (set, frozenset, dict)) else set(ids)
        return np.fromiter(map(ids.__contains__, values.tolist()), bool, len(values))
    return np.isin(values, np.fromiter(ids, np.int64, len(ids)))


def distinct(values: np.ndarray) -> list[int]:
    """The sorted distinct values (metadata ids) of an integer array. A short one (most lines of a host plane, often
    empty) goes through a Python set: np.unique costs about 10 us a call whatever the size. Plain np.unique(values)
    imports numpy.ma on its first call to rule out a masked array (20-45 ms of a 0.3 s start); with the counts
    asked for, numpy skips that check."""
    if len(values) <= _SET_LOOKUP:
        return sorted(set(values.tolist()))
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


_CHUNK = 1 << 18


def self_times(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Duration minus the time of directly nested events (events on one line nest like a call stack)."""
    order = np.lexsort((-end, start))
    result = (end - start).astype(np.int64)
    # The walk holds Python ints only for a chunk of events at a time (40 bytes each, against 8 in numpy).
    stack: list[tuple[int, int]] = []  # (index, end) of the enclosing events
    nested = np.zeros(len(start), dtype=np.int64)
    for first in range(0, len(order), _CHUNK):
        chunk = order[first:first + _CHUNK]
        for i, s, e in zip(chunk.tolist(), start[chunk].tolist(), end[chunk].tolist()):
            while stack and stack[-1][1] <= s:
                stack.pop()
            if stack and e <= stack[-1][1]:
                nested[stack[-1][0]] += e - s
            stack.append((i, e))
    return result - nested


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
