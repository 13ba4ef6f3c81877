"""HBM use of a compiled XLA module: per buffer, per framework op, and at the peak.

From an HloProto the padded sizes are the compiler's own (buffer assignment), and the peak is found
by replaying the heap-simulator trace exactly as XProf's memory viewer does, so the two agree to the
byte: peak = the largest sum of live temporaries in the trace + every allocation with an indefinite
lifetime (parameters, outputs, constants). XProf adds that indefinite (padded) total
to the unpadded peak too; we keep its definition so the figures compare.
"""

from __future__ import annotations

import contextlib
import gc
import math
from operator import attrgetter
from pathlib import Path

from tpuprof.analyses.buffers import aggregate_ops, donation_candidates, fill_shape_details
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.models.hlo_module import HloModule, MissingInstructions
from tpuprof.models.memory import (
    CONSTANT, OUTPUT, PARAMETER, TEMP, THREAD_LOCAL, Buffer, ModuleMemory,
)
from tpuprof.sources import hlo_dump

HBM = 0  # memory color of HBM in TPU buffer assignments


def dump_memory(path: Path, module: str | None = None, target: str | None = None) -> list[ModuleMemory]:
    """Analyse every module under PATH (or the one named), largest peak first. A module that cannot be read is
    left out and named in a note of the first result; when none can, the first module's reason is the error."""
    files = hlo_dump.discover(path, module)
    results, dropped = [], []
    for file in files:
        try:
            results.append(module_memory(file, target))
        except UserError as error:
            if len(files) == 1:
                raise
            dropped.append((file, error))
    if not results:
        raise UserError(f"none of the {len(files)} modules in {path} could be read: {dropped[0][1]}")
    results.sort(key=lambda r: -(r.peak_heap_bytes or 0))
    if dropped:
        results[0].notes.append(f"Left out ({len(dropped)} of {len(files)} modules): "
                                + "; ".join(f"{file.path.name} ({error})" for file, error in dropped))
    return results


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused: the analysis of a large HloProto builds some 100,000 small objects
    (tuples, buffers, protobuf wrappers), none in a reference cycle, and the collector's passes over them were
    about 8% of `memory`'s time (a 48-layer transformer). Whatever it leaves is collected after as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def module_memory(file: hlo_dump.DumpFile, target: str | None = None) -> ModuleMemory:
    """The memory of the module in one dump file (HloProto, buffer-assignment text or HLO text)."""
    # The generation sizes tuple tables and default tiles of an estimate: the dump's own record of it counts.
    detected = None if target else hlo_dump.detect_target(file)
    target = target or (detected if file.kind != "buffer_assignment" else None)
    if file.kind == "hlo_proto":
        with _collector_paused():
            result = _from_buffer_definers(file.path)
        if result is None:
            result = _from_whole_proto(file.path, target)
    elif file.kind == "buffer_assignment":
        from tpuprof.analyses import buffer_assignment_text

        platform = hlo_dump.non_tpu_platform(file.path)
        if platform is not None:
            raise UserError(f"{file.path.name} is XLA:{platform}'s buffer assignment, not TPU memory: give the dump "
                            "folder (or the module's *.after_optimizations.txt) with --target to estimate it for a TPU.")

        result = buffer_assignment_text.from_text(hlo_dump.read_text(file.path), str(file.path),
                                                  hlo_dump.read_hlo_text_beside(file.path))
    else:
        from tpuprof.analyses import hlo_estimate

        result = hlo_estimate.from_text(hlo_dump.read_text(file.path), str(file.path), target)
    result.target = target or result.target or detected
    return result


def _from_buffer_definers(path: Path) -> ModuleMemory | None:
    """The analysis of a TPU HloProto read without its fusion bodies (most of a large module), or None when that
    is not enough: no TPU buffer assignment, or a buffer's instruction missing."""
    proto = hlo_dump.read_buffer_definers(path)
    if proto is None or hlo_dump.non_tpu_platform(path, proto.hlo_module) is not None:
        return None
    try:
        return from_hlo_proto(proto, str(path), whole_module=False)
    except MissingInstructions:
        return None


