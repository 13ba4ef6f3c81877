"""Steps and where their time goes, for one host's XSpace.

Two ways to find steps:

- TPU device planes (`/device:TPU:N`): each chip's own steps and device-time categories (compute,
  host_transfer, input, collective, host overhead, compile, other), see analyses.chips.
- Host-only captures (CPU jobs, or GPU without device steps), where XProf answers "No step time
  measured": step markers on the host, in order of trust: explicit `StepTraceAnnotation` /
  `tf.profiler.experimental.Trace(..., step_num=)` events, Keras' compiled step function
  (`multi_step_on_iterator`, ...), then the busiest jitted function (`PjitFunction(...)`).

A step period runs from one step's start to the next step's start, so the time between steps (the
host's Python loop) belongs to it; the last step, whose next start is not in the capture, is left out
unless it is the only one. Within a host step, with this priority:
  compile       - tracing/compiling events;
  input         - the training thread blocked on the tf.data iterator (`IteratorGetNext...`);
  compute       - kernels running on executor threads (TF ops, XLA:CPU thunks, GPU kernels), and the step
                  call from its first kernel (or input wait) to its last;
  host overhead - the step call's start-up before its first kernel and return after its last, and the
                  gap until the next call: what running several steps per call amortises.
When the capture does not show the input pipeline (a JAX process records jaxlib's events, never the
Python data loader), untraced time on the training thread before a step starts dispatching is the
loader's: input. Traced dispatch, launch and return stay host overhead, and so does the untraced time between
two of JAX's waits for the device (`block_until_ready`) with nothing else on the thread: the host was blocked.
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np

from tpuprof.analyses import chips, input_pipeline, top_ops
from tpuprof.analyses.step_split import make_steps, split_layers
from tpuprof.analyses.timeline import Line, Spans, distinct, read_line, top_level
from tpuprof.models.profile import HostProfile

GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")
HOST_PLANE = "/host:CPU"

# Explicit step markers, as XProf recognises them (IsExplicitHostStepMarker).
EXPLICIT_MARKER = re.compile(r"^(train|test|TraceContext)[^/]*$")
# Keras 3 / TF2 compiled step functions (python-level tf.function call events).
TF_STEP_FUNCTIONS = ("multi_step_on_iterator", "one_step_on_iterator", "one_step_on_data",
                     "one_step_on_data_distributed", "multi_step_on_data", "train_function",
                     "distributed_train_step", "train_step")
TF_INFERENCE = re.compile(r"^__inference_(\w+?)_\d+$")
PJIT = re.compile(r"^PjitFunction\((.*)\)$")
GET_NEXT = re.compile(r"^(IteratorGetNext|[^ ]*:IteratorGetNext(AsOptional)?$)")
COMPILE = re.compile(r"(?i)(compile|pjit_lower|lower_sharding|trace_to_jaxpr|TfFunctionTrac|^Tracing)")
COMPILE_EXCLUDE = re.compile(r"^XlaCompile|:XlaCompile$")  # TF's per-step cache lookup op, not a compile
# Host lines that run the program's ops (TF executor, XLA:CPU thunks, Eigen pools).
EXEC_LINE = re.compile(r"^(tf_Compute|tf_XLA|tf_inter_op|tf_numa|tf_pjrt|tf_Eigen|XLA)", re.I)
XLA_CPU_EXECUTION = "ThunkExecutor::Execute"
PYTHON_TRACER = "$"  # the prefix of the Python tracer's events (a Python function call each)
# The Python tracer's events of JAX's own calls that wait for the device or move data to or from it
# (`$api.py:2551 block_until_ready`), and of its profiler starting and stopping the trace (`$profiler.py:235
# stop_trace`; not a step annotation's constructor, which opens each step): the host is in JAX, not in the
# user's loader, while they run.
JAX_PYTHON_WAITS = re.compile(r"^\$(\S+ (block_until_ready|try_to_block|device_get|device_put)"
                              r"|profiler\.py:\d+ (start_trace|stop_trace|trace))$")


# JAX waiting for a result (`block_until_ready`, `device_get`): PjRt traces `CommonPjRtBuffer::Await` as the wait
# starts and again once the result is there; the blocking between is untraced.
DEVICE_WAIT = re.compile(r"PjRt\w*Buffer::Await$")


def _stat_names(plane) -> dict[int, str]:
    return {key: meta.name for key, meta in plane.stat_metadata.items()}


def _stat(plane, stat, names):
    """A stat's value as a Python value (ref values resolve to the referenced string)."""
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return names.get(stat.ref_value, "")
    if kind == "bytes_value":
        return stat.bytes_value
    return getattr(stat, kind) if kind else None


