"""HBM for HLO without a buffer assignment: HLO text, or HLO from CPU/GPU/TensorFlow.

Each instruction of the entry computation that produces an array is one buffer; its size is exact
when the HLO carries TPU layouts, and a simulation of the default TPU tiling (`--target`) when it
does not: minor dimension to 128 lanes, second-minor to 8 sublanes for 32-bit types (16 for 16-bit,
32 for 8-bit). The peak is a liveness estimate over the entry computation's order (a buffer lives
from its instruction to its last use), not the compiler's heap simulation.
"""

from __future__ import annotations

from tpuprof.analyses.buffers import aggregate_ops, fill_shape_details
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.models.memory import CONSTANT, OUTPUT, PARAMETER, TEMP, Buffer, ModuleMemory
from tpuprof.sources import hlo_text

# Opcodes whose result aliases memory that exists already (no new HBM buffer).
NO_ALLOCATION = {"get-tuple-element", "bitcast", "tuple", "after-all", "partition-id", "replica-id",
                 "opt-barrier", "add-dependency"}


def default_tpu_layout(shape: shapes.Shape) -> shapes.Shape:
    """The tiling XLA:TPU gives an array by default, keeping the dims' order as laid out."""
    if shape.is_tuple:
        return shapes.Shape("tuple", tuple_shapes=tuple(default_tpu_layout(s) for s in shape.tuple_shapes))
    if shape.dtype in shapes.NON_ARRAY_TYPES:
        return shape
    rank = len(shape.dims)
    m2m = shape.layout.minor_to_major if shape.layout and shape.layout.minor_to_major else tuple(
        range(rank - 1, -1, -1))
    bits = shapes.ELEMENT_BITS[shape.dtype]
    if rank == 0:
        tiles: tuple[tuple[int, ...], ...] = ((128,),)
    elif rank == 1:
        tiles = ((128 * max(1, 32 // bits),),)
    else:
        sublanes = 8 * max(1, 32 // bits)
        tiles = ((sublanes, 128),) + (((32 // bits, 1),) if bits < 32 else ())
    space = shape.layout.memory_space if shape.layout else 0
    return shapes.Shape(shape.dtype, shape.dims, shapes.Layout(m2m, tiles, 0, 1, space), dynamic=shape.dynamic)


def _has_tpu_tiles(shape: shapes.Shape) -> bool:
    if shape.is_tuple:
        return any(_has_tpu_tiles(s) for s in shape.tuple_shapes)
    return bool(shape.layout and shape.layout.tiles)


def from_text(text: str, source: str, target: str | None) -> ModuleMemory:
    module = hlo_text.parse(text, source)
    return _estimate(module, source, "hlo_text", target)


def from_module_proto(module_proto, source: str, target: str | None) -> ModuleMemory:
    """An HloModuleProto with no buffer assignment: estimate from its entry computation."""
    from tpuprof.analyses.buffers import InstructionIndex
    instructions = InstructionIndex(module_proto)
    module = hlo_text.TextModule(name=module_proto.name)
    entry = next((c for c in module_proto.computations if c.id == module_proto.entry_computation_id),
                 module_proto.computations[-1])
    module.entry = entry.name
    names = {i.id: i.name for i in entry.instructions}
    module.computations[entry.name] = [
        hlo_text.TextInstruction(
            name=i.name, shape=shapes.from_proto(i.shape), opcode=i.opcode,
            operands=[names[o] for o in i.operand_ids if o in names], computation=entry.name,
            is_root=i.id == entry.root_id, op_name=i.metadata.op_name,
            source_line=instructions.source_line(i),
        )
        for i in entry.instructions
    ]
    return _estimate(module, source, "hlo_proto", target)


def _estimate(module: hlo_text.TextModule, source: str, kind: str, target: str | None) -> ModuleMemory:
    entry = module.entry_instructions
    tiled = any(_has_tpu_tiles(i.shape) for i in entry)
    if not tiled and target is None:
        raise UserError(f"{source} has no TPU layouts (CPU/GPU/TensorFlow HLO): pass --target "
                        "v2|v3|v4|v5e|v5p|v6e to estimate it with the default TPU tiling.")
    result = ModuleMemory(name=module.name, source=source, source_kind=kind, target=target)
    if not tiled:
        result.estimated = True
        result.notes.append(
            "No TPU layouts in this HLO: sizes simulate the default TPU tiling (minor dim to 128, "
            "second-minor to 8/16/32 by element width) on the dims as laid out. Treat it as an upper bound: "
            "libtpu picks layouts that often pad far less (e.g. batch-minor for convolutions); "
            "`--compile` on the module proto, or `tpuprof preflight`, gives the exact figures."
        )
    result.notes.append("No buffer assignment: the peak is a liveness estimate over the entry computation.")

    last_use: dict[str, int] = {}
    for position, instruction in enumerate(entry):
        for operand in instruction.operands:
            last_use[operand] = position
    sizes: dict[str, tuple[int, int]] = {}
    for position, instruction in enumerate(entry):
        if instruction.opcode in NO_ALLOCATION:
            continue
        shape = instruction.shape if tiled else default_tpu_layout(instruction.shape)
        if shape.memory_space != 0:
            continue
        if instruction.opcode == "parameter":
            kind_of = PARAMETER
        elif instruction.is_root:
            kind_of = OUTPUT
        elif instruction.opcode == "constant":
            kind_of = CONSTANT
        else:
            kind_of = TEMP
        padded, unpadded = _tuple_aware_sizes(shape)
        sizes[instruction.name] = (padded, unpadded)
        buffer = Buffer(id=position, instruction=instruction.name, opcode=instruction.opcode, shape="",
                        size_bytes=padded, unpadded_bytes=unpadded, allocation_type=kind_of,
                        op_name=instruction.op_name, source_line=instruction.source_line)
        fill_shape_details(buffer, shape)
        result.buffers.append(buffer)
        if kind_of == PARAMETER:
            result.argument_bytes += padded
        elif kind_of == OUTPUT:
            result.output_bytes += padded
        else:
            result.temp_bytes += padded

    # Liveness: parameters and the output live throughout; others from definition to last use.
    end = len(entry)
    events: list[tuple[int, int, int, str]] = []
    for buffer in result.buffers:
        start = 0 if buffer.allocation_type in (PARAMETER, CONSTANT) else buffer.id
        stop = end if buffer.allocation_type in (PARAMETER, OUTPUT, CONSTANT) else last_use.get(buffer.instruction,
                                                                                                 buffer.id)
        events.append((start, stop, buffer.size_bytes, buffer.instruction))
    unpadded_of = {b.instruction: b.unpadded_bytes for b in result.buffers}
    delta = [0] * (end + 2)
    delta_unpadded = [0] * (end + 2)
    for start, stop, size, name in events:
        delta[start] += size
        delta[stop + 1] -= size
        delta_unpadded[start] += unpadded_of[name]
        delta_unpadded[stop + 1] -= unpadded_of[name]
    total = total_unpadded = peak = peak_unpadded = 0
    for position in range(end + 1):
        total += delta[position]
        total_unpadded += delta_unpadded[position]
        result.heap_timeline.append(total)
        result.unpadded_timeline.append(total_unpadded)
        if total > peak:
            peak, peak_unpadded, result.peak_position = total, total_unpadded, position
    peak_set = {name for start, stop, _, name in events if start <= result.peak_position <= stop} if peak else set()
    result.peak_heap_bytes = peak
    result.peak_unpadded_heap_bytes = peak_unpadded
    for buffer in result.buffers:
        buffer.live_at_peak = buffer.instruction in peak_set
    result.buffers.sort(key=lambda b: (-b.size_bytes, -b.padding_bytes, b.id))
    result.ops, result.ops_scope = aggregate_ops(result.buffers, has_peak=bool(peak_set))
    return result


def _tuple_aware_sizes(shape: shapes.Shape) -> tuple[int, int]:
    """A tuple-shaped result (e.g. a multi-output fusion) owns its elements' buffers too."""
    if shape.is_tuple:
        padded = unpadded = 0
        for element in shape.tuple_shapes:
            p, u = _tuple_aware_sizes(element)
            padded, unpadded = padded + p, unpadded + u
        return padded, unpadded
    return shape.padded_bytes(), shape.unpadded_bytes()
