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


def donation_candidates(parameters, result: shapes.Shape,
                        aliases: tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...] = ()) -> list[str]:
    """The entry parameters an output could be written over if the step donated them: each array of PARAMETERS
    ((number, label, shape), in number order) that no alias already gives an output, matched one to one with an
    array of the entry's RESULT of the same dtype and dims that no alias holds (a train step returns its new state
    in the old state's shapes). Labels: the parameter's label, with the array's index in a tuple parameter."""
    held = {tuple(out_index) for out_index, _, _ in aliases}
    given = {(number, tuple(index)) for _, number, index in aliases}
    wanted: dict[tuple, int] = {}
    for index, leaf in _arrays(result):
        if index not in held:
            key = (leaf.dtype, leaf.dims)
            wanted[key] = wanted.get(key, 0) + 1
    candidates = []
    for number, label, shape in sorted(parameters, key=lambda p: p[0]):
        for index, leaf in _arrays(shape):
            key = (leaf.dtype, leaf.dims)
            if (number, index) in given or not wanted.get(key):
                continue
            wanted[key] -= 1
            candidates.append(label + ("{" + ",".join(map(str, index)) + "}" if index else ""))
    return candidates


def _arrays(shape: shapes.Shape, index: tuple[int, ...] = ()):
    if shape.is_tuple:
        for n, element in enumerate(shape.tuple_shapes):
            yield from _arrays(element, (*index, n))
    elif shape.dtype not in shapes.NON_ARRAY_TYPES:
        yield index, shape
