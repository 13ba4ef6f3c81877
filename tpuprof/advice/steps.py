"""Suggestions from a step report (tpuprof.models.suggestion.Suggestion), ranked by the time per step they can win.

Savings are estimates (a range up to the category's time per step): a fix removes at most the time its
category takes, and usually less.
"""

from __future__ import annotations

import math

from tpuprof.analyses import input_pipeline
from tpuprof.analyses.summary import COMPILE_BOUND, MODERATELY_INPUT_BOUND, ProfileSummary
from tpuprof.models.profile import median
from tpuprof.models.suggestion import Suggestion, rank
from tpuprof.units import fmt_bytes

# Host transfers and collectives worth a suggestion (share of step time).
MIN_HOST_TRANSFER_PERCENT = 5.0
MIN_COLLECTIVE_PERCENT = 10.0

# Host overhead per step we aim for once the loop is amortised over N steps (share of step time).
TARGET_OVERHEAD = 0.05
# Below this share the per-step host overhead is not worth a change of training loop...
MIN_OVERHEAD_PERCENT = 10.0
# ... nor when the change would make a batch less than this much faster.
MIN_SPEEDUP = 1.25
# XProf suggests 16-bit ops when less than 10 % of compute is 16-bit; we look at matmuls/convolutions.
MIN_F32_MATMUL_SHARE = 0.5
MIN_MATMUL_PERCENT = 10.0


# Below this many measured steps on a host, a share of step time is one or two samples (coverage.MIN_STEPS): advice
# resting on it is not blocking, and says how many steps it rests on.
MIN_STEPS = 5
# Steps the program marked as its own (a step annotation, Keras' step function, the device `Steps` line) are
# iterations of a loop; steps found as repeated runs of one program or jitted function may be any repeated call (the
# Pallas matmul benchmark runs one matmul 3 times: no loop over batches to move onto the device).
MARKED_STEPS = ("step markers", "TF step function", "the device `Steps` line")


def _fewest_steps(report: ProfileSummary) -> int:
    return min((len(h.steps) for h in report.hosts if h.steps), default=0)


def _severity(report: ProfileSummary, share: float) -> str:
    """Blocking from 20% of step time, when the share is measured over MIN_STEPS steps or more."""
    return "blocking" if share >= 20 and _fewest_steps(report) >= MIN_STEPS else "improve"


def _few_steps(report: ProfileSummary) -> str:
    """The evidence's caveat when the shares rest on fewer than MIN_STEPS steps ("" otherwise)."""
    fewest = _fewest_steps(report)
    if fewest >= MIN_STEPS:
        return ""
    return (f" Measured over {fewest} step{'s' if fewest != 1 else ''} only (fewer than {MIN_STEPS}): a longer "
            "capture confirms it.")


def _loop_steps(report: ProfileSummary) -> bool:
    """Whether every host's steps are marked by the program as its steps, not inferred from repeated runs."""
    hosts = [h for h in report.hosts if h.steps]
    return bool(hosts) and all(h.step_source.startswith(MARKED_STEPS) for h in hosts)


def _framework(report: ProfileSummary) -> str:
    """jax, tf, or "" when the hosts' events do not say (then advice names both)."""
    found = {h.framework for h in report.hosts if h.steps}
    return found.pop() if len(found) == 1 else ""


