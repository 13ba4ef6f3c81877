"""What every memory reader (HloProto, buffer-assignment text, HLO estimate) shares: shape details of a
buffer and per-framework-op totals.

Kept apart from analyses/memory.py, which dispatches to those readers, so that none of them imports it.
"""

from __future__ import annotations

from tpuprof.models import shape as shapes
from tpuprof.models.memory import Buffer, OpTotal


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
