"""The `tpuprof.preflight/1` document, built in this one place from the typed answer (tpuprof.models.preflight:
PreflightTarget per slice): `PreflightResult.to_dict()` calls `document`; the table, Markdown and HTML print it.
The prose of the document (the step time estimate's method and sources, the verdict when the weights alone do not
fit) and the ranking of the slices by cost and by time are written here too. (tpuprof/documents.py reads
documents back.)
"""

from __future__ import annotations

from tpuprof import targets
from tpuprof.analyses import attention_kernels
from tpuprof.analyses.step_estimate import NOT_MODELLED, StepEstimate, TimedOp
from tpuprof.models.preflight import (Compiled, PreflightTarget, TargetEstimate, TrainingState,
                                      stated_rate)
from tpuprof.units import fmt_bytes, fmt_count, fmt_ms, fmt_usd


def document(targets_: list, top: int) -> dict:
    """The document's body: one entry per slice, in the order given."""
    return {"targets": [target(t, top) for t in targets_]}


def target(t: PreflightTarget, top: int) -> dict:
    """One slice's entry. Keys appear only where they apply (a search's figures with --max-batch, an LLM's with
    --model, the compiler's with a compile), in the order the schema lists them."""
    c, generation = t.compiled, t.slice.target
    out: dict = {"target": generation.name, "topology": t.slice.topology, "slice": t.slice.to_json()}
    if t.model is not None:
        out["mesh"] = dict(t.mesh)
        if t.fast is not None:  # stopped before code generation: the document says what that leaves out
            out["fast"] = fast(t.fast)
        out["model"] = t.model
    out["device"] = generation.device_info()
    out["hbm_capacity_bytes"] = generation.compiler_hbm_bytes
    if t.model is not None:
        out["seq_len"] = t.seq_len
    if t.batch_per_chip is not None:
        out["batch_per_chip"] = t.batch_per_chip
    if t.global_batch is not None:
        out["global_batch"] = t.global_batch
    if t.model is not None:
        if t.searched:
            out["max_batch_per_chip"] = t.max_batch_per_chip
        out["state_bytes_per_chip"] = t.state_bytes_per_chip
        if t.unsharded is not None:
            out["unsharded"] = t.unsharded
        if t.remat_table:
            out["remat_table"] = [{"remat": row.model["remat"], "max_batch_per_chip": row.max_batch_per_chip,
                                   "required_bytes": row.compiled.required_bytes,
                                   "step_ms": _ms(row.estimate.step.point_s) if row.estimate else None,
                                   "compiles": row.compiles} for row in t.remat_table]
    out.update({"batch_size": c.batch_size, "fits": c.fits, "required_bytes": c.required_bytes})
    if t.batch_from is not None:
        out["batch_from"] = t.batch_from
    if c.figures is not None:
        out.update({"argument_bytes": c.figures.argument_bytes, "output_bytes": c.figures.output_bytes,
                    "alias_bytes": c.figures.alias_bytes, "temp_bytes": c.figures.temp_bytes,
                    "generated_code_bytes": c.figures.generated_code_bytes})
    if c.host is not None:
        out["host_bytes"] = c.host.bytes
        if c.host.capacity_bytes is not None:
            out["host_capacity_bytes"] = c.host.capacity_bytes
        out["host_fits"] = c.host.fits
    out.update(_peak(c))
    out.update(_search(c, t.searched, limited=True))
    if c.oom is not None or c.verdict is not None:
        out["parameter_bytes"] = c.parameter_bytes
    if c.verdict is not None:
        out["verdict"] = c.verdict
    out["compiles"] = t.compiles
    out["curve"] = [{"batch_size": p.batch_size, "required_bytes": p.required_bytes, "fits": p.fits,
                     **({"host_bytes": p.host_bytes} if p.host_bytes else {})} for p in c.curve]
    if c.curve_fit is not None:
        out["curve_fit"] = {"fixed_bytes": c.curve_fit.fixed_bytes,
                            "per_example_bytes": int(round(c.curve_fit.per_example_bytes))}
    if t.bf16 is not None:
        out["bf16"] = _bf16(t.bf16, t.searched)
    if c.oom is not None:
        out["oom"] = _oom(c)
    if t.estimate is not None:
        out["estimate"] = estimate(t.estimate)
    if c.dump_dir is not None:
        out["dump_dir"] = c.dump_dir
    out["cache"] = t.cache
    if c.memory is not None:
        from tpuprof.documents_memory import document as memory_document

        out["memory"] = memory_document([c.memory], top)["modules"][0]
    return out


