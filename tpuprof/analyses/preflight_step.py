"""One slice's preflight answer from its compiles (tpuprof.commands.preflight wires them): the step compiled at the
batch asked or the largest that fits (the search, the memory curve, the verdict when none fits, the compiler's
RESOURCE_EXHAUSTED through the OOM triage), the batches a one-device compile means for the slice, the step time with
its gradient all-reduces, and which remat policy answers best.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from tpuprof.analyses import preflight
from tpuprof.errors import UserError
from tpuprof.models.preflight import (BatchSearch, Compiled, CompilerFigures, CurvePoint, HostMemory, OomAtBatch,
                                      PreflightOptionError, PreflightTarget, TargetEstimate, stated_rate)


def compile_step(spec, slice_, dtype: str | None, batch: int | None, max_batch: bool, use_cache: bool,
                 on_compile: Callable[[int], None], breakdown: Callable[[str, dict | None], Any],
                 layout_only: bool = False, on_layout: Callable[[int, int], None] | None = None,
                 stop_at_layout: bool = False) -> Compiled:
    """The step compiled for the slice in DTYPE (None: its own) at BATCH, or at the largest batch that fits
    (MAX_BATCH). ON_COMPILE(batch) is called before each compile. BREAKDOWN(dump_dir, compiler_stats): where the
    memory goes in the reported compile (a tpuprof.models.memory.ModuleMemory, None when the dump has none); the
    dump is reported only with one. LAYOUT_ONLY: each compile stops once the memory is laid out
    (analyses.preflight.Compiler); ON_LAYOUT(batch, bytes) when one that may fit goes on. The OOM triage's
    suggestions are advice's to add."""
    compiler = preflight.Compiler(spec, slice_, dtype, use_cache, on_compile=on_compile, layout_only=layout_only,
                                  on_layout=on_layout, stop_at_layout=stop_at_layout)
    step = getattr(spec, "batch_step", preflight.STEP)
    host_capacity = compiler.host_capacity
    search = None
    points = []
    if max_batch:
        found = preflight.search_max_batch(lambda b: compiler.measure(b, dump=True, need_dump=False),
                                           compiler.capacity, getattr(spec, "batch_limit", preflight.BATCH_LIMIT),
                                           step=step,
                                           preferred=getattr(spec, "preferred_batch", preflight.PREFERRED),
                                           host_capacity=host_capacity)
        batch = found.max_batch_size or step
        search = BatchSearch(found.max_batch_size, found.recommended_batch_size, found.limited, found.bound)
        points = found.points
    chosen = compiler.measure(batch, dump=True)
    compiler.drop_dumps({batch})
    points = sorted({p.batch_size: p for p in [*points, chosen]}.values(), key=lambda p: p.batch_size)
    figures = host = memory = dump_dir = None
    if chosen.stats:
        stats = chosen.stats
        figures = CompilerFigures(stats["argument_size_in_bytes"], stats["output_size_in_bytes"],
                                  stats["alias_size_in_bytes"], stats["temp_size_in_bytes"],
                                  stats["generated_code_size_in_bytes"])
        if chosen.host_bytes:  # offloaded activations or pinned host arguments: the host's memory, not HBM
            host = HostMemory(chosen.host_bytes, host_capacity, chosen.host_fits(host_capacity))
    if chosen.dump_dir:
        memory = breakdown(chosen.dump_dir, chosen.stats)
        if memory is not None:
            dump_dir = chosen.dump_dir
    none_fits = search is not None and search.max_batch_size is None
    parameters = oom = verdict = None
    if chosen.oom_message or none_fits:
        parameters = preflight.parameter_bytes(spec, dtype, slice_)
    if chosen.oom_message:
        oom = oom_at_batch(chosen.oom_message, batch, compiler.capacity, parameters)
    if none_fits:
        verdict = preflight.too_large(parameters, chosen, compiler.capacity, step, host_capacity,
                                      getattr(spec, "host_advice", preflight.HOST_ADVICE),
                                      # an LLM step's figure is its state per device (preflight.parameter_bytes)
                                      "the weights and AdamW state" if hasattr(spec, "state_bytes_per_device")
                                      else "parameters")
    return Compiled(batch, chosen.fits, chosen.required_bytes, compiler.compiles,
                    tuple(CurvePoint(p.batch_size, p.required_bytes, p.fits, p.host_bytes) for p in points),
                    preflight.fit_curve(points), figures, host, memory, dump_dir, search, parameters, oom, verdict,
                    chosen.stage)


def oom_at_batch(message: str, batch: int, capacity: int, parameters: int | None) -> OomAtBatch:
    """The compiler's RESOURCE_EXHAUSTED text through the OOM triage (when it is available), without suggestions.

    The parameter bytes tell the triage what does not shrink with the batch."""
    try:
        from tpuprof.analyses import oom as triage
    except ImportError:
        return OomAtBatch(message)
    report = triage.parse_message(message)
    if report is None:
        return OomAtBatch(message)
    return OomAtBatch(message, report, triage.estimate_batch(report, batch, capacity, dump_arguments=parameters))


