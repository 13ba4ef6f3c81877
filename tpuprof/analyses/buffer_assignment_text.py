"""HBM use from `*-buffer-assignment.txt` (the text form of XLA's buffer assignment).

It lists allocations and the values (logical buffers) in each, with the compiler's padded sizes,
but no heap trace. The peak is therefore the sum of the allocations live for the whole program plus
the temporary allocations, whose size is the heap's high-water mark including fragmentation: an upper
bound of the HloProto's simulated peak. Framework op names come from the HLO text beside it, if any.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpuprof.analyses.buffers import aggregate_ops, fill_shape_details
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.models.memory import CONSTANT, OUTPUT, PARAMETER, TEMP, THREAD_LOCAL, Buffer, ModuleMemory
from tpuprof.sources import hlo_text
from tpuprof.units import read_int

# Possessive digits: with `(\d+)(.*):` a million-digit size was split every way before failing (27 s a line).
_ALLOCATION_RE = re.compile(r"^allocation (\d++): size (\d++)(.*):\s*$")
_VALUE_RE = re.compile(r"^\s+value: <(\d+) ([^ >]+) @(\d+)> \(size=(\d+),offset=(\d+)\): (.*)$")
_COLOR_RE = re.compile(r"\bcolor (\d+)")


def _kind(attributes: str) -> str:
    if re.search(r"\bparameter \d+", attributes):
        return PARAMETER
    if "maybe-live-out" in attributes:
        return OUTPUT
    if "thread-local" in attributes:
        return THREAD_LOCAL
    if "constant" in attributes:
        return CONSTANT
    return TEMP


def from_text(text: str, source: str, hlo_text_beside: str | None = None) -> ModuleMemory:
    """The memory of a buffer-assignment text (read from SOURCE); op names, source lines and opcodes from the
    module's HLO text beside it when there is one (hlo_dump.read_hlo_text_beside)."""
    metadata = _metadata(hlo_text_beside, source) if hlo_text_beside is not None else {}
    result = ModuleMemory(name=Path(source).name.split(".after_optimizations")[0], source=source,
                          source_kind="buffer_assignment")
    result.notes.append("From buffer-assignment text: the peak adds up allocation sizes (fragmentation "
                        "included); the HloProto dump (--xla_dump_hlo_as_proto) gives the exact simulated peak.")
    allocations = 0
    kind, color = TEMP, 0
    for line in text.splitlines():
        match = _ALLOCATION_RE.match(line)
        if match:
            allocations += 1
            size, attributes = read_int(match.group(2), "an allocation size"), match.group(3)
            kind = _kind(attributes)
            color_match = _COLOR_RE.search(attributes)
            color = read_int(color_match.group(1), "an allocation color") if color_match else 0
            if color != 0:
                result.other_memory_spaces[color] = result.other_memory_spaces.get(color, 0) + size
            elif kind == PARAMETER:
                result.argument_bytes += size
                if "maybe-live-out" in attributes:
                    result.output_bytes += size
                    result.aliased_bytes += size
            elif kind == OUTPUT:
                result.output_bytes += size
            elif kind in (TEMP,):
                result.temp_bytes += size
            if color == 0 and kind in (PARAMETER, OUTPUT, CONSTANT, TEMP):
                result.peak_heap_bytes = (result.peak_heap_bytes or 0) + size
            continue
        value = _VALUE_RE.match(line)
        if value is None or color != 0:
            continue
        value_id, name, _, size, _, shape_text = value.groups()
        shape = shapes.parse_shape(shape_text)
        instruction = name.split("{")[0]
        op_name, source_line, opcode = metadata.get(instruction, ("", "", ""))
        buffer = Buffer(id=read_int(value_id, "a value id"), instruction=name, opcode=opcode, shape="",
                        size_bytes=read_int(size, "a value size"),
                        unpadded_bytes=shape.unpadded_bytes(), allocation_type=kind, op_name=op_name,
                        source_line=source_line, live_at_peak=False)
        fill_shape_details(buffer, shape)
        result.buffers.append(buffer)
    if not allocations:
        raise UserError(f"{source} holds no buffer allocations: not a buffer-assignment dump.")
    result.allocated_bytes = result.peak_heap_bytes  # the text's peak is its allocations added up
    result.buffers.sort(key=lambda b: (-b.size_bytes, -b.padding_bytes, b.id))
    result.ops, result.ops_scope = aggregate_ops(result.buffers, has_peak=False)
    return result


def _metadata(text: str, source: str) -> dict[str, tuple[str, str, str]]:
    """op_name, source line and opcode per instruction of the module's HLO text."""
    try:
        module = hlo_text.parse(text, source)
    except UserError:
        return {}
    return {i.name: (i.op_name, i.source_line, i.opcode) for i in module.by_name().values()}
