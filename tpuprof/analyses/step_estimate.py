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
Not modelled: see NOT_MODELLED.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpuprof import targets
from tpuprof.analyses import attention_kernels, op_costs
from tpuprof.analyses.op_costs import Loop, OpCost, ProgramCost
from tpuprof.sources import hlo_dump
from tpuprof.units import fmt_count, fmt_ms, fmt_usd

NOT_MODELLED = ["ICI latency per hop and per collective step (bandwidth terms only)",
                "contention between concurrent collectives beyond first-in-first-out on the links",
                "overlap of the cross-slice (DCN) gradient all-reduce with compute (counted exposed)",
                "host offload and host-device transfers", "the input pipeline", "step-to-step dispatch overhead"]

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
    if untimed and cost.torus is not None and cost.hlo_module is not None:
        per_execution = {(t.op.computation, t.op.name): t.point_s / max(t.op.count, 1) for t in timed}
        result.communication = collectives.communication(cost.hlo_module, cost.torus, per_execution)
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


def report(estimate_: StepEstimate, batch_size: int, tokens_per_example: int | None = None,
           price=None, top: int = 5, model_flops_per_device: float | None = None,
           gradient_source: str = "") -> dict:
    """The JSON `estimate` of one preflight target: step time, throughput per chip, utilisation, cost.

    `price`: a tpuprof.prices.Price (per chip-hour) or None. Throughput is per chip: a device's batch
    over the step time, times the devices a chip holds. `model_flops_per_device` (model_flops() / devices)
    gives the MFU; without it the MFU is the compiled program's FLOPs over the peak (hardware utilisation)."""
    chips = devices_per_chip(targets.get(estimate_.target))
    step = estimate_.point_s
    examples_per_s = batch_size * chips / step if step > 0 else None
    tokens_per_s = examples_per_s * tokens_per_example if examples_per_s and tokens_per_example else None
    total = estimate_.compute_s + estimate_.memory_s
    flops_for_mfu = model_flops_per_device if model_flops_per_device else estimate_.flops
    mfu = 100 * flops_for_mfu / (step * estimate_.peaks.bf16_flops) if step > 0 else None
    out = {
        "step_ms": _ms(step),
        "step_ms_low": _ms(estimate_.low_s),
        "step_ms_high": _ms(estimate_.high_s),
        "roofline_ms": _ms(estimate_.roofline_s),
        "compiler_ms": _ms(estimate_.compiler_s) if estimate_.compiler_s else None,
        "compute_ms": _ms(estimate_.compute_point_s),
        "collective_ms": _ms(estimate_.collective_s),
        "exposed_collective_ms": _ms(estimate_.exposed_collective_s),
        "dcn_ms": _ms(estimate_.dcn_s) if estimate_.dcn_s is not None else None,
        "num_slices": estimate_.num_slices,
        "examples_per_s": _round(examples_per_s),
        "tokens_per_s": _round(tokens_per_s),
        "tokens_per_s_per_chip": _round(tokens_per_s),
        "flop_utilization_percent": round(100 * estimate_.flop_utilization, 1),
        "mfu_percent": round(mfu, 1) if mfu is not None else None,
        "mfu_source": ("model FLOPs (6 x active parameters x tokens + causal attention, as MaxText counts them) / "
                       "(step x peak bf16 FLOP/s)" if model_flops_per_device else
                       "the compiled program's FLOPs / (step x peak bf16 FLOP/s): hardware FLOP utilisation, "
                       "no model FLOPs known"),
        "compute_bound_percent": round(100 * estimate_.compute_s / total, 1) if total else None,
        "memory_bound_percent": round(100 * estimate_.memory_s / total, 1) if total else None,
        "flops_per_step": int(estimate_.flops),
        "hbm_bytes_per_step": int(estimate_.hbm_bytes),
        "devices_per_chip": chips,
        "ops_with_compiler_cycles": estimate_.ops_with_cycles,
        "price_per_chip_hour": price.usd_per_chip_hour if price else None,
        "price_source": price.source if price else "no price known: pass --price GENERATION=USD",
        "price_verified": bool(price and price.verified),
        "cost_per_million_examples": None,
        "cost_per_million_tokens": None,
        "loops": [{"name": loop.name, "op_name": loop.op_name, "trip_count": loop.trip_count,
                   "trip_count_source": loop.trip_count_source} for loop in estimate_.loops],
        "top_ops": [_op_json(t) for t in estimate_.top(top)],
        "top_collectives": [op.to_json() for op in sorted(
            estimate_.communication.ops if estimate_.communication else [],
            key=lambda op: -op.seconds * op.count)[:top]],
        "collectives_method": _collectives_method(estimate_, gradient_source),
        "kernels_without_estimate": estimate_.kernels_without_estimate,
        "kernels_estimated": estimate_.kernels_estimated,
        "kernels_estimated_rule": attention_kernels.RULE if estimate_.kernels_estimated else None,
        "not_modelled": not_modelled(estimate_),
        "peaks_source": estimate_.peaks.source,
        "method": ("band = [roofline over the compiled ops, the compiler's estimated_cycles at the TensorCore "
                   "clock]; point = their geometric mean" if estimate_.compiler_s else
                   "roofline over the compiled ops only (no compiler cycles in this dump)")
                  + "; plus exposed collectives (the band's high end: all collectives, no overlap)"
                  + ("; plus the cross-slice DCN all-reduce" if estimate_.num_slices > 1 else ""),
    }
    if price and examples_per_s:
        per_example = price.usd_per_chip_hour / 3600 / examples_per_s
        out["cost_per_million_examples"] = _significant(per_example * 1e6)
        if tokens_per_s:
            out["cost_per_million_tokens"] = _significant(price.usd_per_chip_hour / 3600 / tokens_per_s * 1e6)
    return out


