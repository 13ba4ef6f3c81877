"""`tpuprof preflight SPEC --tpu v5e`: compile the user's step with libtpu for one TPU device, say
whether it fits in HBM (and by how much), find the largest batch that does, and show where the memory
goes (the memory command's analysis of the compile's dump). No TPU needed.
"""

from __future__ import annotations

import os

from tpuprof import targets
from tpuprof.errors import UserError


def run(spec_text: str | None, tpu: str, *, as_json: bool = False, format_: str | None = None, **settings) -> None:
    """The command line: SETTINGS are preflight_options' keywords; an option error names the flag."""
    from tpuprof.models.preflight import PreflightOptionError, preflight_options
    from tpuprof.renderers import preflight as render
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_)
    try:
        options = preflight_options(spec_text, tpu=tpu, **settings)
        with render.progress(enabled=format_ == "table") as report_progress:
            checked = result(options, report_progress)
    except PreflightOptionError as error:
        raise error.for_flags() from None
    if not print_document(checked, format_):
        render.print_report(checked.spec, checked.targets, checked.top)


def result(options, on_compile=None):
    """Every slice's figures for PreflightOptions, as the typed result that `tpuprof.preflight()` returns and the
    CLI renders. ON_COMPILE(label, batch) is called before each compile (the progress line)."""
    from tpuprof.sources import tpu_compile

    if not tpu_compile.jax_available():
        raise UserError(tpu_compile.INSTALL_HINT)
    if options.model is not None:
        return model_result(options, on_compile)
    spec, batch = _load_step(options)
    return step_result(spec, options, batch, on_compile)


def _load_step(options):
    """The user's step as a tpu_compile.Spec, and the batch to check (the example arguments' when none is given)."""
    from tpuprof.models.preflight import PreflightOptionError
    from tpuprof.sources import tpu_compile

    batch = options.batch
    if isinstance(options.step, (str, os.PathLike)):
        spec = tpu_compile.load_spec(str(options.step))
    else:
        from tpuprof.sources.python_step import spec_from_objects

        spec, example_batch = spec_from_objects(options.step, options.example_args)
        if options.compare_bf16 and not spec.accepts_dtype:
            raise PreflightOptionError("compare_bf16", "{option} needs a factory with a `dtype` parameter (or a "
                                       "file.py:factory): tpuprof cannot make a bfloat16 version of a function or "
                                       "model it is given.")
        if batch is None and not options.max_batch:
            batch = example_batch
            if batch is None:
                raise PreflightOptionError("batch", "the example arguments have no common leading (batch) dimension: "
                                           "give {batch_n} as a factory, or arguments whose last one has a batch "
                                           "dimension.")
    if options.mesh is not None:
        if not spec.accepts_mesh:
            raise PreflightOptionError("mesh", f"{{option}} shards a step that takes a `mesh` parameter; "
                                       f"{spec.factory_name} in {spec.path} has none (or use {{model}}).")
        spec.mesh_text = options.mesh
        for chosen in options.slices:  # a bad mesh is one sentence before any compile
            mesh_sizes(options.mesh, chosen)
    return spec, batch


def mesh_sizes(mesh: str | None, chosen) -> dict:
    """--mesh over the slice's devices; a mesh that does not fit them is an option error."""
    from tpuprof.models.options import template
    from tpuprof.models.preflight import PreflightOptionError
    from tpuprof.sources.mesh import parse_mesh

    try:
        return parse_mesh(mesh, chosen.devices)
    except UserError as error:
        raise PreflightOptionError("mesh", template(str(error), "--mesh")) from None


def step_result(spec, options, batch: int | None, on_compile=None):
    """Every slice's figures for the user's step (a tpu_compile.Spec)."""
    from tpuprof.results import PreflightResult

    report_progress = on_compile or (lambda label, batch_size: None)
    checked = [_target(spec, chosen, batch, options, report_progress) for chosen in options.slices]
    for target in checked:
        estimate = _estimate(target, options.tokens_per_example, options.prices, options.top, spec)
        if estimate is not None:
            target["estimate"] = estimate
    return PreflightResult(spec.text, checked, options.top)


