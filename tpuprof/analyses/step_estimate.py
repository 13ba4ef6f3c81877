"""How long one step of a compiled program takes on a TPU generation: a band [roofline, compiler] and a point.

Read from the module libtpu compiled (`*.after_codegen.hlo.pb`, else `*.after_optimizations.hlo.pb`), op by
op over the compiled schedule (the entry computation, loop bodies and called computations, never fused
instructions one by one):

- FLOPs follow XLA's HloCostAnalysis counting (xla/service/hlo_cost_analysis.cc): a dot or convolution
  2 x output elements x contracted elements, an elementwise op one per output element (transcendental
  ops count as transcendentals, not FLOPs), a reduce (input - output elements) x the reducer's ops; a
  fusion the sum of its fused instructions. A Pallas kernel's `cost_estimate`, when the kernel carries one.
- HBM bytes: the op's operands and results whose layout is in HBM (memory space 0; `S(1)`... are on-chip
  memories and excluded), padded as laid out. A fusion operand read only through a slice or dynamic-slice
  counts the slice (one loop step reads one layer's weights, not the stack); an in-place
  dynamic-update-slice writes the update only.
- Loops: a while body and condition count once per trip; the trip count is the compiler's
  `known_trip_count` when recorded, else inferred from the condition (`i < N` against a constant, `i`
  starting from a constant and stepping by a constant), else 1 (reported).

Two estimates of the step time follow:
- roofline: each op takes max(FLOPs / peak FLOP/s for its dtype, HBM bytes / HBM bandwidth), summed;
  optimistic: it assumes every op reaches the peaks and nothing stalls;
- compiler: each op the compiler scheduled with a cost model carries `window_config.estimated_cycles`
  in its backend_config, divided by the TensorCore clock; ops without one take their roofline time.
  The compiler's model is conservative on large programs.
The band is [the smaller, the larger] and the point their geometric mean; no constant is fitted.

A sharded compile's collectives are timed on the slice's ICI torus and overlapped with the compute scheduled
between their start and done (tpuprof.analyses.collectives): the step adds the exposed part (the band's high
end adds all of it, as if nothing overlapped); a multi-slice job adds the gradient all-reduce across slices
over the data-centre network, counted exposed.
Not modelled: see NOT_MODELLED.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpuprof import targets
from tpuprof.analyses import attention_kernels
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes

NOT_MODELLED = ["ICI latency per hop and per collective step (bandwidth terms only)",
                "contention between concurrent collectives beyond first-in-first-out on the links",
                "overlap of the cross-slice (DCN) gradient all-reduce with compute (counted exposed)",
                "host offload and host-device transfers", "the input pipeline", "step-to-step dispatch overhead"]

# Opcodes XLA's HloCostAnalysis sends to HandleElementwiseOp: one FLOP per output element ...
ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder", "and", "or", "xor", "not",
    "negate", "abs", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "compare", "select",
    "clamp", "convert", "is-finite", "shift-left", "shift-right-arithmetic", "shift-right-logical",
    "popcnt", "count-leading-zeros", "real", "imag", "complex", "reduce-precision", "stochastic-convert",
}
# ... except these, which it counts as transcendentals (not FLOPs).
TRANSCENDENTAL = {
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "power", "rsqrt", "sqrt",
    "cbrt", "tanh", "sine", "cosine", "tan", "atan2", "erf",
}
# Ops that move no data of their own: views, tuples, control.
NO_TRAFFIC = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
    "add-dependency", "partition-id", "replica-id", "copy-done", "async-done", "send-done", "recv-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done", "while", "call", "conditional",
    "domain", "iota",
}
COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "all-reduce-start", "all-gather-start", "collective-permute-start", "ragged-all-to-all"}
# Custom calls that only reinterpret or place buffers: no kernel to estimate.
LAYOUT_ONLY_CUSTOM_CALLS = {"ConcatBitcast", "AllocateBuffer", "Sharding", "SPMDFullToShardShape",
                            "SPMDShardToFullShape", "MoveToHost", "MoveToDevice", "annotate_device_placement"}
INT8 = {"s8", "u8", "s4", "u4"}
FP8 = {"f8e4m3fn", "f8e5m2", "f8e4m3b11fnuz", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e3m4"}


@dataclass
class OpCost:
    """One op of the compiled schedule, per execution, and how many times a step runs it."""

    name: str
    opcode: str
    op_name: str  # the framework op it came from (metadata)
    source_line: str
    computation: str
    count: int  # executions per step (product of enclosing loops' trip counts)
    flops: float
    hbm_bytes: float
    matmul_dtype: str | None  # element type of a dot/convolution's operands, for the peak to use
    compiler_cycles: int | None  # the compiler's estimated_cycles, if it recorded them
    flops_source: str = "hlo"  # hlo | cost_estimate (a Pallas kernel's own) | estimated (attention_kernels)
    kernel_without_estimate: bool = False  # a custom kernel with neither cycles nor cost_estimate
    kernel_estimate: object = None  # attention_kernels.KernelFlops: the rule that estimated such a kernel
    collective: bool = False  # an async-start wrapping a collective: timed by the collective model, not as traffic


@dataclass
class Loop:
    name: str
    op_name: str
    trip_count: int
    trip_count_source: str  # known_trip_count | inferred | unknown (counted once)
    count: int  # how many times the loop itself runs per step


@dataclass
class ProgramCost:
    """Device-independent figures of one compiled module."""

    module: str
    source: str  # the file read
    stage: str  # after_codegen | after_optimizations
    target: str | None  # the generation the dump was compiled for, when it says so
    ops: list[OpCost] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    walker: object = field(default=None, repr=False, compare=False)  # the module and its index, for collectives
    torus: object = field(default=None, repr=False)  # collectives.Torus of a dump, None without one

    @property
    def flops(self) -> float:
        return sum(op.flops * op.count for op in self.ops)

    @property
    def hbm_bytes(self) -> float:
        return sum(op.hbm_bytes * op.count for op in self.ops)


# --- reading ------------------------------------------------------------------------------------------

def find_module(dump_dir: str | Path) -> Path:
    """The module proto of a compile's dump: after_codegen (carries the compiler's cycles) if kept."""
    folder = Path(dump_dir)
    for suffix in (".after_codegen.hlo.pb", ".after_optimizations.hlo.pb"):
        found = sorted(folder.glob(f"*{suffix}"), key=lambda p: (-p.stat().st_size, p.name))
        if found:
            return found[0]
    raise UserError(f"{folder} holds no *.after_codegen.hlo.pb or *.after_optimizations.hlo.pb to estimate from.")


def load(path: str | Path) -> ProgramCost:
    """A dump folder or one HloProto file -> its per-op costs."""
    from tpuprof.protos import hlo_pb2

    path = Path(path)
    proto_path = find_module(path) if path.is_dir() else path
    try:
        data = proto_path.read_bytes()
        proto = hlo_pb2().HloProto.FromString(data)
        module = proto.hlo_module
        if not module.computations:
            module = hlo_pb2().HloModuleProto.FromString(data)
    except Exception as error:  # noqa: BLE001 - DecodeError, OSError
        raise UserError(f"{proto_path} is not a readable HLO proto ({type(error).__name__}).") from None
    stage = "after_codegen" if ".after_codegen." in proto_path.name else "after_optimizations"
    target = None
    arguments = proto_path.with_name(proto_path.name.split(f".{stage}")[0] + ".target_arguments.txt")
    if arguments.is_file():
        target = targets.from_target_arguments(arguments.read_text(errors="replace"))
    cost = analyse(module, str(proto_path), stage, target)
    if target is not None:
        from tpuprof.analyses import collectives

        cost.torus = collectives.torus_from_dump(proto_path.parent, proto_path.name, targets.get(target))
    return cost


def analyse(module, source: str = "", stage: str = "after_optimizations", target: str | None = None) -> ProgramCost:
    return _Walker(module).run(source, stage, target)


class _Walker:
    def __init__(self, module):
        from tpuprof.analyses.buffers import InstructionIndex

        self.module = module
        self.computations = {c.id: c for c in module.computations}
        self.by_id = {}
        for computation in module.computations:
            for instruction in computation.instructions:
                self.by_id[instruction.id] = instruction
        self.index = InstructionIndex(module, needed=set())
        self.index.by_id = self.by_id
        self._shape_cache: dict[int, shapes.Shape] = {}
        self._users: dict[int, dict[int, list]] = {}
        self._flops_cache: dict[int, float] = {}

    # shapes
    def shape(self, instruction) -> shapes.Shape:
        cached = self._shape_cache.get(instruction.id)
        if cached is None:
            cached = self._shape_cache[instruction.id] = shapes.from_proto(instruction.shape)
        return cached

    def users(self, computation) -> dict[int, list]:
        users = self._users.get(computation.id)
        if users is None:
            users = {i.id: [] for i in computation.instructions}
            for instruction in computation.instructions:
                for operand in instruction.operand_ids:
                    users.setdefault(operand, []).append(instruction)
            self._users[computation.id] = users
        return users

    # the walk over the schedule
    def run(self, source, stage, target) -> ProgramCost:
        result = ProgramCost(self.module.name, source, stage, target, walker=self)
        entry = self.computations.get(self.module.entry_computation_id) or self.module.computations[-1]
        self._walk(entry, 1, result, depth=0)
        return result

    def _walk(self, computation, count: int, result: ProgramCost, depth: int) -> None:
        if depth > 64:
            raise UserError("the HLO module nests loops or calls more than 64 deep.")
        for instruction in computation.instructions:
            opcode = instruction.opcode
            called = [self.computations[c] for c in instruction.called_computation_ids if c in self.computations]
            if opcode == "while":
                trips, how = self.trip_count(instruction)
                result.loops.append(Loop(instruction.name, instruction.metadata.op_name, trips, how, count))
                body, condition = self.loop_parts(instruction)
                if body is not None:
                    self._walk(body, count * trips, result, depth + 1)
                if condition is not None:
                    self._walk(condition, count * trips, result, depth + 1)
                continue
            if opcode == "call" and called:
                self._walk(called[0], count, result, depth + 1)
                continue
            if opcode == "conditional" and called:
                # One branch runs: count the costliest (an upper bound on a data-dependent choice).
                costs = []
                for branch in called:
                    part = ProgramCost("", "", "", None)
                    self._walk(branch, count, part, depth + 1)
                    costs.append(part)
                worst = max(costs, key=lambda p: (p.flops, p.hbm_bytes))
                result.ops.extend(worst.ops)
                result.loops.extend(worst.loops)
                continue
            if opcode in NO_TRAFFIC:
                continue
            result.ops.append(self.op_cost(instruction, computation, count))

    # one op
    def op_cost(self, instruction, computation, count: int) -> OpCost:
        config = _backend_config(instruction)
        cycles = None
        window = config.get("window_config") if isinstance(config, dict) else None
        if isinstance(window, dict) and str(window.get("estimated_cycles", "0")).isdigit():
            cycles = int(window["estimated_cycles"]) or None
        flops, hbm, source = self.flops(instruction), self.hbm_bytes(instruction), "hlo"
        # A Pallas kernel's own cost_estimate (pl.CostEstimate), in its Mosaic custom_call_config.
        call_config = config.get("custom_call_config")
        estimate = config.get("cost_estimate") or (call_config.get("cost_estimate")
                                                   if isinstance(call_config, dict) else None)
        without, rule = False, None
        if instruction.opcode == "custom-call":
            if isinstance(estimate, dict):
                flops = float(estimate.get("flops", 0) or 0)
                hbm = float(estimate.get("bytes_accessed", hbm) or hbm)
                source = "cost_estimate"
            elif instruction.custom_call_target not in LAYOUT_ONLY_CUSTOM_CALLS and cycles is None:
                without = True  # still flagged when a rule estimates its FLOPs: no figure of its own
                rule = attention_kernels.estimate(self, instruction, config)
                if rule is not None:
                    flops, source = rule.flops, "estimated"
        collective = False
        if instruction.opcode == "async-start":  # may wrap a collective (TPU7x's SparseCore all-reduces)
            from tpuprof.analyses import collectives

            collective = collectives.collective_in(instruction, self.computations) is not None
        return OpCost(
            name=instruction.name, opcode=instruction.opcode, op_name=instruction.metadata.op_name,
            source_line=self.index.source_line(instruction), computation=computation.name, count=count,
            flops=flops, hbm_bytes=hbm, matmul_dtype=self.matmul_dtype(instruction), compiler_cycles=cycles,
            flops_source=source, kernel_without_estimate=without, kernel_estimate=rule, collective=collective,
        )

    # FLOPs (HloCostAnalysis rules)
    def flops(self, instruction) -> float:
        cached = self._flops_cache.get(instruction.id)
        if cached is not None:
            return cached
        value = self._flops(instruction)
        self._flops_cache[instruction.id] = value
        return value

    def _flops(self, instruction) -> float:
        opcode = instruction.opcode
        out = self.shape(instruction)
        if opcode in ("fusion", "async-start", "call"):
            return sum(self.flops(i) for c in instruction.called_computation_ids if c in self.computations
                       for i in self.computations[c].instructions)
        if out.is_tuple or out.dtype in shapes.NON_ARRAY_TYPES:
            elements = 0
        else:
            elements = out.element_count
        if opcode in ELEMENTWISE:
            return float(elements)
        if opcode == "dot":
            lhs = self.shape(self.by_id[instruction.operand_ids[0]])
            contracted = math.prod(lhs.dims[d] for d in instruction.dot_dimension_numbers.lhs_contracting_dimensions)
            return 2.0 * elements * contracted
        if opcode == "convolution":
            return self.convolution_flops(instruction, out)
        if opcode in ("reduce", "reduce-window"):
            reducer = sum(self.flops(i) for c in instruction.called_computation_ids if c in self.computations
                          for i in self.computations[c].instructions)
            if opcode == "reduce-window":
                return float(self._reduce_window_count(instruction, _first_array(out)) * reducer)
            first = self.shape(self.by_id[instruction.operand_ids[0]])
            produced = _first_array(out).element_count
            return float(max(first.element_count - produced, 0) * reducer)
        return 0.0

    @staticmethod
    def _reduce_window_count(instruction, out: shapes.Shape) -> int:
        """Reductions of a reduce-window as HloCostAnalysis counts them: (window - 1) per output element,
        except the prefix-sum form (one dimension of size 2p+1 padded by p = its length - 1 on each side),
        which XLA computes in (outputs / length + length - 1) steps."""
        dims = list(instruction.window.dimensions)
        window = math.prod(d.size for d in dims) if dims else 1
        outputs = out.element_count
        reducing = [n for n, d in enumerate(dims) if d.size != 1]
        padded = [n for n, d in enumerate(dims) if d.padding_low or d.padding_high]
        if len(reducing) == 1 and len(padded) == 1 and not out.is_tuple:
            axis = reducing[0]
            d = dims[axis]
            if (d.padding_low == d.padding_high and d.size == 2 * d.padding_low + 1
                    and d.padding_low == out.dims[axis] - 1):
                length = out.dims[axis]
                return outputs // length + (length - 1)
        return (window - 1) * outputs

    def convolution_flops(self, instruction, out: shapes.Shape) -> float:
        """2 x multiply-adds that touch real input elements (HloCostAnalysis::GetConvolutionFlops): window
        positions that fall on padding or between dilated elements are not counted, which matters for the
        batched matmuls XLA:TPU writes as base-dilated convolutions."""
        import numpy as np

        lhs = self.shape(self.by_id[instruction.operand_ids[0]])
        numbers = instruction.convolution_dimension_numbers
        groups = max(instruction.feature_group_count, 1)
        input_features = lhs.dims[numbers.input_feature_dimension] // groups
        per_output = out.dims[numbers.output_batch_dimension] * out.dims[numbers.output_feature_dimension]
        valid_positions = 1
        for axis, window in enumerate(instruction.window.dimensions):
            size_in = lhs.dims[numbers.input_spatial_dimensions[axis]]
            size_out = out.dims[numbers.output_spatial_dimensions[axis]]
            base = max(window.base_dilation, 1)
            stride = max(window.stride, 1)
            dilation = max(window.window_dilation, 1)
            last = (size_in - 1) * base
            positions = np.arange(size_out, dtype=np.int64) * stride - window.padding_low
            count = 0
            for k in range(window.size):
                where = positions + k * dilation
                count += int(np.count_nonzero((where >= 0) & (where <= last) & (where % base == 0)))
            valid_positions *= count
        return 2.0 * valid_positions * per_output * input_features

    def matmul_dtype(self, instruction) -> str | None:
        if instruction.opcode in ("dot", "convolution"):
            return self.shape(self.by_id[instruction.operand_ids[0]]).dtype
        best = None
        for c in instruction.called_computation_ids:
            for inner in self.computations.get(c, _EMPTY).instructions:
                dtype = self.matmul_dtype(inner)
                if dtype is not None and (best is None or shapes.ELEMENT_BITS.get(dtype, 32) < shapes.ELEMENT_BITS.get(best, 32)):
                    best = dtype
        return best

    # HBM bytes
    def hbm_bytes(self, instruction) -> float:
        opcode = instruction.opcode
        out = self.shape(instruction)
        operands = [self.by_id[o] for o in instruction.operand_ids if o in self.by_id]
        if opcode == "copy-start":
            return sum(_hbm(self.shape(o)) for o in operands) + _hbm(_element(out, 0))
        if opcode in ("fusion", "async-start") and instruction.called_computation_ids:
            fused = self.computations.get(instruction.called_computation_ids[0])
            if fused is None:
                return sum(_hbm(self.shape(o)) for o in operands) + _hbm(out)
            result_shape = _element(out, 1) if opcode == "async-start" else out
            in_place = self._in_place_parameters(fused)
            total = 0.0
            params = {i.parameter_number: i for i in fused.instructions if i.opcode == "parameter"}
            for number, operand in enumerate(operands):
                operand_shape = self.shape(operand)
                if number in in_place or not _hbm(operand_shape):
                    continue
                parameter = params.get(number)
                total += self._read_bytes(fused, parameter, operand_shape) if parameter is not None else _hbm(operand_shape)
            total += self._written_bytes(fused, result_shape)
            return total
        if opcode == "dynamic-update-slice":
            update = self.shape(operands[1])
            return 2.0 * _bytes_in(update, out.memory_space == 0)
        if opcode in ("slice", "dynamic-slice"):
            return 2.0 * _hbm(out) if operands and _hbm(self.shape(operands[0])) else _hbm(out)
        return sum(_hbm(self.shape(o)) for o in operands) + _hbm(out)

    def _read_bytes(self, computation, parameter, full: shapes.Shape, depth: int = 0) -> float:
        """Bytes of an HBM operand the fused computation really reads: slices only, when it only slices."""
        whole = _hbm(full)
        if depth > 16:
            return whole
        users = self.users(computation).get(parameter.id, [])
        if parameter.id == computation.root_id:
            return whole  # passed through to the result: read whole
        if not users:
            return 0.0
        total = 0.0
        for user in users:
            if user.opcode in ("slice", "dynamic-slice"):
                total += _bytes_in(self.shape(user), True)
            elif user.opcode == "bitcast":
                total += self._read_bytes(computation, user, full, depth + 1)
            elif user.opcode == "fusion" and user.called_computation_ids:
                inner = self.computations.get(user.called_computation_ids[0])
                positions = [n for n, o in enumerate(user.operand_ids) if o == parameter.id]
                inner_params = {i.parameter_number: i for i in inner.instructions if i.opcode == "parameter"} if inner else {}
                if not inner or not all(p in inner_params for p in positions):
                    return whole
                total += sum(self._read_bytes(inner, inner_params[p], full, depth + 1) for p in positions)
            else:
                return whole
            if total >= whole:
                return whole
        return total

    def _in_place_parameters(self, fused) -> set[int]:
        """Parameters a root dynamic-update-slice updates in place: written only where the update goes."""
        roots = self._roots(fused)
        numbers = set()
        for root in roots:
            if root.opcode != "dynamic-update-slice":
                continue
            target = self.by_id.get(root.operand_ids[0])
            while target is not None and target.opcode == "bitcast":
                target = self.by_id.get(target.operand_ids[0])
            if target is not None and target.opcode == "parameter":
                numbers.add(target.parameter_number)
        return numbers

    def _roots(self, computation) -> list:
        root = self.by_id.get(computation.root_id)
        if root is None:
            return []
        if root.opcode == "tuple":
            return [self.by_id[o] for o in root.operand_ids if o in self.by_id]
        return [root]

    def _written_bytes(self, fused, result: shapes.Shape) -> float:
        roots = self._roots(fused)
        parts = list(result.tuple_shapes) if result.is_tuple else [result]
        if len(roots) != len(parts):
            return _hbm(result)
        total = 0.0
        for root, part in zip(roots, parts):
            if root.opcode == "dynamic-update-slice":
                update = self.shape(self.by_id[root.operand_ids[1]])
                total += _bytes_in(update, part.memory_space == 0) if not part.is_tuple else 0
            else:
                total += _hbm(part)
        return total

    # trip counts
    def trip_count(self, instruction) -> tuple[int, str]:
        config = _backend_config(instruction)
        known = config.get("known_trip_count") if isinstance(config, dict) else None
        if isinstance(known, dict) and str(known.get("n", "")).lstrip("-").isdigit():
            return max(int(known["n"]), 0), "known_trip_count"
        inferred = self.infer_trip_count(instruction)
        if inferred is not None:
            return inferred, "inferred"
        return 1, "unknown"

    def loop_parts(self, loop):
        """(body, condition) of a while: XLA keeps them as called computations [body, condition]."""
        called = [self.computations.get(c) for c in loop.called_computation_ids]
        if len(called) != 2 or None in called:
            return None, None
        body, condition = called
        if self.shape(self.by_id[condition.root_id]).dtype != "pred":
            body, condition = condition, body
        return body, condition

    def infer_trip_count(self, loop) -> int | None:
        """`while (i < N)` with i from a constant, stepped by a constant in the body: the trip count."""
        body, condition = self.loop_parts(loop)
        if condition is None or body is None:
            return None
        compare = self.by_id.get(condition.root_id)
        compare = self._through_copies(compare)
        if compare is None or compare.opcode != "compare" or len(compare.operand_ids) != 2:
            return None
        lhs, rhs = (self._through_copies(self.by_id.get(o)) for o in compare.operand_ids)
        direction = compare.comparison_direction
        flipped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}
        if lhs is not None and lhs.opcode == "constant" and rhs is not None and rhs.opcode == "get-tuple-element":
            lhs, rhs, direction = rhs, lhs, flipped.get(direction, direction)
        if lhs is None or lhs.opcode != "get-tuple-element" or rhs is None or rhs.opcode != "constant":
            return None
        index = lhs.tuple_index
        limit = _scalar(rhs)
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

    def _through_copies(self, instruction):
        while instruction is not None and instruction.opcode in ("copy", "bitcast", "convert") and instruction.operand_ids:
            instruction = self.by_id.get(instruction.operand_ids[0])
        return instruction

    def _initial_value(self, loop, index: int) -> float | None:
        init = self._through_copies(self.by_id.get(loop.operand_ids[0])) if loop.operand_ids else None
        if init is None or init.opcode != "tuple" or index >= len(init.operand_ids):
            return None
        element = self._through_copies(self.by_id.get(init.operand_ids[index]))
        return _scalar(element) if element is not None and element.opcode == "constant" else None

    def _step(self, body, index: int) -> float | None:
        root = self.by_id.get(body.root_id)
        if root is None or root.opcode != "tuple" or index >= len(root.operand_ids):
            return None
        update = self._through_copies(self.by_id.get(root.operand_ids[index]))
        if update is None or update.opcode not in ("add", "subtract"):
            return None
        a, b = (self._through_copies(self.by_id.get(o)) for o in update.operand_ids)

        def is_counter(i):
            return i is not None and i.opcode == "get-tuple-element" and i.tuple_index == index

        if is_counter(a) and b is not None and b.opcode == "constant":
            step = _scalar(b)
        elif update.opcode == "add" and is_counter(b) and a is not None and a.opcode == "constant":
            step = _scalar(a)
        else:
            return None
        if step is None:
            return None
        return -step if update.opcode == "subtract" else step


class _Empty:
    instructions: list = []


_EMPTY = _Empty()


def _backend_config(instruction) -> dict:
    raw = instruction.backend_config
    if not raw:
        return {}
    try:
        value = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _scalar(constant) -> float | None:
    """The value of a scalar integer constant (its literal)."""
    literal = constant.literal
    for name in ("s32s", "s64s", "u32s", "u64s", "s16s", "u16s", "s8s", "u8s"):
        values = getattr(literal, name, None)
        if values is not None and len(values) == 1:
            return float(values[0])
    if literal.s8s and len(literal.s8s) == 1:
        return float(int.from_bytes(literal.s8s, "little", signed=True))
    return None


def _first_array(shape: shapes.Shape) -> shapes.Shape:
    while shape.is_tuple and shape.tuple_shapes:
        shape = shape.tuple_shapes[0]
    return shape


def _element(shape: shapes.Shape, index: int) -> shapes.Shape:
    if shape.is_tuple and index < len(shape.tuple_shapes):
        return shape.tuple_shapes[index]
    return shape


def _hbm(shape: shapes.Shape) -> float:
    """Padded bytes of the arrays in HBM (memory space 0); tuples summed, on-chip memories excluded."""
    if shape.is_tuple:
        return sum(_hbm(s) for s in shape.tuple_shapes)
    if shape.dtype in shapes.NON_ARRAY_TYPES or shape.memory_space != 0:
        return 0.0
    return float(shape.padded_bytes())


def _bytes_in(shape: shapes.Shape, in_hbm: bool) -> float:
    if not in_hbm or shape.is_tuple or shape.dtype in shapes.NON_ARRAY_TYPES:
        return 0.0
    return float(shape.padded_bytes())


# --- per generation -----------------------------------------------------------------------------------

def devices_per_chip(target: targets.Target) -> int:
    """Devices a job sees per chip (tpuprof.targets): 2 on v2/v3 and TPU7x, else 1."""
    return max(int(getattr(target, "devices_per_chip", 1) or 1), 1)


@dataclass
class Peaks:
    """Per compile-only device."""

    bf16_flops: float
    int8_ops: float
    fp8_flops: float
    hbm_bytes_per_s: float
    clock_hz: float | None
    source: str

    def for_dtype(self, dtype: str | None) -> float:
        if dtype in INT8:
            return self.int8_ops
        if dtype in FP8:
            return self.fp8_flops
        return self.bf16_flops  # f32 dots run on the MXU in bf16 passes at the default precision


def peaks(target: targets.Target) -> Peaks:
    share = devices_per_chip(target)
    bf16 = target.peak_bf16_tflops * 1e12 / share
    int8 = (getattr(target, "peak_int8_tops", None) or target.peak_bf16_tflops) * 1e12 / share
    fp8 = (getattr(target, "peak_fp8_tflops", None) or target.peak_bf16_tflops) * 1e12 / share
    clock = getattr(target, "clock_ghz", None)
    source = (f"tpuprof.targets {target.name}: {target.peak_bf16_tflops:g} TFLOP/s bf16, {target.hbm_gbps:g} GB/s "
              f"HBM per chip" + (f", / {share} devices per chip" if share > 1 else "")
              + (f"; TensorCore clock {clock:g} GHz" if clock else "; no TensorCore clock"))
    return Peaks(bf16, int8, fp8, target.hbm_gbps * 1e9 / share, clock * 1e9 if clock else None, source)


@dataclass
class TimedOp:
    op: OpCost
    compute_s: float
    memory_s: float
    roofline_s: float  # per step (times count)
    compiler_s: float  # per step; the roofline time when the compiler recorded no cycles
    point_s: float


@dataclass
class StepEstimate:
    """The band and point of the compute (compute_*), plus communication: low/point add the exposed
    collectives, high adds all of them (no overlap); all three add the cross-slice all-reduce."""

    target: str
    roofline_s: float
    compiler_s: float | None  # None: no op carries the compiler's cycles (no after_codegen, or no clock)
    flops: float
    hbm_bytes: float
    compute_s: float  # the roofline's time in ops bound by FLOP/s
    memory_s: float  # ... and in ops bound by HBM bandwidth
    ops_with_cycles: int
    ops: list[TimedOp]
    loops: list[Loop]
    kernels_without_estimate: list[str]
    peaks: Peaks
    communication: object = None  # collectives.Communication of a sharded compile with a known torus
    dcn_s: float | None = 0.0  # the cross-slice all-reduce; None: a multi-slice job whose DCN is not published
    num_slices: int = 1
    untimed_collectives: int = 0  # collectives in the program that could not be timed (no torus / ICI figure)
    replica_all_reduce_untimed: bool = False  # a replica compile on a slice whose gradient size is unknown
    kernels_estimated: list = field(default_factory=list)  # flagged kernels whose FLOPs a rule estimated

    @property
    def compute_low_s(self) -> float:
        return min(self.roofline_s, self.compiler_s) if self.compiler_s else self.roofline_s

    @property
    def compute_high_s(self) -> float:
        return max(self.roofline_s, self.compiler_s) if self.compiler_s else self.roofline_s

    @property
    def compute_point_s(self) -> float:
        return math.sqrt(self.compute_low_s * self.compute_high_s)

    @property
    def collective_s(self) -> float:
        return self.communication.collective_s if self.communication else 0.0

    @property
    def exposed_collective_s(self) -> float:
        return self.communication.exposed_s if self.communication else 0.0

    @property
    def low_s(self) -> float:
        return self.compute_low_s + self.exposed_collective_s + (self.dcn_s or 0.0)

    @property
    def high_s(self) -> float:
        return self.compute_high_s + self.collective_s + (self.dcn_s or 0.0)

    @property
    def point_s(self) -> float:
        return self.compute_point_s + self.exposed_collective_s + (self.dcn_s or 0.0)

    @property
    def flop_utilization(self) -> float:
        return self.flops / (self.point_s * self.peaks.bf16_flops) if self.point_s > 0 else 0.0

    def top(self, n: int) -> list[TimedOp]:
        return sorted(self.ops, key=lambda t: -t.point_s)[:n] if n else sorted(self.ops, key=lambda t: -t.point_s)


def estimate(cost: ProgramCost, target_name: str, num_slices: int = 1,
             gradient_bytes_per_device: float | None = None, replica_of: str | None = None,
             replica_gradient_bytes: float | None = None) -> StepEstimate:
    """The step time of `cost` on one device of `target_name`, with its collectives when the dump says
    which torus it was compiled for, and for `num_slices` > 1 the all-reduce of `gradient_bytes_per_device`
    across slices over DCN. `replica_of` (a slice topology, `v5p:4x4x4`): the compile is one data-parallel
    replica of that slice; its gradient all-reduce of `replica_gradient_bytes` over the slice is added.

    The compiler's cycles are for the generation the module was compiled for: estimate each generation
    from its own compile (preflight does)."""
    from tpuprof.analyses import collectives

    target = targets.get(target_name)
    rates = peaks(target)
    timed = []
    roofline = compiler = compute = memory = 0.0
    with_cycles = 0
    communication_ops = collectives.SYNC | set(collectives.STARTS)
    untimed = 0
    for op in cost.ops:
        if op.opcode in communication_ops or op.collective:  # timed by the collective model, not as HBM traffic
            untimed += 1
            continue
        compute_one = op.flops / rates.for_dtype(op.matmul_dtype)
        memory_one = op.hbm_bytes / rates.hbm_bytes_per_s
        roof = max(compute_one, memory_one) * op.count
        if op.compiler_cycles is not None and rates.clock_hz:
            by_compiler = op.compiler_cycles / rates.clock_hz * op.count
            with_cycles += 1
        else:
            by_compiler = roof
        roofline += roof
        compiler += by_compiler
        if compute_one >= memory_one:
            compute += roof
        else:
            memory += roof
        timed.append(TimedOp(op, compute_one * op.count, memory_one * op.count, roof, by_compiler,
                             math.sqrt(roof * by_compiler)))
    flagged = sorted({op.name for op in cost.ops if op.kernel_without_estimate})
    result = StepEstimate(target.name, roofline, compiler if with_cycles else None, cost.flops, cost.hbm_bytes,
                          compute, memory, with_cycles, timed, cost.loops, flagged, rates, num_slices=num_slices)
    by_name = {op.name: op for op in cost.ops if op.kernel_estimate is not None}
    result.kernels_estimated = [
        {"name": name, "kernel": op.kernel_estimate.kernel, "flops": int(op.flops * op.count),
         "blocks_run": round(op.kernel_estimate.blocks_run, 4), "blocks": op.kernel_estimate.how_blocks}
        for name, op in sorted(by_name.items())]
    if untimed and cost.torus is not None and cost.walker is not None:
        per_execution = {(t.op.computation, t.op.name): t.point_s / max(t.op.count, 1) for t in timed}
        result.communication = collectives.analyse(cost.walker, cost.torus, per_execution)
    else:
        result.untimed_collectives = untimed
    if replica_of:
        torus = collectives.slice_torus(replica_of, target)
        if torus is not None and torus.chips * torus.devices_per_chip > 1:
            if replica_gradient_bytes:
                op = collectives.data_parallel_all_reduce(replica_gradient_bytes, torus)
                communication = result.communication or collectives.Communication(torus=torus)
                communication.ops.append(op)
                communication.collective_s += op.seconds
                communication.exposed_s += op.seconds
                result.communication = communication
            else:
                result.replica_all_reduce_untimed = True
    if num_slices > 1:
        result.dcn_s = (collectives.dcn_all_reduce_seconds(gradient_bytes_per_device, num_slices, target)
                        if gradient_bytes_per_device else None)
    return result


def short_source(line: str) -> str:
    """`/long/path/to/model.py:42` -> `model.py:42`."""
    return re.sub(r"^.*/", "", line) if line else ""


# --- what preflight reports ---------------------------------------------------------------------------

def model_flops(parameters: float, tokens: float, layers: int = 0, seq_len: int = 0, attention_width: int = 0,
                causal: bool = True) -> float:
    """Model FLOPs of a training step as MaxText counts them (calculate_tflops_training_per_device):
    6 x parameters x tokens for the matmuls (forward 2, backward 4), plus attention's two batched
    matmuls, 12 x layers x tokens x seq_len x (heads x head_dim), halved when causal. MaxText counts
    the matmul parameters only (no embedding lookup: `--model` passes its active_parameters); passing all
    parameters overcounts by the embedding table."""
    attention = 12 * layers * tokens * seq_len * attention_width * (0.5 if causal else 1.0)
    return 6 * parameters * tokens + attention