def _from_whole_proto(path: Path, target: str | None) -> ModuleMemory:
    proto = hlo_dump.read_hlo_proto(path)
    platform = hlo_dump.non_tpu_platform(path, proto.hlo_module)
    if platform is None and proto.HasField("buffer_assignment") and proto.buffer_assignment.logical_buffers:
        return from_hlo_proto(proto, str(path))
    from tpuprof.analyses import hlo_estimate

    reason = ""
    if platform is not None and proto.buffer_assignment.logical_buffers:
        reason = (f"This HloProto carries a {platform} buffer assignment, not a TPU one: its sizes and "
                  "peak are not TPU memory, so they are estimated for the TPU from its HLO.")
    return hlo_estimate.from_module_proto(proto.hlo_module, str(path), target, reason)


# ---------------------------------------------------------------------------------------------
# HloProto with buffer assignment
# ---------------------------------------------------------------------------------------------

class _Allocation:
    """The fields of one BufferAllocationProto, read once."""

    __slots__ = ("index", "size", "color", "is_entry_computation_parameter", "maybe_live_out", "kind", "indefinite",
                 "assigned")

    def __init__(self, allocation):
        self.index = allocation.index
        self.size = allocation.size
        self.color = allocation.color
        parameter = self.is_entry_computation_parameter = allocation.is_entry_computation_parameter
        live_out = self.maybe_live_out = allocation.maybe_live_out
        constant = allocation.is_constant
        if parameter:
            self.kind = PARAMETER
        elif live_out:
            self.kind = OUTPUT
        elif allocation.is_thread_local:
            self.kind = THREAD_LOCAL
        else:
            self.kind = CONSTANT if constant else TEMP
        # Live for the whole program. Thread-local scratch (scalars of reducer computations) is not counted: XProf
        # 2.24 leaves it out of the peak, and it is not program HBM.
        self.indefinite = bool(parameter or constant or live_out)
        # Other memory spaces count by their allocations' sizes alone: their buffers (a third of a large module's,
        # in two allocations) are not read.
        self.assigned = [assigned.logical_buffer_id for assigned in allocation.assigned] if self.color == HBM else []


_ELEMENTS: dict[int, tuple[str, int]] = {}  # PrimitiveType number -> (name, bits per element)


def _dense_facts(shape_proto) -> tuple[int, str]:
    """(dense bytes, dtype) of a ShapeProto without building a Shape (the hot loop of large modules)."""
    if not _ELEMENTS:
        from tpuprof import protos

        for name, number in protos.xla_data_pb2().PrimitiveType.items():
            lowered = "opaque" if name == "OPAQUE_TYPE" else name.lower()
            _ELEMENTS[number] = (lowered, shapes.ELEMENT_BITS.get(lowered, 0))
    dtype, bits = _ELEMENTS.get(shape_proto.element_type, ("", 0))
    if dtype == "tuple":
        return shapes.POINTER_BYTES * len(shape_proto.tuple_shapes), dtype
    return math.ceil(math.prod(shape_proto.dimensions) * bits / 8), dtype


