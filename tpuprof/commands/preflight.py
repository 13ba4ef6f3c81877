"""`tpuprof preflight SPEC --tpu v5e`: compile the user's step with libtpu for one TPU device, say
whether it fits in HBM (and by how much), find the largest batch that does, and show where the memory
goes (the memory command's analysis of the compile's dump). No TPU needed. Wiring only: options
(tpuprof.models.preflight), the step or the LLM (sources), each slice's compiles, batches and step time
(tpuprof.analyses.preflight_step), the memory breakdown and advice, the document (tpuprof.documents_preflight).
"""

from __future__ import annotations

import os

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
        render.print_document(checked.to_dict(), checked.top, checked.spec)


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
    """Every slice's answer for the user's step (a tpu_compile.Spec)."""
    from dataclasses import replace

    from tpuprof.analyses import preflight_step
    from tpuprof.results import PreflightResult

    report_progress = on_compile or (lambda label, batch_size: None)
    checked = [_target(spec, chosen, batch, options, report_progress) for chosen in options.slices]
    checked = [replace(target, estimate=preflight_step.estimate(target.slice, target.compiled, options,
                                                                tokens=options.tokens_per_example,
                                                                whole_job=target.global_batch is not None,
                                                                spec=spec))
               for target in checked]
    return PreflightResult(spec.text, checked, options.top)


def _target(spec, chosen, batch, options, report_progress):
    from tpuprof.analyses import preflight, preflight_step
    from tpuprof.models.preflight import PreflightTarget

    main = _compile(spec, chosen, None, batch, options, lambda b: report_progress(chosen.name, b))
    if main.memory is not None and main.batch_size and not options.max_batch:
        from tpuprof.advice.memory import batch_to_measure, measure_batch

        smaller = batch_to_measure(main.memory)
        if smaller and smaller < main.batch_size:  # the batch fix's estimate, compiled: its saving is then measured
            at = _compile(spec, chosen, None, smaller, options, lambda b: report_progress(chosen.name, b))
            measure_batch(main.memory, main.batch_size, main.required_bytes, smaller, at.required_bytes, at.fits)
    bf16 = None
    if options.compare_bf16:
        bf16 = _compile(spec, chosen, "bfloat16", batch, options, lambda b: report_progress(f"{chosen.name} bf16", b))
        if main.memory is not None and bf16.batch_size == main.batch_size:
            from tpuprof.advice.memory import measure_bf16

            measure_bf16(main.memory, bf16.memory.peak_heap_bytes if bf16.memory else None, main.batch_size)
    return PreflightTarget(chosen, main, str(preflight.cache_root()), bf16=bf16,
                           searched=options.max_batch, batch_from=spec.batch_from,
                           **preflight_step.slice_batches(chosen, main.batch_size))


def _compile(spec, chosen, dtype, batch, options, on_compile, layout_only=False, on_layout=None,
             stop_at_layout=False):
    """The step compiled for the slice (analyses.preflight_step.compile_step), its memory broken down by the memory
    command's analysis and both advised."""
    from dataclasses import replace

    from tpuprof.analyses import preflight_step

    def breakdown(dump_dir: str, stats: dict | None):
        memory = _memory(dump_dir, chosen.generation, options.top)
        if memory is not None and stats:  # the compiler's own totals: the shortfall, and the donation hint's figure
            from tpuprof.advice.memory import add_compiled_total, add_donation

            add_compiled_total(memory, stats)
            add_donation(memory, stats)
        return memory

    compiled = preflight_step.compile_step(spec, chosen, dtype, batch, options.max_batch, options.use_cache,
                                           on_compile, breakdown, layout_only=layout_only, on_layout=on_layout,
                                           stop_at_layout=stop_at_layout)
    if compiled.oom is None or compiled.oom.report is None:
        return compiled
    try:
        from tpuprof.advice import oom as advice
    except ImportError:
        return compiled
    # The advice to dump or to run preflight is dropped: this is preflight, and the dump is the compile's own.
    suggestions = [s for s in advice.suggest(compiled.oom.report, compiled.oom.batch_estimate)
                   if "--xla_dump_to" not in s["message"] and "tpuprof preflight" not in s["message"]]
    return replace(compiled, oom=replace(compiled.oom, suggestions=tuple(suggestions)))


