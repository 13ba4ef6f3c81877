"""What every memory reader (HloProto, buffer-assignment text, HLO estimate) shares: shape details of a
buffer, per-framework-op totals, and the instruction index of an HloModuleProto.

Kept apart from analyses/memory.py, which dispatches to those readers, so that none of them imports it.
"""

from __future__ import annotations

from tpuprof.models import shape as shapes
from tpuprof.models.memory import Buffer, OpTotal


class MissingInstructions(Exception):
    """A module read in part (hlo_dump.read_buffer_definers) lacks an instruction a buffer needs."""


class InstructionIndex:
    """Instruction lookup by id, with the module's stack frames for source lines."""

    def __init__(self, module, needed: set[int] | None = None, whole_module: bool = True):
        # Large modules have tens of thousands of instructions, most in fusion computations that own no
        # buffer. XLA numbers an instruction (computation id << 32 | local id): visit only the computations
        # that define a needed instruction, and everything if that numbering does not hold. A module read in part
        # (whole_module=False) that still lacks one raises MissingInstructions: the rest of it may hold it.
        self.by_id = {}
        self._frames = module.stack_frame_index
        owners = {i >> 32 for i in needed} if needed else None
        self._index(module, needed, owners)
        if needed and not needed <= self.by_id.keys():
            self._index(module, needed, None)
            if not whole_module and not needed <= self.by_id.keys():
                raise MissingInstructions

    def _index(self, module, needed, owners) -> None:
        for computation in module.computations:
            if owners is not None and computation.id not in owners:
                continue
            for instruction in computation.instructions:
                instruction_id = instruction.id
                if needed is None or instruction_id in needed:
                    self.by_id[instruction_id] = instruction

    def source_line(self, instruction) -> str:
        metadata = instruction.metadata
        if metadata.source_file:
            return f"{metadata.source_file}:{metadata.source_line}"
        frame_id = metadata.stack_frame_id
        index = self._frames
        if frame_id and 0 < frame_id <= len(index.stack_frames):
            location_id = index.stack_frames[frame_id - 1].file_location_id
            if 0 < location_id <= len(index.file_locations):
                location = index.file_locations[location_id - 1]
                if 0 < location.file_name_id <= len(index.file_names):
                    return f"{index.file_names[location.file_name_id - 1]}:{location.line}"
        return ""


def fill_shape_details(buffer: Buffer, shape: shapes.Shape) -> None:
    buffer.shape = shape.text()
    buffer.dtype = shape.dtype
    buffer.padded_dims = shape.padded_dims()
    if shape.layout is not None and not shape.is_tuple:
        buffer.minor_to_major = shape.layout.minor_to_major
        buffer.tile = shape.layout.tiles[0] if shape.layout.tiles else ()


def aggregate_ops(buffers: list[Buffer], has_peak: bool) -> tuple[list[OpTotal], str]:
    """Totals per framework op over the buffers live at the peak (or over all, with no peak)."""
    scope = "peak" if has_peak else "all"
    totals: dict[str, OpTotal] = {}
    for buffer in buffers:
        if has_peak and not buffer.live_at_peak:
            continue
        key = buffer.op_name or f"({buffer.opcode} without op_name)"
        total = totals.get(key)
        if total is None:
            total = totals[key] = OpTotal(key)
        total.size_bytes += buffer.size_bytes
        total.unpadded_bytes += buffer.unpadded_bytes
        total.buffers += 1
        if buffer.padding_bytes > total.worst_padding_bytes:
            total.worst_padding_bytes = buffer.padding_bytes
            total.worst_buffer = buffer.instruction
    ops = sorted(totals.values(), key=lambda t: (-t.size_bytes, t.op_name))
    return ops, scope
