"""Read a Perfetto trace back with the perfetto package's own protos (no trace processor: it downloads a binary at
run time): tracks with their names and parents, and slices rebuilt from BEGIN/END events per track."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slice:
    name: str
    start_ns: int
    end_ns: int
    args: dict
    categories: list
    flows: list


@dataclass
class Track:
    uuid: int
    name: str
    parent: int = 0
    process: str = ""
    slices: list = field(default_factory=list)
    counters: list = field(default_factory=list)


def read(path) -> dict[int, Track]:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace.FromString(open(path, "rb").read())
    tracks: dict[int, Track] = {}
    pids: dict[int, str] = {}
    open_slices: dict[int, list] = {}
    events = []
    for packet in trace.packet:
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                pids[d.process.pid] = d.process.process_name
                tracks[d.uuid] = Track(d.uuid, d.process.process_name, process=d.process.process_name)
            elif d.HasField("thread"):
                tracks[d.uuid] = Track(d.uuid, d.thread.thread_name, process=pids.get(d.thread.pid, ""))
            else:
                tracks[d.uuid] = Track(d.uuid, d.name, parent=d.parent_uuid)
        elif packet.HasField("track_event"):
            events.append((packet.timestamp, packet.track_event))
    for track in tracks.values():  # child tracks belong to their parent's process
        if not track.process and track.parent in tracks:
            track.process = tracks[track.parent].process
    Begin, End, Counter = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_COUNTER
    last: dict[int, int] = {}
    for ts, event in events:  # in file order: the writer emits each track's events nested and in time order
        track = tracks[event.track_uuid]
        if event.type in (Begin, End):
            # Time never goes back on a track: with BEGIN/END paired by a stack, the slices nest properly.
            assert ts >= last.get(track.uuid, 0), f"{track.name}: a slice event at {ts} after {last[track.uuid]}"
            last[track.uuid] = ts
        if event.type == Begin:
            args = {a.name: a.string_value for a in event.debug_annotations}
            open_slices.setdefault(track.uuid, []).append(Slice(event.name, ts, ts, args, list(event.categories),
                                                                list(event.flow_ids)))
        elif event.type == End:
            done = open_slices[track.uuid].pop()
            assert ts >= done.start_ns, f"slice {done.name} on {track.name} ends before it starts"
            done.end_ns = ts
            track.slices.append(done)
        elif event.type == Counter:
            track.counters.append((ts, event.counter_value))
    assert not any(open_slices.values()), "slices left open"
    return tracks