def _memory(dump_dir: str, generation: str, top: int):
    from pathlib import Path

    from tpuprof.commands import memory

    modules = [m for m in memory.module_memories(Path(dump_dir), target=generation, top=top) if m.buffers]
    return max(modules, key=lambda m: m.peak_heap_bytes or 0) if modules else None


# --- LLMs from a name or a config (--model) ------------------------------------------------------------

def model_result(options, on_compile=None):
    """Every slice's answer for the LLM train step (the typed result `tpuprof.preflight(model=...)` returns)."""
    from dataclasses import replace

    from tpuprof.analyses import preflight_step
    from tpuprof.models.options import template
    from tpuprof.models.preflight import PreflightOptionError
    from tpuprof.results import PreflightResult
    from tpuprof.sources import llm

    try:
        config, source = llm.load_config(options.model)
    except UserError as error:
        raise PreflightOptionError("model", "{option}: " + template(str(error))) from None
    if options.moe != "capacity" and not config.moe:
        raise PreflightOptionError("moe", f"{{option}} {options.moe}: {config.name} has no mixture of experts.")
    positions = config.learned_positions or config.max_position_embeddings
    if positions and options.seq > positions:
        table = "its learned position table" if config.learned_positions else "max_position_embeddings"
        raise PreflightOptionError("seq", f"{{option}} {options.seq} is beyond the {positions:,} positions "
                                          f"{config.name} was trained for ({table}): give a shorter {{option}}, or a "
                                          "config.json whose max_position_embeddings allows it (context extension).")
    for chosen in options.slices:  # a mesh the model cannot take is one sentence before any compile
        model_mesh(config, chosen, options)
    report_progress = on_compile or (lambda label, batch_size: None)
    work = [(chosen, policy) for chosen in options.slices for policy in options.remat_policies]
    if options.ray:  # the tasks run elsewhere: no progress lines from there
        report_progress = lambda label, batch_size: None  # noqa: E731
    answers = _in_parallel(lambda job: _model_target(config, source, *job, options, report_progress), work,
                           workers=1 if options.full else SWEEP_WORKERS,
                           same_program=lambda job: (job[0].compile_label, job[1]), ray=options.ray)
    checked = []
    for index, chosen in enumerate(options.slices):
        rows = answers[index * len(options.remat_policies):(index + 1) * len(options.remat_policies)]
        best = _measure_batch_fix(config, source, preflight_step.best(rows), options, report_progress)
        best = _measure_state_change(config, source, best, options, report_progress)
        checked.append(replace(best, remat_table=tuple(rows)) if len(rows) > 1 else best)
    return PreflightResult(f"--model {config.name}", checked, options.top)


# A sweep's compiles (several --tpu, --remat all) at once: each is a child process (llm.Spec.compiles_in_a_child),
# stopped early when its layout does not fit, so a thread per target only waits on its child.
# libtpu's compile is mostly one thread, so one child per core; --full compiles to the end, one at a time (a whole
# compile of a large step holds many GiB of the machine's memory).
SWEEP_WORKERS = max(1, min(os.cpu_count() or 1, 8))


def _in_parallel(function, jobs: list, workers: int, same_program, ray: str | None = None) -> list:
    """FUNCTION of each job, in the jobs' order whichever finishes first; the first error is raised. Jobs whose
    SAME_PROGRAM key is equal (a multi-slice job and its one slice) run one after the other, so the second finds
    the first's compiles in the cache instead of compiling them again alongside. RAY: each such group is a task
    on that cluster (commands.ray_tasks)."""
    groups: dict = {}
    for index, job in enumerate(jobs):
        groups.setdefault(same_program(job), []).append(index)
    if ray:
        from tpuprof.commands.ray_tasks import map_on_ray

        answers: list = [None] * len(jobs)
        chunks = [[jobs[i] for i in indices] for indices in groups.values()]
        for indices, done in zip(groups.values(), map_on_ray(lambda chunk: [_portable(function(j)) for j in chunk],
                                                            chunks, ray)):
            for index, answer in zip(indices, done):
                answers[index] = answer
        return answers
    if workers <= 1 or len(groups) <= 1:
        return [function(job) for job in jobs]
    from concurrent.futures import ThreadPoolExecutor

    answers: list = [None] * len(jobs)

    def run(indices: list) -> None:
        for index in indices:
            answers[index] = function(jobs[index])

    with ThreadPoolExecutor(max_workers=min(workers, len(groups))) as pool:
        for done in [pool.submit(run, indices) for indices in groups.values()]:
            done.result()
    return answers