def _ids(names: dict[int, str], predicate) -> set[int]:
    """The metadata ids whose event name satisfies PREDICATE; NAMES: id -> name of a plane's event metadata (read
    once: each pass over the proto map makes a Python object per entry)."""
    return {key for key, name in names.items() if predicate(name)}


# --------------------------------------------------------------------------------------------------
# Splitting step periods into categories.


def _periods(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step i's period is [start_i, start_{i+1}); the last one ends with its marker."""
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    period_end = np.empty_like(ends)
    period_end[:-1] = starts[1:]
    period_end[-1] = ends[-1]
    return starts, np.maximum(period_end, starts)


# --------------------------------------------------------------------------------------------------
# Host planes.


class HostView:
    """The host plane's lines, with the spans the step split needs."""

    def __init__(self, stream):
        """STREAM: the host plane (sources.xspace_stream.PlaneStream); its lines are read once, keeping only the
        events the analyses look at (all of them on a line that holds step-marker candidates)."""
        plane = self.plane = stream.header
        names = self.names = {key: meta.name for key, meta in plane.event_metadata.items()}
        get_next = _ids(names, GET_NEXT.match)
        compile_ids = _ids(names, lambda n: bool(COMPILE.search(n)) and not COMPILE_EXCLUDE.search(n))
        # Work = kernels actually running: TF ops (`scope/name:Type`) and XLA:CPU thunks on executor threads, and
        # XLA:CPU's executor running a program (`ThunkExecutor::Execute`, with its wait for the thunks it handed to
        # the thread pool: a matmul there shows no event of its own). The executor is no op of its own (top ops
        # leave it out), but the CPU is computing the step while it runs.
        tf_ops = _ids(names, lambda n: bool(top_ops.TF_OP.match(n)))
        xla_ops = _ids(names, lambda n: bool(n) and not top_ops.NOT_OP.match(n) and not top_ops.TF_OP.match(n)) | \
            _ids(names, lambda n: n.startswith(XLA_CPU_EXECUTION))
        iterator_ids = _ids(names, lambda n: n.startswith("Iterator::"))
        markers = set().union(*self._marker_ids().values())
        wanted = get_next | compile_ids | tf_ops | iterator_ids | markers | \
            _ids(names, lambda n: bool(input_pipeline.PY_FUNCTION.match(n)))
        self.lines = []
        for stream_line in stream.lines():
            if not stream_line.has_events:
                continue
            keep = wanted | xla_ops if top_ops.XLA_CPU_LINE.match(stream_line.label) else wanted
            line = read_line(stream_line, keep=keep, stats_for=markers)
            if len(line.select(markers)):
                # A step-marker candidate's line: its other events (dispatch, transfers) are the host's traced
                # work, and its first and last event bound the thread's time. Read it again, whole.
                line = read_line(stream_line, stats_for=markers)
            self.lines.append(line)
        wait, comp, work, comp_ids = [], [], [], []
        for line in self.lines:
            idx = line.select(get_next)
            wait.append((line.start[idx], line.end[idx]))
            idx = line.select(compile_ids)
            comp.append((line.start[idx], line.end[idx]))
            comp_ids.append(line.mid[idx])
            if EXEC_LINE.match(line.name):
                idx = line.select(tf_ops | xla_ops if top_ops.XLA_CPU_LINE.match(line.name) else tf_ops)
                work.append((line.start[idx], line.end[idx]))
        self.get_next_ids = get_next
        # The input pipeline is visible when the capture holds tf.data events (not just their names).
        visible = get_next | iterator_ids
        self.input_visible = any(len(line.select(visible)) for line in self.lines)
        self.input_wait = _spans(wait)
        self.compile = _spans(comp)
        # One compilation shows on several threads at once (jax's backend_compile_and_load on the caller, XLA's
        # PjRtCpuClient::Compile and codegen on its pools): count the outermost event only, so that the events
        # named add up to time spent, not to the same time twice.
        self._compiles = (np.zeros(0, np.int64),) * 3
        if comp:
            starts, ends = np.concatenate([c[0] for c in comp]), np.concatenate([c[1] for c in comp])
            keys = np.concatenate(comp_ids)
            outer = top_level(starts, ends)
            self._compiles = (keys[outer], starts[outer], ends[outer])
        self.work = _spans(work)

    def compile_events(self, window: tuple[int, int] | None = None) -> list[tuple[str, int, int]]:
        """The 3 compile events that took longest in all, (name, count, ps), each compilation counted once; with a
        WINDOW (host clock, ps) only those that start in it."""
        keys, starts, ends = self._compiles
        if window is not None:
            inside = (starts >= window[0]) & (starts < window[1])
            keys, starts, ends = keys[inside], starts[inside], ends[inside]
        compiles: dict[int, list[int]] = {}
        for key, duration in zip(keys.tolist(), (ends - starts).tolist()):
            entry = compiles.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += duration
        return sorted(((self.plane.event_metadata[k].name, c, d) for k, (c, d) in compiles.items()),
                      key=lambda item: item[2], reverse=True)[:3]

    def markers(self):
        """(line, event indices, description) of the best step markers, or None (computed once)."""
        if not hasattr(self, "_markers"):
            self._markers = self._find_markers()
        return self._markers

    def _marker_ids(self) -> dict[str, set[int]]:
        return {"explicit": _ids(self.names, EXPLICIT_MARKER.match),
                "tf_step": _ids(self.names, lambda n: n in TF_STEP_FUNCTIONS),
                "tf_inference": _ids(self.names, lambda n: bool(TF_INFERENCE.match(n))
                                     and TF_INFERENCE.match(n).group(1) in TF_STEP_FUNCTIONS),
                "pjit": _ids(self.names, PJIT.match)}

    def _find_markers(self):
        meta = self.plane.event_metadata
        ids = self._marker_ids()
        explicit, tf_step, tf_inference, pjit = ids["explicit"], ids["tf_step"], ids["tf_inference"], ids["pjit"]
        # A marker seen twice is a step; once, only when nothing repeats (a step longer than the capture).
        for fewest, ids, label in ((2, explicit, "step markers"), (2, tf_step, "TF step function"),
                                   (2, tf_inference, "TF step function"), (2, pjit, "jitted function"),
                                   (1, explicit, "step markers"), (1, tf_step, "TF step function")):
            best = None
            for line in self.lines:
                found = line.select(ids)
                for key in distinct(line.mid[found]):
                    idx = found[line.mid[found] == key]
                    if len(idx) < fewest:
                        continue
                    idx = idx[top_level(line.start[idx], line.end[idx])]
                    total = int((line.end[idx] - line.start[idx]).sum())
                    if best is None or total > best[0]:
                        best = (total, line, idx, key)
            if best is not None:
                _, line, idx, key = best
                return line, idx, f"{label} `{meta[key].name}` on thread `{line.name}`"
        return None

    def traced_host_work(self, line: Line) -> Spans:
        """The training thread's traced events other than step markers (dispatch, transfers, other jits). The
        Python tracer's events (`$file.py:12 load_batch`, `$time sleep`: `--python-tracer-level 1`) are not among
        them but for JAX's own (JAX_PYTHON_WAITS): they trace the user's Python itself, the loader included, which
        is untraced without that tracer."""
        skipped = _ids(self.names, lambda n: bool(EXPLICIT_MARKER.match(n))
                       or (n.startswith(PYTHON_TRACER) and not JAX_PYTHON_WAITS.match(n)))
        keep = ~np.isin(line.mid, list(skipped)) if skipped else np.ones(len(line.mid), bool)
        return Spans(line.start[keep], line.end[keep])

    def step_numbers(self, line: Line, idx: np.ndarray) -> np.ndarray | None:
        names = _stat_names(self.plane)
        numbers = []
        for i in idx.tolist():
            value = None
            for stat in line.event_stats(i):
                if names.get(stat.metadata_id) in ("step_num", "iter_num"):
                    value = _stat(self.plane, stat, names)
            if not isinstance(value, int):
                return None
            numbers.append(value)
        return np.array(numbers)

    def batches_per_step(self, a, b) -> np.ndarray | None:
        """How many iterator GetNext calls each step made (Keras steps_per_execution), if visible."""
        starts = []
        for line in self.lines:
            idx = line.select(self.get_next_ids)
            if len(idx):
                idx = idx[top_level(line.start[idx], line.end[idx])]
                starts.append(line.start[idx])
        if not starts:
            return None
        # A call's GetNext events can run on several threads (Keras fetches the first batch of a
        # multi-step call outside its loop): count the top-level calls of every thread.
        counts = [np.searchsorted(np.sort(s), b) - np.searchsorted(np.sort(s), a) for s in starts]
        return np.maximum(np.sum(np.vstack(counts), axis=0), 1)


def _spans(pairs) -> Spans:
    if not pairs:
        return Spans.empty()
    return Spans(np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs]))