def _estimate(target: dict, tokens_per_example, price_overrides, top, spec=None) -> dict | None:
    """Step time, throughput and cost from the reported compile's dump (None without a dump)."""
    from tpuprof import prices
    from tpuprof.analyses import step_estimate

    if not target.get("dump_dir") or target.get("required_bytes") is None:
        return None
    try:
        cost = step_estimate.load(target["dump_dir"])
    except UserError:
        return None
    slice_ = target.get("slice") or {}
    num_slices = slice_.get("num_slices") or 1
    gradient, gradient_source = _gradient_bytes_per_device(target, cost)
    replica = cost.torus is None or len(cost.torus.assignment) <= 1  # one device: a data-parallel replica
    replica_of = slice_.get("topology") if replica and "global_batch" in target else None  # a named slice
    replica_gradient, replica_source = (_replica_gradient_bytes(target, spec, replica_of)
                                        if replica_of and slice_.get("devices", 1) > 1 else (None, ""))
    estimate = step_estimate.estimate(cost, target["target"], num_slices, gradient, replica_of=replica_of,
                                      replica_gradient_bytes=replica_gradient)
    if estimate.point_s <= 0:
        return None
    tokens = target.get("seq_len") or tokens_per_example
    return step_estimate.report(estimate, target["batch_size"], tokens,
                                prices.price_for(target["target"], price_overrides), top=min(top, 5),
                                model_flops_per_device=_model_flops_per_device(target),
                                gradient_source="; ".join(p for p in (replica_source, gradient_source if num_slices > 1 else "") if p))


def _replica_gradient_bytes(target: dict, spec, topology: str) -> tuple[float | None, str]:
    """The gradients a data-parallel replica all-reduces across the slice: f32 per parameter of a known model,
    else the step's batch-independent argument bytes (parameters and optimizer state: exact for a step without
    optimizer state, an upper bound otherwise)."""
    parameters = (target.get("model") or {}).get("parameters")
    if parameters:
        return 4.0 * parameters, f"data-parallel all-reduce of {parameters:,} f32 gradients"
    if spec is None:
        return None, ""
    from tpuprof.analyses import preflight

    state = target.get("parameter_bytes") or preflight.parameter_bytes(spec, None, topology)
    if not state:
        return None, ""
    return float(state), ("data-parallel all-reduce of the step's batch-independent arguments (parameters and "
                          "optimizer state: an upper bound on the gradients)")


def _gradient_bytes_per_device(target: dict, cost) -> tuple[float | None, str]:
    """What each device all-reduces across slices: its share of the f32 gradients once reduced within the
    slice (reduce-scatter over ICI, all-reduce of the shard over DCN, all-gather over ICI)."""
    devices = (target.get("slice") or {}).get("devices") or 1
    parameters = (target.get("model") or {}).get("parameters")
    if parameters:
        return 4.0 * parameters / devices, f"{parameters:,} parameters x 4 bytes (f32) / {devices} devices per slice"
    arguments = target.get("argument_bytes")
    if arguments:
        compiled = len(cost.torus.assignment) if cost.torus is not None and cost.torus.assignment else 1
        return (arguments * compiled / devices,
                "the compiled step's argument bytes per device (parameters, optimizer state and batch: an "
                "upper bound on the gradients) / the slice's devices")
    return None, ""


def _model_flops_per_device(target: dict) -> float | None:
    """MaxText's model FLOPs per device for an LLM of known size (--model); None for other programs."""
    from tpuprof.analyses import step_estimate

    model = target.get("model") or {}
    parameters, seq = model.get("parameters"), target.get("seq_len")
    batch = target.get("batch_per_chip")
    if not (parameters and seq and batch):
        return None
    devices_per_chip = (target.get("device") or {}).get("devices_per_chip") or 1
    tokens = batch / devices_per_chip * seq
    # An MoE model computes with its active parameters; attention needs heads x head_dim (0: left out).
    active = model.get("active_parameters") or parameters
    width = model.get("attention_width") or (model.get("heads") or 0) * (model.get("head_dim") or 0)
    return step_estimate.model_flops(active, tokens, model.get("layers") or 0, seq, width)