def _portable(target):
    """A target as a Ray task sends it back: its memory breakdowns without the module they read lazily."""
    from tpuprof.analyses.memory import self_contained

    for compiled in (target.compiled, target.bf16, target.state_change,
                     *(row.compiled for row in target.remat_table or ())):
        if compiled is not None and compiled.memory is not None:
            self_contained(compiled.memory)
    return target


def llm_spec(config, source, chosen, remat: str, options):
    """The LLM train step the options describe on slice CHOSEN (with REMAT, one policy of a sweep), as preflight
    compiles it (the bench's layouts build theirs here too)."""
    from tpuprof.sources import llm

    sizes = model_mesh(config, chosen, options)
    step = llm.Step(config, source, options.seq, remat, options.dtype, sizes, options.weight_dtype,
                    options.mu_dtype, options.vocab_tiling, options.moe, options.grad_dtype,
                    options.shard_exp_on_fsdp)
    return llm.Spec(step, chosen)


def model_mesh(config, chosen, options) -> dict:
    """--mesh over slice CHOSEN for the LLM CONFIG: its axes' sizes; an option error when the model cannot take it."""
    from tpuprof.models.preflight import PreflightOptionError

    sizes = mesh_sizes(options.mesh, chosen)
    if options.moe == "dropless" and sizes["expert"] > 1:
        raise PreflightOptionError("moe", "{option} dropless with an expert axis ({mesh} expert="
                                          f"{sizes['expert']}) is not modelled: tpuprof's dropless MoE holds every "
                                          "expert on each device, as MaxText's does without expert parallelism.")
    if options.shard_exp_on_fsdp and not (config.moe and config.num_experts % sizes["fsdp"] == 0
                                          and sizes["tensor"] == sizes["expert"] == 1):
        # MaxText's own condition (pyconfig: num_experts divisible by ici_fsdp_parallelism, no tensor or expert
        # parallelism)
        raise PreflightOptionError("shard_exp_on_fsdp", f"{{option}} needs a mixture of experts whose experts the fsdp "
                                                        f"axis divides, without tensor or expert axes: {config.name} has "
                                                        f"{config.num_experts or 'no'} experts, the mesh "
                                                        + ", ".join(f"{a}={n}" for a, n in sizes.items() if n > 1)
                                                        + ".")
    tensor = sizes["tensor"]
    if config.num_attention_heads % tensor or (not config.mla and config.num_key_value_heads % tensor):
        raise PreflightOptionError("mesh", f"{{option}} tensor={tensor} must divide the attention heads "
                                           f"({config.num_attention_heads}) and key/value heads "
                                           f"({config.num_key_value_heads}) of {config.name}.")
    return sizes


def _state_verdict(config, spec, chosen, unsharded, measured: dict | None = None) -> str:
    """Why no batch fits when the weights and AdamW state alone exceed HBM, with what would divide them (MEASURED:
    change -> what the compile of the step so changed says)."""
    from tpuprof.analyses import preflight_step
    from tpuprof.documents_preflight import state_too_large

    alternatives = preflight_step.smaller_state(config, spec.step.mesh_sizes, spec.step.state, chosen)
    return state_too_large(spec.state_bytes_per_device, config.parameter_count(), spec.step.state,
                           spec.step.mesh_sizes, unsharded, chosen.target, alternatives, measured)


