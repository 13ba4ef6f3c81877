"""One host's capture, within a time window, as Perfetto tracks: streamed plane by plane, line by line.

What goes in (`HostTrace.write`):
- a process per plane (`<host> /host:CPU`, `<host> /device:TPU:0`...), a thread track per host thread and a track
  per device line (XLA Modules, XLA Ops, Steps, XLA TraceMe...), events overlapping the window, whole;
- TPU ops named by their HLO instruction, with the framework op, HLO category and program as arguments (the
  names `tpuprof analyze` reports, from the same metadata reader); tf.data stages (`Iterator::...`) on their
  threads with the category `tf.data`;
- flows: an event that produces a context (`_p`/`_pt` stats) is joined to the events that consume it (`_c`/`_ct`),
  e.g. a host launch to the XLA module it ran on each TPU core;
- a counter per allocator from the runtime's MemoryAllocation/MemoryDeallocation events (`bytes_allocated`: the
  memory in use after the event), where the capture has them;
- `tpuprof steps` tracks: the steps as `tpuprof analyze` measured them (host level, and per TPU core), so the
  trace and the analysis agree step by step.

Only the window's events of the current line are held (sorted to nest), never a plane or the file.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpuprof.renderers.perfetto import Lanes, Writer

HOST_PLANE = "/host:CPU"
MEMORY_EVENTS = ("MemoryAllocation", "MemoryDeallocation")
STEPS_TRACK = "tpuprof steps"
OP_LINES = ("XLA Ops", "Async XLA Ops")  # TPU lines whose events are HLO instructions


class _RawEvent(NamedTuple):
    """An event's raw XStat bytes, in the shape xplane.event_stats reads."""

    stats: list


def flow_id(kind: int, context: int) -> int:
    """One id per (context type, context id), within Perfetto's uint64."""
    return ((kind & 0xFFFF) << 47 | (context & ((1 << 47) - 1))) or 1


class HostTrace:
    """Writes one host's planes; pids are unique over the whole trace (`next_pid`)."""

    def __init__(self, writer: Writer, host: str, window_ps: tuple[int, int], numbers: set[int], next_pid: int):
        self.writer, self.host = writer, host
        self.start_ps, self.end_ps = window_ps
        self.numbers = numbers
        self.next_pid = next_pid
        self.events = 0
        self.consumed: set[int] = set()  # flow ids the window's events consume: their producers are kept too

    def write(self, space, profile) -> None:
        from tpuprof.analyses import chips

        steps_parent = None
        names = space.plane_names()
        # Devices first: the contexts their programs consume name the host launches to keep (flows).
        order = sorted(range(len(names)), key=lambda i: (names[i] == HOST_PLANE, i))
        for index in order:
            plane = space.plane(index)
            name = plane.name
            is_host, tpu = name == HOST_PLANE, chips.TPU_PLANE.match(name)
            if not (is_host or name.startswith("/device:")) or not plane.line_count:
                continue
            pid = self.next_pid
            self.next_pid += 1
            process = self.writer.process(pid, f"{self.host} {name}")
            if is_host:
                steps_parent = process
            infos = None
            if tpu:
                from tpuprof.analyses.top_ops import device_op_infos

                infos = device_op_infos(plane.header)
                device = next((d for d in profile.devices if d.id == f"TPU:{tpu.group(1)}"), None)
                if device is not None:
                    self._steps(process, device.steps)
            self._plane(plane, pid, process, is_host, infos)
        if profile.steps:
            parent = steps_parent or self.writer.process(self._pid(), f"{self.host} steps")
            self._steps(parent, profile.steps)

    def _pid(self) -> int:
        self.next_pid += 1
        return self.next_pid - 1

    def _steps(self, process: int, steps) -> None:
        """The chosen steps as the analysis measured them; a chip's step periods can overlap by a little (each
        ends at its own next start, on the chip's clock), so an overlapping one goes on a second track."""
        lanes = Lanes(self.writer, lambda lane: self.writer.track(
            process, STEPS_TRACK if lane == 0 else f"{STEPS_TRACK} (overlapping {lane})", rank=lane - 10))
        for step in sorted(steps, key=lambda s: (s.start_ps, -s.duration_ps)):
            middle = step.start_ps + step.duration_ps // 2  # numbers can repeat in a long capture
            if step.number in self.numbers and self.start_ps <= middle < self.end_ps:
                start = step.start_ps // 1000
                lanes.add(start, start + step.duration_ps // 1000, f"step {step.number}", "step",
                          {"duration_ms": f"{step.duration_ps / 1e9:.3f}"})
        lanes.close()

    def _plane(self, plane, pid: int, process: int, is_host: bool, infos) -> None:
        from tpuprof.sources.xplane import event_stats

        header = plane.header
        stat_names = {key: meta.name for key, meta in header.stat_metadata.items()}
        memory_ids = {key for key, meta in header.event_metadata.items() if meta.name in MEMORY_EVENTS}
        counters: dict[int, int] = {}
        for rank, line in enumerate(plane.lines()):
            if not line.has_events:
                continue
            start, duration, mid, raw = self._window_events(line, stat_names if is_host else None)
            if not len(start):
                continue
            order = np.lexsort((-duration, start))
            label = line.label
            if is_host:
                tid = line.id if 0 < line.id < 2**31 else rank + 1
                first = self.writer.thread(pid, tid, label)
                make = (lambda lane, first=first, label=label:
                        first if lane == 0 else self.writer.track(first, f"{label} (overlapping {lane})"))
            else:
                make = (lambda lane, label=label, rank=rank:
                        self.writer.track(process, label if lane == 0 else f"{label} (overlapping {lane})",
                                          rank=rank * 100 + lane))
            lanes = Lanes(self.writer, make)
            ops = infos if label in OP_LINES else None
            for i in order.tolist():
                key = int(mid[i])
                meta = header.event_metadata.get(key)
                stats = {stat_names.get(s.metadata_id, ""): _value(s, stat_names) for s in event_stats(raw[i])} \
                    if raw[i] is not None else {}
                begin_ns = int(start[i]) // 1000
                end_ns = begin_ns + int(duration[i]) // 1000
                if key in memory_ids and isinstance(stats.get("bytes_allocated"), int):
                    allocator = stats.get("index_on_host", 0)
                    if allocator not in counters:
                        counters[allocator] = self.writer.counter_track(
                            process, f"memory in use (allocator {allocator})")
                    self.writer.counter(counters[allocator], begin_ns, stats["bytes_allocated"])
                name, category, args = _describe(meta, ops, key, stats)
                flows = _flows(stats)
                if not is_host:
                    self.consumed.update(flows)
                lanes.add(begin_ns, end_ns, name, category, args, flows)
                self.events += 1
            lanes.close()

    def _window_events(self, line, stat_names: dict[int, str] | None = None):
        """The line's events overlapping the window, and on the host the launches that produced what the window's
        device programs consume: absolute start (ps), duration (ps), metadata id, and the raw event (for its
        stats) — read batch by batch, only these kept."""
        from tpuprof.sources.xplane import MISSING

        producer_stats = {name: key for key, name in (stat_names or {}).items() if name in ("_p", "_pt")}
        linked = np.fromiter(self.consumed, np.int64, len(self.consumed)) if self.consumed else None
        origin = int(line.timestamp_ns) * 1000
        starts, durations, ids, raws = [], [], [], []
        sorted_so_far, last_start = True, None  # lines are usually in start order: then stop past the window
        for batch in line.event_batches():
            begin, duration = origin + batch.offset_ps, batch.duration_ps
            if len(begin):
                sorted_so_far = sorted_so_far and (last_start is None or begin[0] >= last_start) \
                    and bool(np.all(begin[1:] >= begin[:-1]))
                last_start = int(begin[-1])
                if sorted_so_far and begin[0] >= self.end_ps and (linked is None or len(producer_stats) != 2):
                    break  # every later event starts after the window (producers of linked flows may come later)
            inside = (begin < self.end_ps) & (begin + duration > self.start_ps)
            if linked is not None and len(producer_stats) == 2:
                values = batch.int_stats(producer_stats)
                produced = (values["_pt"] & 0xFFFF) << 47 | (values["_p"] & ((1 << 47) - 1))
                inside |= (values["_p"] != MISSING) & np.isin(produced, linked)
            keep = np.flatnonzero(inside)
            if not len(keep):
                continue
            starts.append(begin[keep])
            durations.append(duration[keep])
            ids.append(batch.metadata_id[keep])
            raws += [_RawEvent(stats) if (stats := batch.stats(i)) else None for i in keep.tolist()]
        if not starts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, []
        return np.concatenate(starts), np.concatenate(durations), np.concatenate(ids), raws


