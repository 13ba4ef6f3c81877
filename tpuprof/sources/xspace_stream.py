"""Read an XSpace (`<host>.xplane.pb`) as a stream: planes -> lines -> batches of events, in bounded memory.

A capture can be gigabytes; parsing it whole holds the file and its parse tree (about 6 bytes of memory per byte of
file). Here the protobuf wire format is walked directly from the file (mmap for a local file, block reads for a
gs:// or other fsspec URL) and only bounded slices are handed to the C++ (upb) protobuf parser:

- XSpace.planes (field 1) are found by their length prefixes, without reading their content;
- a plane's header (id, name, event_metadata, stat_metadata, stats: every field but its lines) is parsed on its own;
- a line's events (XLine.events, field 4) are cut into runs of consecutive records of about `BATCH_BYTES`:
  a run of length-delimited `events` records cut from an XLine is itself a valid serialized XLine, so each run is
  parsed as one XLine message, and dropped before the next. `event_batches` parses a large run as a line of
  serialized events (`repeated bytes`) and decodes their fields with numpy (EventBatch); `batches` gives light
  XEvent messages.

Pages read through the mmap are let go as the walk passes them (they would count in the process's RSS). Messages
are the light classes of `light_xspace_class` below (same field numbers as tsl's xplane.proto; events keep their
stats as undecoded bytes: `xplane.event_stats` decodes them). Usage (a trace exporter, an analysis):

    with XSpaceStream(path) as space:           # a local path, file://, gs:// or any fsspec URL, or bytes
        for plane in space.planes():            # PlaneStream: .name .id .header (event_metadata, stat_metadata, stats)
            names = {key: meta.name for key, meta in plane.header.event_metadata.items()}
            for line in plane.lines():          # LineStream: .id .label .timestamp_ns .has_events
                for batch in line.event_batches():   # EventBatch: int64 arrays, in file order
                    batch.offset_ps, batch.duration_ps, batch.metadata_id   # + batch.stats(i), batch.int_stats({...})

`space.plane_names()` reads only the planes' names; `space.plane(i)` reads plane I again (a second pass). A
malformed record raises CorruptCapture from any of these (xplane.open_stream and xplane.readable turn it and an
unreadable file into the one-sentence UserError).

Field numbers (tsl/profiler/protobuf/xplane.proto): XSpace planes=1; XPlane id=1 name=2 lines=3 event_metadata=4
stat_metadata=5 stats=6; XLine id=1 name=2 timestamp_ns=3 events=4 duration_ps=9 display_id=10 display_name=11.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import Iterator

from tpuprof.errors import UserError

BATCH_BYTES = 4 << 20  # bytes of events parsed at once: about 100,000 events, ~15 MB of parse tree
SMALL_RUN_BYTES = 64 << 10  # below it, a run's events are read as messages rather than decoded in numpy
REMOTE_BLOCK_BYTES = 16 << 20
_PLANES, _LINES, _EVENTS = 1, 3, 4
_FAULT_AROUND_BYTES = 64 << 10  # Linux's default fault_around_bytes
_RELEASE_ALL_BYTES = 64 << 20


class CorruptCapture(Exception):
    """The bytes do not follow the protobuf wire format (truncated file, or not a capture)."""


class _LocalBytes:
    """A local file as one read-only buffer (mmap: pages are read on demand; `release` lets them go)."""

    def __init__(self, path: str):
        import mmap

        try:
            with open(path, "rb") as handle:
                self.size = _size(handle)
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        except OSError as error:
            raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
        self.view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._released = 0

    def slice(self, start: int, end: int):
        return self.view[start:end]

    def byte(self, at: int) -> int:
        return self.view[at]

    def release(self, start: int, end: int) -> None:
        """Drop the mapped pages of [START, END) from this process (they stay in the page cache): a mapped page
        that was read counts in the process's RSS until then, and a walk through a 4 GB file reads them all."""
        import mmap

        if self._map is None or not hasattr(self._map, "madvise"):
            return
        # A read of one page maps more around it (the kernel's 64 KiB fault-around window, or a whole large folio of
        # the page cache), beyond START and END: the range is rounded outwards, and every RELEASE_ALL_BYTES of
        # released ranges the whole file is let go. A page dropped while still in use is read again, from the
        # page cache.
        self._released += end - start
        if self._released >= _RELEASE_ALL_BYTES:
            self._released = 0
            first, last = 0, self.size
        else:
            window = max(mmap.PAGESIZE, _FAULT_AROUND_BYTES)
            first, last = start // window * window, min(-(-end // window) * window, self.size)
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def close(self) -> None:
        try:
            self.view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass  # a slice is still referenced (an error's traceback): the mapping goes with the last of them