def _measure_batch_fix(config, source, target, options, report_progress):
    """A step that does not fit, compiled again at the smaller batch its memory advice names ('about N sequences per
    device fit', arithmetic on the layout's buffers), as the user's step is: the fix then says what that compile
    needs. A layout-only compile (it stops once its layout alone cannot fit, and compiles to the end where it may),
    for the answer reported (a remat sweep's best row), not with --max-batch (the search has the answer)."""
    from dataclasses import replace

    from tpuprof.advice.memory import batch_to_measure, measure_batch

    compiled = target.compiled
    if options.max_batch or compiled.fits or compiled.memory is None or not compiled.batch_size \
            or compiled.required_bytes is None or target.model is None:
        return target
    smaller = batch_to_measure(compiled.memory)
    if not smaller or smaller >= compiled.batch_size:
        return target
    remat = target.model["remat"]
    spec = llm_spec(config, source, target.slice, remat, options)
    label = f"{target.slice.name} {config.name} remat={remat}"
    # Stopped at its layout (unless --full): a whole compile of a layout that may fit takes minutes on a large
    # step, and the answer before it came in seconds.
    at = _compile(spec, target.slice, None, smaller, options, lambda b: report_progress(label, b),
                  stop_at_layout=not options.full)
    bound = at.stage == "buffer_assignment"
    measure_batch(compiled.memory, compiled.batch_size, compiled.required_bytes, smaller, at.required_bytes,
                  at.runs and not bound, needed_is_bound=compiled.stage == "buffer_assignment",
                  smaller_is_bound=bound, smaller_refused=at.oom is not None,
                  smaller_layout_fits=bound and at.fits)
    return replace(target, batch_check=at)


def _measure_state_change(config, source, target, options, report_progress):
    """A step that does not fit HBM, compiled again at its batch with the smallest change of its training state that
    can make it fit: AdamW's first moment in bf16 (MaxText's mu_dtype, the TPU7x recipes' setting), else the
    gradients (grad_dtype: not state, so only where the state fits), else the weights and both moments
    (weight_dtype). Where the state fits, the change is the first whose arithmetic covers the
    compiled shortfall, and becomes a fix with what the two compiles measure; where the state alone cannot fit, the
    first whose state does, and the verdict says what its compile needs. The arithmetic alone cannot say whether the
    step then fits. One compile, for the answer reported (a remat sweep's best row)."""
    from dataclasses import replace

    from tpuprof.advice import llm_step

    compiled = target.compiled
    if compiled.fits or target.model is None:
        return target
    remat, capacity = target.model["remat"], target.slice.target.compiler_hbm_bytes
    spec = llm_spec(config, source, target.slice, remat, options)
    state = spec.step.state
    whole_state = spec.state_bytes_per_device > capacity  # the state alone cannot fit: nothing was compiled
    # Gradients of fp32 weights are fp32 unless cast (bf16 weights have bf16 gradients); they are not state.
    fp32_gradients = state.weights == "float32" and options.grad_dtype == "float32" and not whole_state
    changes = [change for change, applies in ((llm_step.MU_BF16, state.first_moment == "float32"),
                                               (llm_step.GRAD_BF16, fp32_gradients),
                                               (llm_step.WEIGHTS_BF16, state.weights == "float32")) if applies]
    if whole_state and target.unsharded:
        return target  # the verdict's answer is the mesh that divides the state
    if whole_state and "full" in options.remat_policies:
        remat = "full"  # a sweep none of whose policies was compiled: the one that keeps least
    if not whole_state and (compiled.memory is None or compiled.batch_size is None or compiled.required_bytes is None):
        return target  # the compiler refused the step: no layout to weigh the state against
    for change in changes:
        changed_options = replace(options, max_batch=False, **{change.option: "bfloat16"})
        changed_spec = llm_spec(config, source, target.slice, remat, changed_options)
        state_saved = spec.state_bytes_per_device - changed_spec.state_bytes_per_device
        if change is llm_step.GRAD_BF16:  # the parameters per device, each gradient 4 bytes -> 2
            state_saved = spec.state_bytes_per_device // state.bytes_per_parameter() * 2
        # The compiles measured free less than the state arithmetic (the 975M-parameter step of the tests: 1.61 GiB
        # of the first moment's 1.82): a change whose arithmetic cannot cover the shortfall is not compiled.
        if (changed_spec.state_bytes_per_device <= capacity if whole_state
                else compiled.required_bytes - capacity <= state_saved):
            break
    else:
        return target if whole_state else _larger_slice(config, spec, target)
    batch = compiled.batch_size or changed_spec.batch_step
    label = f"{target.slice.name} {config.name} remat={remat} {change.code}"
    # Stopped at its layout (unless --full), as the batch fix's compile is: minutes of code generation on a large
    # step for a change whose layout already says whether it can fit.
    changed = _compile(changed_spec, target.slice, None, batch, changed_options,
                       lambda b: report_progress(label, b), stop_at_layout=not options.full)
    if whole_state:
        verdict = _state_verdict(config, spec, target.slice, target.unsharded,
                                 {change.label: _compiled_words(changed, batch, capacity, remat)})
        return replace(target, compiled=replace(compiled, verdict=verdict), state_change=changed)
    changed_is_bound = changed.stage == "buffer_assignment"
    fits, layout_fits = changed.runs and not changed_is_bound, changed.runs and changed_is_bound
    fix = llm_step.measured(change, batch, compiled.required_bytes, compiled.stage == "buffer_assignment",
                            changed.required_bytes, changed_is_bound, fits, capacity, state_saved,
                            changed_layout_fits=layout_fits)
    llm_step.add(compiled.memory, fix, compiled.required_bytes)
    # None fits (--max-batch): the verdict names the change that makes one fit, or whose layout does.
    if compiled.verdict and (fits or layout_fits):
        from tpuprof.units import fmt_bytes

        if fits:
            said = f"it fits: compiled so at batch {batch}, the step needs {fmt_bytes(changed.required_bytes)}."
        else:
            said = (f"its layout fits: compiled so up to its memory layout at batch {batch}, the step needs at least "
                    f"{fmt_bytes(changed.required_bytes)}, and code generation adds to it (`--full` compiles it to "
                    "the end).")
        compiled = replace(compiled, verdict=f"{compiled.verdict} With {change.code} {said}")
    target = replace(target, compiled=compiled, state_change=changed)
    if fits or layout_fits:
        return target
    return _larger_slice(config, spec, target)  # the change, compiled, is not enough