def _target(spec, chosen, batch, options, report_progress) -> dict:
    from tpuprof.analyses import preflight

    target = chosen.target
    max_batch, top, use_cache = options.max_batch, options.top, options.use_cache
    result = {"target": target.name, "topology": chosen.topology, "slice": chosen.to_json(),
              "device": target.device_info(), "hbm_capacity_bytes": target.compiler_hbm_bytes}
    main = _run_dtype(spec, chosen, None, batch, max_batch, top, use_cache, report_progress)
    result.update(main)
    result.update(_batches(chosen, result["batch_size"]))
    if options.compare_bf16:
        bf16 = _run_dtype(spec, chosen, "bfloat16", batch, max_batch, top, use_cache, report_progress)
        result["bf16"] = {k: bf16.get(k) for k in (
            "batch_size", "fits", "required_bytes", "peak_heap_bytes", "peak_unpadded_heap_bytes",
            "padding_at_peak_bytes", "max_batch_size", "recommended_batch_size", "max_batch_bound", "compiles",
            "verdict")
            if k in bf16}
        result["compiles"] += bf16["compiles"]
        if main.get("memory") is not None and bf16.get("batch_size") == main.get("batch_size"):
            from tpuprof.advice.memory import measure_bf16

            measure_bf16(main["memory"], bf16.get("peak_heap_bytes"), main["batch_size"])
    result["cache"] = str(preflight.cache_root())
    return result


def _batches(chosen, batch_per_device: int | None, whole_slice: bool | None = None) -> dict:
    """A one-device compile is one data-parallel replica: every device of the slice (of every slice) runs it
    with its own batch. A bare generation (`--tpu v6e`) names no slice: no global batch, unless the step was
    compiled over the whole topology (`whole_slice`, the LLM step)."""
    if batch_per_device is None:
        return {}
    out = {"batch_per_chip": batch_per_device * chosen.target.devices_per_chip}
    if chosen.explicit if whole_slice is None else whole_slice:
        out["global_batch"] = batch_per_device * chosen.total_devices
    return out


def _run_dtype(spec, slice_, dtype, batch, max_batch, top, use_cache, report_progress) -> dict:
    from tpuprof.analyses import preflight

    label = f"{slice_.name}{' bf16' if dtype else ''}"
    compiler = preflight.Compiler(spec, slice_, dtype, use_cache,
                                  on_compile=lambda b: report_progress(label, b))
    out: dict = {}
    step = getattr(spec, "batch_step", preflight.STEP)
    host_capacity = compiler.host_capacity
    if max_batch:
        search = preflight.search_max_batch(lambda b: compiler.measure(b, dump=True, need_dump=False),
                                            compiler.capacity, getattr(spec, "batch_limit", preflight.BATCH_LIMIT),
                                            step=step,
                                            preferred=getattr(spec, "preferred_batch", preflight.PREFERRED),
                                            host_capacity=host_capacity)
        batch = search.max_batch_size or step
        out["max_batch_size"] = search.max_batch_size
        out["recommended_batch_size"] = search.recommended_batch_size
        out["search_limited"] = search.limited
        out["max_batch_bound"] = search.bound
        points = search.points
    else:
        points = []
    chosen = compiler.measure(batch, dump=True)
    compiler.drop_dumps({batch})
    points = sorted({p.batch_size: p for p in [*points, chosen]}.values(), key=lambda p: p.batch_size)
    curve = preflight.fit_curve(points)
    out.update({
        "batch_size": batch,
        "fits": chosen.fits,
        "required_bytes": chosen.required_bytes,
        "compiles": compiler.compiles,
        "curve": [{"batch_size": p.batch_size, "required_bytes": p.required_bytes, "fits": p.fits,
                   **({"host_bytes": p.host_bytes} if p.host_bytes else {})} for p in points],
    })
    if curve is not None:
        out["curve_fit"] = {"fixed_bytes": curve.fixed_bytes, "per_example_bytes": int(round(curve.per_example_bytes))}
    if chosen.stats:
        out.update({
            "argument_bytes": chosen.stats["argument_size_in_bytes"],
            "output_bytes": chosen.stats["output_size_in_bytes"],
            "alias_bytes": chosen.stats["alias_size_in_bytes"],
            "temp_bytes": chosen.stats["temp_size_in_bytes"],
            "generated_code_bytes": chosen.stats["generated_code_size_in_bytes"],
        })
        if chosen.host_bytes:  # offloaded activations or pinned host arguments: the host's memory, not HBM
            out["host_bytes"] = chosen.host_bytes
            if host_capacity is not None:
                out["host_capacity_bytes"] = host_capacity
            out["host_fits"] = chosen.host_fits(host_capacity)
    if chosen.dump_dir:
        memory = _memory(chosen.dump_dir, slice_.generation, top)
        if memory is not None:
            out["peak_heap_bytes"] = memory.peak_heap_bytes
            out["peak_unpadded_heap_bytes"] = memory.peak_unpadded_heap_bytes
            out["padding_at_peak_bytes"] = memory.padding_at_peak_bytes
            out["memory"] = memory
            if chosen.stats:  # the compiler's aliased bytes make the donation hint's figure (tpuprof.advice.memory)
                from tpuprof.advice.memory import add_donation
                add_donation(memory, chosen.stats)
            out["dump_dir"] = chosen.dump_dir
    parameters = None
    if chosen.oom_message or (max_batch and out["max_batch_size"] is None):
        parameters = out["parameter_bytes"] = preflight.parameter_bytes(spec, dtype, slice_)
    if chosen.oom_message:
        out["oom"] = _oom(chosen.oom_message, batch, compiler.capacity, parameters)
    if max_batch and out["max_batch_size"] is None:
        out["verdict"] = preflight.too_large(parameters, chosen, compiler.capacity, step, host_capacity,
                                             getattr(spec, "host_advice", preflight.HOST_ADVICE))
    return out


