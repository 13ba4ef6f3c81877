"""Read HLO text (`module.after_optimizations.txt`, CPU/GPU/TF dumps): instructions, shapes, metadata."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tpuprof.errors import UserError
from tpuprof.models.shape import Shape, parse_shape_prefix, strip_comments

# A computation header: `[ENTRY] %name (params) -> result {`. Matched at its start only, after cheap checks of
# '->' and the closing '{': one regex over the whole line backtracks quadratically on a long hostile line.
_COMPUTATION_RE = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(|->)")
_INSTRUCTION_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE_RE = re.compile(r"\s*([\w\-]+)\(")
_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_METADATA_RE = {
    "op_name": re.compile(r'op_name="((?:[^"\\]|\\.)*)"'),
    "source_file": re.compile(r'source_file="((?:[^"\\]|\\.)*)"'),
    "source_line": re.compile(r"source_line=(\d+)"),
}


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


@dataclass
class TextModule:
    name: str
    entry: str = ""
    computations: dict[str, list[TextInstruction]] = field(default_factory=dict)

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


def _parse_instruction(line: str, computation: str, source: str) -> TextInstruction | None:
    line = strip_comments(line)  # long tuples carry /*index=5*/ markers
    match = _INSTRUCTION_RE.match(line)
    if not match:
        return None
    try:
        shape, end = parse_shape_prefix(line, match.end())
    except UserError as error:
        raise UserError(f"{source}: {error}") from None
    opcode_match = _OPCODE_RE.match(line, end)
    if not opcode_match:
        return None
    operands_text, rest = _balanced(line, opcode_match.end() - 1)
    operands = [m.group(1) for m in _NAME_RE.finditer(operands_text) if "%" in m.group(0)]
    if not operands:  # HLO printed without '%' sigils: operands are the bare names after shapes
        operands = [tok.split()[-1] for tok in _split_top(operands_text) if tok.strip()]
    op_name = _METADATA_RE["op_name"].search(rest)
    source_file = _METADATA_RE["source_file"].search(rest)
    source_line = _METADATA_RE["source_line"].search(rest)
    return TextInstruction(
        name=match.group(2), shape=shape, opcode=opcode_match.group(1), operands=operands,
        computation=computation, is_root=bool(match.group(1)),
        op_name=op_name.group(1) if op_name else "",
        source_line=f"{source_file.group(1)}:{source_line.group(1)}" if source_file and source_line else "",
    )


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