def slice_batches(chosen, batch_per_device: int | None, whole_slice: bool | None = None) -> dict:
    """PreflightTarget's batch_per_chip and global_batch. A one-device compile is one data-parallel replica: every
    device of the slice (of every slice) runs it with its own batch. A bare generation (`--tpu v6e`) names no slice:
    no global batch, unless the step was compiled over the whole topology (`whole_slice`, the LLM step)."""
    if batch_per_device is None:
        return {}
    out = {"batch_per_chip": batch_per_device * chosen.target.devices_per_chip}
    if chosen.explicit if whole_slice is None else whole_slice:
        out["global_batch"] = batch_per_device * chosen.total_devices
    return out


def llm_batch_per_device(chosen, batch_per_chip: int | None, global_batch: int | None) -> int | None:
    """The LLM step's sequences per device from --batch-per-chip or --global-batch (None: --max-batch searches it);
    one that does not divide evenly over the slice's devices is an option error."""
    per_chip = chosen.target.devices_per_chip
    if batch_per_chip is not None:
        if batch_per_chip % per_chip:
            raise PreflightOptionError("batch_per_chip", f"{{option}} {batch_per_chip}: a {chosen.target.name} chip "
                                       f"is {per_chip} devices, so the batch per chip must be a multiple of "
                                       f"{per_chip}.")
        return batch_per_chip // per_chip
    if global_batch is not None:
        if global_batch % chosen.total_devices:
            raise PreflightOptionError("global_batch", f"{{option}} {global_batch} is not a multiple of the "
                                       f"{chosen.total_devices} devices of {chosen.name}"
                                       f"{f' x {chosen.num_slices}' if chosen.num_slices > 1 else ''}.")
        return global_batch // chosen.total_devices
    return None


def estimate(chosen, compiled: Compiled, options, *, tokens: int | None, model=None, seq_len: int | None = None,
             batch_per_chip: int | None = None, whole_job: bool = False, spec=None) -> TargetEstimate | None:
    """Step time, throughput and cost from the reported compile's dump (None without a dump, or for a step timed at
    0). None too for a step that does not fit HBM or the host's memory: it cannot run, so it has no step time, MFU
    or cost (a job stops at its out-of-memory error). WHOLE_JOB: the batch names every device of the slice, so a
    one-device compile is a data-parallel replica of the job, and its gradient all-reduce over the slice is timed.
    OPTIONS: PreflightOptions (prices, top)."""
    from tpuprof import prices
    from tpuprof.analyses import step_estimate

    if not compiled.runs or not compiled.dump_dir or compiled.required_bytes is None:
        return None
    try:
        cost = step_estimate.load(compiled.dump_dir)
    except UserError:
        return None
    parameters = (model or {}).get("parameters")
    compiled_devices = len(cost.torus.assignment) if cost.torus is not None and cost.torus.assignment else 1
    gradient, gradient_source = preflight.gradient_bytes_per_device(
        chosen.devices, parameters, compiled.figures.argument_bytes if compiled.figures else None, compiled_devices)
    replica = cost.torus is None or len(cost.torus.assignment) <= 1  # one device: a data-parallel replica
    replica_of = chosen.topology if replica and whole_job else None
    replica_gradient, replica_source = None, ""
    if replica_of and chosen.devices > 1:
        state = None
        if not parameters and spec is not None:
            state = compiled.parameter_bytes or preflight.parameter_bytes(spec, None, chosen)
        replica_gradient, replica_source = preflight.replica_gradient_bytes(parameters, state)
    timed = step_estimate.estimate(cost, chosen.generation, chosen.num_slices, gradient, replica_of=replica_of,
                                   replica_gradient_bytes=replica_gradient)
    if timed.point_s <= 0:
        return None
    flops = preflight.model_flops_per_device(model, seq_len, batch_per_chip, chosen.target.devices_per_chip)
    basis = preflight.model_flops_basis(model, seq_len, batch_per_chip, chosen.target.devices_per_chip) if flops else ""
    sources = (replica_source, gradient_source if chosen.num_slices > 1 else "")
    return TargetEstimate(timed, compiled.batch_size, seq_len or tokens,
                          prices.price_for(chosen.generation, options.prices), top=min(options.top, 5),
                          model_flops_per_device=flops, model_flops_basis=basis,
                          gradient_source="; ".join(p for p in sources if p))


MU_BF16 = "--mu-dtype bfloat16 (MaxText's mu_dtype)"
WEIGHTS_BF16 = "--weight-dtype bfloat16 (MaxText's weight_dtype)"