def _trim(starts: np.ndarray, ends: np.ndarray, inner: Spans) -> tuple[np.ndarray, np.ndarray]:
    """Each [start, end) shrunk to the span from the first INNER time that begins in it to the last INNER time it
    contains. A span begun before it (the previous step's program still finishing) does not open it: its time
    inside counts through INNER itself, and the untraced time after it (a loader's sleep) is not the step's work."""
    if not len(inner.starts):
        return starts, ends
    first = np.searchsorted(inner.starts, starts, side="left")  # first inner span starting at or after start
    first_start = inner.starts[np.minimum(first, len(inner.starts) - 1)]
    new_starts = np.where(first < len(inner.starts), np.maximum(starts, first_start), ends)
    last = np.searchsorted(inner.starts, ends, side="left") - 1  # last inner span starting before end
    last_end = inner.ends[np.maximum(last, 0)]
    new_ends = np.where(last >= 0, np.minimum(ends, last_end), starts)
    return new_starts, np.maximum(new_ends, new_starts)


def host_steps(view: HostView, profile: HostProfile) -> None:
    found = view.markers()
    if found is None:
        profile.notes.append("no step markers on the host (no StepTraceAnnotation or Keras step function, and "
                             "no jitted function ran twice in the capture)")
        return
    line, idx, description = found
    start, end = line.start[idx], line.end[idx]
    order = np.argsort(start)
    idx, start, end = idx[order], start[order], end[order]
    a, b = _periods(start, end)
    # The step call's own start-up and return (before its first kernel or input wait, after its last) is
    # per-call host overhead, the part that running several steps per call amortises.
    core_start, core_end = _trim(start, end, view.work | view.input_wait)
    core = Spans(core_start, core_end)
    profile.step_source = description
    profile.input_visible = view.input_visible
    if view.input_visible:
        layers = [("compile", view.compile), ("input", view.input_wait), ("compute", core | view.work)]
        parts = split_layers(a, b, layers, rest="host_overhead")
    else:
        # No input pipeline in the trace: untraced host time is the Python data loader's.
        profile.untraced_input = True
        # Untraced time on the training thread before a step starts dispatching its work (between steps,
        # or inside the step annotation before the jitted call) is the host's Python preparing the batch:
        # input. From the first traced dispatch event to the first kernel (launch latency), and after the
        # last kernel (the return to Python), it is host overhead.
        traced = view.traced_host_work(line)
        launch_start = core_start
        if len(traced.starts):
            first = np.searchsorted(traced.ends, start, side="right")
            first_start = traced.starts[np.minimum(first, len(traced.starts) - 1)]
            launch_start = np.where(first < len(traced.starts), np.maximum(start, first_start), core_start)
        launch = Spans(np.minimum(launch_start, core_start), core_start)
        layers = [("compile", view.compile), ("input", view.input_wait), ("compute", core | view.work),
                  ("host_overhead", traced | launch | Spans(core_end, end) | _blocked(view, line))]
        parts = split_layers(a, b, layers, rest="input")
    numbers = view.step_numbers(line, idx)
    batches = view.batches_per_step(start, end)
    profile.steps = make_steps(a, b, parts, numbers, batches)
    if len(profile.steps) > 1:
        # The last step's period ends with its marker: the gap before the next step is not in the capture, so
        # it would be measured shorter than the others. Leave it out.
        profile.steps = profile.steps[:-1]