def not_modelled(estimate_: StepEstimate) -> list[str]:
    """NOT_MODELLED plus what this estimate could not time."""
    out = list(NOT_MODELLED)
    target = targets.get(estimate_.target)
    if estimate_.untimed_collectives:
        why = ("no published ICI bandwidth for " + target.name if not target.ici_link_gbps
               else "the dump does not say which torus it was compiled for")
        out.insert(0, f"{estimate_.untimed_collectives} collective(s) of the compiled program ({why})")
    if estimate_.replica_all_reduce_untimed:
        out.insert(0, "the data-parallel gradient all-reduce across the slice (a one-device compile holds no "
                      "collectives and the gradient size is not known: use --model, or compile the sharded step)")
    if estimate_.num_slices > 1 and estimate_.dcn_s is None:
        out.insert(0, f"the all-reduce across {estimate_.num_slices} slices (no DCN bandwidth published for "
                      f"{target.name}, or no gradient size known)")
    return out


def _collectives_method(estimate_: StepEstimate, gradient_source: str) -> str:
    target = targets.get(estimate_.target)
    parts = []
    torus = estimate_.communication.torus if estimate_.communication else None
    if torus is not None:
        shape = "x".join(str(b) for b in torus.bounds)
        rings = ",".join("xyz"[a] for a in range(3) if torus.wrap[a]) or "none"
        parts.append(f"ICI: {shape} chips, wraparound on {rings}, {target.ici_link_gbps:g} GB/s per link and "
                     f"direction ({target.ici_source}); ring/torus bandwidth terms per collective "
                     "(tpuprof.analyses.collectives), overlap from the schedule's async start/done pairs")
    if estimate_.num_slices > 1:
        parts.append(f"DCN: {estimate_.num_slices} slices, {target.dcn_gbps_per_chip or 'unknown'} Gbit/s per chip "
                     f"({target.ici_source.split(' ')[0] if target.ici_source else 'not published'}), counted exposed")
    if gradient_source:
        parts.append(f"gradient bytes: {gradient_source}")
    return "; ".join(parts) or "no collectives timed"