def smaller_state(config, sizes: dict, state, chosen) -> tuple:
    """What divides the weights and AdamW state further, each with the state per device it gives (llm's
    sharding arithmetic, as the verdict's own figure; STATE: its TrainingState): the data axis folded into fsdp, a
    bf16 first moment (MU_BF16), bf16 weights and moments, and the smallest slice Cloud TPU offers of the generation
    (named as Cloud TPU names it: v5p-32 is 16 devices) where they fit."""
    from tpuprof.sources import llm

    capacity = chosen.target.compiler_hbm_bytes
    found = []
    if sizes["data"] > 1:
        folded = {**sizes, "fsdp": sizes["fsdp"] * sizes["data"], "data": 1}
        found.append((f"--mesh fsdp={folded['fsdp']}" + "".join(f",{axis}={folded[axis]}" for axis in
                                                               ("tensor", "expert") if folded[axis] > 1),
                      llm.state_bytes_per_device(config, folded, state)))
    if state.first_moment == "float32":
        found.append((MU_BF16, llm.state_bytes_per_device(config, sizes, replace(state, mu="bfloat16"))))
    if state.weights == "float32":
        found.append((WEIGHTS_BF16,
                      llm.state_bytes_per_device(config, sizes, replace(state, weights="bfloat16"))))
    from tpuprof import slices

    devices, split = math.prod(sizes.values()), sizes["tensor"] * sizes["expert"]
    for offered in sorted((s for s in slices.table() if s.generation == chosen.generation), key=lambda s: s.devices):
        if offered.devices <= devices or offered.devices % split:
            continue
        wider = {**sizes, "fsdp": offered.devices // split, "data": 1}
        per_device = llm.state_bytes_per_device(config, wider, state)
        if per_device <= capacity:
            kept = "".join(f",{axis}={wider[axis]}" for axis in ("tensor", "expert") if wider[axis] > 1)
            found.append((f"{offered.name} ({offered.devices} devices), fsdp over them"
                          + (f" (--mesh fsdp={wider['fsdp']}{kept})" if kept else ""), per_device))
            break
    return tuple(found)


def larger_slices(config, sizes: dict, state, chosen, needed: int, gradients: bool = False) -> tuple:
    """Where the step, at the same batch per device, fits by the state arithmetic: on the smallest slice Cloud TPU
    offers of the generation whose devices divide the weights and AdamW state (fsdp over them, the tensor and expert
    axes kept) so much further that what the step NEEDED here less the state freed fits the HBM (its activations per
    device do not change with the slice). (found, largest): each (Slice, state bytes per device) or None; the
    largest slice offered, to say that none is large enough. GRADIENTS: the gradients (one per parameter, in the
    weights' dtype) divided with the state, as fsdp divides them: the other bound of the arithmetic, which keeps them
    whole."""
    from tpuprof import slices
    from tpuprof.models.preflight import WEIGHT_DTYPES
    from tpuprof.sources import llm

    capacity = chosen.target.compiler_hbm_bytes
    per_parameter = state.bytes_per_parameter()
    with_gradients = per_parameter + (WEIGHT_DTYPES[state.weights] if gradients else 0)

    def state_bytes_per_device(config_, sizes_, state_) -> int:
        return llm.state_bytes_per_device(config_, sizes_, state_) // per_parameter * with_gradients

    here = state_bytes_per_device(config, sizes, state)
    devices, split = math.prod(sizes.values()), sizes["tensor"] * sizes["expert"]
    found = largest = None
    for offered in sorted((s for s in slices.table() if s.generation == chosen.generation), key=lambda s: s.devices):
        if offered.devices <= devices or offered.devices % split:
            continue
        wider = {**sizes, "fsdp": offered.devices // split, "data": 1}
        largest = (offered, state_bytes_per_device(config, wider, state))
        if found is None and needed - (here - largest[1]) <= capacity:
            found = largest
    return found, largest


def throughput(target: PreflightTarget) -> float:
    """Tokens per second per chip at the reported batch, as the document states it (0 when it does not fit; the
    batch per chip, scaled far below any throughput, without an estimate)."""
    if not target.compiled.runs:  # HBM, or the host's memory, exceeded
        return 0.0
    tokens = target.estimate.tokens_per_s if target.estimate is not None else None
    return float(stated_rate(tokens) or 0) or float(target.batch_per_chip or 0) * 1e-9


def best(answers: list) -> PreflightTarget:
    """The answer (one per remat policy) with the highest throughput; the first of equals. Where none runs, the one
    that comes closest (the least HBM required): the policy a smaller training state is measured with."""
    found = max(answers, key=throughput)
    if throughput(found) > 0:
        return found
    return min(answers, key=lambda a: a.compiled.required_bytes if a.compiled.required_bytes is not None
               else math.inf)