def _blocked(view: HostView, line: Line) -> Spans:
    """The training thread blocked on the device: from one JAX wait event to the next when nothing else ran on the
    thread between them. Without step annotations a step ends with its dispatch, and that wait (the device
    finishing, then the thread waking up) read as untraced loader time: a compute-bound job with a free loader
    read 9.8% waiting for input, 'moderately input-bound'."""
    waits = line.select(_ids(view.names, lambda n: bool(DEVICE_WAIT.search(n))))
    if len(waits) < 2:
        return Spans.empty()
    wait = Spans(line.start[waits], line.end[waits])
    markers = set().union(*view._marker_ids().values())
    others = np.ones(len(line.mid), bool)
    others[waits] = False
    if markers:
        others &= ~np.isin(line.mid, list(markers))
    gap_starts, gap_ends = wait.ends[:-1], wait.starts[1:]
    quiet = Spans(line.start[others], line.end[others]).measure(gap_starts, gap_ends) == 0
    return Spans(gap_starts[quiet], wait.ends[1:][quiet])


def _framework(plane) -> str:
    names = [meta.name for meta in plane.event_metadata.values()]
    if any(PJIT.match(n) for n in names):
        return "jax"
    if any(n.startswith(("Iterator::", "EagerExecute", "__inference_", "EagerLocalExecute")) or n in TF_STEP_FUNCTIONS
           for n in names):
        return "tf"
    return ""