def _memory(dump_dir: str, generation: str, top: int):
    from pathlib import Path

    from tpuprof.commands import memory

    modules = [m for m in memory.analyze(Path(dump_dir), target=generation, top=top) if m.buffers]
    return max(modules, key=lambda m: m.peak_heap_bytes or 0) if modules else None


def _oom(message: str, batch: int, capacity: int, parameters: int | None) -> dict:
    """The compiler's RESOURCE_EXHAUSTED text through the OOM triage (when it is available).

    The parameter bytes tell the triage what does not shrink with the batch; its advice to dump or
    to run preflight is dropped: this is preflight, and the dump is the compile's own."""
    try:
        from tpuprof.advice import oom as advice
        from tpuprof.analyses import oom as triage
    except ImportError:
        return {"message": message}
    report = triage.parse_message(message)
    if report is None:
        return {"message": message}
    estimate = triage.estimate_batch(report, batch, capacity, dump_arguments=parameters)
    suggestions = [s for s in advice.suggest(report, estimate)
                   if "--xla_dump_to" not in s["message"] and "tpuprof preflight" not in s["message"]]
    return {"message": message, "report": report.to_json(), "batch_estimate": estimate.to_json(),
            "suggestions": suggestions}


# --- LLMs from a name or a config (--model) ------------------------------------------------------------

def model_result(options, on_compile=None, fast: bool | None = None):
    """Every slice's figures for the LLM train step (the typed result `tpuprof.preflight(model=...)` returns).
    FAST: True forces the extrapolated answer, None lets the layer count decide (`options.full`: never)."""
    from tpuprof.models.options import template
    from tpuprof.models.preflight import PreflightOptionError
    from tpuprof.results import PreflightResult
    from tpuprof.sources import llm

    if options.full and fast:
        raise PreflightOptionError("full", "{option} compiles every layer: not with a fast (extrapolated) answer.")
    try:
        config, source = llm.load_config(options.model)
    except UserError as error:
        raise PreflightOptionError("model", "{option}: " + template(str(error))) from None
    report_progress = on_compile or (lambda label, batch_size: None)
    checked = []
    for chosen in options.slices:
        rows = [_model_target(config, source, chosen, policy, options, report_progress,
                              False if options.full else fast) for policy in options.remat_policies]
        best = max(rows, key=_throughput)
        if len(rows) > 1:
            best["remat_table"] = [{"remat": row["model"]["remat"], "max_batch_per_chip": row.get("max_batch_per_chip"),
                                    "required_bytes": row.get("required_bytes"),
                                    "step_ms": (row.get("estimate") or {}).get("step_ms"),
                                    "compiles": row.get("compiles", 0)} for row in rows]
        checked.append(best)
    return PreflightResult(f"--model {config.name}", checked, options.top)


def _throughput(row: dict) -> float:
    """Tokens per second per chip at the reported batch (0 when it does not fit)."""
    if not row.get("fits") or row.get("host_fits") is False:  # HBM, or the host's memory, exceeded
        return 0.0
    estimate = row.get("estimate") or {}
    return float(estimate.get("tokens_per_s") or 0) or float(row.get("batch_per_chip") or 0) * 1e-9


