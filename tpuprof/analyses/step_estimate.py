"""How long one step of a compiled program takes on a TPU generation: a band [roofline, compiler] and a point.

From the per-op FLOPs, HBM bytes and compiler cycles of the module libtpu compiled (tpuprof.analyses.op_costs:
HloCostAnalysis counting over the compiled schedule, loops times their trip counts), two estimates of the step
time follow:
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

A step that offloads activations (a remat policy's host offload) copies them between HBM and the host's memory
asynchronously; each copy is timed at the host link's bandwidth per device and direction (tpuprof.targets
host_link_gbps: the JAX scaling book's typical figure per chip, an estimate) and overlapped with the compute between
its start and done in the same walk (tpuprof.analyses.collectives): the step adds the exposed part, the band's high
end all of it. A generation without a published host link (TPU7x) leaves the transfers untimed and says so.
Not modelled: see NOT_MODELLED.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpuprof import targets
from tpuprof.analyses import op_costs
from tpuprof.analyses.op_costs import Loop, OpCost, ProgramCost
from tpuprof.sources import hlo_dump

NOT_MODELLED = ["ICI latency per hop and per collective step (bandwidth terms only)",
                "contention between concurrent collectives beyond first-in-first-out on the links",
                "overlap of the cross-slice (DCN) gradient all-reduce with compute (counted exposed)",
                "the host link's latency (offload copies are timed by bandwidth only)", "the input pipeline",
                "step-to-step dispatch overhead"]

INT8 = {"s8", "u8", "s4", "u4"}
FP8 = {"f8e4m3fn", "f8e5m2", "f8e4m3b11fnuz", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e3m4"}


def load(path: str | Path) -> ProgramCost:
    """A compile's dump folder (or one module proto of it) -> its per-op costs."""
    return op_costs.program_cost(hlo_dump.read_compiled_module(path))


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
    def host_s(self) -> float:
        """The host transfers' time per step (0 when none, or when the host link is not published)."""
        return self.communication.host_s if self.communication else 0.0

    @property
    def exposed_host_s(self) -> float:
        return self.communication.host_exposed_s if self.communication else 0.0

    @property
    def low_s(self) -> float:
        return self.compute_low_s + self.exposed_collective_s + self.exposed_host_s + (self.dcn_s or 0.0)

    @property
    def high_s(self) -> float:
        return self.compute_high_s + self.collective_s + self.host_s + (self.dcn_s or 0.0)

    @property
    def point_s(self) -> float:
        return self.compute_point_s + self.exposed_collective_s + self.exposed_host_s + (self.dcn_s or 0.0)

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
    module = cost.hlo_module
    collectives_timed = bool(untimed and cost.torus is not None and module is not None)
    offloads = module is not None and any(collectives.host_transfer_in(i, module) for i in module.by_id.values()
                                          if i.opcode in collectives.HOST_STARTS)
    if collectives_timed or offloads:
        per_execution = {(t.op.computation, t.op.name): t.point_s / max(t.op.count, 1) for t in timed}
        result.communication = collectives.communication(
            module, cost.torus if collectives_timed else None, per_execution, host_link_bytes_per_s(target))
    if not collectives_timed:
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


def host_link_bytes_per_s(target: targets.Target) -> float | None:
    """One device's share of its chip's host link, bytes/s per direction; None when not published."""
    gbps = getattr(target, "host_link_gbps", None)
    return gbps * 1e9 / devices_per_chip(target) if gbps else None


def short_source(line: str) -> str:
    """`/long/path/to/model.py:42` -> `model.py:42`."""
    return re.sub(r"^.*/", "", line) if line else ""


# --- what preflight reports ---------------------------------------------------------------------------

def model_flops(parameters: float, tokens: float, layers: int = 0, seq_len: int = 0, attention_width: int = 0,
                causal: bool = True, spans: list[tuple[str, int]] | None = None,
                widths: dict[str, int] | None = None) -> float:
    """Model FLOPs of a training step as MaxText counts them (calculate_tflops_training_per_device):
    6 x parameters x tokens for the matmuls (forward 2, backward 4), plus attention's two batched
    matmuls, 12 x tokens x (heads x head_dim) x the keys a query attends, per layer, halved when causal:
    seq_len in each of `layers`, or per layer the `spans` given as (kind, length): a "sliding" window of W keys
    counts the S x W - W^2 / 2 (query, key) pairs of its causal band, a "chunked" layer its causal chunks of C
    (MaxText's calculate_mixed_attention_model_tflops_training_per_device and calculate_llama4_attention_tflops;
    a length of 0: the whole sequence). WIDTHS: heads x head_dim of the spans' layers of each kind where they differ
    (Gemma 4's full layers, heads of 512: MaxText's calculate_gemma4_tflops_training_per_device). MaxText counts
    the matmul parameters only (no embedding lookup: `--model` passes its active_parameters); passing all parameters
    overcounts by the embedding table."""
    def keys(kind: str, span: int) -> float:  # per query, before the causal half
        if not span or span >= seq_len:
            return seq_len
        if kind == "sliding":  # every query past the first W attends W keys: not halved by the causal mask
            return 2 * span - span * span / seq_len
        whole, rest = divmod(seq_len, span)  # causal chunks of `span`, and a shorter last one
        return (whole * span * span + rest * rest) / seq_len

    if spans is not None:
        total = sum(keys(kind, span) * (widths or {}).get(kind, attention_width) for kind, span in spans)
    else:
        total = layers * seq_len * attention_width
    attention = 12 * tokens * total * (0.5 if causal else 1.0)
    return 6 * parameters * tokens + attention