def _input(report: ProfileSummary) -> Suggestion | None:
    share = report.breakdown_percent.get("input", 0.0)
    if share < MODERATELY_INPUT_BOUND:
        return None
    per_step = report.breakdown_ms_per_step["input"]
    evidence = [f"{share:.1f}% of step time ({per_step:.2f} ms of {report.mean_ms:.2f} ms per step) waiting for input"]
    stage = report.bottleneck_stage
    # A pipeline that prefetches already is not told to (tf_slow_map and tf_tiny_spe64 end with one); one that does
    # not is told once, at the end.
    prefetches = any(s.kind == "Prefetch" for s in report.stages)
    if stage is not None:
        kind = stage.kind
        evidence.append(f"slowest tf.data stage `{stage.name}`: {stage.self_ps / 1e9:.1f} ms of its own time over "
                        f"{stage.count} calls")
        if stage.py_function_ps > 0.5 * stage.self_ps:
            evidence.append(f"{100 * stage.py_function_ps / max(stage.self_ps, 1):.0f}% of it in Python "
                            "(`tf.py_function`, EagerPyFunc)")
            message = ("The input pipeline is the bottleneck: its `map` runs Python (`tf.py_function`) one example "
                       "at a time. Rewrite the function with TensorFlow ops (or preprocess the data once, offline, "
                       "and `cache()` the result); until then `map(..., num_parallel_calls=tf.data.AUTOTUNE)` "
                       "overlaps the calls (as far as the GIL lets them: Python that waits on I/O overlaps, Python "
                       "that computes does not). If the host's CPUs are saturated, move preprocessing to other "
                       "machines with `tf.data.service`.")
        elif "Map" in kind and kind.startswith("Parallel"):
            message = ("The input pipeline is the bottleneck in a `map` that already runs in parallel: do less per "
                       "example (batch first, then map a vectorised function over whole batches), `cache()` "
                       "deterministic preprocessing, precompute it offline, or move it to other machines with "
                       "`tf.data.service` when the host's CPUs are saturated.")
        elif "Map" in kind:
            message = ("The input pipeline is the bottleneck in a `map`: use `map(..., num_parallel_calls="
                       "tf.data.AUTOTUNE, deterministic=False)` and `cache()` after deterministic preprocessing that "
                       "fits in memory; batch before an element-wise map to vectorise it.")
        elif input_pipeline.FILE_KINDS.search(kind):
            message = ("The input pipeline is bound on reading files: read several files at once with "
                       "`interleave(..., cycle_length=N, num_parallel_calls=tf.data.AUTOTUNE)` over more, "
                       "larger shards, and `cache()` if the data fit.")
        elif "Batch" in kind:
            message = "Batching is the slowest stage: `batch(..., num_parallel_calls=tf.data.AUTOTUNE)`."
        else:
            message = (f"The input pipeline is the bottleneck (stage `{kind}`): parallelise it "
                       "(`num_parallel_calls=tf.data.AUTOTUNE`), `cache()` what does not change between epochs, "
                       "or offload it with `tf.data.service`.")
        if not prefetches:
            message += " The pipeline has no `prefetch`: add `prefetch(tf.data.AUTOTUNE)` as its last stage."
    elif any(h.untraced_input for h in report.hosts):
        evidence.append("the host ran its own Python (no dispatch, transfer or kernel traced) between steps, with no "
                        "step running: in a JAX process this is the data loader")
        message = ("The step waits for the host to prepare each batch: load batches ahead in a background "
                   "thread (a prefetching iterator, `grain` or `tf.data` with `prefetch`), move preprocessing "
                   "out of the Python loop (precompute, vectorise with numpy), and put the next batch on the "
                   "device while the current step runs (`jax.device_put` ahead of time).")
    else:
        message = ("The step waits for input: parallelise the pipeline (`num_parallel_calls=tf.data.AUTOTUNE`), "
                   "`cache()` and `prefetch(tf.data.AUTOTUNE)`.")
    return Suggestion(kind="input_pipeline", message=message, evidence="; ".join(evidence) + "." + _few_steps(report),
                      severity=_severity(report, share), saving_ms_per_step=per_step,
                      saving_ms_range=(0.0, per_step), framework=_framework(report) or None)


def steps_per_execution_for(overhead_ms: float, compute_ms_per_batch: float, current: int) -> int | None:
    """The smallest power of two N with overhead / (overhead + N * compute) <= TARGET_OVERHEAD."""
    if compute_ms_per_batch <= 0 or overhead_ms <= 0:
        return None
    needed = overhead_ms * (1 - TARGET_OVERHEAD) / (TARGET_OVERHEAD * compute_ms_per_batch)
    n = 1 << max(0, math.ceil(math.log2(max(needed, 1))))
    return n if n >= 2 * current else None