def _model_target(config, source, chosen, remat, options, report_progress, fast=None) -> dict:
    from tpuprof.analyses import preflight
    from tpuprof.models.preflight import PreflightOptionError
    from tpuprof.renderers import preflight as render
    from tpuprof.sources import llm
    from tpuprof.units import fmt_bytes

    seq, batch_per_chip, global_batch, max_batch = options.seq, options.batch_per_chip, options.global_batch, \
        options.max_batch
    top, use_cache, price_overrides, weight_dtype = options.top, options.use_cache, options.prices, \
        options.weight_dtype
    target = chosen.target
    sizes = mesh_sizes(options.mesh, chosen)
    step = llm.Step(config, source, seq, remat, options.dtype, sizes, weight_dtype)
    spec = llm.Spec(step, chosen.topology)
    per_chip = target.devices_per_chip
    if batch_per_chip is not None:
        if batch_per_chip % per_chip:
            raise PreflightOptionError("batch_per_chip", f"{{option}} {batch_per_chip}: a {target.name} chip is "
                                       f"{per_chip} devices, so the "
                            f"batch per chip must be a multiple of {per_chip}.")
        batch = batch_per_chip // per_chip
    elif global_batch is not None:
        if global_batch % chosen.total_devices:
            raise PreflightOptionError("global_batch", f"{{option}} {global_batch} is not a multiple of the "
                                       f"{chosen.total_devices} devices of {chosen.name}{f' x {chosen.num_slices}' if chosen.num_slices > 1 else ''}.")
        batch = global_batch // chosen.total_devices
    else:
        batch = None
    result = {"target": target.name, "topology": chosen.topology, "slice": chosen.to_json(),
              "device": target.device_info(), "hbm_capacity_bytes": target.compiler_hbm_bytes,
              "mesh": sizes, "model": spec.model_info(), "seq_len": seq,
              "state_bytes_per_chip": spec.state_bytes_per_device * per_chip}
    whole = llm.unsharded(config, sizes, weight_dtype)
    if whole is not None:
        result["unsharded"] = whole.to_json(per_chip)
    capacity = target.compiler_hbm_bytes
    if spec.state_bytes_per_device > capacity:  # no batch can fit: say why without compiling
        shards = sizes["fsdp"] * sizes["tensor"] * sizes["expert"]
        sharding = ("" if whole else f", sharded {shards} ways over fsdp x tensor x expert")
        verdict = (f"does not fit: the parameters and AdamW state alone need {fmt_bytes(spec.state_bytes_per_device)} "
                   f"per device ({config.parameter_count() / 1e9:.1f}B parameters x "
                   f"{llm.state_bytes_per_parameter(weight_dtype)} bytes: {_WEIGHT_WORDS[weight_dtype]} weights and two "
                   f"{_WEIGHT_WORDS[weight_dtype]} moments{sharding}), more than the {fmt_bytes(capacity)} of HBM a "
                   f"{target.name} device has; "
                   + (f"{render.unsharded_words(result['unsharded'], sizes)}." if whole
                      else "use a larger slice or more fsdp."))
        result.update({"batch_size": batch, "fits": False, "required_bytes": None, "compiles": 0, "curve": [],
                       "verdict": verdict, "parameter_bytes": spec.state_bytes_per_device})
        if max_batch:
            result.update({"max_batch_size": None, "max_batch_per_chip": None})
        result.update(_batches(chosen, batch, whole_slice=True))
        result["cache"] = str(preflight.cache_root())
        return result
    label = f"{chosen.name} {config.name} remat={remat}"
    plan = llm.fast_plan(config, force=bool(fast)) if not max_batch and fast is not False else None
    if fast and plan is None:
        raise PreflightOptionError("full", f"{config.name} has too few layers for a faster answer than the full "
                                   "compile: use {option}.")
    if plan is not None:
        result.update(_fast_answer(step, plan, chosen, batch, top, use_cache, report_progress, label, seq,
                                   price_overrides, result))
        result.update(_batches(chosen, result["batch_size"], whole_slice=True))
        result["cache"] = str(preflight.cache_root())
        return result
    main = _run_dtype(spec, chosen, None, batch, max_batch, top, use_cache,
                      lambda _label, b: report_progress(label, b))
    if main.get("memory") is not None:  # tpuprof's own step: the options that build it, not edits of its code
        from tpuprof.advice.memory import for_builtin_step

        for_builtin_step(main["memory"], remat, options.dtype)
    result.update(main)
    if max_batch:
        result["max_batch_per_chip"] = (main["max_batch_size"] * per_chip if main.get("max_batch_size") else None)
    result.update(_batches(chosen, result["batch_size"], whole_slice=True))
    result["cache"] = str(preflight.cache_root())
    estimate = _estimate(result, seq, price_overrides, top)
    if estimate is not None:
        result["estimate"] = estimate
    return result