def _value(stat, names: dict[int, str]):
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return names.get(stat.ref_value, "")
    return getattr(stat, kind) if kind else None


def _describe(meta, infos, key: int, stats: dict) -> tuple[str, str, dict]:
    """The slice's name, category and arguments: TPU ops by HLO instruction with their framework op."""
    if infos is not None and key in infos:
        info = infos[key]
        return info.hlo_op, info.category or "xla", {"framework_op": info.framework_op if info.framework_op !=
                                                      info.hlo_op else "", "hlo_category": info.hlo_category,
                                                      "program": info.program}
    name = (meta.display_name or meta.name) if meta is not None else str(key)
    category = "tf.data" if name.startswith("Iterator::") else ""
    args = {k: v for k, v in stats.items() if k in ("tf_op", "run_id", "shape", "bytes_allocated") and v != ""}
    return name or str(key), category, args


def _flows(stats: dict) -> list[int]:
    flows = []
    if isinstance(stats.get("_p"), int):
        flows.append(flow_id(int(stats.get("_pt") or 0), stats["_p"]))
    if isinstance(stats.get("_c"), int):
        flows.append(flow_id(int(stats.get("_ct") or 0), stats["_c"]))
    return flows


def print_summary(done) -> None:
    """The text answer of `tpuprof trace` (done: a TraceResult): which run of a logdir it read, then what the
    trace holds."""
    import sys

    from tpuprof.presentation.analyze import run_sentence
    from tpuprof.units import fmt_bytes

    if done.run:
        print(run_sentence(done.run), file=sys.stdout)
    shown = f"{done.steps[0]}" if len(done.steps) == 1 else f"{done.steps[0]}-{done.steps[-1]}"
    print(f"{done.output}: steps {shown} of {len(done.hosts)} host(s), {done.events:,} events over "
          f"{done.window_ms:.1f} ms, {fmt_bytes(done.bytes)}. Open it in https://ui.perfetto.dev", file=sys.stdout)