def _size(handle) -> int:
    import os

    return os.fstat(handle.fileno()).st_size


class _RemoteBytes:
    """A remote file (gs://, any fsspec URL) read in blocks, each within the remote time limit; the last two blocks are
    kept, so a walk that goes forward reads every byte once."""

    def __init__(self, path: str):
        import fsspec

        from tpuprof.sources import remote

        remote.quiet_loggers()
        self.path = path
        try:
            self._handle = remote.call(path, "opening the capture", fsspec.open(path, "rb").open)
            self.size = int(remote.call(path, "opening the capture", lambda: self._handle.size))
        except (OSError, ValueError) as error:
            raise UserError(f"cannot read {path}: {_first_line(error)}.") from None
        self._blocks: dict[int, bytes] = {}

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is None:
            from tpuprof.sources import remote

            def read() -> bytes:
                self._handle.seek(index * REMOTE_BLOCK_BYTES)
                return self._handle.read(REMOTE_BLOCK_BYTES)

            try:
                block = remote.call(self.path, "reading the capture", read)
            except (OSError, ValueError) as error:
                raise UserError(f"cannot read {self.path}: {_first_line(error)}.") from None
            while len(self._blocks) >= 2:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[index] = block
        return block

    def slice(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        first, last = start // REMOTE_BLOCK_BYTES, max(end - 1, start) // REMOTE_BLOCK_BYTES
        if first == last:
            base = first * REMOTE_BLOCK_BYTES
            return self._block(first)[start - base:end - base]
        parts = [self._block(i) for i in range(first, last + 1)]
        base = first * REMOTE_BLOCK_BYTES
        return b"".join(parts)[start - base:end - base]

    def byte(self, at: int) -> int:
        return self._block(at // REMOTE_BLOCK_BYTES)[at % REMOTE_BLOCK_BYTES]

    def release(self, start: int, end: int) -> None:
        pass  # only the last two blocks are held

    def close(self) -> None:
        self._handle.close()
        self._blocks.clear()


class _BytesSource:
    """Bytes already in memory (tests, small captures built in memory)."""

    def __init__(self, data: bytes):
        self.view = memoryview(data)
        self.size = len(data)

    def slice(self, start: int, end: int):
        return self.view[start:end]

    def byte(self, at: int) -> int:
        return self.view[at]

    def release(self, start: int, end: int) -> None:
        pass

    def close(self) -> None:
        pass


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0][:300] if text else type(error).__name__


# ----------------------------------------------------------------------------------------------------------------
# The wire format: varints and field records.


def _varint(source, at: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at AT."""
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise CorruptCapture
        byte = source.byte(at)
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _records(source, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, record start, value start, value end) of each field in [START, END); varint and fixed fields
    have their bytes as value. Raises CorruptCapture on a record that runs past END."""
    at = start
    while at < end:
        key, value_at = _varint(source, at, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, after = _varint(source, value_at, end)
        elif wire == 2:
            length, value_at = _varint(source, value_at, end)
            after = value_at + length
        elif wire == 1:
            after = value_at + 8
        elif wire == 5:
            after = value_at + 4
        else:  # groups (3, 4) and 6, 7 are not in xplane.proto
            raise CorruptCapture
        if after > end or number == 0:
            raise CorruptCapture
        yield number, at, value_at, after
        at = after


def _parse(message_class, data, what: str):
    from google.protobuf.message import DecodeError

    message = message_class()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise CorruptCapture(what) from None
    return message


@lru_cache(maxsize=None)
def _light(name: str):
    space = light_xspace_class()  # first: through tpuprof.protos, it defers protobuf's pure-Python messages
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(space.DESCRIPTOR.file.pool.FindMessageTypeByName(
        f"tpuprof.xplane_light.{name}"))


# ----------------------------------------------------------------------------------------------------------------
# Planes, lines, batches.


@dataclass
class LineStream:
    """One XLine: its header now, its events on demand (`batches`)."""

    id: int
    name: str
    display_name: str
    timestamp_ns: int
    has_events: bool
    _source: object = field(repr=False)
    _start: int = field(repr=False)  # the line's content in the file
    _end: int = field(repr=False)
    _line_class: object = field(repr=False)
    _records_class: object = field(repr=False)

    @property
    def label(self) -> str:
        """The name XProf shows: name, else display name, else the id."""
        return self.name or self.display_name or str(self.id)

    def batches(self, batch_bytes: int = BATCH_BYTES) -> Iterator:
        """The line's events, a light XLine message per run of about BATCH_BYTES of consecutive event records
        (other XLine fields inside a run are parsed too and harmless)."""
        for start, end in self._runs(batch_bytes):
            yield _parse(self._line_class, self._source.slice(start, end), "events")

    def event_batches(self, batch_bytes: int = BATCH_BYTES) -> Iterator["EventBatch"]:
        """The line's events as columns (EventBatch), run by run: a large run is decoded in numpy (several times
        faster than reading a message per event), a small one through messages (numpy's fixed cost per call
        would dominate)."""
        for start, end in self._runs(batch_bytes):
            data = self._source.slice(start, end)
            if end - start >= SMALL_RUN_BYTES:
                yield EventBatch(_parse(self._records_class, data, "events").events)
            else:
                yield EventBatch.from_messages(_parse(self._line_class, data, "events").events)

    def _runs(self, batch_bytes: int) -> Iterator[tuple[int, int]]:
        """(start, end) of runs of whole records of the line, about BATCH_BYTES each; each run's pages are let go
        once the caller has parsed it."""
        source, start, end = self._source, self._start, self._end
        if end - start <= batch_bytes:
            yield start, end
            source.release(start, end)
            return
        cut = start
        at = start
        while at < end:
            # Events (tag 0x22, one-byte length below 128) are almost all records: skip them without a call.
            if source.byte(at) == 0x22:
                length = source.byte(at + 1) if at + 1 < end else 0x80
                if length < 0x80:
                    at += 2 + length
                else:
                    length, value_at = _varint(source, at + 1, end)
                    at = value_at + length
            else:
                for _, _, _, after in _records(source, at, end):
                    at = after
                    break
            if at > end:
                raise CorruptCapture("line")
            if at - cut >= batch_bytes:
                yield cut, at
                source.release(cut, at)
                cut = at
        if at > cut:
            yield cut, at
            source.release(cut, at)


def _line(source, start: int, end: int, line_class, records_class) -> LineStream:
    """A line's header fields; the walk stops at its first event when it has a name (C++ writes fields in number
    order: id, name, timestamp_ns, events, ..., display_name), else goes on to find its display name."""
    header, has_events, named = [], False, False
    for number, record_at, value_at, after in _records(source, start, end):
        if number == _EVENTS:
            has_events = True
            if named:
                break
            continue
        header.append(bytes(source.slice(record_at, after)))
        named = named or (number == 2 and after > value_at)
    message = _parse(line_class, b"".join(header), "line header")
    return LineStream(message.id, message.name, message.display_name, message.timestamp_ns, has_events,
                      source, start, end, line_class, records_class)


@dataclass
class PlaneStream:
    """One XPlane: its header (a light XPlane message without lines: id, name, event_metadata, stat_metadata,
    stats) and its lines on demand."""

    header: object
    _source: object = field(repr=False)
    _lines: list = field(repr=False)  # (start, end) of each line's content
    _line_class: object = field(repr=False)

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def id(self) -> int:
        return self.header.id

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def lines(self) -> Iterator[LineStream]:
        for start, end in self._lines:
            line = _line(self._source, start, end, self._line_class, _light("XLineRecords"))
            self._source.release(start, end)  # the header's pages: a line that is not read would keep them
            yield line


def _plane(source, start: int, end: int, plane_class, line_class) -> PlaneStream:
    lines, header = [], []
    for number, record_at, value_at, after in _records(source, start, end):
        if number == _LINES:
            lines.append((value_at, after))
        else:
            header.append(bytes(source.slice(record_at, after)))
    return PlaneStream(_parse(plane_class, b"".join(header), "plane"), source, lines, line_class)


class XSpaceStream:
    """An XSpace file (local path, file:// or any fsspec URL such as gs://) or bytes, read plane by plane.

    Raises UserError when the file cannot be read; CorruptCapture (from any iterator) when its bytes are not a
    well-formed XSpace: callers turn it into their one-sentence error (xplane.open_stream does)."""

    def __init__(self, path_or_bytes):
        from tpuprof.sources import remote

        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            self.path = "<bytes>"
            self._source = _BytesSource(bytes(path_or_bytes))
        else:
            self.path = str(path_or_bytes)
            self._source = _RemoteBytes(self.path) if remote.is_remote(self.path) else \
                _LocalBytes(self.path.removeprefix("file://"))
        self.size = self._source.size
        self._plane_class, self._line_class = _light("XPlane"), _light("XLine")
        self._extents: list[tuple[int, int]] | None = None

    def plane_extents(self) -> list[tuple[int, int]]:
        """(start, end) of each plane's content: walks the file's top level once (a few reads per plane)."""
        if self._extents is None:
            extents, released = [], 0
            for number, _, value_at, after in _records(self._source, 0, self.size):
                if number == _PLANES:
                    extents.append((value_at, after))
                if number == _PLANES and len(extents) % 64 == 0:
                    # Each page read maps its neighbours too (the kernel's fault-around): let them go as we pass.
                    self._source.release(released, after)
                    released = after
            self._source.release(released, self.size)
            self._extents = extents
        return self._extents

    def planes(self) -> Iterator[PlaneStream]:
        for index in range(len(self.plane_extents())):
            yield self.plane(index)

    def plane(self, index: int) -> PlaneStream:
        """The INDEX-th plane (in file order), read again from the file: a caller can drop a plane and come back."""
        start, end = self.plane_extents()[index]
        plane = _plane(self._source, start, end, self._plane_class, self._line_class)
        self._source.release(start, end)
        return plane

    def plane_names(self) -> list[str]:
        """Every plane's name, reading only the start of each plane (its name is field 2, before its lines)."""
        names = []
        for start, end in self.plane_extents():
            name = ""
            for number, _, value_at, after in _records(self._source, start, end):
                if number == 2:
                    name = bytes(self._source.slice(value_at, after)).decode("utf-8", "replace")
                    break
                if number > 2:
                    break
            self._source.release(start, end)
            names.append(name)
        return names

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> "XSpaceStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_OFFSET, _DURATION, _METADATA = attrgetter("offset_ps"), attrgetter("duration_ps"), attrgetter("metadata_id")


def event_arrays(batch):
    """(offset_ps, duration_ps, metadata_id) of a batch's events as int64 numpy arrays (the loop stays in C)."""
    import numpy as np

    events = batch.events
    n = len(events)
    return (np.fromiter(map(_OFFSET, events), np.int64, n), np.fromiter(map(_DURATION, events), np.int64, n),
            np.fromiter(map(_METADATA, events), np.int64, n))


def _times(events):
    """(offset_ps, duration_ps) of light XEvent messages as int64 numpy arrays."""
    import numpy as np

    n = len(events)
    return np.fromiter(map(_OFFSET, events), np.int64, n), np.fromiter(map(_DURATION, events), np.int64, n)


_PAD = 21  # zero bytes after a buffer decoded in numpy: a varint read at its end stays inside
MISSING = -(2**63)  # int_stats_at: the event has no such stat


class EventBatch:
    """A run of one line's events as columns: `offset_ps`, `duration_ps`, `metadata_id` (int64 numpy arrays, in file
    order), decoded from the serialized events with numpy rather than one Python object per event.

    `stats(i)` is event I's stats as raw XStat bytes (xplane.event_stats decodes them); `int_stats({name: stat id})`
    reads integer stats of every event at once (xplane.int_stat_values)."""

    def __init__(self, records):
        import numpy as np

        self._messages = None
        n = self.size = len(records)
        lengths = np.fromiter(map(len, records), np.int64, n)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        self._buf = buf = np.frombuffer(b"".join(records) + bytes(_PAD), dtype=np.uint8)
        self.metadata_id, self._offset, self._duration = (np.zeros(n, np.int64) for _ in range(3))
        columns = {1: self.metadata_id, 2: self._offset, 3: self._duration}
        stat_owner, stat_start, stat_end = [], [], []
        index, at = np.flatnonzero(lengths), starts[lengths > 0]
        # One field of every unfinished event per round: as many rounds as the longest event has fields.
        while len(index):
            tag, tag_end, ok = _varints(buf, at)
            number, wire = tag >> np.uint64(3), tag & np.uint64(7)
            value, value_end, ok_value = _varints(buf, tag_end)
            length = np.minimum(value, np.uint64(2**40)).astype(np.int64)
            after = np.select([wire == 0, wire == 2, wire == 1, wire == 5],
                              [value_end, value_end + length, tag_end + 8, tag_end + 4], -1)
            limit = ends[index]
            if not (ok.all() and (number > 0).all() and (after >= 0).all() and (after <= limit).all()
                    and ok_value[(wire == 0) | (wire == 2)].all()):
                raise CorruptCapture("event")
            varint = wire == 0
            for key, column in columns.items():
                chosen = varint & (number == key)
                if chosen.any():
                    column[index[chosen]] = value[chosen].view(np.int64)
            chosen = (wire == 2) & (number == 4)
            if chosen.any():
                stat_owner.append(index[chosen])
                stat_start.append(value_end[chosen])
                stat_end.append(after[chosen])
            going = after < limit
            index, at = index[going], after[going]
        self._starts = starts
        join = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
        owner, start, end = join(stat_owner), join(stat_start), join(stat_end)
        order = np.argsort(owner, kind="stable")  # stats of one event in file order, events in order
        self._stat_owner, self._stat_start, self._stat_end = owner[order], start[order], end[order]

    @classmethod
    def from_messages(cls, events) -> "EventBatch":
        """The same columns from light XEvent messages (a repeated field of a light XLine)."""
        import numpy as np

        batch = cls.__new__(cls)
        # Held in a list, each event's Python object is made once, not once per column (a fifth faster).
        batch._messages = events = list(events)
        batch.size = n = len(events)
        batch.metadata_id = np.fromiter(map(_METADATA, events), np.int64, n)
        batch._offset = batch._duration = None  # read when asked for (`times`): most events of a host line are not
        return batch

    @property
    def offset_ps(self):
        if self._offset is None:
            self._offset, self._duration = _times(self._messages)
        return self._offset

    @property
    def duration_ps(self):
        if self._duration is None:
            self._offset, self._duration = _times(self._messages)
        return self._duration

    def times(self, index=None):
        """(offset_ps, duration_ps) of the events at INDEX (every event when None). A batch of messages reads the
        times of those events only: on a host plane, where the analyses keep about one event in 80, most are
        never read."""
        if index is None:
            return self.offset_ps, self.duration_ps
        if self._offset is None:
            return _times([self._messages[i] for i in index.tolist()])
        return self._offset[index], self._duration[index]

    def __len__(self) -> int:
        return self.size

    def stats(self, index: int) -> list[bytes]:
        """Event INDEX's stats, each a serialized XStat (as the light XEvent keeps them)."""
        import numpy as np

        if self._messages is not None:
            return list(self._messages[index].stats)

        first, last = np.searchsorted(self._stat_owner, [index, index + 1])
        data = self._buf
        return [data[a:b].tobytes() for a, b in zip(self._stat_start[first:last].tolist(),
                                                      self._stat_end[first:last].tolist())]

    def int_stats(self, stat_ids: dict[str, int], index=None) -> dict:
        """{name: int64 array per event (of INDEX, if given), xplane.MISSING where an event lacks it}."""
        import numpy as np

        if self._messages is not None:
            events = self._messages
            return int_stats_of(events if index is None else [events[i] for i in index.tolist()], stat_ids)
        owner, start, end = self._stat_owner, self._stat_start, self._stat_end
        n = self.size
        if index is not None:
            position = np.full(self.size, -1, np.int64)
            position[index] = np.arange(len(index))
            mine = position[owner] >= 0
            owner, start, end, n = position[owner[mine]], start[mine], end[mine], len(index)
        return int_stats_at(self._buf, start, end - start, owner, n, stat_ids)


def _varints(buf, positions):
    """Protobuf varints at POSITIONS of the uint8 array BUF: (values as uint64, positions after them, whether each
    ended within 10 bytes)."""
    import numpy as np

    values = np.zeros(len(positions), dtype=np.uint64)
    lengths = np.zeros(len(positions), dtype=np.int64)
    going = np.ones(len(positions), dtype=bool)
    for k in range(10):
        byte = buf[positions + k].astype(np.uint64)
        values |= np.where(going, (byte & np.uint64(0x7F)) << np.uint64(7 * k), np.uint64(0))
        lengths += going
        going &= (byte & np.uint64(0x80)) != 0
        if not going.any():
            break
    return values, positions + lengths, ~going


def int_stats_of(events, stat_ids: dict[str, int]) -> dict[str, "object"]:
    """int_stats_at for light XEvent messages (stats kept as serialized XStats): their stats joined into one buffer."""
    import numpy as np
    from itertools import chain

    n = len(events)
    per_event = [event.stats for event in events]
    counts = np.fromiter(map(len, per_event), np.int64, n)
    stats = list(chain.from_iterable(per_event))
    lengths = np.fromiter(map(len, stats), np.int64, len(stats))
    starts = np.cumsum(lengths) - lengths
    buf = np.frombuffer(b"".join(stats) + bytes(_PAD), dtype=np.uint8)
    return int_stats_at(buf, starts, lengths, np.repeat(np.arange(n), counts), n, stat_ids)


def int_stats_at(buf, starts, lengths, owner, n: int, stat_ids: dict[str, int]) -> dict[str, "object"]:
    """int_stat_values from serialized XStats lying in the uint8 array BUF (padded with 21 zero bytes) at STARTS,
    LENGTHS, each stat of event OWNER (of N events)."""
    import numpy as np

    result = {name: np.full(n, MISSING, dtype=np.int64) for name in stat_ids}
    if not len(starts):
        return result
    # Field 1 (metadata_id, tag 0x08) comes first; proto3 omits it when 0 (then the stat has no id we want).
    has_id = buf[starts] == 0x08
    ids, value_at, _ = _varints(buf, starts + 1)
    ids = np.where(has_id, ids, 0).astype(np.int64)
    tag = np.where(value_at < starts + lengths, buf[np.minimum(value_at, len(buf) - 1)], 0)
    values, _, _ = _varints(buf, value_at + 1)
    integer = np.isin(tag, (0x18, 0x20, 0x38))  # uint64_value, int64_value, ref_value
    # A stat with an id and no value field holds 0 (proto3 omits defaults).
    values = np.where(integer, values, 0).view(np.int64)
    for name, key in stat_ids.items():
        mask = has_id & (ids == key) & (integer | (tag == 0))
        result[name][owner[mask]] = values[mask]
    return result


@lru_cache(maxsize=None)
def light_xspace_class():
    """An XSpace class that reads what the analyses need, and keeps each event's stats undecoded.

    Same field numbers as tsl's xplane.proto, so it reads the same bytes; events keep only their
    metadata id, offset and duration, and their stats as raw bytes (decode one with `event_stats`).
    Parsing skips building millions of XStat messages: on a TF capture about 5x faster.
    """
    from tpuprof.protos import xplane_pb2  # first: it defers protobuf's pure-Python messages

    from google.protobuf import descriptor_pb2, message_factory  # noqa: I001

    real = xplane_pb2().DESCRIPTOR
    pool = real.pool
    package = "tpuprof.xplane_light"
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.XSpace"))
    except KeyError:
        pass
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(name="tpuprof/xplane_light.proto", package=package, syntax="proto3")
    proto.dependency.append(real.name)

    def message(name, fields, into=proto.message_type):
        result = into.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = result.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
        return result

    message("XEvent", [("metadata_id", 1, field.TYPE_INT64, optional, None),
                       ("offset_ps", 2, field.TYPE_INT64, optional, None),
                       ("duration_ps", 3, field.TYPE_INT64, optional, None),
                       ("stats", 4, field.TYPE_BYTES, repeated, None)])
    message("XLine", [("id", 1, field.TYPE_INT64, optional, None),
                      ("name", 2, field.TYPE_STRING, optional, None),
                      ("display_name", 11, field.TYPE_STRING, optional, None),
                      ("timestamp_ns", 3, field.TYPE_INT64, optional, None),
                      ("events", 4, field.TYPE_MESSAGE, repeated, f".{package}.XEvent")])
    # The same line with each event left as its serialized bytes: xspace_stream decodes them in numpy.
    message("XLineRecords", [("id", 1, field.TYPE_INT64, optional, None),
                             ("name", 2, field.TYPE_STRING, optional, None),
                             ("display_name", 11, field.TYPE_STRING, optional, None),
                             ("timestamp_ns", 3, field.TYPE_INT64, optional, None),
                             ("events", 4, field.TYPE_BYTES, repeated, None)])
    plane = message("XPlane", [("id", 1, field.TYPE_INT64, optional, None),
                               ("name", 2, field.TYPE_STRING, optional, None),
                               ("lines", 3, field.TYPE_MESSAGE, repeated, f".{package}.XLine"),
                               ("stats", 6, field.TYPE_MESSAGE, repeated, f".{real.package}.XStat")])
    for field_name, number, value_type in (("event_metadata", 4, "XEventMetadata"),
                                           ("stat_metadata", 5, "XStatMetadata")):
        entry_name = "".join(part.title() for part in field_name.split("_")) + "Entry"
        entry = message(entry_name, [("key", 1, field.TYPE_INT64, optional, None),
                                     ("value", 2, field.TYPE_MESSAGE, optional, f".{real.package}.{value_type}")],
                        into=plane.nested_type)
        entry.options.map_entry = True
        plane.field.add(name=field_name, number=number, type=field.TYPE_MESSAGE, label=repeated,
                        type_name=f".{package}.XPlane.{entry_name}")
    message("XSpace", [("planes", 1, field.TYPE_MESSAGE, repeated, f".{package}.XPlane"),
                       ("errors", 2, field.TYPE_STRING, repeated, None),
                       ("warnings", 3, field.TYPE_STRING, repeated, None),
                       ("hostnames", 4, field.TYPE_STRING, repeated, None)])
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.XSpace"))
