"""HBM for HLO without a TPU buffer assignment: HLO text, or HLO from CPU/GPU/TensorFlow.

The estimate follows what XLA's buffer assignment does, on the text alone:

- values: every instruction defines one value per array in its shape, and one tuple index table per tuple,
  except where XLA's dataflow makes it an alias: get-tuple-element, bitcast and tuple pass their operands'
  values on (a tuple defines only its table); a while loop updates its state in place (operand, body
  parameter, body root and result are one buffer); the `*-start` of an async pair passes its operand on
  and its `*-done` returns the start's result; dynamic-update-slice, scatter, fusions whose root updates a
  parameter in place and `output_to_operand_aliasing` compute into their operand's buffer; a donated
  parameter (`input_output_alias` in the module header) holds the output that reuses it;
- sizes: the padded size of each array with its own layout (TPU tiles and memory space as printed; only
  memory space 0, HBM, counts), tuple tables sized as libtpu sizes them per generation; for text without
  TPU layouts, libtpu's default tiles;
- liveness: entry parameters, constants and the entry's outputs (a tuple ROOT's elements) live for the whole
  program, as XProf counts them; every other buffer from its first definition to its last use in the
  computation that holds it (uses inside a while body or a branch count at the calling instruction); the
  temporaries of a called computation (while body, condition, branches) add at the instruction calling it.
  In a scheduled module (`is_scheduled=true`) the text order is the execution order, so the peak is the
  heap simulator's sum of live buffers without its buffer sharing and fragmentation.
"""

from __future__ import annotations

import math

from tpuprof import targets
from tpuprof.analyses.buffers import aggregate_ops, donation_candidates, fill_shape_details
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.models.hlo_module import HloModule
from tpuprof.models.memory import (
    CONSTANT, OUTPUT, PARAMETER, TEMP, Buffer, ModuleMemory, METHOD_HLO_LIVENESS, METHOD_UNSCHEDULED_BOUND,
)
from tpuprof.sources import hlo_text

TUPLE_TABLE_ENTRY_BYTES = 4
DEFAULT_TUPLE_TABLE_GRANULE = 512  # generation unknown: v4/v5e's

# Largest deviation of the scheduled-text estimate from the exact peak (the buffer assignment / XProf) over the
# libtpu compiles of sample_profiles/estimate (tests/test_hlo_estimate.py checks it stays within this).
EXPECTED_ERROR_PERCENT = 10

# Instructions whose result is (part of) an operand's buffer: (opcode, operand whose buffer it is).
PASS_THROUGH = {"bitcast": 0, "opt-barrier": 0, "add-dependency": 0, "domain": 0}
IN_PLACE = {"dynamic-update-slice": 0, "scatter": 0}
# Async pairs whose start passes its operand(s) on at tuple index {0} and whose done returns index {1}.
ASYNC_STARTS = {"copy-start", "all-gather-start", "collective-permute-start", "async-start", "send", "recv"}


def tuple_table_bytes(elements: int, target: str | None) -> int:
    granule = targets.TARGETS[target].tuple_table_granule_bytes if target in targets.TARGETS else \
        DEFAULT_TUPLE_TABLE_GRANULE
    return max(1, math.ceil(elements * TUPLE_TABLE_ENTRY_BYTES / granule)) * granule


# ---------------------------------------------------------------------------------------------
# Default TPU layouts (text without TPU tiles)
# ---------------------------------------------------------------------------------------------

# Generations whose scalars and small rank-1 arrays of 32-bit (and wider) types tile to 256 elements, not 128.
WIDE_SMALL_TILE_GENERATIONS = {"v2", "v3"}


