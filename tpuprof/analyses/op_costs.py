"""The cost of each op of a compiled program, walked over its schedule (the entry computation, loop bodies and
called computations, never fused instructions one by one): what the step estimate (tpuprof.analyses.step_estimate)
times on each TPU generation.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpuprof import targets
from tpuprof.analyses import attention_kernels, collectives
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.models.hlo_module import HloModule, backend_config
from tpuprof.sources.hlo_dump import CompiledModule

# Opcodes XLA's HloCostAnalysis sends to HandleElementwiseOp: one FLOP per output element. It counts the
# transcendental ones (exponential, log, tanh, rsqrt...) as transcendentals, not FLOPs: they count none here.
ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder", "and", "or", "xor", "not",
    "negate", "abs", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "compare", "select",
    "clamp", "convert", "is-finite", "shift-left", "shift-right-arithmetic", "shift-right-logical",
    "popcnt", "count-leading-zeros", "real", "imag", "complex", "reduce-precision", "stochastic-convert",
}
# Ops that move no data of their own: views, tuples, control.
NO_TRAFFIC = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
    "add-dependency", "partition-id", "replica-id", "copy-done", "async-done", "send-done", "recv-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done", "while", "call", "conditional",
    "domain", "iota",
}
# Custom calls that move no data of their own: layout and placement markers, and libtpu's token-only bookkeeping
# around an async call (PrepareAsyncCallStart/Done: token in, token out, before an async collective).
LAYOUT_ONLY_CUSTOM_CALLS = {"ConcatBitcast", "AllocateBuffer", "Sharding", "SPMDFullToShardShape",
                            "SPMDShardToFullShape", "MoveToHost", "MoveToDevice", "annotate_device_placement",
                            "PrepareAsyncCallStart", "PrepareAsyncCallDone"}


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
    hlo_module: HloModule | None = field(default=None, repr=False, compare=False)  # its index, for the collectives
    torus: object = field(default=None, repr=False)  # collectives.Torus of a dump, None without one

    @property
    def flops(self) -> float:
        return sum(op.flops * op.count for op in self.ops)

    @property
    def hbm_bytes(self) -> float:
        return sum(op.hbm_bytes * op.count for op in self.ops)


def program_cost(compiled: CompiledModule) -> ProgramCost:
    """The per-op costs of a module libtpu compiled, with the torus it was compiled for when the dump says."""
    cost = walk(HloModule(compiled.proto), str(compiled.path), compiled.stage, compiled.target)
    if compiled.target is not None:
        cost.torus = collectives.compiled_torus(compiled.target_arguments, compiled.device_assignment,
                                                targets.get(compiled.target))
    return cost


def walk(module: HloModule, source: str = "", stage: str = "after_optimizations",
         target: str | None = None) -> ProgramCost:
    """The per-op costs of MODULE over its schedule from the entry computation."""
    return OpCostWalker(module).run(source, stage, target)


class OpCostWalker:
    """Walks a module's schedule and counts each op's FLOPs and HBM bytes (HloCostAnalysis rules)."""

    def __init__(self, module: HloModule):
        self.module = module
        self.computations = module.computations
        self.by_id = module.by_id
        self.shape = module.shape
        self._flops_cache: dict[int, float] = {}

    # the walk over the schedule
    def run(self, source, stage, target) -> ProgramCost:
        result = ProgramCost(self.module.name, source, stage, target, hlo_module=self.module)
        self._walk(self.module.entry, 1, result, depth=0)
        return result

    def _walk(self, computation, count: int, result: ProgramCost, depth: int) -> None:
        if depth > 64:
            raise UserError("the HLO module nests loops or calls more than 64 deep.")
        for instruction in computation.instructions:
            opcode = instruction.opcode
            called = [self.computations[c] for c in instruction.called_computation_ids if c in self.computations]
            if opcode == "while":
                trips, how = self.module.trip_count(instruction)
                result.loops.append(Loop(instruction.name, instruction.metadata.op_name, trips, how, count))
                body, condition = self.module.loop_parts(instruction)
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
        config = backend_config(instruction)
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
                rule = attention_kernels.estimate(self.module, instruction, config)
                if rule is not None:
                    flops, source = rule.flops, "estimated"
        collective = False
        if instruction.opcode == "async-start":  # may wrap a collective (TPU7x's SparseCore all-reduces)
            collective = collectives.collective_in(instruction, self.computations) is not None
        elif instruction.opcode == "fusion":  # libtpu's async collective start/done: the collective, no compute
            collective = collectives.async_collective_role(instruction, self.computations) is not None
        return OpCost(
            name=instruction.name, opcode=instruction.opcode, op_name=instruction.metadata.op_name,
            source_line=self.module.source_line(instruction), computation=computation.name, count=count,
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
        for called in self.module.called(instruction):
            for inner in called.instructions:
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
        users = self.module.users(computation).get(parameter.id, [])
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
        roots = self.module.roots(fused)
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

    def _written_bytes(self, fused, result: shapes.Shape) -> float:
        roots = self.module.roots(fused)
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