def _host_overhead(report: ProfileSummary) -> Suggestion | None:
    share = report.breakdown_percent.get("host_overhead", 0.0)
    if share < MIN_OVERHEAD_PERCENT or not _loop_steps(report) or _fewest_steps(report) < MIN_STEPS:
        # Steps per call amortise a loop's per-call overhead: the capture must show a loop (steps the program
        # marks) and the overhead in enough of its steps to be the loop's, not a benchmark's few repeated calls.
        return None
    k = max(1, int(report.batches_per_step))
    per_step = report.breakdown_ms_per_step
    overhead = per_step["host_overhead"]
    work_per_batch = (report.mean_ms - overhead) / k
    n = steps_per_execution_for(overhead, work_per_batch, k)
    if n is None:
        return None
    now_per_batch = report.mean_ms / k
    then_per_batch = work_per_batch + overhead / n
    # Batches cannot come faster than the input pipeline delivers them: tf_tiny_spe1 was promised 6.1x (1.05 ->
    # 0.17 ms a batch) where its prefetch thread took 0.55 ms a batch; run at 64 per call it made 0.72, input-bound.
    pace = input_pipeline.producer_pace(report.stages)
    paced = pace is not None and pace[1] > then_per_batch
    if paced:
        # The fewest batches per call that reach the pipeline's pace: more gain nothing until it is faster.
        n = min(n, 1 << max(0, math.ceil(math.log2(max(overhead / (pace[1] - work_per_batch), 1)))))
        if n < 2 * k:
            return None
        then_per_batch = pace[1]
    if now_per_batch < MIN_SPEEDUP * then_per_batch:
        return None
    evidence = (f"{share:.1f}% of step time is per-call host overhead: start-up, return and the gap to the next "
                f"call ({overhead:.2f} ms per call against "
                f"{report.mean_ms - overhead:.2f} ms of work for {k} batch(es))")
    if paced:
        evidence += (f". The input pipeline delivered a batch every {pace[1]:.2f} ms in this capture (its prefetch "
                     f"thread's time in `{pace[0].kind}`, {pace[0].total_ps / 1e9:.1f} ms, over the batches it gave): "
                     f"from {n} batches per call ({work_per_batch:.2f} + {overhead:.2f} / {n} ms a batch) the steps "
                     "would wait for it, and more per call gain nothing until the pipeline is faster.")
    else:
        evidence += f"; with {n} batches per call it falls to {100 * (overhead / n) / then_per_batch:.1f}%."
    effect = (f"about {now_per_batch / then_per_batch:.1f}x faster per batch "
              f"({now_per_batch:.2f} -> {then_per_batch:.2f} ms" + (", the input pipeline's pace" if paced else "")
              + ")")
    # A larger batch amortises the per-call overhead, not the pipeline's time per example.
    larger = "" if paced else " A larger batch also amortises the overhead."
    jax_way = (f"loop over {n} batches inside the jitted step with `jax.lax.scan` or `jax.lax.fori_loop` (a "
               f"training loop on the device), feeding a stacked [{n}, batch, ...] array")
    framework = _framework(report)
    if framework == "jax":
        message = f"Run {n} steps per call: {jax_way}; {effect}.{larger}"
    elif not framework:
        message = (f"Run {n} steps per call to pay the per-call host overhead once: Keras "
                   f"`model.compile(..., steps_per_execution={n})`, or in JAX {jax_way}; {effect}.{larger}")
    else:
        message = (f"Set `model.compile(..., steps_per_execution={n})` (now {k}) so Keras runs {n} steps per call "
                   f"and pays the per-call host overhead once; {effect}.{larger}")
    saving = (now_per_batch - then_per_batch) * k
    return Suggestion(kind="steps_per_execution", message=message, evidence=evidence, saving_ms_per_step=saving,
                      saving_ms_range=(0.0, saving), severity=_severity(report, share),
                      code=f"model.compile(..., steps_per_execution={n})" if framework == "tf" else "",
                      framework=framework or None, extra={"steps_per_execution": n})