def from_hlo_proto(proto, source: str, whole_module: bool = True) -> ModuleMemory:
    """The analysis of an HloProto with a TPU buffer assignment. whole_module=False: the module holds only the
    computations that define buffers (hlo_dump.read_buffer_definers), so a defining instruction not found there
    raises MissingInstructions rather than being looked for in the rest."""
    module = proto.hlo_module
    assignment = proto.buffer_assignment
    # Every field of every logical buffer and allocation, read once into plain tuples: each read of a protobuf
    # field builds a Python object, and a large module has tens of thousands of buffers that the replay, the
    # allocations and the buffer list all visit.
    rows = []  # (id, size, color, defining instruction id, shape index) per logical buffer, in the proto's order
    logical = {}  # the same rows by id: a repeated id keeps its last
    for lb in assignment.logical_buffers:
        defined_at = lb.defined_at
        index = defined_at.shape_index  # most buffers are not tuple elements: no list built for them
        row = (lb.id, lb.size, lb.color, defined_at.instruction_id, index[:] if index else ())
        rows.append(row)
        logical[row[0]] = row
    hlo = HloModule(module)
    by_id = hlo.find({row[3] for row in logical.values()}, whole_module)

    allocations = [_Allocation(a) for a in assignment.buffer_allocations]
    # Which allocation holds each logical buffer.
    allocation_of: dict[int, _Allocation] = {}
    for allocation in allocations:
        for buffer_id in allocation.assigned:
            if buffer_id in logical:
                allocation_of[buffer_id] = allocation

    # (dense bytes, dtype) of a logical buffer (a repeated id: its last), read from its shape when the replay or
    # the buffer list first asks: other memory spaces' buffers (a third of a large module's) are never read.
    facts: dict[int, tuple[int, str]] = {}
    shape_of: dict[int, object] = {}  # instruction id -> its ShapeProto (each field read builds an object)

    def dense_facts(buffer_id: int) -> tuple[int, str]:
        known = facts.get(buffer_id)
        if known is not None:
            return known
        _, size, _, instruction_id, index = logical[buffer_id]
        shape = shape_of.get(instruction_id)
        if shape is None:
            instruction = by_id.get(instruction_id)
            if instruction is None:
                known = facts[buffer_id] = (size, "")
                return known
            shape = shape_of[instruction_id] = instruction.shape
        # Like XProf, a shape index selects by its LAST entry (nested indices are rare in HBM buffers and XProf
        # reports them this way); a damaged proto can hold a negative one.
        if index and 0 <= index[-1] < len(shape.tuple_shapes):
            shape = shape.tuple_shapes[index[-1]]
        known = facts[buffer_id] = _dense_facts(shape)
        return known

    def unpadded(buffer_id: int) -> int:
        return dense_facts(buffer_id)[0]

    result = ModuleMemory(name=module.name, source=source, source_kind="hlo_proto")
    _aliasing(hlo, result)
    replay = _replay_heap_trace(assignment, allocations, logical, allocation_of, unpadded)

    # Allocations of indefinite lifetime count at every point of the program.
    indefinite_bytes = 0
    indefinite_buffers: list[int] = []
    result.allocated_bytes = 0
    for allocation in allocations:
        space, size = allocation.color, allocation.size
        if space != HBM:
            result.other_memory_spaces[space] = result.other_memory_spaces.get(space, 0) + size
            continue
        if allocation.kind != THREAD_LOCAL:
            result.allocated_bytes += size
        if allocation.is_entry_computation_parameter:
            result.argument_bytes += size
        if allocation.maybe_live_out:
            result.output_bytes += size
            if allocation.is_entry_computation_parameter:
                result.aliased_bytes += size
        if not allocation.indefinite:
            result.temp_bytes += size
            continue
        indefinite_bytes += size
        # XProf shows the largest logical buffer of the allocation.
        best, best_size = None, 0
        for buffer_id in allocation.assigned:
            row = logical.get(buffer_id)
            if row is not None and row[1] > best_size:
                best, best_size = buffer_id, row[1]
        if best is not None:
            indefinite_buffers.append(best)

    result.peak_heap_bytes = replay.peak + indefinite_bytes
    result.peak_unpadded_heap_bytes = replay.peak_unpadded + indefinite_bytes
    result.heap_timeline = [v + indefinite_bytes for v in replay.timeline]
    result.unpadded_timeline = [v + indefinite_bytes for v in replay.unpadded_timeline]
    result.peak_position = replay.peak_position
    live_at_peak = set(replay.peak_buffers) | set(indefinite_buffers)

    # Every HBM logical buffer becomes a Buffer; shapes and source lines only for the ones shown.
    kind_of_allocation = {a.index: a.kind for a in allocations}
    described: dict[int, tuple[str, str, str]] = {}  # instruction id -> (name, opcode, op_name)
    buffers = result.buffers
    for buffer_id, size, color, instruction_id, index in rows:
        if color != HBM:
            continue
        allocation = allocation_of.get(buffer_id)
        if allocation is None:
            continue
        names = described.get(instruction_id)
        if names is None:
            instruction = by_id.get(instruction_id)
            if instruction is None:
                continue
            names = described[instruction_id] = (instruction.name, instruction.opcode, instruction.metadata.op_name)
        name, opcode, op_name = names
        if index:
            name += "{" + ",".join(map(str, index)) + "}"
        dense, dtype = dense_facts(buffer_id)
        buffers.append(Buffer(buffer_id, name, opcode, "", size, dense, kind_of_allocation[allocation.index], op_name,
                              "", HBM, buffer_id in live_at_peak, dtype=dtype))
    # Largest first, ties by id: two stable sorts by attribute, cheaper than one by a built tuple key.
    buffers.sort(key=attrgetter("id"))
    buffers.sort(key=attrgetter("size_bytes"), reverse=True)
    result.details_source = (hlo, by_id, logical)
    result.ops, result.ops_scope = aggregate_ops(result.buffers, has_peak=bool(live_at_peak))
    return result