def _op_json(timed: TimedOp) -> dict:
    op = timed.op
    return {"name": op.name, "opcode": op.opcode, "op_name": op.op_name, "source_line": op.source_line,
            "count": op.count, "ms": _ms(timed.point_s), "roofline_ms": _ms(timed.roofline_s),
            "compiler_ms": _ms(timed.compiler_s) if op.compiler_cycles is not None else None,
            "bound": "compute" if timed.compute_s >= timed.memory_s else "memory",
            "flops": int(op.flops * op.count), "hbm_bytes": int(op.hbm_bytes * op.count)}


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def _round(value: float | None) -> float | None:
    if value is None:
        return None
    return round(value, 2) if value < 1000 else round(value)


def target_label(result: dict) -> str:
    """A target as people name it: the slice (v6e-256, 2xv5p-128) when one was given, else the generation (an
    explicit topology such as v5e:2x2 is shown as its generation, the topology beside it)."""
    slice_ = result.get("slice") or {}
    name = slice_.get("name") or result["target"]
    if ":" in name:
        return result["target"]
    return f"{slice_['num_slices']}x{name}" if slice_.get("num_slices", 1) > 1 and "x" not in name[:3] else name


def _chips(result: dict) -> int:
    slice_ = result.get("slice") or {}
    return (slice_.get("chips") or 1) * (slice_.get("num_slices") or 1)


def ranking(results: list[dict]) -> dict:
    """The targets that fit, by cost (per 1M tokens, else per 1M examples) and by time (the whole slice's
    throughput: per-chip examples/s x its chips; a bare generation counts one chip)."""
    fitting = [r for r in results if r.get("fits") and r.get("estimate") and r["estimate"].get("examples_per_s")]
    tokens = any(r["estimate"].get("cost_per_million_tokens") is not None for r in fitting)
    key = "cost_per_million_tokens" if tokens else "cost_per_million_examples"
    priced = [r for r in fitting if r["estimate"].get(key) is not None]
    return {"by_cost": sorted(priced, key=lambda r: r["estimate"][key]), "cost_key": key,
            "by_time": sorted(fitting, key=lambda r: -r["estimate"]["examples_per_s"] * _chips(r))}


def choice(results: list[dict]) -> str | None:
    """Two lines: the cheapest generation/slice that fits (ranked by cost) and the fastest (ranked by time)."""
    ranked = ranking(results)
    if not ranked["by_time"]:
        return None
    lines = []
    key = ranked["cost_key"]
    unit = "1M tokens" if key == "cost_per_million_tokens" else "1M examples"
    if ranked["by_cost"]:
        cheapest = ranked["by_cost"][0]
        e = cheapest["estimate"]
        order = " < ".join(f"{target_label(r)} {fmt_usd(r['estimate'][key])}" for r in ranked["by_cost"])
        lines.append(f"cheapest that fits: {target_label(cheapest)} ({fmt_usd(e[key])} per {unit} at batch "
                     f"{cheapest['batch_size']}{'' if e['price_verified'] else ', unverified price'})"
                     + (f"; by cost: {order}" if len(ranked["by_cost"]) > 1 else ""))
    fastest = ranked["by_time"][0]
    e = fastest["estimate"]
    order = " > ".join(f"{target_label(r)} {fmt_count(r['estimate']['examples_per_s'] * _chips(r))}/s" for r in ranked["by_time"])
    lines.append(f"fastest: {target_label(fastest)} ({e['examples_per_s']:,} examples/s per chip, step {fmt_ms(e['step_ms'])} "
                 f"at batch {fastest['batch_size']})"
                 + (f"; by time (examples/s for the whole slice): {order}" if len(ranked["by_time"]) > 1 else ""))
    return "\n".join(lines)