def _precision(report: ProfileSummary) -> Suggestion | None:
    matmul = sum(h.matmul_ps for h in report.hosts)
    wide = sum(h.matmul_f32_ps for h in report.hosts)
    compute = sum(h.total("compute") for h in report.hosts)
    if not matmul or not compute or wide < MIN_F32_MATMUL_SHARE * matmul:
        return None
    share = 100.0 * wide / compute
    if share < MIN_MATMUL_PERCENT:
        return None
    framework = _framework(report)
    keras_way = "`keras.mixed_precision.set_global_policy(\"mixed_bfloat16\")` before building the model"
    jax_way = "bfloat16 params/activations (`jnp.bfloat16`, e.g. `param_dtype`/`dtype` in Flax)"
    how = keras_way if framework == "tf" else jax_way if framework == "jax" else f"{keras_way} (Keras) or {jax_way}"
    per_step_ms = wide / 1e9 / max(report.step_count, 1)
    return Suggestion(
        kind="bf16",
        message=(f"{share:.0f}% of device compute is matmuls/convolutions with 32-bit results. Use {how}: the "
                 "MXU is a bfloat16 unit and 16-bit operands halve the HBM traffic and activation memory, so "
                 f"expect up to about half of those {per_step_ms:.2f} ms per step back."),
        evidence=f"{wide / 1e9:.1f} ms of {matmul / 1e9:.1f} ms in matmuls/convolutions return f32; "
                 f"compute {compute / 1e9:.1f} ms in total.",
        saving_ms_per_step=per_step_ms / 2, saving_ms_range=(0.0, per_step_ms / 2), framework=framework or None)


def _compile(report: ProfileSummary) -> Suggestion | None:
    share = report.breakdown_percent.get("compile", 0.0)
    if share < COMPILE_BOUND / 2:
        return None
    events: dict[str, list[int]] = {}
    for host in report.hosts:
        for name, count, spent in host.compile_events:
            entry = events.setdefault(name, [0, 0])
            entry[0] += count
            entry[1] += spent
    biggest = sorted(events.items(), key=lambda item: item[1][1], reverse=True)[:2]
    named = ", ".join(f"`{name}` x{count} ({spent / 1e9:.0f} ms)" for name, (count, spent) in biggest)
    # The events are counted in the measured steps when every host measured its steps on its own clock; TPU steps
    # are the chips', on another clock: their hosts' events are the whole capture's, and the evidence says so.
    in_steps = all(h.compile_events_in_steps for h in report.hosts if h.steps)
    where = "in those steps" if in_steps else "in the whole capture"
    per_step = report.breakdown_ms_per_step.get("compile", 0.0)
    framework = _framework(report)
    jax_way = ("keep array shapes and dtypes and the jitted function's static arguments the same from step to step "
               "(pad batches to fixed shapes or a few bucket sizes; pass changing Python values as arrays, not "
               "`static_argnums`); `jax.config.update(\"jax_explain_cache_misses\", True)` names what changed")
    tf_way = ("keep the step function's input shapes and Python arguments the same from step to step (`batch(..., "
              "drop_remainder=True)` so the last batch has the others' shape, pad to fixed shapes or a few bucket "
              "sizes, pass changing values as tensors, not Python numbers)")
    if framework == "jax":
        how = jax_way
    elif framework == "tf":
        how = tf_way
    else:
        how = f"in JAX, {jax_way}; in TensorFlow, {tf_way}"
    return Suggestion(kind="compile",
                      message=f"Steps keep compiling: {how}.",
                      evidence=f"{share:.1f}% of step time in tracing/compilation over {report.step_count} steps"
                               + (f"; compile events {where}: {named}." if named else ".") + _few_steps(report),
                      severity="blocking" if share >= COMPILE_BOUND and _fewest_steps(report) >= MIN_STEPS
                      else "improve",
                      saving_ms_per_step=per_step, saving_ms_range=(0.0, per_step), framework=framework or None)


# A host that holds the pod up by less than this share of the median step per step is not worth a suggestion.
POD_DELAY_SHARE = 0.05


def _straggler(host: str, evidence: str, saving: float) -> Suggestion:
    return Suggestion(kind="straggler",
                      message=(f"Host {host} is slower than the others; every synchronous step waits for it: check "
                               "its input pipeline, CPU load and data locality."),
                      evidence=evidence, saving_ms_per_step=saving, saving_ms_range=(0.0, saving))