_WEIGHT_WORDS = {"float32": "fp32", "bfloat16": "bf16"}
# Figures of a compile that grow with the layers: extrapolated in the layer count by the fast answer.
_LINEAR = ("required_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "host_bytes")
_LINEAR_MS = ("step_ms", "step_ms_low", "step_ms_high", "roofline_ms", "compute_ms", "collective_ms",
              "exposed_collective_ms", "flops_per_step", "hbm_bytes_per_step")


def _fast_answer(step, plan, chosen, batch, top, use_cache, report_progress, label, seq, price_overrides,
                 result) -> dict:
    """The first answer: the step compiled with each varied segment of the layer plan repeated a few times
    (llm.fast_plan), every memory figure and the step time extrapolated linearly in the repeats to the model's
    own, said as such. The memory breakdown shown is the largest compile's (its layers, not the model's)."""
    from dataclasses import replace

    from tpuprof.analyses import preflight
    from tpuprof.sources import llm

    rows = []
    for repeats in plan.points:
        reduced = replace(step, config=step.config.with_repeats(repeats))
        spec = llm.Spec(reduced, chosen.topology)
        row = _run_dtype(spec, chosen, None, batch, False, top, use_cache,
                         lambda _label, b, n=reduced.config.num_hidden_layers: report_progress(f"{label} {n} layers", b))
        row.update({key: result[key] for key in ("target", "topology", "slice", "device", "mesh")})
        row.update({"model": spec.model_info(), "seq_len": seq,
                    "batch_per_chip": batch * result["device"].get("devices_per_chip", 1)})
        row["estimate"] = _estimate(row, seq, price_overrides, top)
        rows.append((repeats, row))
    if any(row.get("required_bytes") is None for _, row in rows):  # a reduced compile already fails: say so plainly
        failed = next(row for _, row in rows if row.get("required_bytes") is None)
        failed.pop("model", None)
        return {**failed, "fast": {"layers_compiled": [sum(len(b) * n for (b, _), n in zip(step.config.plan, r))
                                                       for r, _ in rows],
                                   "method": "a compile of fewer layers already does not fit"}}
    out = dict(rows[-1][1])
    out.pop("dump_dir", None)
    out["model"] = result["model"]
    for key in _LINEAR:
        values = [row.get(key) or 0 for _, row in rows]
        if any(row.get(key) is not None for _, row in rows):
            out[key] = int(round(plan.extrapolate(values)))
    out["fits"] = out["required_bytes"] <= result["hbm_capacity_bytes"]
    if out.get("host_bytes"):
        out["host_fits"] = (out["host_bytes"] <= out["host_capacity_bytes"]
                            if out.get("host_capacity_bytes") is not None else None)
    out["curve"] = [{"batch_size": batch, "required_bytes": out["required_bytes"], "fits": out["fits"]}]
    out.pop("curve_fit", None)
    estimates = [row.get("estimate") for _, row in rows]
    if all(estimates):
        estimate = dict(estimates[-1])
        for key in _LINEAR_MS:
            if all(e.get(key) is not None for e in estimates):
                estimate[key] = round(plan.extrapolate([e[key] for e in estimates]), 4)
        ratio = estimates[-1]["step_ms"] / estimate["step_ms"] if estimate.get("step_ms") else 1.0
        for key in ("examples_per_s", "tokens_per_s", "tokens_per_s_per_chip", "flop_utilization_percent"):
            if estimate.get(key) is not None:
                estimate[key] = round(estimate[key] * ratio, 3)
        for key in ("cost_per_million_examples", "cost_per_million_tokens"):
            if estimate.get(key) is not None:
                estimate[key] = estimate[key] / ratio
        full_flops, reduced_flops = _model_flops_per_device({**out, "model": result["model"]}), \
            _model_flops_per_device(rows[-1][1])
        if estimate.get("mfu_percent") is not None and full_flops and reduced_flops:
            estimate["mfu_percent"] = round(estimate["mfu_percent"] * ratio * full_flops / reduced_flops, 1)
        estimate["top_ops"], estimate["top_collectives"] = [], []  # per-op figures are the small compile's
        estimate["method"] = (f"extrapolated linearly in the layer count from compiles of {plan.words()}; "
                              + str(estimate.get("method", "")))
        out["estimate"] = estimate
    else:
        out.pop("estimate", None)
    out["compiles"] = sum(row.get("compiles", 0) for _, row in rows)
    out["fast"] = {"layers_compiled": plan.layers(), "layers": step.config.num_hidden_layers,
                   "method": f"estimated from {plan.words()}, extrapolated linearly in the layer count; "
                             f"--full compiles all {step.config.num_hidden_layers} layers"}
    return out
