"""Read an XSpace (`<host>.xplane.pb`) as a stream: planes -> lines -> batches of events, in bounded memory.

A capture can be gigabytes; parsing it whole holds the file and its parse tree (about 6 bytes of memory per byte of
file). Here the protobuf wire format is walked directly from the file (mmap for a local file, block reads for a
gs:// or other fsspec URL) and only bounded slices are handed to the C++ (upb) protobuf parser:

- XSpace.planes (field 1) are found by their length prefixes, without reading their content;
- a plane's header (id, name, event_metadata, stat_metadata, stats: every field but its lines) is parsed on its own;
- a line's events (XLine.events, field 4) are cut into runs of consecutive records of about `BATCH_BYTES`:
  a run of length-delimited `events` records cut from an XLine is itself a valid serialized XLine, so each run is
  parsed as one (light) XLine message, and dropped before the next.

Messages are the light classes of `xplane.light_xspace_class` (same field numbers as tsl's xplane.proto; events
keep their stats as undecoded bytes: `xplane.event_stats` decodes them). Usage:

    with XSpaceStream(path) as space:
        for plane in space.planes():            # PlaneStream: .name .id .header (metadata maps, stats)
            for line in plane.lines():          # LineStream: .id .name .display_name .timestamp_ns
                for batch in line.batches():    # a light XLine; batch.events in file order
                    offsets, durations, ids = event_arrays(batch)

Field numbers (tsl/profiler/protobuf/xplane.proto): XSpace planes=1; XPlane id=1 name=2 lines=3 event_metadata=4
stat_metadata=5 stats=6; XLine id=1 name=2 timestamp_ns=3 events=4 duration_ps=9 display_id=10 display_name=11.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterator

from tpuprof.errors import UserError

BATCH_BYTES = 4 << 20  # bytes of events parsed at once: about 100,000 events, ~15 MB of parse tree
REMOTE_BLOCK_BYTES = 16 << 20
_PLANES, _LINES, _EVENTS = 1, 3, 4


class CorruptCapture(Exception):
    """The bytes do not follow the protobuf wire format (truncated file, or not a capture)."""


class _LocalBytes:
    """A local file as one read-only buffer (mmap: pages are read on demand and dropped under memory pressure)."""

    def __init__(self, path: str):
        import mmap

        try:
            with open(path, "rb") as handle:
                self.size = _size(handle)
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        except OSError as error:
            raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
        self.view = memoryview(self._map) if self._map is not None else memoryview(b"")

    def slice(self, start: int, end: int):
        return self.view[start:end]

    def byte(self, at: int) -> int:
        return self.view[at]

    def release(self, start: int, end: int) -> None:
        """Drop the mapped pages of [START, END) from this process (they stay in the page cache): a mapped page
        that was read counts in the process's RSS until then, and a walk through a 4 GB file reads them all."""
        import mmap

        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if self._map is not None and last > first and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def close(self) -> None:
        self.view.release()
        if self._map is not None:
            self._map.close()


def _size(handle) -> int:
    import os

    return os.fstat(handle.fileno()).st_size


class _RemoteBytes:
    """A remote file (gs://, any fsspec URL) read in blocks, each within the remote time limit; the last two blocks are
    kept, so a walk that goes forward reads every byte once."""

    def __init__(self, path: str):
        import fsspec

        from tpuprof.sources import remote, xplane

        xplane._quiet_remote_loggers()
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


def _light(name: str):
    from google.protobuf import message_factory

    from tpuprof.sources import xplane

    space = xplane.light_xspace_class()
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

    @property
    def label(self) -> str:
        """The name XProf shows: name, else display name, else the id."""
        return self.name or self.display_name or str(self.id)

    def batches(self, batch_bytes: int = BATCH_BYTES) -> Iterator:
        """The line's events, a light XLine message per run of about BATCH_BYTES of consecutive event records
        (other XLine fields inside a run are parsed too and harmless)."""
        source, start, end = self._source, self._start, self._end
        if end - start <= batch_bytes:
            yield _parse(self._line_class, source.slice(start, end), "line")
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
                yield _parse(self._line_class, source.slice(cut, at), "events")
                source.release(cut, at)
                cut = at
        if at > cut:
            yield _parse(self._line_class, source.slice(cut, at), "events")
            source.release(cut, at)


def _line(source, start: int, end: int, line_class) -> LineStream:
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
                      source, start, end, line_class)


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
            yield _line(self._source, start, end, self._line_class)


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
            self._extents = [(value_at, after) for number, _, value_at, after in
                             _records(self._source, 0, self.size) if number == _PLANES]
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