def _larger_slice(config, spec, target):
    """A step whose state fits but that no change of its state makes fit (by its arithmetic, or compiled): the
    smallest larger slice of the generation where it does by the state arithmetic, or that none does, among its fixes
    (and in the verdict when no batch fits)."""
    from dataclasses import replace

    from tpuprof.advice import llm_step
    from tpuprof.analyses import preflight_step

    compiled, chosen = target.compiled, target.slice
    from tpuprof.models.preflight import WEIGHT_DTYPES

    sizes, state = spec.step.mesh_sizes, spec.step.state
    found, largest = preflight_step.larger_slices(config, sizes, state, chosen, compiled.required_bytes)
    divided, _ = preflight_step.larger_slices(config, sizes, state, chosen, compiled.required_bytes, gradients=True)
    gradients = spec.state_bytes_per_device // state.bytes_per_parameter() * WEIGHT_DTYPES[state.weights]
    fix = llm_step.larger_slice(chosen, compiled.batch_size, compiled.required_bytes,
                                compiled.stage == "buffer_assignment", spec.state_bytes_per_device, found, largest,
                                chosen.target.compiler_hbm_bytes, gradients_here=gradients,
                                divided=divided)
    llm_step.add(compiled.memory, fix, compiled.required_bytes)
    if compiled.verdict:  # none fits (--max-batch): the verdict names the slice too
        compiled = replace(compiled, verdict=f"{compiled.verdict} {fix.message}")
    return replace(target, compiled=compiled)