def _not_waiting(report: ProfileSummary) -> str | None:
    """What in the capture shows that no host waits for another, or None. Hosts in lockstep run the same steps in
    one capture window; TPU chips that wait for each other do it in collectives, which their planes show."""
    pod = report.pod
    if pod is None:
        return None
    if pod.not_one_job:
        return pod.not_one_job
    rows = [r for r in pod.hosts if r.steps]
    counts = [r.steps for r in rows]
    if not pod.matched_steps and counts and max(counts) > 1.1 * min(counts) + 1:
        # jax_two_hosts_straggler: two jobs traced in one call, 70 and 41 steps.
        return ("the hosts ran no step number in common and " + ", ".join(f"{r.host} {r.steps} steps" for r in rows)
                + " in the same capture: they do not run in lockstep")
    return None


def _stragglers(report: ProfileSummary) -> list[Suggestion]:
    pod = report.pod
    unwaited = _not_waiting(report)
    if unwaited and report.stragglers:
        # Nothing in the capture waits for the slow host: its steps are slower, no time of the pod's is lost to it.
        found = [Suggestion(
            kind="straggler",
            message=(f"Host {host}'s steps are slower than the others', but in this capture none waited for it; if "
                     "these hosts train one model in lockstep, every step would wait for it: check its input "
                     "pipeline, CPU load and data locality."),
            evidence=f"median step {value:.2f} ms against {middle:.2f} ms across hosts; {unwaited}.")
            for host, value, middle in report.stragglers]
    elif pod is not None and pod.matched_steps:
        # The hosts' steps are matched: name the hosts the collective waited for, by how long.
        found = []
        middle = median(r.median_ms for r in pod.hosts if r.steps)
        for row in pod.stragglers:
            per_step = row.delay_ms / pod.matched_steps
            if per_step >= POD_DELAY_SHARE * report.median_ms:
                found.append(_straggler(row.host, (
                    f"the last host to reach the collective in {row.last_steps} of {pod.matched_steps} matched steps, "
                    f"holding the pod up {per_step:.2f} ms per step ({row.delay_ms:.2f} ms in all); its median step "
                    f"{row.median_ms:.2f} ms against {middle:.2f} ms across hosts (the hosts' median)."), per_step))
    else:
        found = [_straggler(host, f"median step {value:.2f} ms against {middle:.2f} ms across hosts.", value - middle)
                 for host, value, middle in report.stragglers]
    for chip in report.slow_chips:
        found.append(Suggestion(
            kind="slow_chip",
            message=(f"Chip {chip.chip} of {chip.host} does more work per step than the others, which wait for it: "
                     "balance the sharding (uneven shards or padding land on one chip) or check that chip's ops "
                     "in the per-chip breakdown."),
            evidence=f"its own work {chip.work_ms:.2f} ms per step against {chip.fastest_ms:.2f} ms on the "
                     "least-busy chip (median over aligned steps).",
            saving_ms_per_step=chip.work_ms - chip.fastest_ms, saving_ms_range=(0.0, chip.work_ms - chip.fastest_ms)))
    return found


def _host_transfer(report: ProfileSummary) -> Suggestion | None:
    share = report.breakdown_percent.get("host_transfer", 0.0)
    if share < MIN_HOST_TRANSFER_PERCENT:
        return None
    per_step = report.breakdown_ms_per_step["host_transfer"]
    ops = [o for o in report.device_ops if o.category == "host_transfer" and o.step_count]
    steps = max(report.chip_steps, 1)
    copies = [o for o in ops if o.transfer and not o.async_start]
    incoming = sum(o.bytes_accessed * o.step_count for o in copies if o.transfer == "to_device") / steps
    outgoing = sum(o.bytes_accessed * o.step_count for o in copies if o.transfer == "to_host") / steps
    capacity = ""
    from tpuprof import targets

    target = targets.TARGETS.get(report.roof.device_kind) if report.roof else None
    if target and incoming:
        fits = "fits" if incoming < target.compiler_hbm_bytes else "does not fit"
        capacity = (f" ({fmt_bytes(int(incoming))} of arrays come in each step; a {target.name} chip offers "
                    f"{fmt_bytes(target.compiler_hbm_bytes)} of HBM: it {fits})")
    framework = _framework(report)
    jax_way = ("place them with `jax.device_put(x, NamedSharding(mesh, spec))` (memory_kind \"device\", not "
               "\"pinned_host\") and keep them as the jitted step's donated state")
    message = (f"The step waits for copies between host memory and HBM ({per_step:.0f} ms per step). Keep the "
               f"arrays in HBM across steps if they fit{capacity}: {jax_way}; if they must live on the host "
               "(host offload), overlap the copies with compute: issue the next step's transfers before this step's "
               "work (prefetch to device), split the arrays so a copy and the ops that use it pipeline, and move "
               "fewer bytes (bf16 halves them).")
    evidence = (f"{share:.1f}% of step time in host transfers: {fmt_bytes(int(incoming))} into HBM and "
                f"{fmt_bytes(int(outgoing))} back per step per chip")
    rates = [report.rates(o) for o in copies if report.rates(o) and report.rates(o).bytes_per_s]
    if rates:
        fastest = max(r.bytes_per_s for r in rates)
        evidence += f"; waited-for copies run at {min(r.bytes_per_s for r in rates) / 1e9:.1f}-{fastest / 1e9:.1f} GB/s"
    return Suggestion(kind="host_transfer", message=message, evidence=evidence + "." + _few_steps(report),
                      severity=_severity(report, share), saving_ms_per_step=per_step,
                      saving_ms_range=(0.0, per_step), framework=framework or None,
                      code="jax.device_put(x, jax.sharding.NamedSharding(mesh, spec, memory_kind='device'))",
                      extra={"host_transfer_bytes_per_step": int(incoming + outgoing)})


