"""The one index of an HloModuleProto the analyses share (memory, HLO estimate, step estimate, collectives):
computations and instructions by id, each computation's users, what an instruction calls, shapes converted once,
source lines from the module's stack frames, and the parts and trip counts of its while loops.

It reads the proto it is given and nothing else: sources/hlo_dump.py reads the files.
"""

from __future__ import annotations

import json
import math
from functools import cached_property

from tpuprof.models import shape as shapes


class MissingInstructions(Exception):
    """A module read in part (hlo_dump.read_buffer_definers) lacks an instruction a buffer needs."""


class HloModule:
    """An HloModuleProto and its lookups, each built when first asked."""

    def __init__(self, proto):
        self.proto = proto
        self.name = proto.name
        self._by_id: dict | None = None
        self._shapes: dict[int, shapes.Shape] = {}
        self._users: dict[int, dict[int, list]] = {}
        self._parameter_loops: dict | None = None

    @cached_property
    def computations(self) -> dict:
        """Computation id -> computation."""
        return {c.id: c for c in self.proto.computations}

    @property
    def entry(self):
        """The entry computation (XLA lists it last when the module does not name it)."""
        return self.computations.get(self.proto.entry_computation_id) or self.proto.computations[-1]

    @property
    def by_id(self) -> dict:
        """Every instruction of the module by id."""
        if self._by_id is None:
            self._by_id = {i.id: i for c in self.proto.computations for i in c.instructions}
        return self._by_id

    def find(self, needed: set[int], whole_module: bool = True) -> dict:
        """The instructions of NEEDED by id, visiting as little of the module as it can.

        Large modules have tens of thousands of instructions, most in fusion computations that own no buffer. XLA
        numbers an instruction (computation id << 32 | local id): visit only the computations that define a needed
        instruction, and everything if that numbering does not hold. A module read in part (whole_module=False)
        that still lacks one raises MissingInstructions: the rest of it may hold it."""
        found: dict = {}
        if not needed:
            return found
        self._find(needed, {i >> 32 for i in needed}, found)
        if not needed <= found.keys():
            self._find(needed, None, found)
            if not whole_module and not needed <= found.keys():
                raise MissingInstructions
        return found

    def _find(self, needed: set[int], owners: set[int] | None, found: dict) -> None:
        for computation in self.proto.computations:
            if owners is not None and computation.id not in owners:
                continue
            for instruction in computation.instructions:
                instruction_id = instruction.id
                if instruction_id in needed:
                    found[instruction_id] = instruction

    def called(self, instruction) -> list:
        """The computations an instruction calls (fusion body, loop body and condition, branches...)."""
        return [self.computations[c] for c in instruction.called_computation_ids if c in self.computations]

    def shape(self, instruction) -> shapes.Shape:
        cached = self._shapes.get(instruction.id)
        if cached is None:
            cached = self._shapes[instruction.id] = shapes.from_proto(instruction.shape)
        return cached

    def users(self, computation) -> dict[int, list]:
        """Instruction id -> the instructions of COMPUTATION that use it."""
        users = self._users.get(computation.id)
        if users is None:
            users = {i.id: [] for i in computation.instructions}
            for instruction in computation.instructions:
                for operand in instruction.operand_ids:
                    users.setdefault(operand, []).append(instruction)
            self._users[computation.id] = users
        return users

    def roots(self, computation) -> list:
        """The root of a computation, or the elements of its root tuple."""
        root = self.by_id.get(computation.root_id)
        if root is None:
            return []
        if root.opcode == "tuple":
            return [self.by_id[o] for o in root.operand_ids if o in self.by_id]
        return [root]

    def source_line(self, instruction) -> str:
        """`file:line` of the framework code an instruction came from, from its metadata or stack frame."""
        metadata = instruction.metadata
        if metadata.source_file:
            return f"{metadata.source_file}:{metadata.source_line}"
        frame_id = metadata.stack_frame_id
        index = self.proto.stack_frame_index
        if frame_id and 0 < frame_id <= len(index.stack_frames):
            location_id = index.stack_frames[frame_id - 1].file_location_id
            if 0 < location_id <= len(index.file_locations):
                location = index.file_locations[location_id - 1]
                if 0 < location.file_name_id <= len(index.file_names):
                    return f"{index.file_names[location.file_name_id - 1]}:{location.line}"
        return ""

    # --- while loops ---------------------------------------------------------------------------------------

    def loop_parts(self, loop):
        """(body, condition) of a while: XLA keeps them as called computations [body, condition]."""
        called = [self.computations.get(c) for c in loop.called_computation_ids]
        if len(called) != 2 or None in called:
            return None, None
        body, condition = called
        if self.shape(self.by_id[condition.root_id]).dtype != "pred":
            body, condition = condition, body
        return body, condition

    def loop_of(self, parameter):
        """The while loop whose body or condition declares PARAMETER, or None."""
        if self._parameter_loops is None:  # parameter id -> its while, once per module
            loops = {called: i for c in self.proto.computations for i in c.instructions
                     if i.opcode == "while" and i.operand_ids for called in i.called_computation_ids}
            self._parameter_loops = {
                i.id: loops[c.id] for c in self.proto.computations if c.id in loops
                for i in c.instructions if i.opcode == "parameter"}
        return self._parameter_loops.get(parameter.id)

    def trip_count(self, loop) -> tuple[int, str]:
        """(trips, how): the compiler's known_trip_count when recorded, else inferred from the condition, else 1."""
        config = backend_config(loop)
        known = config.get("known_trip_count")
        if isinstance(known, dict) and str(known.get("n", "")).lstrip("-").isdigit():
            return max(int(known["n"]), 0), "known_trip_count"
        inferred = self.infer_trip_count(loop)
        if inferred is not None:
            return inferred, "inferred"
        return 1, "unknown"

    def infer_trip_count(self, loop) -> int | None:
        """`while (i < N)` with i from a constant, stepped by a constant in the body: the trip count."""
        body, condition = self.loop_parts(loop)
        if condition is None or body is None:
            return None
        compare = self.through_copies(self.by_id.get(condition.root_id))
        if compare is None or compare.opcode != "compare" or len(compare.operand_ids) != 2:
            return None
        lhs, rhs = (self.through_copies(self.by_id.get(o)) for o in compare.operand_ids)
        direction = compare.comparison_direction
        flipped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}
        if lhs is not None and lhs.opcode == "constant" and rhs is not None and rhs.opcode == "get-tuple-element":
            lhs, rhs, direction = rhs, lhs, flipped.get(direction, direction)
        if lhs is None or lhs.opcode != "get-tuple-element" or rhs is None or rhs.opcode != "constant":
            return None
        index = lhs.tuple_index
        limit = scalar(rhs)
        start = self._initial_value(loop, index)
        step = self._step(body, index)
        if limit is None or start is None or not step:
            return None
        if direction in ("LT", "NE") and step > 0:
            return max(math.ceil((limit - start) / step), 0)
        if direction == "LE" and step > 0:
            return max(math.floor((limit - start) / step) + 1, 0)
        if direction == "GT" and step < 0:
            return max(math.ceil((start - limit) / -step), 0)
        if direction == "GE" and step < 0:
            return max(math.floor((start - limit) / -step) + 1, 0)
        return None

    def through_copies(self, instruction):
        """INSTRUCTION, or the value it copies, bitcasts or converts, followed to its source."""
        while instruction is not None and instruction.opcode in ("copy", "bitcast", "convert") and instruction.operand_ids:
            instruction = self.by_id.get(instruction.operand_ids[0])
        return instruction

    def _initial_value(self, loop, index: int) -> float | None:
        init = self.through_copies(self.by_id.get(loop.operand_ids[0])) if loop.operand_ids else None
        if init is None or init.opcode != "tuple" or index >= len(init.operand_ids):
            return None
        element = self.through_copies(self.by_id.get(init.operand_ids[index]))
        return scalar(element) if element is not None and element.opcode == "constant" else None

    def _step(self, body, index: int) -> float | None:
        root = self.by_id.get(body.root_id)
        if root is None or root.opcode != "tuple" or index >= len(root.operand_ids):
            return None
        update = self.through_copies(self.by_id.get(root.operand_ids[index]))
        if update is None or update.opcode not in ("add", "subtract"):
            return None
        a, b = (self.through_copies(self.by_id.get(o)) for o in update.operand_ids)

        def is_counter(i):
            return i is not None and i.opcode == "get-tuple-element" and i.tuple_index == index

        if is_counter(a) and b is not None and b.opcode == "constant":
            step = scalar(b)
        elif update.opcode == "add" and is_counter(b) and a is not None and a.opcode == "constant":
            step = scalar(a)
        else:
            return None
        if step is None:
            return None
        return -step if update.opcode == "subtract" else step


def backend_config(instruction) -> dict:
    """An instruction's backend_config (JSON in XLA:TPU's protos) as a dict; {} when it holds none."""
    raw = instruction.backend_config
    if not raw:
        return {}
    try:
        value = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def scalar(constant) -> float | None:
    """The value of a scalar integer constant (its literal)."""
    literal = constant.literal
    for name in ("s32s", "s64s", "u32s", "u64s", "s16s", "u16s", "s8s", "u8s"):
        values = getattr(literal, name, None)
        if values is not None and len(values) == 1:
            return float(values[0])
    if literal.s8s and len(literal.s8s) == 1:
        return float(int.from_bytes(literal.s8s, "little", signed=True))
    return None