def _host_waiting(view: HostView) -> Spans:
    """When the host was busy getting the next batch: blocked in the tf.data iterator, or, when the
    capture shows no input pipeline (JAX), running untraced Python on the training thread."""
    if view.input_visible:
        return view.input_wait
    found = view.markers()
    if found is None:
        return view.input_wait
    line = found[0]
    traced = view.traced_host_work(line)
    if not len(traced.starts):
        return view.input_wait
    # The gaps between traced events, from the thread's first event to its last.
    untraced = Spans(np.concatenate([[line.start.min()], traced.ends]),
                     np.concatenate([traced.starts, [line.end.max()]]))
    return view.input_wait | untraced


def host_profile(space, host: str, path: str = "") -> HostProfile:
    """One host's capture, SPACE a sources.xspace_stream.XSpaceStream: planes are read one at a time, each line's
    events batch by batch, keeping only the arrays the analyses need."""
    names = space.plane_names()
    host_index = next((i for i, name in enumerate(names) if name == HOST_PLANE), None)
    tpu_planes = sorted((i for i, name in enumerate(names) if chips.TPU_PLANE.match(name)),
                        key=lambda i: int(chips.TPU_PLANE.match(names[i])[1]))
    gpu_planes = [i for i, name in enumerate(names) if GPU_PLANE.match(name)]
    platform = "tpu" if tpu_planes else "gpu" if gpu_planes else "cpu"
    profile = HostProfile(host=host, path=path, platform=platform, step_source="")
    view = HostView(space.plane(host_index)) if host_index is not None else None
    if view is not None:
        profile.input_visible = view.input_visible
        profile.framework = _framework(view.plane)

    if view is not None and gpu_planes:
        # GPU kernels and copies run on the device planes' stream lines: they are the step's compute.
        for index in gpu_planes:
            kernels = [read_line(line) for line in space.plane(index).lines() if line.has_events]
            view.work = view.work | _spans([(k.start, k.end) for k in kernels])
    host_wait = _host_waiting(view) if view is not None and tpu_planes else Spans.empty()
    host_compile = view.compile if view is not None else Spans.empty()
    found = chips.chips_of_host([partial(space.plane, i) for i in tpu_planes], host_wait, host_compile) \
        if tpu_planes else None
    if found is not None and found.steps:
        profile.steps = found.steps
        profile.devices = found.devices
        profile.chip_steps = found.chip_steps
        profile.step_source = f"{found.source} of {len(found.devices)} TPU chip(s)"
    elif view is not None:
        host_steps(view, profile)
    else:
        profile.notes.append("the capture has neither a host plane nor TPU steps")

    if view is not None:
        profile.stages = input_pipeline.stages(view.plane, view.lines)
    host_measured = view is not None and profile.steps and not (found is not None and found.steps)
    profile.host_ops_in_steps = bool(host_measured)
    window = (profile.steps[0].start_ps, profile.steps[-1].start_ps + profile.steps[-1].duration_ps) \
        if host_measured else None  # on the host's clock only when the host measured the steps
    if view is not None:
        profile.compile_events = view.compile_events(window)
        profile.compile_events_in_steps = window is not None
    profile.ops = (found.ops if found is not None else []) + \
        (top_ops.host_ops(view.plane, view.lines, window) if view else [])
    if found is not None:
        profile.matmul_ps, profile.matmul_f32_ps = found.matmul_ps, found.matmul_f32_ps
    if view is not None and tpu_planes:
        _lost_device_data(profile, view, found)
    return profile