def fast(answer) -> dict:
    """What a compile stopped at its memory layout (FastAnswer) says, in words a user reads in the "how" row."""
    return {"stage": "buffer_assignment", "margin_bytes": answer.margin_bytes,
            "method": ("stopped before code generation: the compiler's memory layout alone (its buffer assignment) "
                       f"exceeds the HBM offered by more than {fmt_bytes(answer.margin_bytes)}, more than code "
                       "generation was seen to remove (7 MB; it added up to 7.9 GiB); the figures are the layout's, a "
                       "lower bound; --full compiles to the end")}


def _peak(c: Compiled) -> dict:
    if c.memory is None:
        return {}
    return {"peak_heap_bytes": c.memory.peak_heap_bytes, "peak_unpadded_heap_bytes": c.memory.peak_unpadded_heap_bytes,
            "padding_at_peak_bytes": c.memory.padding_at_peak_bytes}


def _search(c: Compiled, searched: bool, limited: bool) -> dict:
    if c.search is None:
        return {"max_batch_size": None} if searched else {}  # the weights alone do not fit: nothing searched
    out = {"max_batch_size": c.search.max_batch_size, "recommended_batch_size": c.search.recommended_batch_size}
    if limited:
        out["search_limited"] = c.search.limited
    out["max_batch_bound"] = c.search.bound
    return out


def _bf16(c: Compiled, searched: bool) -> dict:
    """--compare-bf16: the bfloat16 compile's headline figures."""
    out = {"batch_size": c.batch_size, "fits": c.fits, "required_bytes": c.required_bytes, **_peak(c),
           **(_search(c, searched, limited=False) if c.search is not None else {}), "compiles": c.compiles}
    if c.verdict is not None:
        out["verdict"] = c.verdict
    return out


def _oom(c: Compiled) -> dict:
    oom = c.oom
    if oom.report is None:
        return {"message": oom.message}
    return {"message": oom.message, "report": oom.report.to_json(), "batch_estimate": oom.batch_estimate.to_json(),
            "suggestions": list(oom.suggestions)}


# --- prose -----------------------------------------------------------------------------------------------

_WEIGHT_WORDS = {"float32": "fp32", "bfloat16": "bf16"}
_WITH_ARTICLE = {"fp32": "an fp32", "bf16": "a bf16"}


def state_too_large(state_bytes_per_device: int, parameters: int, state: TrainingState, mesh: dict, unsharded,
                    generation, alternatives: tuple = (), compiled: dict | None = None) -> str:
    """The verdict when the weights and AdamW state alone exceed a device's HBM: no batch fits, nothing compiled.
    ALTERNATIVES: (what to change, the state per device it gives), from the same arithmetic, smallest change
    first; COMPILED: change -> what the compile of the step so changed says (the change's own words)."""
    shards = mesh["fsdp"] * mesh["tensor"]
    divided = f"sharded {shards} ways over fsdp x tensor" if shards > 1 else "whole on each device (fsdp x tensor: 1)"
    sharding = "" if unsharded else (f", {divided}"
                                     + (f", the experts' weights {shards * mesh['expert']} ways with expert"
                                        if mesh["expert"] > 1 else ""))
    weights, mu = _WEIGHT_WORDS[state.weights], _WEIGHT_WORDS[state.first_moment]
    kept = (f"{weights} weights and two {weights} moments" if mu == weights
            else f"{weights} weights, {_WITH_ARTICLE[mu]} first moment and {_WITH_ARTICLE[weights]} second moment")
    capacity = generation.compiler_hbm_bytes
    verdict = (f"does not fit: the parameters and AdamW state alone need {fmt_bytes(state_bytes_per_device)} "
               f"per device ({parameters / 1e9:.1f}B parameters x {state.bytes_per_parameter()} bytes: "
               f"{kept}{sharding}), more than the "
               f"{fmt_bytes(capacity)} of HBM a {generation.name} device has")
    if unsharded:
        return f"{verdict}; {unsharded_words(unsharded, mesh)}."
    changes = [f"{change}: {fmt_bytes(state)} per device{'' if state <= capacity else ' (still too much)'}"
               + (f" ({compiled[change]})" if change in (compiled or {}) else "") for change, state in alternatives]
    if not changes:
        return f"{verdict}; use a larger slice."
    return (f"{verdict}. The state per device with {'; with '.join(changes)}"
            + (" (the state alone: activations come on top)." if any(s <= capacity for _, s in alternatives)
               else "."))


def unsharded_words(unsharded: dict, mesh: dict) -> str:
    """What stays whole of the parameters on each device, why, and the mesh that divides them (the table, the
    verdict and Markdown say it the same way)."""
    why = "; ".join(f"{' or '.join(map(str, dims))} is no multiple of {axis}={mesh.get(axis)}"
                    for axis, dims in unsharded["dimensions"].items())
    names = unsharded["parameters"]
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    words = (f"{listed} not sharded, {fmt_bytes(unsharded['state_bytes_per_chip'])} per chip more than an even "
             f"split ({why}; JAX shards a dimension only evenly)")
    if unsharded.get("mesh"):
        words += f"; --mesh {unsharded['mesh']} divides them"
    return words