def _aliasing(hlo: HloModule, result: ModuleMemory) -> None:
    """The module's declared input_output_alias (XLA writes it, empty too, into every HloProto) and the entry
    parameters an output could be written over."""
    module = hlo.proto
    if not module.HasField("input_output_alias"):
        return
    aliases = tuple((tuple(e.output_shape_index), e.parameter_number, tuple(e.parameter_shape_index))
                    for e in module.input_output_alias.entries)
    result.alias_pairs = len(aliases)
    entry = hlo.entry
    root = next((i for i in entry.instructions if i.id == entry.root_id), None)
    if root is None:
        return
    parameters = [(i.parameter_number, i.metadata.op_name or i.name, hlo.shape(i))
                  for i in entry.instructions if i.opcode == "parameter"]
    result.donation_candidates = donation_candidates(parameters, hlo.shape(root), aliases)


def self_contained(result: ModuleMemory) -> ModuleMemory:
    """RESULT with every buffer's details filled in and the module they are read from let go, so that it pickles
    (a Ray task's answer) and reads the same elsewhere."""
    describe(result, result.buffers)
    result.details_source = None
    return result


def describe(result: ModuleMemory, buffers: list[Buffer]) -> None:
    """Fill shape text, padded dims and source lines for the buffers about to be shown."""
    if result.details_source is None:
        return
    hlo, by_id, logical = result.details_source
    # A model's layers repeat their shapes: convert each once, and write each element's text once.
    converted: dict[bytes, shapes.Shape] = {}
    filled: dict[tuple[bytes, tuple[int, ...]], tuple] = {}  # (shape, index) -> the details written for it
    for buffer in buffers:
        if buffer.shape:
            continue
        row = logical.get(buffer.id)
        # A damaged proto can repeat a logical buffer id with another defining instruction: keep it unshaped.
        instruction = by_id.get(row[3]) if row is not None else None
        if instruction is None:
            continue
        key = instruction.shape.SerializeToString()
        details = filled.get((key, tuple(row[4])))
        if details is None:
            shape = converted.get(key)
            if shape is None:
                shape = converted[key] = shapes.from_proto(instruction.shape)
            fill_shape_details(buffer, shape.subshape(list(row[4])))
            filled[key, tuple(row[4])] = (buffer.shape, buffer.dtype, buffer.padded_dims, buffer.minor_to_major,
                                          buffer.tile)
        else:
            buffer.shape, buffer.dtype, padded_dims, buffer.minor_to_major, buffer.tile = details
            buffer.padded_dims = list(padded_dims)
        buffer.source_line = hlo.source_line(instruction)


# ---------------------------------------------------------------------------------------------
# Heap-simulator replay (XProf memory_viewer's algorithm)
# ---------------------------------------------------------------------------------------------

class _Replay:
    def __init__(self):
        self.peak = 0
        self.peak_unpadded = 0
        self.peak_position = 0
        self.peak_buffers: list[int] = []
        self.timeline: list[int] = []
        self.unpadded_timeline: list[int] = []


def _pick_trace(assignment, allocations, logical, allocation_of) -> int:
    """The heap-simulator trace of HBM temporaries, chosen as XProf chooses it."""
    traces = assignment.heap_simulator_traces
    trace_of_allocation = {}
    for i, trace in enumerate(traces):
        if not trace.events:
            continue
        allocation = allocation_of.get(trace.events[0].buffer_id)
        if allocation is not None:
            trace_of_allocation[allocation.index] = i
    for allocation in allocations:
        if allocation.color == HBM and not allocation.indefinite and allocation.index in trace_of_allocation:
            return trace_of_allocation[allocation.index]
    best, best_count = -1, 0
    for i, trace in enumerate(traces):
        count = sum(1 for e in trace.events if e.buffer_id in logical and logical[e.buffer_id][2] == HBM)
        if count > best_count:
            best, best_count = i, count
    return best


