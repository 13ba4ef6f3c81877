"""A Perfetto trace (protobuf TracePacket format) written packet by packet, with Perfetto's own protos.

The file is a `perfetto.protos.Trace`: a sequence of `packet` fields (field 1, length-delimited), so each
TracePacket is serialized and appended as soon as it is made; nothing but the current packet is held. Tracks:
a process per host plane or TPU core, a thread track per host thread, child tracks per device line, counter tracks.
Slices are a BEGIN and an END TrackEvent on their track; the caller emits them properly nested per track (see
`Lanes`), in time order.
"""

from __future__ import annotations

SEQUENCE_ID = 1  # one writer, one packet sequence
_TRACE_PACKET_TAG = b"\x0a"  # Trace.packet: field 1, wire type 2


def protos():
    """perfetto_trace_pb2 (TracePacket, TrackEvent, TrackDescriptor...), imported only when a trace is written."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Writer:
    """Appends TracePackets to a binary file object."""

    def __init__(self, handle):
        self.pb = protos()
        self._handle = handle
        self._next_uuid = 1
        self.packets = 0
        first = self.pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID)
        first.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self._write(first)

    def _write(self, packet) -> None:
        data = packet.SerializeToString()
        self._handle.write(_TRACE_PACKET_TAG + _varint(len(data)) + data)
        self.packets += 1

    def _uuid(self) -> int:
        self._next_uuid += 1
        return self._next_uuid

    def _descriptor(self, **fields) -> int:
        uuid = self._uuid()
        packet = self.pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID)
        packet.track_descriptor.CopyFrom(self.pb.TrackDescriptor(uuid=uuid, **fields))
        self._write(packet)
        return uuid

    def process(self, pid: int, name: str) -> int:
        return self._descriptor(process=self.pb.ProcessDescriptor(pid=pid, process_name=name))

    def thread(self, pid: int, tid: int, name: str) -> int:
        return self._descriptor(thread=self.pb.ThreadDescriptor(pid=pid, tid=tid, thread_name=name))

    def track(self, parent: int, name: str, rank: int = 0) -> int:
        return self._descriptor(parent_uuid=parent, name=name, sibling_order_rank=rank)

    def counter_track(self, parent: int, name: str, unit_bytes: bool = True) -> int:
        counter = self.pb.CounterDescriptor(unit=self.pb.CounterDescriptor.UNIT_SIZE_BYTES) if unit_bytes \
            else self.pb.CounterDescriptor()
        return self._descriptor(parent_uuid=parent, name=name, counter=counter)

    def _event(self, ts_ns: int, **fields):
        packet = self.pb.TracePacket(timestamp=ts_ns, trusted_packet_sequence_id=SEQUENCE_ID)
        packet.track_event.CopyFrom(self.pb.TrackEvent(**fields))
        self._write(packet)

    def begin(self, track: int, ts_ns: int, name: str, category: str = "", args: dict | None = None,
              flows: list[int] | None = None) -> None:
        annotations = [self.pb.DebugAnnotation(name=key, string_value=str(value))
                       for key, value in (args or {}).items() if value not in (None, "")]
        self._event(ts_ns, type=self.pb.TrackEvent.TYPE_SLICE_BEGIN, track_uuid=track, name=name,
                    categories=[category] if category else [], debug_annotations=annotations,
                    flow_ids=flows or [])

    def end(self, track: int, ts_ns: int) -> None:
        self._event(ts_ns, type=self.pb.TrackEvent.TYPE_SLICE_END, track_uuid=track)

    def counter(self, track: int, ts_ns: int, value: int) -> None:
        self._event(ts_ns, type=self.pb.TrackEvent.TYPE_COUNTER, track_uuid=track, counter_value=int(value))


class Lanes:
    """Slices of one timeline line on as few tracks as keep every track properly nested.

    XLines nest by time, but not always (an async op overlapping the next one): an event that would end after
    the slice it starts in goes to the next lane. `add` takes events in start order (longest first at a tie);
    `close` ends what is open."""

    def __init__(self, writer: Writer, make_track):
        self.writer = writer
        self._make_track = make_track  # lane index -> track uuid
        self._tracks: list[int] = []
        self._stacks: list[list[int]] = []  # per lane, the end times of the open slices

    def add(self, start_ns: int, end_ns: int, name: str, category: str = "", args: dict | None = None,
            flows: list[int] | None = None) -> None:
        for lane, stack in enumerate(self._stacks):
            self._close_until(lane, start_ns)
            if not stack or end_ns <= stack[-1]:
                break
        else:
            lane = len(self._stacks)
            self._stacks.append([])
            self._tracks.append(self._make_track(lane))
        self.writer.begin(self._tracks[lane], start_ns, name, category, args, flows)
        self._stacks[lane].append(end_ns)

    def _close_until(self, lane: int, time_ns: int) -> None:
        stack = self._stacks[lane]
        while stack and stack[-1] <= time_ns:
            self.writer.end(self._tracks[lane], stack.pop())

    def close(self) -> None:
        for lane in range(len(self._stacks)):
            self._close_until(lane, 2**63)
