"""Read HLO text (`module.after_optimizations.txt`, CPU/GPU/TF dumps): instructions, shapes, metadata."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tpuprof.errors import UserError
from tpuprof.models.shape import Shape, parse_shape_prefix, strip_comments
from tpuprof.units import read_int

# A computation header: `[ENTRY] %name (params) -> result {`. Matched at its start only, after cheap checks of
# '->' and the closing '{': one regex over the whole line backtracks quadratically on a long hostile line.
_COMPUTATION_RE = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(|->)")
_INSTRUCTION_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE_RE = re.compile(r"\s*([\w\-]+)\(")
_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*)")
# Attributes the memory estimate needs: called computations, the tuple index of a get-tuple-element, in-place
# aliasing of a fusion/custom-call output with an operand, a parameter's number.
_CALLED_RE = re.compile(r"\b(calls|body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES_RE = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_INDEX_RE = re.compile(r"\bindex=(\d+)")
_FUSION_KIND_RE = re.compile(r"\bkind=(k\w+)")
# libtpu's backend_config names the operand whose buffer an output takes: {"indices":["1","2"]} pairs operand 1
# with index 2, the output (operands are numbered first, then the output).
_INDICES_RE = re.compile(r'"indices":\["(\d+)","(\d+)"\]')
_ALIAS_RE = re.compile(r"\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}")
_OPERAND_ALIASING_RE = re.compile(r"\boutput_to_operand_aliasing=\{(.*?\))\s*\}")
_INPUT_OUTPUT_ALIAS_RE = re.compile(r"\binput_output_alias=\{(.*?\))\s*\}")
_METADATA_RE = {
    "op_name": re.compile(r'op_name="((?:[^"\\]|\\.)*)"'),
    "source_file": re.compile(r'source_file="((?:[^"\\]|\\.)*)"'),
    "source_line": re.compile(r"source_line=(\d+)"),
}


def _unescape(value: str) -> str:
    """A metadata string as XLA printed it, C-escaped (absl::CEscape: \\', \\", \\\\, octal bytes), back to what the
    HloProto holds."""
    if "\\" not in value:
        return value
    import codecs

    return codecs.escape_decode(value.encode("ascii", "backslashreplace"))[0].decode("utf-8", "replace")


@dataclass
class TextInstruction:
    name: str
    shape: Shape
    opcode: str
    operands: list[str]
    computation: str
    is_root: bool = False
    op_name: str = ""
    source_line: str = ""
    called: tuple[str, ...] = ()  # computations it calls (fusion, while body and condition, branches...)
    index: int | None = None  # get-tuple-element's tuple index
    parameter_number: int | None = None
    fusion_kind: str = ""  # kLoop, kInput, kOutput, kCustom
    # (output shape index, operand number, operand shape index): outputs computed in place in an operand.
    operand_aliasing: tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...] = ()


@dataclass
class TextModule:
    name: str
    entry: str = ""
    computations: dict[str, list[TextInstruction]] = field(default_factory=dict)
    scheduled: bool = False  # `is_scheduled=true`: each computation lists its instructions in execution order
    # (output shape index, parameter number, parameter shape index): donated parameters the outputs reuse.
    input_output_alias: tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...] = ()

    @property
    def entry_instructions(self) -> list[TextInstruction]:
        return self.computations.get(self.entry, [])

    def by_name(self) -> dict[str, TextInstruction]:
        return {i.name: i for instructions in self.computations.values() for i in instructions}


def parse(text: str, source: str = "HLO text") -> TextModule:
    lines = text.splitlines()
    header = next((line for line in lines if line.strip()), "")
    if not header.startswith("HloModule"):
        raise UserError(f"{source} is not HLO text: it does not start with 'HloModule'.")
    module = TextModule(name=header.split()[1].rstrip(",") if len(header.split()) > 1 else "module")
    module.scheduled = "is_scheduled=true" in header
    alias = _INPUT_OUTPUT_ALIAS_RE.search(header)
    if alias:
        module.input_output_alias = _aliases(alias.group(1))
    open_at_end = _open_at_end(lines)
    if open_at_end:
        raise UserError(f"{source} ends inside computation {open_at_end} (no closing '}}'): the file is cut short; "
                        f"give the whole dump file.")
    current: list[TextInstruction] | None = None
    current_name = ""
    for line in lines:
        stripped = line.strip()
        if current is None:
            match = _COMPUTATION_RE.match(stripped) if stripped.endswith("{") and "->" in stripped else None
            if match:
                current_name = match.group(2)
                current = module.computations.setdefault(current_name, [])
                if match.group(1):
                    module.entry = current_name
            continue
        if stripped == "}":
            current = None
            continue
        instruction = _parse_instruction(line, current_name, source)
        if instruction is not None:
            current.append(instruction)
    if not module.entry and module.computations:
        module.entry = list(module.computations)[-1]  # XLA prints the entry computation last
    if not module.computations:
        raise UserError(f"{source} holds no HLO computations.")
    return module


def _open_at_end(lines: list[str]) -> str:
    """The computation a text ends inside, or "": checked before its instructions are read, so that a copy cut short
    is said to be one, not blamed on whatever its last, half line or the missing ones leave unresolved."""
    name = ""
    for line in lines:
        stripped = line.strip()
        if not name:
            match = _COMPUTATION_RE.match(stripped) if stripped.endswith("{") and "->" in stripped else None
            name = match.group(2) if match else ""
        elif stripped == "}":
            name = ""
    return name


def _parse_instruction(line: str, computation: str, source: str) -> TextInstruction | None:
    line = strip_comments(line)  # long tuples carry /*index=5*/ markers
    match = _INSTRUCTION_RE.match(line)
    if not match:
        return None
    shape, end = _shape_at(line, match.end(), source)
    opcode_match = _OPCODE_RE.match(line, end)
    if not opcode_match:
        return None
    operands_text, rest = _balanced(line, opcode_match.end() - 1)
    operands = [m.group(1) for m in _NAME_RE.finditer(operands_text) if "%" in m.group(0)]
    if not operands:  # HLO printed without '%' sigils: operands are the bare names after shapes
        operands = [tok.split()[-1] for tok in _split_top(operands_text) if tok.strip()]
    opcode = opcode_match.group(1)
    parameter_number = None
    if opcode in ("parameter", "constant", "iota"):  # what follows is a number or literal, not operands
        parameter_number = (read_int(operands_text, "a parameter number") if opcode == "parameter"
                            and operands_text.strip().isdigit() else None)
        operands = []
    attributes = rest.split(", metadata={", 1)[0].split(", backend_config=", 1)[0]
    roles = {m.group(1): m.group(2) for m in _CALLED_RE.finditer(attributes)}
    # A while loop lists its body first (XLA's order), whatever order the text prints them in.
    called = [roles.pop(role) for role in ("body", "condition") if role in roles] + list(roles.values())
    branches = _BRANCHES_RE.search(attributes)
    if branches:
        called += [name.strip().lstrip("%") for name in branches.group(1).split(",") if name.strip()]
    index = _INDEX_RE.search(attributes) if opcode == "get-tuple-element" else None
    aliasing = _OPERAND_ALIASING_RE.search(attributes)
    fusion_kind = _FUSION_KIND_RE.search(attributes) if opcode == "fusion" else None
    op_name = _METADATA_RE["op_name"].search(rest)
    source_file = _METADATA_RE["source_file"].search(rest)
    source_line = _METADATA_RE["source_line"].search(rest)
    return TextInstruction(
        name=match.group(2), shape=shape, opcode=opcode, operands=operands,
        computation=computation, is_root=bool(match.group(1)), called=tuple(called),
        index=read_int(index.group(1), "a tuple index") if index else None, parameter_number=parameter_number,
        fusion_kind=fusion_kind.group(1) if fusion_kind else "",
        operand_aliasing=(_aliases(aliasing.group(1)) if aliasing else
                          backend_aliasing(rest, len(operands), shape.is_tuple)),
        op_name=_unescape(op_name.group(1)) if op_name else "",
        source_line=(f"{_unescape(source_file.group(1))}:{source_line.group(1)}" if source_file and source_line
                     else ""),
    )


_SHAPES: dict[str, tuple[Shape, int]] = {}  # shape text -> (shape, length): large modules repeat a few shapes
_MAX_CACHED_SHAPES = 200_000


def _shape_at(line: str, start: int, source: str) -> tuple[Shape, int]:
    """The shape that starts at START and where it ends. An array shape runs to the first space, a tuple to its
    closing parenthesis; parses are cached by text, since a module's instructions share a few hundred shapes."""
    if line.startswith("(", start):
        close = _closing(line, start)
        stop = close + 1 if close > 0 else -1
    else:
        stop = line.find(" ", start)
    key = line[start:stop] if stop > start else None
    cached = _SHAPES.get(key) if key is not None else None
    if cached is not None:
        return cached[0], start + cached[1]
    try:
        shape, end = parse_shape_prefix(line, start)
    except UserError as error:
        raise UserError(f"{source}: {error}") from None
    if key is not None and end == stop:
        if len(_SHAPES) >= _MAX_CACHED_SHAPES:
            _SHAPES.clear()
        _SHAPES[key] = (shape, end - start)
    return shape, end


def _closing(text: str, open_at: int) -> int:
    """Where the parenthesis opened at OPEN_AT closes (-1 if it does not); brackets and braces nest inside."""
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def backend_aliasing(rest: str, operand_count: int, tuple_result: bool = False
                     ) -> tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...]:
    """libtpu's `aliasing_operands` pairs (operand, output): outputs are numbered after the operands, one number per
    array of the result: the result itself when it is an array, element k of a tuple result as operand_count + k
    (a 3-operand all-reduce returning 3 arrays lists ["0","3"], ["1","4"]: {0} in operand 0, {1} in operand 1)."""
    if '"aliasing_operands":{"lists":[{' not in rest:
        return ()
    lists = rest[rest.index('"aliasing_operands":{"lists":[{'):]
    pairs = []
    for match in _INDICES_RE.finditer(lists[:lists.find("]}") + 2 if "]}]" not in lists else lists.find("]}]") + 3]):
        operand, output = sorted((read_int(match.group(1), "an aliasing operand"),
                                  read_int(match.group(2), "an aliasing operand")))
        if operand < operand_count <= output:
            element = output - operand_count
            pairs.append(((element,) if tuple_result or element else (), operand, ()))
    return tuple(pairs)


def _aliases(text: str) -> tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...]:
    """`{0}: (0, {}, may-alias), {1}: (2, {0})` -> ((0,), 0, ()), ((1,), 2, (0,))."""
    return tuple((_index(m.group(1)), read_int(m.group(2), "an aliased parameter"), _index(m.group(3)))
                 for m in _ALIAS_RE.finditer(text))


def _index(text: str) -> tuple[int, ...]:
    return tuple(read_int(part, "a shape index") for part in text.split(",") if part.strip())


def _balanced(text: str, open_at: int) -> tuple[str, str]:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "({[":
            depth += 1
        elif text[i] in ")}]":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i], text[i + 1:]
    return text[open_at + 1:], ""


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