def _replay_heap_trace(assignment, allocations, logical, allocation_of, unpadded) -> _Replay:
    replay = _Replay()
    trace_id = _pick_trace(assignment, allocations, logical, allocation_of)
    if trace_id < 0:
        replay.timeline, replay.unpadded_timeline = [0], [0]
        return replay
    trace = assignment.heap_simulator_traces[trace_id]
    kinds = type(trace.events[0]) if trace.events else None
    alloc_kind = kinds.ALLOC if kinds else 0
    free_kind = kinds.FREE if kinds else 1
    share_kind = kinds.SHARE_WITH if kinds else 2

    canonical: dict[int, int] = {}  # buffer -> the buffer it shares memory with
    refcount: dict[int, int] = {}
    live: dict[int, None] = {}  # insertion-ordered set: program order of the live buffers
    heap = heap_unpadded = 0
    timeline, unpadded_timeline = replay.timeline, replay.unpadded_timeline

    def root(buffer_id: int) -> int:
        # Terminates: a share that would close a cycle is refused below, so the chains have ends.
        while buffer_id in canonical:
            buffer_id = canonical[buffer_id]
        return buffer_id

    # The live set at the peak is copied only when it is about to change after a new peak, not at each new peak: a
    # run of allocations raises the peak hundreds of times in a large module before anything is freed.
    peak_unsaved = False

    def save_peak_buffers() -> None:
        nonlocal peak_unsaved
        replay.peak_buffers = list(live)
        peak_unsaved = False

    def grow(buffer_id: int) -> None:
        nonlocal heap, heap_unpadded, peak_unsaved
        size = logical[buffer_id][1]
        if heap + size <= replay.peak and peak_unsaved:
            save_peak_buffers()
        live[buffer_id] = None
        heap += size
        heap_unpadded += unpadded(buffer_id)
        if heap > replay.peak:
            replay.peak = heap
            replay.peak_unpadded = heap_unpadded
            # Where the timeline shows the peak: the value after this event. (XProf's peakHeapSizePosition
            # is one earlier, the event that caused it.)
            replay.peak_position = len(timeline)
            peak_unsaved = True

    for event in trace.events:
        timeline.append(heap)
        unpadded_timeline.append(heap_unpadded)
        buffer_id = event.buffer_id
        if buffer_id not in logical:
            continue
        kind = event.kind
        if kind == alloc_kind:
            key = root(buffer_id)
            refcount[key] = refcount.get(key, 0) + 1
            grow(buffer_id)
        elif kind == free_kind:
            key = root(buffer_id)
            refcount[key] = refcount.get(key, 0) - 1
            if refcount[key] < 0:
                raise UserError(f"the heap trace frees buffer {buffer_id} twice: the HloProto is inconsistent.")
            if refcount[key] == 0:
                if peak_unsaved:
                    save_peak_buffers()
                live.pop(key, None)
                heap -= logical[key][1]
                heap_unpadded -= unpadded(key)
        elif kind == share_kind:
            target = event.share_with_canonical_id
            if target not in logical:
                continue
            if _reaches(canonical, target, buffer_id):
                through = "" if target == buffer_id else f" through buffer {target}"
                raise UserError(f"the heap trace makes buffer {buffer_id} share memory with itself{through}: the "
                                "HloProto is inconsistent.")
            canonical[buffer_id] = target
            key = root(target)
            refcount[key] = refcount.get(key, 0) + 1
            if refcount[key] == 1:  # memory of a freed buffer taken up again
                grow(key)
    if peak_unsaved:
        save_peak_buffers()
    timeline.append(heap)
    unpadded_timeline.append(heap_unpadded)
    return replay



def _reaches(canonical: dict[int, int], start: int, wanted: int) -> bool:
    """Whether following the shares from START reaches WANTED (so that sharing WANTED with START makes a cycle)."""
    node = start
    while True:
        if node == wanted:
            return True
        if node not in canonical:
            return False
        node = canonical[node]