def _collective(report: ProfileSummary) -> Suggestion | None:
    share = report.breakdown_percent.get("collective", 0.0)
    if share < MIN_COLLECTIVE_PERCENT:
        return None
    per_step = report.breakdown_ms_per_step["collective"]
    ops = [o for o in report.device_ops if o.category == "collective" and (report.ms_per_step(o) or 0) > 0]
    named = ", ".join(f"{o.hlo_op} {o.shape.split('{')[0]} ({report.ms_per_step(o):.2f} ms)" for o in ops[:3])
    return Suggestion(
        kind="collective",
        message=("The step waits for collectives between chips. Overlap them with compute (XLA's async collectives "
                 "and latency-hiding scheduler: keep the -start and -done of each collective apart), shard so that "
                 "less crosses chips (FSDP/ZeRO-style parameter sharding moves gradients once; keep activations "
                 "sharded along the batch), reduce in bf16, and avoid collectives over the data-centre network "
                 "(DCN) inside the step."),
        evidence=f"{share:.1f}% of step time ({per_step:.2f} ms per step) waiting in collectives"
                 + (f": {named}." if named else ".") + _few_steps(report),
        severity=_severity(report, share), saving_ms_per_step=per_step,
        saving_ms_range=(0.0, per_step))


def _memory_bound(report: ProfileSummary) -> Suggestion | None:
    if report.verdict != "memory-bound":
        return None
    ops = report.verdict_ops
    spent = sum(report.ms_per_step(o) or 0 for o in ops)
    named = ", ".join(f"{o.hlo_op} {o.shape.split('{')[0]} ({report.ms_per_step(o):.2f} ms, intensity "
                      f"{report.rates(o).intensity:.2f} FLOP/B)" for o in ops[:3] if report.rates(o).intensity)
    ridge = report.roof.ridge if report.roof else None
    return Suggestion(
        kind="memory_bound",
        message=("Most device time is vector work limited by HBM bandwidth (few FLOPs per byte). Let XLA fuse it into "
                 "the matmuls around it (avoid reshapes/transposes and dtype changes between them, keep elementwise "
                 "chains inside one jitted function), store activations in bf16 (half the bytes), and recompute "
                 "cheap elementwise results rather than writing and reading them back."),
        evidence=(f"{100 * (spent / report.mean_ms if report.mean_ms else 0):.0f}% of the step in HBM-bound ops"
                  + (f" (ridge point {ridge:.0f} FLOP/B)" if ridge else "") + (f": {named}." if named else ".")),
        saving_ms_per_step=spent / 2, saving_ms_range=(0.0, spent / 2))


def suggest(report: ProfileSummary) -> list[Suggestion]:
    found = [_input(report), _host_overhead(report), _compile(report), _host_transfer(report), _collective(report),
             _memory_bound(report), _precision(report), *_stragglers(report)]
    return rank([s for s in found if s])