def _compiled_words(compiled, batch: int, capacity: int, remat: str) -> str:
    """What one compile of a changed step says, for the verdict's list of changes."""
    from tpuprof.models.memory import LAYOUT_FITS
    from tpuprof.units import fmt_bytes

    so = f"compiled so with remat {remat} at batch {batch} per device"
    if compiled.required_bytes is None:
        return f"{so}, the compiler refused the step: it does not fit"
    bound = compiled.stage == "buffer_assignment"
    if bound and compiled.runs:
        return (f"{so} up to its memory layout, the step needs at least {fmt_bytes(compiled.required_bytes)} of "
                f"{fmt_bytes(capacity)}: {LAYOUT_FITS} (`--full` compiles it to the end)")
    return (f"{so}, the step needs {'at least ' if bound else ''}{fmt_bytes(compiled.required_bytes)} of "
            f"{fmt_bytes(capacity)}: {'it fits' if compiled.runs and not bound else 'it does not fit'}")


def _model_target(config, source, chosen, remat, options, report_progress):
    from dataclasses import replace

    from tpuprof.analyses import preflight, preflight_step
    from tpuprof.models.preflight import Compiled, FastAnswer, PreflightTarget
    from tpuprof.sources import llm

    seq, max_batch = options.seq, options.max_batch
    target = chosen.target
    spec = llm_spec(config, source, chosen, remat, options)
    sizes = spec.step.mesh_sizes
    per_chip = target.devices_per_chip
    batch = preflight_step.llm_batch_per_device(chosen, options.batch_per_chip, options.global_batch)
    whole = llm.unsharded(config, sizes, spec.step.state)
    model = spec.model_info()
    llm_fields = dict(model=model, mesh=sizes, seq_len=seq, state_bytes_per_chip=spec.state_bytes_per_device * per_chip,
                      unsharded=whole.to_json(per_chip) if whole is not None else None, searched=max_batch)
    cache = str(preflight.cache_root())
    if spec.state_bytes_per_device > target.compiler_hbm_bytes:  # no batch can fit: say why without compiling
        verdict = _state_verdict(config, spec, chosen, llm_fields["unsharded"])
        compiled = Compiled(batch, False, None, 0, parameter_bytes=spec.state_bytes_per_device, verdict=verdict)
        return PreflightTarget(chosen, compiled, cache, **llm_fields,
                               **preflight_step.slice_batches(chosen, batch, whole_slice=True))
    label = f"{chosen.name} {config.name} remat={remat}"
    laid_out = getattr(report_progress, "laid_out", None)  # the CLI's progress shows the layout's lower bound
    on_layout = (lambda b, hbm: laid_out(label, b, hbm, target.compiler_hbm_bytes)) if laid_out else None
    compiled = _compile(spec, chosen, None, batch, options, lambda b: report_progress(label, b),
                        layout_only=not options.full, on_layout=on_layout)
    if compiled.memory is not None:  # tpuprof's own step: the options that build it, not edits of its code
        from tpuprof.advice.memory import for_builtin_step

        # The batch is split over the data, fsdp and expert axes and repeated over tensor: each device's program
        # holds tensor x the batch per device.
        for_builtin_step(compiled.memory, remat, options.dtype, compiled.batch_size, sizes.get("tensor", 1), per_chip)
    if compiled.oom is not None and compiled.oom.suggestions:
        from tpuprof.advice.memory import for_builtin_oom

        compiled = replace(compiled, oom=replace(compiled.oom, suggestions=for_builtin_oom(compiled.oom.suggestions,
                                                                                             remat, per_chip)))
    if max_batch:
        found = compiled.search.max_batch_size
        llm_fields["max_batch_per_chip"] = found * per_chip if found else None
    batches = preflight_step.slice_batches(chosen, compiled.batch_size, whole_slice=True)
    estimate = preflight_step.estimate(chosen, compiled, options, tokens=seq, model=model, seq_len=seq,
                                       batch_per_chip=batches.get("batch_per_chip"),
                                       whole_job="global_batch" in batches)
    fast = FastAnswer(preflight.CODEGEN_MARGIN_BYTES) if compiled.stage == "buffer_assignment" else None
    return PreflightTarget(chosen, compiled, cache, estimate=estimate, fast=fast, **llm_fields, **batches)