def _lost_device_data(profile: HostProfile, view: HostView, found) -> None:
    """Host step calls the chips have no execution for, and whether the chips' events stop before the host's.

    The profiler keeps a bounded number of device events, and a device buffer that a long capture can outrun
    (jax-ml/jax#23446): the host's events then go on after the chips' stop. A call or two at the end with no
    execution can also be the host running ahead of the chips when the capture stopped.
    """
    markers = view.markers()
    if markers is None:
        return
    line, idx, _ = markers
    host_end = int(line.end[idx].max())
    if found is None or not found.steps:
        profile.steps_without_device = len(profile.steps)
        profile.notes.append("the TPU planes hold no step: every step was measured on the host only (the device's "
                             "events were lost: the profiler's device buffer or event cap, jax-ml/jax#23446)")
        return
    profile.steps_without_device = max(0, len(idx) - found.executions)
    if not profile.steps_without_device:
        return
    early = host_end - found.last_event_ps
    if early > 0:
        profile.device_stops_early_ps = early
    when = f"the chips' events stop {early / 1e12:.2f} s before the host's last step call: " if early > 0 else ""
    profile.notes.append(
        f"{when}the host called its step {profile.steps_without_device} more time(s) than the chips ran it: "
        f"{profile.steps_without_device} step(s) have no device data (the profiler's device buffer or event cap, "
        f"jax-ml/jax#23446); the device figures cover the steps it has")


def host_profile_of_file(path: str) -> HostProfile:
    """Read and analyse one host file (runs in a worker process when there are several hosts)."""
    from tpuprof.sources import xplane

    with xplane.open_stream(path) as space, xplane.readable(path):
        return host_profile(space, xplane.host_name(path), path)