# --- the step time estimate --------------------------------------------------------------------------------

def estimate(answer: TargetEstimate) -> dict:
    """The JSON `estimate` of one preflight target: step time, throughput per chip, utilisation, cost.

    Throughput is per chip (TargetEstimate.examples_per_s). A model's FLOPs per device give the MFU; without them
    the MFU is the compiled program's FLOPs over the peak (hardware utilisation)."""
    estimate_, price, top = answer.step, answer.price, answer.top
    model_flops_per_device, gradient_source = answer.model_flops_per_device, answer.gradient_source
    chips = answer.devices_per_chip
    step = estimate_.point_s
    examples_per_s, tokens_per_s = answer.examples_per_s, answer.tokens_per_s
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
        "examples_per_s": stated_rate(examples_per_s),
        "tokens_per_s": stated_rate(tokens_per_s),
        "tokens_per_s_per_chip": stated_rate(tokens_per_s),
        "flop_utilization_percent": round(100 * estimate_.flop_utilization, 1),
        "mfu_percent": round(mfu, 1) if mfu is not None else None,
        "mfu_source": _mfu_source(answer, flops_for_mfu),
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
        **_host_transfers(estimate_),
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


def _mfu_source(answer: TargetEstimate, flops: float) -> str:
    """How the MFU was obtained: whose FLOPs, how many a step on one device, over which peak."""
    estimate_ = answer.step
    chip = targets.get(estimate_.target)
    share = answer.devices_per_chip
    peak = (f"{estimate_.peaks.bf16_flops / 1e12:g} TFLOP/s bf16 a device ({chip.name}'s {chip.peak_bf16_tflops:g} a "
            f"chip{f' / {share} devices' if share > 1 else ''}, tpuprof.targets)")
    basis = answer.model_flops_basis or "MaxText's count"
    counted = (f"model FLOPs ({basis})" if answer.model_flops_per_device else
               "the compiled program's FLOPs (hardware FLOP utilisation: no model FLOPs known)")
    return f"{counted}: {flops / 1e12:,.4g} TFLOP a step on one device / (the step's point estimate x {peak})"


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
    communication = estimate_.communication
    if communication is not None and communication.host_transfers and communication.host_link_bytes_per_s is None:
        out.insert(0, f"{communication.host_copies} copies between HBM and the host (no "
                      f"host link bandwidth published for {target.name})")
    if estimate_.num_slices > 1 and estimate_.dcn_s is None:
        out.insert(0, f"the all-reduce across {estimate_.num_slices} slices (no DCN bandwidth published for "
                      f"{target.name}, or no gradient size known)")
    return out


def _host_transfers(estimate_: StepEstimate) -> dict:
    """`host_transfers` of a step that copies activations between HBM and the host (nothing otherwise): bytes per
    step each way, and their time at the host link's bandwidth, all of it and the part compute does not hide."""
    communication = estimate_.communication
    if communication is None or not communication.host_transfers:
        return {}
    from tpuprof.analyses.collectives import FROM_HOST, TO_HOST

    target = targets.get(estimate_.target)
    timed = communication.host_link_bytes_per_s is not None
    link = (f"estimated at {communication.host_link_bytes_per_s / 1e9:g} GB/s per device and direction "
            f"(tpuprof.targets {target.name}: {target.host_link}), overlapped with the compute the schedule puts "
            "between each copy's start and done" if timed else
            f"not timed: no host link bandwidth is published for {target.name}; the step leaves these transfers out")
    return {"host_transfers": {
        "to_host_bytes": int(communication.host_bytes(TO_HOST)),
        "from_host_bytes": int(communication.host_bytes(FROM_HOST)),
        "copies": communication.host_copies,
        "ms": _ms(communication.host_s) if timed else None,
        "exposed_ms": _ms(communication.host_exposed_s) if timed else None,
        "method": link}}


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
                     f"{cheapest['batch_size']} per device{'' if e['price_verified'] else ', unverified price'})"
                     + (f"; by cost: {order}" if len(ranked["by_cost"]) > 1 else ""))
    fastest = ranked["by_time"][0]
    e = fastest["estimate"]
    order = " > ".join(f"{target_label(r)} {fmt_count(r['estimate']['examples_per_s'] * _chips(r))}/s" for r in ranked["by_time"])
    lines.append(f"fastest: {target_label(fastest)} ({e['examples_per_s']:,} examples/s per chip, step {fmt_ms(e['step_ms'])} "
                 f"at batch {fastest['batch_size']} per device)"
                 + (f"; by time (examples/s for the whole slice): {order}" if len(ranked["by_time"]) > 1 else ""))
    return "\n".join(lines)