def default_tpu_layout(shape: shapes.Shape, target: str | None = None) -> shapes.Shape:
    """The tiling libtpu gives an array by default (libtpu 0.0.42.1, all generations), keeping the dims' order
    as laid out: T(8,128) on the two minor dims, with T(1,128)/T(2,128)/T(4,128) when the second-minor dim is
    that small; 16-bit types add (2,1), 8-bit (4,1), 4-bit (8,1) with E(4) (packed); rank 1 T(1024)
    (T(512)/T(256)/T(128) for smaller arrays of wider types), scalars T(128) (T(256) for 16-bit types, T(512) for
    8-bit ones); on v2/v3 the smallest tile of 32-bit scalars and rank-1 arrays is T(256). A size-1 minor dim
    leaves the lanes: libtpu lays the others minor."""
    if shape.is_tuple:
        return shapes.Shape("tuple", tuple_shapes=tuple(default_tpu_layout(s, target) for s in shape.tuple_shapes))
    if shape.dtype in shapes.NON_ARRAY_TYPES:
        return shape
    rank = len(shape.dims)
    m2m = shape.layout.minor_to_major if shape.layout and shape.layout.minor_to_major else tuple(
        range(rank - 1, -1, -1))
    if rank >= 2 and shape.dims[m2m[0]] == 1 and any(d > 1 for d in shape.dims):
        # libtpu does not leave a size-1 dim in the lanes of a buffer (a [time, batch, 1] target would be 128x):
        # f32[64,30840,1] gets {1,2,0:T(1,128)}, f32[N,1] {0,1:T(1,128)}, s32[4096,1,1] {0,2,1:T(1,128)}, whose
        # sizes are those of the size-1 dims made most-major.
        m2m = tuple(d for d in m2m if shape.dims[d] != 1) + tuple(d for d in m2m if shape.dims[d] == 1)
    bits = shapes.ELEMENT_BITS[shape.dtype]
    packing = max(1, 32 // bits) if bits < 32 else 1
    element_bits = bits if bits < 8 else 0
    smallest = 256 if target in WIDE_SMALL_TILE_GENERATIONS else 128
    if rank == 0:
        tiles: tuple[tuple[int, ...], ...] = ((128 * packing if packing > 1 else smallest,),)
    elif rank == 1:
        size = shape.dims[0]
        lanes = 1024 if size > 512 or bits < 32 else max(smallest, 1 << max(0, (size - 1).bit_length()))
        tiles = ((lanes,), (128,)) + (((packing, 1),) if packing > 1 else ())
        if lanes <= 256:
            tiles = ((lanes,),)
    else:
        second_minor = shape.dims[m2m[1]]
        rows = next((r for r in (1, 2, 4) if second_minor <= r), 8) if packing == 1 else 8
        tiles = ((rows, 128),) + (((packing, 1),) if packing > 1 else ())
    space = shape.layout.memory_space if shape.layout else 0
    layout = shapes.Layout(m2m, tiles, element_bits, 1, space)
    return shapes.Shape(shape.dtype, shape.dims, layout, dynamic=shape.dynamic)


def worst_tpu_bytes(shape: shapes.Shape) -> int:
    """An upper bound of an array's padded size under any layout libtpu picks: the two dims that pad most as
    the tiled ones (second-minor to 8 rows, 16 for 16-bit types as on v7x's T(16,128)(2,1), 32 for 8-bit and 64
    for 4-bit types; minor to 128 lanes)."""
    if shape.dtype in shapes.NON_ARRAY_TYPES or shape.is_tuple:
        return 0
    bits = shapes.ELEMENT_BITS[shape.dtype]
    dims = list(shape.dims)
    if len(dims) <= 1:
        count = _round_up(dims[0] if dims else 1, 1024)
        return math.ceil(count * bits / 8) if bits < 8 else count * shapes.element_bytes(shape.dtype)
    rows = 64 if bits < 8 else 32 if bits == 8 else 16 if bits == 16 else 8
    rest = math.prod(dims)
    best = 0
    for minor in range(len(dims)):
        for second in range(len(dims)):
            if minor != second and dims[minor] and dims[second]:
                padded = _round_up(dims[minor], 128) * _round_up(dims[second], rows)
                best = max(best, rest // (dims[minor] * dims[second]) * padded)
    return math.ceil(best * bits / 8) if bits < 8 else best * shapes.element_bytes(shape.dtype)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _has_tpu_tiles(shape: shapes.Shape) -> bool:
    if shape.is_tuple:
        return any(_has_tpu_tiles(s) for s in shape.tuple_shapes)
    return bool(shape.layout and shape.layout.tiles)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

def from_text(text: str, source: str, target: str | None) -> ModuleMemory:
    module = hlo_text.parse(text, source)
    return estimate(module, source, "hlo_text", target)


def from_module_proto(module_proto, source: str, target: str | None, reason: str = "") -> ModuleMemory:
    """An HloModuleProto without a TPU buffer assignment: estimate from its computations (in the order of
    its schedule when it has one)."""
    module = module_from_proto(module_proto)
    result = estimate(module, source, "hlo_proto", target)
    if reason:
        result.notes.insert(0, reason)
    return result


_FUSION_KINDS = {"kLoop": "kLoop", "kInput": "kInput", "kOutput": "kOutput", "kCustom": "kCustom"}


def _text_of(config) -> str:
    return config.decode("utf-8", "replace") if isinstance(config, bytes) else str(config)


def module_from_proto(module_proto) -> hlo_text.TextModule:
    index = HloModule(module_proto)
    module = hlo_text.TextModule(name=module_proto.name)
    sequences = {sid: list(seq.instruction_ids) for sid, seq in module_proto.schedule.sequences.items()}
    module.scheduled = bool(sequences)
    module.input_output_alias = tuple(
        (tuple(e.output_shape_index), e.parameter_number, tuple(e.parameter_shape_index))
        for e in module_proto.input_output_alias.entries)
    for computation in module_proto.computations:
        names = {i.id: i.name for i in computation.instructions}
        ordered = list(computation.instructions)
        if computation.id in sequences:
            position = {iid: n for n, iid in enumerate(sequences[computation.id])}
            ordered.sort(key=lambda i: position.get(i.id, len(position)))
        module.computations[computation.name] = [
            hlo_text.TextInstruction(
                name=i.name, shape=shapes.from_proto(i.shape), opcode=i.opcode,
                operands=[names[o] for o in i.operand_ids if o in names], computation=computation.name,
                is_root=i.id == computation.root_id, op_name=i.metadata.op_name,
                source_line=index.source_line(i), called=tuple(c.name for c in index.called(i)),
                index=i.tuple_index if i.opcode == "get-tuple-element" else None,
                parameter_number=i.parameter_number if i.opcode == "parameter" else None,
                fusion_kind=_FUSION_KINDS.get(i.fusion_kind, "") if i.opcode == "fusion" else "",
                operand_aliasing=tuple((tuple(a.output_shape_index), a.operand_index, tuple(a.operand_shape_index))
                                       for a in i.output_operand_aliasing)
                or hlo_text.backend_aliasing(_text_of(i.backend_config), len(i.operand_ids),
                                             bool(i.shape.tuple_shapes)),
            )
            for i in ordered
        ]
        if computation.id == module_proto.entry_computation_id:
            module.entry = computation.name
    if not module.entry and module.computations:
        module.entry = list(module.computations)[-1]
    return module


# ---------------------------------------------------------------------------------------------
# Dataflow: values and the buffers they share
# ---------------------------------------------------------------------------------------------

class _Value:
    __slots__ = ("name", "index", "opcode", "shape", "size", "unpadded", "worst", "space", "instance", "position",
                 "kind", "op_name", "source_line")

    def __init__(self, name, index, opcode, shape, size, unpadded, worst, space, instance, position, kind,
                 op_name, source_line):
        self.name, self.index, self.opcode, self.shape = name, index, opcode, shape
        self.size, self.unpadded, self.worst, self.space = size, unpadded, worst, space
        self.instance, self.position, self.kind = instance, position, kind
        self.op_name, self.source_line = op_name, source_line


class _Instance:
    """One execution context of a computation: the entry, or a while body/condition/branch at its call site."""

    __slots__ = ("name", "parent", "position", "depth", "length", "children")

    def __init__(self, name, parent, position, depth, length):
        self.name, self.parent, self.position, self.depth, self.length = name, parent, position, depth, length
        self.children: dict[int, list[int]] = {}  # position -> instances called there


class _Dataflow:
    def __init__(self, module: hlo_text.TextModule, target: str | None, tiled: bool):
        self.module = module
        self.target = target
        self.tiled = tiled
        self.values: list[_Value] = []
        self.parent: list[int] = []  # union-find over value ids: values that share one buffer
        self.uses: list[tuple[int, int, int]] = []  # (value, instance, position)
        self.instances: list[_Instance] = []
        self.in_place_cache: dict[str, tuple] = {}

    # -- union-find
    def find(self, v: int) -> int:
        parent = self.parent
        root = v
        while parent[root] != root:
            root = parent[root]
        while parent[v] != root:
            parent[v], v = root, parent[v]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def union_trees(self, a, b) -> None:
        if a is None or b is None:
            return
        self.union(a[0], b[0])
        for x, y in zip(a[1], b[1]):
            self.union_trees(x, y)

    # -- values
    def new_value(self, instruction, index, shape, instance, position, kind) -> int:
        if shape.is_tuple:
            size = unpadded = worst = tuple_table_bytes(len(shape.tuple_shapes), self.target)
            space = 0
        elif shape.dtype in shapes.NON_ARRAY_TYPES:
            size = unpadded = worst = space = 0
        else:
            laid_out = shape if self.tiled else default_tpu_layout(shape, self.target)
            size, unpadded = laid_out.padded_bytes(), laid_out.unpadded_bytes()
            worst = size if self.tiled else max(size, worst_tpu_bytes(shape))
            space = laid_out.memory_space
            shape = laid_out
        vid = len(self.values)
        self.values.append(_Value(instruction.name, index, instruction.opcode, shape, size, unpadded, worst, space,
                                  instance, position, kind, instruction.op_name, instruction.source_line))
        self.parent.append(vid)
        return vid

    def build(self, instruction, shape, instance, position, kind, index=()):
        """A tree (value id, children) of fresh values for SHAPE."""
        vid = self.new_value(instruction, index, shape, instance, position, kind)
        if not shape.is_tuple:
            return vid, ()
        return vid, tuple(self.build(instruction, s, instance, position, kind, index + (i,))
                          for i, s in enumerate(shape.tuple_shapes))

    def use(self, tree, instance: int, position: int) -> None:
        stack = [tree]
        while stack:
            node = stack.pop()
            if node is None:
                continue
            self.uses.append((node[0], instance, position))
            stack.extend(node[1])

    # -- computations
    def run(self, computation: str, param_trees, parent: int | None, position: int, depth: int):
        instructions = self.module.computations.get(computation, [])
        instance = len(self.instances)
        self.instances.append(_Instance(computation, parent, position, depth, len(instructions)))
        if parent is not None:
            self.instances[parent].children.setdefault(position, []).append(instance)
        trees: dict[str, tuple] = {}
        root = None
        entry = param_trees is None
        for pos, ins in enumerate(instructions):
            operands = [trees.get(name) for name in ins.operands]
            tree = self.define(ins, operands, instance, pos, depth, entry, param_trees)
            trees[ins.name] = tree
            if ins.is_root:
                root = tree
        if root is None and instructions:
            root = trees[instructions[-1].name]
        return instance, root

    def define(self, ins, operands, instance, pos, depth, entry, param_trees):
        op = ins.opcode
        first = operands[0] if operands else None
        if op == "parameter":
            if not entry:
                number = ins.parameter_number or 0
                if param_trees and 0 <= number < len(param_trees) and param_trees[number] is not None:
                    return param_trees[number]
            return self.build(ins, ins.shape, instance, pos, PARAMETER if entry else TEMP)
        if op == "constant":
            return self.build(ins, ins.shape, instance, pos, CONSTANT)
        if op == "get-tuple-element":
            if first is not None:
                self.uses.append((first[0], instance, pos))  # reads the index table only
                if ins.index is not None and 0 <= ins.index < len(first[1]):
                    return first[1][ins.index]
            return self.build(ins, ins.shape, instance, pos, TEMP)
        if op == "tuple":
            vid = self.new_value(ins, (), ins.shape, instance, pos, TEMP)
            children = tuple(o if o is not None else self.build(ins, s, instance, pos, TEMP, (i,))
                             for i, (o, s) in enumerate(zip(operands, ins.shape.tuple_shapes)))
            return vid, children
        if op in PASS_THROUGH and first is not None:
            return first
        for operand in operands:
            self.use(operand, instance, pos)
        if op == "while" and first is not None:
            for callee in ins.called:
                _, body_root = self.run(callee, [first], instance, pos, depth + 1)
                if callee == ins.called[0]:
                    self.union_trees(first, body_root)
            return first
        if op in ("conditional", "call"):
            out = self.build(ins, ins.shape, instance, pos, TEMP)
            branch_operands = operands[1:] if op == "conditional" else operands
            for n, callee in enumerate(ins.called):
                params = [branch_operands[n]] if op == "conditional" and n < len(branch_operands) else branch_operands
                _, branch_root = self.run(callee, params, instance, pos, depth + 1)
                self.union_trees(out, branch_root)
            return out
        if op.endswith("-done") and first is not None:
            if first[1]:
                k = 0 if op == "copy-done" else 1
                return first[1][k] if k < len(first[1]) else first[1][-1]
            return first
        if op in IN_PLACE and first is not None and not ins.shape.is_tuple:
            out = self.build(ins, ins.shape, instance, pos, TEMP)
            self.union(out[0], first[0])
            return out
        out = self.build(ins, ins.shape, instance, pos, TEMP)
        if op in ASYNC_STARTS and out[1] and operands:
            # copy-start is (destination, source, context); the others put their operands first.
            head = out[1][1 if op == "copy-start" and len(out[1]) > 1 else 0]
            if len(operands) == 1 and not (head[1] and ins.shape.subshape((0,)).is_tuple and op != "copy-start"):
                self.union_trees(head, operands[0])
            else:
                for element, operand in zip(head[1], operands):
                    self.union_trees(element, operand)
        aliasing = ins.operand_aliasing or (self.fusion_in_place(ins) if op == "fusion" else ())
        for out_index, operand_number, operand_index in aliasing:
            if 0 <= operand_number < len(operands) and operands[operand_number] is not None:
                self.union_trees(_subtree(out, out_index), _subtree(operands[operand_number], operand_index))
        return out

    def fusion_in_place(self, ins) -> tuple:
        """(output index, operand, ()) for each output of a fusion whose root updates a parameter in place
        (dynamic-update-slice or scatter on a fusion parameter, through bitcasts): XLA computes it in the
        operand's buffer."""
        if not ins.called:
            return ()
        name = ins.called[0]
        if name in self.in_place_cache:
            return self.in_place_cache[name]
        instructions = self.module.computations.get(name, [])
        by_name = {i.name: i for i in instructions}
        root = next((i for i in instructions if i.is_root), instructions[-1] if instructions else None)
        pairs = []

        def parameter_of(instruction):
            while instruction is not None and instruction.opcode == "bitcast" and instruction.operands:
                instruction = by_name.get(instruction.operands[0])
            if instruction is not None and instruction.opcode == "parameter":
                return instruction.parameter_number
            return None

        def updated_parameter(instruction):
            while instruction is not None and instruction.opcode == "bitcast" and instruction.operands:
                instruction = by_name.get(instruction.operands[0])
            if instruction is not None and instruction.opcode in IN_PLACE and instruction.operands:
                return parameter_of(by_name.get(instruction.operands[0]))
            return None

        if root is not None:
            if root.opcode == "tuple":
                for n, operand in enumerate(root.operands):
                    number = updated_parameter(by_name.get(operand))
                    if number is not None:
                        pairs.append(((n,), number, ()))
            else:
                number = updated_parameter(root)
                if number is not None:
                    pairs.append(((), number, ()))
        self.in_place_cache[name] = tuple(pairs)
        return self.in_place_cache[name]


def _subtree(tree, index):
    for i in index:
        if tree is None or not 0 <= i < len(tree[1]):  # damaged protos: negative or missing tuple indices
            return None
        tree = tree[1][i]
    return tree


def _flatten(tree) -> list[int]:
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if node is not None:
            out.append(node[0])
            stack.extend(node[1])
    return out


# ---------------------------------------------------------------------------------------------
# Liveness and the peak
# ---------------------------------------------------------------------------------------------

def estimate(module: hlo_text.TextModule, source: str, kind: str, target: str | None) -> ModuleMemory:
    entry = module.entry_instructions
    if not entry:
        raise UserError(f"{source} has no entry computation with instructions.")
    tiled = any(_has_tpu_tiles(i.shape) for i in entry)
    if not tiled and target is None:
        from tpuprof import targets

        raise UserError(f"{source} has no TPU layouts (CPU/GPU/TensorFlow HLO): pass --target "
                        f"{'|'.join(targets.TARGETS)} to estimate it with libtpu's default tiling.")
    flow = _Dataflow(module, target, tiled)
    entry_instance, root = flow.run(module.entry, None, None, 0, 0)
    outputs = _flatten(root)
    params_by_number: dict[int, tuple] = {}
    for instruction in entry:
        if instruction.opcode == "parameter" and instruction.parameter_number is not None:
            params_by_number[instruction.parameter_number] = None
    # Donation: the output at each aliased index lives in the parameter's buffer.
    if module.input_output_alias:
        parameter_trees = _entry_parameter_trees(flow, entry_instance)
        for out_index, number, param_index in module.input_output_alias:
            output, parameter = _subtree(root, out_index), _subtree(parameter_trees.get(number), param_index)
            if output is None or parameter is None:
                raise UserError(
                    f"{source}: its input_output_alias gives output {{{','.join(map(str, out_index))}}} to parameter "
                    f"{number} {{{','.join(map(str, param_index))}}}, which the module does not have "
                    "(a damaged or hand-edited module).")
            flow.union_trees(output, parameter)

    sets = _buffer_sets(flow, outputs)
    if _pack_into_outputs(flow, sets):
        sets = _buffer_sets(flow, outputs)
    result = ModuleMemory(name=module.name, source=source, source_kind=kind, target=target, estimated=True)
    result.alias_pairs = len(module.input_output_alias)
    result_shape = next((i.shape for i in entry if i.is_root), None)
    if result_shape is not None:
        result.donation_candidates = donation_candidates(
            [(i.parameter_number, i.op_name or i.name, i.shape) for i in entry
             if i.opcode == "parameter" and i.parameter_number is not None],
            result_shape, module.input_output_alias)
    scheduled = module.scheduled and tiled
    result.method = METHOD_HLO_LIVENESS if scheduled else METHOD_UNSCHEDULED_BOUND
    _peak(flow, sets, result, entry_instance)
    if scheduled:
        result.expected_error_percent = EXPECTED_ERROR_PERCENT
        result.notes.append(
            "No TPU buffer assignment: the peak is a liveness estimate over the scheduled HLO (XLA's aliasing, "
            f"the layouts as printed); expected within {EXPECTED_ERROR_PERCENT}% of the compiler's peak. That peak "
            "is of live buffers: to fit, the compiler also needs room for its heap's fragmentation (public OOM "
            "reports show up to a third of the temporaries).")
    else:
        why = ("no TPU layouts (CPU/GPU/TensorFlow HLO): sizes use libtpu's default tiles"
               if not tiled else "the module is not scheduled: the text order is not libtpu's execution order")
        result.notes.append(
            f"Estimate with {why}; libtpu fuses, lays out and schedules differently, so the peak can land "
            "anywhere in the stated range. Recompiling the module proto with libtpu (`--compile`) gives the "
            "exact figures.")
    return result


def _entry_parameter_trees(flow: _Dataflow, entry_instance: int) -> dict[int, tuple]:
    """Rebuild each entry parameter's value tree from the values the entry defined for it."""
    trees: dict[int, tuple] = {}
    by_name: dict[str, list[_Value]] = {}
    for vid, value in enumerate(flow.values):
        if value.instance == entry_instance and value.kind == PARAMETER:
            by_name.setdefault(value.name, []).append(vid)
    for instruction in flow.module.entry_instructions:
        if instruction.opcode != "parameter" or instruction.name not in by_name:
            continue
        vids = {flow.values[v].index: v for v in by_name[instruction.name]}

        def tree(index, shape):
            children = tuple(tree(index + (i,), s) for i, s in enumerate(shape.tuple_shapes)) if shape.is_tuple else ()
            return vids.get(index, -1), children

        built = tree((), instruction.shape)
        if built[0] >= 0:
            trees[instruction.parameter_number if instruction.parameter_number is not None else 0] = built
    return trees


class _Set:
    __slots__ = ("root", "members", "kind", "size", "unpadded", "worst", "space", "home", "start", "stop", "live_out")


def _buffer_sets(flow: _Dataflow, outputs: list[int]) -> dict[int, _Set]:
    instances = flow.instances
    sets: dict[int, _Set] = {}
    for vid, value in enumerate(flow.values):
        root = flow.find(vid)
        entry = sets.get(root)
        if entry is None:
            entry = sets[root] = _Set()
            entry.root, entry.members, entry.kind, entry.live_out = root, [], TEMP, False
            entry.size = entry.unpadded = entry.worst = 0
            entry.space, entry.home = value.space, value.instance
        entry.members.append(vid)
        if value.size > entry.size:
            entry.size, entry.unpadded, entry.worst = value.size, value.unpadded, value.worst
        if instances[value.instance].depth < instances[entry.home].depth:
            entry.home, entry.space = value.instance, value.space
        if value.kind in (PARAMETER, CONSTANT):
            entry.kind = PARAMETER if PARAMETER in (value.kind, entry.kind) else CONSTANT
    for vid in outputs:
        entry = sets[flow.find(vid)]
        entry.live_out = True
        if entry.kind == TEMP:
            entry.kind = OUTPUT
    for entry in sets.values():
        entry.start, entry.stop = None, None
        for vid in entry.members:
            value = flow.values[vid]
            position = _position_in(instances, value.instance, value.position, entry.home)
            if position is not None:
                entry.start = position if entry.start is None else min(entry.start, position)
                entry.stop = position if entry.stop is None else max(entry.stop, position)
    for vid, instance, position in flow.uses:
        entry = sets[flow.find(vid)]
        mapped = _position_in(instances, instance, position, entry.home)
        if mapped is not None and entry.start is not None:
            entry.stop = max(entry.stop, mapped)
    return sets


# Bounds on the reuse search (largest holders are tried first): temporaries under 64 KiB stay where they are, and a
# temporary tries at most 64 holders. Large modules have thousands of each; the peak is decided by large buffers.
PACK_MIN_BYTES = 64 * 1024
PACK_MAX_TRIES = 64


def _pack_into_outputs(flow: _Dataflow, sets: dict[int, _Set]) -> bool:
    """XLA's buffer assigner gives the live-out buffers their allocations first, then lets each temporary (largest
    first) reuse an existing allocation it fits in when their live ranges do not meet. An output lives from its
    definition to the end of the program, so a temporary of the entry computation that is dead before an output
    is written can sit in that output's allocation and costs nothing beyond it (XProf counts the output for the
    whole program)."""
    import bisect

    entry = 0
    # Allocations that outlive the program: outputs from their definition on, and donated parameters (a parameter
    # that holds an output) except between the parameter's last read and the output's definition.
    holders: list[tuple[_Set, list[tuple[int, int]]]] = []
    donated: dict[int, _Set] = {}
    for s in sets.values():
        if s.size <= 0 or s.home != entry or s.start is None:
            continue
        if s.kind == OUTPUT:
            holders.append((s, [(s.start, 1 << 62)]))
        elif s.kind == PARAMETER and s.live_out:
            donated[s.root] = s
    if donated:
        last_read: dict[int, int] = {}
        first_write: dict[int, int] = {}
        instances = flow.instances
        for vid, instance, position in flow.uses:
            root = flow.find(vid)
            if root in donated and flow.values[vid].kind == PARAMETER:
                mapped = _position_in(instances, instance, position, entry)
                if mapped is not None:
                    last_read[root] = max(last_read.get(root, 0), mapped)
        for root, s in donated.items():
            for vid in s.members:
                value = flow.values[vid]
                if value.kind != PARAMETER:
                    mapped = _position_in(instances, value.instance, value.position, entry)
                    if mapped is not None:
                        first_write[root] = min(first_write.get(root, 1 << 62), mapped)
            read, write = last_read.get(root, 0), first_write.get(root)
            if write is not None and read < write:
                holders.append((s, [(-1, read), (write, 1 << 62)]))
    if not holders:
        return False
    holders.sort(key=lambda h: (-h[0].size, h[1][0][0]))
    outputs = [h[0] for h in holders]
    temps = sorted((s for s in sets.values() if s.kind == TEMP and s.home == entry and s.start is not None
                    and s.size > 0), key=lambda s: (-s.size, s.start))
    busy = {h[0].root: h[1] for h in holders}  # sorted, disjoint live ranges of each holder
    latest_free = max(h[1][-1][0] for h in holders)
    packed_any = False
    for temp in temps:
        if temp.stop >= latest_free or temp.size < PACK_MIN_BYTES:
            continue  # still live when every holder is written, or too small to move the peak
        tried = 0
        for output in outputs:
            if output.size < temp.size or tried >= PACK_MAX_TRIES:
                break
            ranges = busy[output.root]
            if output.space != temp.space or ranges[-1][0] <= temp.stop:
                continue  # another memory space, or the holder is written before the temporary dies
            tried += 1
            at = bisect.bisect_left(ranges, (temp.start, temp.stop))
            if (at > 0 and ranges[at - 1][1] >= temp.start) or (at < len(ranges) and ranges[at][0] <= temp.stop):
                continue
            ranges.insert(at, (temp.start, temp.stop))
            flow.union(output.root, temp.root)
            packed_any = True
            break
    return packed_any


def _position_in(instances: list[_Instance], instance: int, position: int, home: int) -> int | None:
    """POSITION of INSTANCE seen from HOME: the calling instruction's position when it is nested deeper."""
    while instance != home:
        parent = instances[instance].parent
        if parent is None:
            return None
        position, instance = instances[instance].position, parent
    return position


def _peak(flow: _Dataflow, sets: dict[int, _Set], result: ModuleMemory, entry_instance: int) -> None:
    instances = flow.instances
    indefinite = indefinite_unpadded = indefinite_worst = 0
    local: dict[int, list[_Set]] = {}
    for entry in sets.values():
        if entry.size <= 0:
            continue
        if entry.space != 0:
            result.other_memory_spaces[entry.space] = result.other_memory_spaces.get(entry.space, 0) + entry.size
            continue
        if entry.kind in (PARAMETER, OUTPUT, CONSTANT):
            indefinite += entry.size
            indefinite_unpadded += entry.unpadded
            indefinite_worst += entry.worst
            if entry.kind == PARAMETER:
                result.argument_bytes += entry.size
            if entry.live_out:  # a donated parameter holding an output counts in both, as in buffer assignments
                result.output_bytes += entry.size
                if entry.kind == PARAMETER:
                    result.aliased_bytes += entry.size
        else:
            result.temp_bytes += entry.size
            if entry.start is not None:
                local.setdefault(entry.home, []).append(entry)

    # Peak of temporaries per instance, innermost first (children have larger instance numbers).
    peaks: dict[int, tuple[int, int]] = {}
    timelines: dict[int, tuple[list[int], list[int]]] = {}
    for number in range(len(instances) - 1, -1, -1):
        instance = instances[number]
        length = max(instance.length, 1)
        delta = [0] * (length + 1)
        delta_unpadded = [0] * (length + 1)
        for entry in local.get(number, ()):
            delta[entry.start] += entry.size
            delta[entry.stop + 1] -= entry.size
            delta_unpadded[entry.start] += entry.unpadded
            delta_unpadded[entry.stop + 1] -= entry.unpadded
        live = live_unpadded = 0
        timeline, unpadded_timeline = [], []
        best = (0, 0)
        for position in range(length):
            live += delta[position]
            live_unpadded += delta_unpadded[position]
            nested = max((peaks[c] for c in instance.children.get(position, ())), default=(0, 0))
            timeline.append(live + nested[0])
            unpadded_timeline.append(live_unpadded + nested[1])
            if timeline[-1] > best[0]:
                best = (timeline[-1], unpadded_timeline[-1])
        peaks[number] = best
        if number == entry_instance:
            timelines[number] = (timeline, unpadded_timeline)

    timeline, unpadded_timeline = timelines[entry_instance]
    result.heap_timeline = [indefinite + v for v in timeline]
    result.unpadded_timeline = [indefinite_unpadded + v for v in unpadded_timeline]
    result.peak_heap_bytes = max(result.heap_timeline) if result.heap_timeline else indefinite
    result.peak_position = result.heap_timeline.index(result.peak_heap_bytes) if result.heap_timeline else 0
    result.peak_unpadded_heap_bytes = (result.unpadded_timeline[result.peak_position]
                                       if result.unpadded_timeline else indefinite_unpadded)
    if result.method == METHOD_UNSCHEDULED_BOUND:
        # Every temporary live at once, each at its worst TPU padding: no schedule or layout libtpu picks
        # needs more for these buffers. The low end is what must be there: the arguments and outputs.
        worst_temps = sum(e.worst for e in sets.values() if e.space == 0 and e.kind == TEMP)
        result.peak_range_bytes = (indefinite_unpadded, indefinite_worst + worst_temps)

    # Buffers: one per HBM buffer set, named after its first definition of the set's size. A set can hold arrays of
    # other sizes (a temporary packed into an output's allocation, which keeps the output's size): the row's shape
    # and bytes are then the largest array's, as XProf shows an allocation by its largest logical buffer.
    peak_position = result.peak_position
    described = []
    values = flow.values
    for entry in sets.values():
        if entry.size <= 0 or entry.space != 0:
            continue
        first = values[min((v for v in entry.members
                            if (values[v].size, values[v].unpadded) == (entry.size, entry.unpadded)),
                           key=lambda v: (instances[values[v].instance].depth, v))]
        if entry.kind == TEMP:
            live = (entry.home == entry_instance and entry.start is not None
                    and entry.start <= peak_position <= entry.stop)
        else:
            live = True
        name = first.name + ("{" + ",".join(map(str, first.index)) + "}" if first.index else "")
        buffer = Buffer(id=entry.root, instruction=name, opcode=first.opcode, shape="", size_bytes=entry.size,
                        unpadded_bytes=entry.unpadded, allocation_type=entry.kind, op_name=first.op_name,
                        source_line=first.source_line, live_at_peak=live)
        described.append((buffer, first.shape))
    described.sort(key=lambda pair: (-pair[0].size_bytes, -pair[0].padding_bytes, pair[0].id))
    for buffer, shape in described:
        fill_shape_details(buffer, shape)
    result.buffers = [buffer for buffer, _ in described]
    result.ops, result.ops_scope = aggregate_ops(result.buffers, has_peak=True)
