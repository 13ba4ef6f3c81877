"""What to change when a serving engine (vLLM on TPU) runs out of memory starting up: its own options
(--gpu-memory-utilization, --max-num-seqs, --max-model-len, --kv-cache-dtype, --block-size,
--tensor-parallel-size), each with the fact it rests on and the figures from the log, and the `tpuprof serve`
command that answers the question before the server is started again.

The facts are vLLM TPU's (tpu-inference, read from its code: ../shared/reference/serving-facts.md):
* the KV cache gets `limit x gpu_memory_utilization - weights` per device, sized before any program is compiled;
  the compiled programs then load into the (1 - gpu_memory_utilization) left, each reserved contiguously at the
  bottom of HBM (XLA E0101), so a program that does not fit there fails the start-up;
* one program is compiled per token bucket (doubling from 16 to --max-num-batched-tokens) and request padding
  (doubling from 8 to --max-num-seqs): the largest buckets make the largest programs;
* the paged-attention kernel reads the int32 page table [max_num_seqs, ceil(max_model_len / page)] from SMEM, which
  must fit in half of the 1 MiB SMEM (flash_attn.py get_min_page_size);
* fp8 KV packs 4 values per 32-bit slot: with one KV head per device, a token's K and V fill 2 of the 4 slots and
  the cache does not shrink.
"""

from __future__ import annotations

import math
import shlex

from tpuprof.analyses import oom_serving
from tpuprof.analyses.oom import format_bytes as fmt
from tpuprof.analyses.serve_memory import runs_vllm_model_code, vllm_quantization
from tpuprof.analyses.serve_plan import hub_id_runs_vllm_model_code
from tpuprof.models.oom import OomReport
from tpuprof.models.suggestion import Suggestion, rank

SMEM_PAGE_TABLE_BYTES = 512 * 1024  # half of the 1 MiB SMEM per core (tpu-inference get_min_page_size)
# VMEM per TensorCore, jax 0.10.2 _src/pallas/mosaic/tpu_info.py (serving-facts.md).
VMEM_PER_CORE = {"v4": 16 << 20, "v5e": 128 << 20, "v5p": 64 << 20, "v6e": 128 << 20, "tpu7x": 64 << 20}


def suggestions(report: OomReport, missing: int | None, scratch: Suggestion | None = None) -> list[Suggestion]:
    """The ranked fixes for a serving engine's out-of-memory failure (REPORT.serving is set). MISSING: the bytes
    the message says are lacking; SCRATCH: the general advice on a kernel's on-chip scratch (tpuprof.advice.oom)."""
    serving = report.serving
    settings = serving.settings
    found: list[Suggestion] = []
    cause = serving.cause
    if cause in ("program_load", "runtime_buffer"):
        found += _headroom(report, settings)
    elif cause == "kv_budget":
        found += _kv_budget(report, settings)
    elif cause == "weights_over_cap":
        found += _weights_over_cap(report, settings)
    elif cause == "compile_hbm":
        found += _compile_hbm(report, settings)
    elif cause == "smem":
        found += _smem(report, settings)
    elif cause == "vmem":
        found += ([scratch] if scratch else []) + _vmem(report, settings)
    found.append(_plan(report, settings))
    for item in found:
        item.framework = item.framework or ("vllm" if item.code.startswith("vllm") else None)
    if report.reservable_bytes is not None and report.requested_bytes is not None \
            and report.requested_bytes > report.reservable_bytes:
        missing = report.requested_bytes - report.reservable_bytes  # what the reservation lacks, not all free memory
    return rank(found, shortfall_bytes=missing)


def _vllm(settings, flag: str) -> str:
    return f"vllm serve {settings.model or 'MODEL'} {flag}"


def _headroom(report: OomReport, settings) -> list[Suggestion]:
    """E0101 and run-time buffer failures after the KV cache took its share: give the programs more room."""
    out = []
    want = report.requested_bytes
    room = report.reservable_bytes if report.reservable_bytes is not None else report.free_bytes
    short = want - room if want is not None and room is not None and want > room else None
    what = f"'{report.program_name}'" if report.program_name else "a program"
    fact = ("vLLM TPU gives the KV cache limit x --gpu-memory-utilization minus the weights before it compiles "
            "anything; the compiled programs load afterwards into the rest, each reserved contiguously at the bottom "
            "of HBM (XLA E0101)")
    if report.kind != "reservation" and not report.program_name:
        fact = ("vLLM TPU gives the KV cache limit x --gpu-memory-utilization minus the weights; every other buffer and "
                "the compiled programs share the rest")
    if short is not None:
        found = f"{what} needed {fmt(want)}, {fmt(room)} was {'reservable' if report.reservable_bytes is not None else 'free'}: {fmt(short)} short"
    elif want is not None:
        found = f"{what} needed {fmt(want)}"
    else:
        found = "the message gives no sizes"
    if short is not None:
        # One more program of the failing one's size on top of the shortfall: the log names only the program that
        # failed, and the programs loaded after it may be as large.
        needed = short + want
        planned = oom_serving.utilization_for_room(settings, needed)
        minimal = oom_serving.utilization_for_room(settings, short)
    else:
        planned = minimal = None
    limit = oom_serving.hbm_per_device(settings)
    if planned and planned[1] > 0:
        current, target = planned
        freed = int(round((current - target) * limit))
        message = (f"{fact}. Here {found}. Lower --gpu-memory-utilization from {current:g} to {target:.2f}: each 0.01 "
                   f"moves {fmt(int(limit * 0.01))} per device from the KV cache to the programs. {minimal[1]:.2f} is "
                   f"the most that makes room for this program alone (arithmetic on the log); {target:.2f} also leaves "
                   "room for one more program of its size, an estimate: the log names only the program that failed, "
                   "and the programs loaded after it may need more (`tpuprof serve` compiles them all).")
        kv = _kv_after(settings, current - target)
        if kv:
            message += " " + kv
        out.append(Suggestion(kind="gpu_memory_utilization", severity="blocking", saving_bytes=freed,
                              saving_bytes_range=(int(round((current - minimal[1]) * limit)), freed),
                              confidence="estimated", message=message,
                              evidence=f"gpu_memory_utilization {current:g}, HBM limit {fmt(limit)} per device "
                                       f"({_limit_source(settings)}); {found}",
                              code=_vllm(settings, f"--gpu-memory-utilization {target:.2f}")))
    else:
        current = settings.utilization()
        how = (f"from {current:g} " if current is not None else "")
        need = (f" by at least {fmt(short)} per device ({short / limit:.3f} of {fmt(limit)})"
                if short is not None and limit else "")
        out.append(Suggestion(kind="gpu_memory_utilization", severity="blocking", saving_bytes=short,
                              confidence="exact" if short is not None else "estimated",
                              message=f"{fact}. Here {found}. Lower --gpu-memory-utilization {how}so the programs get "
                                      f"more of HBM{need}; `tpuprof serve` compiles every program the engine loads and "
                                      "gives the largest safe value.",
                              evidence=found))
    tokens = settings.max_num_batched_tokens
    seqs = settings.max_num_seqs
    buckets = f" (token buckets 16, 32, ... up to {tokens:,})" if tokens else ""
    out.append(Suggestion(
        kind="max_num_batched_tokens", severity="improve", confidence="estimated",
        message=("The engine compiles one program per token bucket and request padding; the largest, at "
                 f"--max-num-batched-tokens{' ' + format(tokens, ',') if tokens else ''}{buckets} and "
                 f"--max-num-seqs{' ' + str(seqs) if seqs else ''}, hold the largest temporaries. Lowering either "
                 "shrinks what the programs need at the bottom of HBM, keeping the KV cache as it is (at some "
                 "throughput: fewer tokens or sequences per step)."),
        evidence=found))
    return out


def _limit_source(settings) -> str:
    return ("the engine's memory statistics" if settings.hbm_limit_bytes
            else f"tpuprof's runtime limit for {settings.tpu}: the log does not print it")


def _kv_after(settings, utilization_drop: float) -> str:
    """The KV cache the engine would then hold, scaled from the tokens and budget the log shows."""
    tokens, budget, limit = settings.kv_cache_tokens, settings.kv_budget_bytes, settings.hbm_limit_bytes
    if not (tokens and budget and limit):
        return ""
    kept = budget - utilization_drop * limit
    if kept <= 0:
        return "That leaves no KV cache: the weights take the rest."
    new_tokens = int(tokens * kept / budget)
    text = f"The KV cache would hold about {new_tokens:,} tokens instead of {tokens:,}"
    if settings.concurrency_tokens:
        text += f" ({new_tokens / settings.concurrency_tokens:.2f}x requests of {settings.concurrency_tokens:,} tokens"
        text += f" instead of {settings.max_concurrency:.2f}x)" if settings.max_concurrency else ")"
    return text + " (estimated: scaled from the log's KV budget and tokens)."


def _kv_budget(report: OomReport, settings) -> list[Suggestion]:
    needed, available = report.required_bytes, report.capacity_bytes
    length = settings.max_model_len
    estimated = report.serving.estimated_max_model_len
    short = needed - available if needed is not None and available is not None else None
    found = (f"one request of {length:,} tokens needs {fmt(needed)} of KV cache, {fmt(available)} is left for it"
             if length else f"one request needs {fmt(needed)} of KV cache, {fmt(available)} is left for it")
    out = []
    if estimated:
        out.append(Suggestion(
            kind="max_model_len", severity="blocking", saving_bytes=short, confidence="exact",
            message=(f"vLLM starts only if the KV cache holds one request of --max-model-len; {found}. Set "
                     f"--max-model-len {estimated:,} or less: vLLM's own estimate of the longest request the "
                     "available KV cache holds (max concurrency 1 at that length)."),
            evidence=found, code=_vllm(settings, f"--max-model-len {estimated}")))
    elif needed and available and length:
        fits = int(length * available / needed)
        out.append(Suggestion(
            kind="max_model_len", severity="blocking", saving_bytes=short, confidence="estimated",
            message=(f"vLLM starts only if the KV cache holds one request of --max-model-len; {found}. KV grows "
                     f"linearly with length: about --max-model-len {fits:,} fits."),
            evidence=found, code=_vllm(settings, f"--max-model-len {fits}")))
    if needed:
        halves = needed // 2
        fits_fp8 = available is not None and halves <= available
        out.append(Suggestion(
            kind="kv_cache_dtype", severity="improve", saving_bytes=halves, saving_bytes_range=(0, halves),
            confidence="estimated",
            message=("--kv-cache-dtype fp8 stores each KV value in 1 byte instead of 2, halving the cache when each "
                     "device holds at least two KV heads (fp8 packs 4 values per 32-bit slot: with one KV head per "
                     "device a token's K and V fill 2 of the 4 and nothing is saved)"
                     + (f"; halved, {fmt(halves)} fits in the {fmt(available)} available." if fits_fp8 else ".")),
            evidence=found, code=_vllm(settings, "--kv-cache-dtype fp8")))
    current = settings.utilization()
    limit = oom_serving.hbm_per_device(settings)
    if short and limit and current is not None:
        devices = oom_serving.devices(settings) or 1
        raised = math.ceil((current + short / (limit * devices)) * 100) / 100
        if raised < 1:
            out.append(Suggestion(
                kind="gpu_memory_utilization", severity="improve", saving_bytes=short, confidence="estimated",
                message=(f"The KV budget is limit x --gpu-memory-utilization minus the weights: {raised:.2f} instead of "
                         f"{current:g} covers the {fmt(short)} lacking, but takes it from the room the compiled "
                         "programs load into (E0101 when too little is left): check it with `tpuprof serve`."),
                evidence=found, code=_vllm(settings, f"--gpu-memory-utilization {raised:.2f}")))
    out.append(_more_devices(settings, "the KV heads and the weights are split over the tensor-parallel devices, so "
                             "each device holds less of both"))
    return out


def _weights_over_cap(report: OomReport, settings) -> list[Suggestion]:
    used, cap, over = report.used_bytes, report.capacity_bytes, report.exceeded_bytes
    current = settings.utilization()
    found = f"{fmt(used)} is in use before any KV cache, the cap is {fmt(cap)}: {fmt(over)} over"
    out = []
    if current is not None and cap:
        limit_total = cap / current
        raised = math.ceil((used / limit_total) * 100 + 1) / 100  # the weights plus at least 1% for the KV cache
        if raised >= 1:
            found += (f"; that is more than the whole HBM limit ({fmt(int(limit_total))}): only more devices or "
                      "smaller weights help")
        else:
            out.append(Suggestion(
                kind="gpu_memory_utilization", severity="blocking", saving_bytes=over, confidence="estimated",
                message=(f"tpu-inference caps what the weights and the KV cache may use at limit x "
                         f"--gpu-memory-utilization ({current:g}); {found}. At {raised:.2f} the weights fit with a "
                         "little KV cache, which leaves the programs less room: check it with `tpuprof serve`."),
                evidence=found, code=_vllm(settings, f"--gpu-memory-utilization {raised:.2f}")))
    devices = _more_devices(settings, f"the weights are split over the tensor-parallel devices; {found}")
    if not out:
        devices.severity = "blocking"
    out.append(devices)
    out.append(_quantize(settings, found))
    return out


def _compile_hbm(report: OomReport, settings) -> list[Suggestion]:
    used, capacity = report.used_bytes, report.capacity_bytes
    found = (f"the program needs {fmt(used)} of the {fmt(capacity)} a device has" if used and capacity
             else "a program does not fit a device's HBM")
    out = []
    tp = settings.tensor_parallel_size
    if used and capacity and tp:
        # Weights and most temporaries split over the tensor-parallel devices; the lower bound assumes all do.
        wanted = math.ceil(used * tp / capacity)
        power = 1 << max(0, wanted - 1).bit_length()
        out.append(Suggestion(
            kind="tensor_parallel", severity="blocking", saving_bytes=used - capacity, confidence="rough",
            message=(f"{found} at --tensor-parallel-size {tp}. The weights split over the tensor-parallel devices: "
                     f"at least {power} devices if all of the {fmt(used)} splits (what is replicated does not)."),
            evidence=found, code=_vllm(settings, f"--tensor-parallel-size {power}")))
    else:
        out.append(_more_devices(settings, found))
    out.append(_quantize(settings, found))
    tokens = settings.max_num_batched_tokens
    out.append(Suggestion(
        kind="max_num_batched_tokens", severity="improve", confidence="estimated",
        message=("The largest program is the largest token bucket's: --max-num-batched-tokens"
                 f"{' ' + format(tokens, ',') if tokens else ''} sets how many tokens one step computes, and the "
                 "activations of that step grow with it."),
        evidence=found))
    return out


def _smem(report: OomReport, settings) -> list[Suggestion]:
    seqs, length, page = settings.max_num_seqs, settings.max_model_len, settings.block_size
    fact = ("the paged-attention kernel reads the page table, int32 [max_num_seqs, ceil(max_model_len / page size)], "
            f"from SMEM, where it must fit in {fmt(SMEM_PAGE_TABLE_BYTES)} (half of the 1 MiB per core; tpu-inference)")
    used = (f"Used {fmt(report.used_bytes)} of {fmt(report.capacity_bytes)} smem"
            if report.used_bytes and report.capacity_bytes else "SMEM ran out")
    out = []
    if seqs and length and page:
        pages = math.ceil(length / page)
        table = seqs * pages * 4
        most_seqs = SMEM_PAGE_TABLE_BYTES // (4 * pages)
        per_request = SMEM_PAGE_TABLE_BYTES // (4 * seqs)
        smallest_page = 1 << max(0, math.ceil(length / per_request) - 1).bit_length() if per_request else None
        message = (f"{used}: {fact}. Here {seqs} sequences x {pages:,} pages of {page} tokens x 4 B = {fmt(table)}. "
                   f"Fits: --max-num-seqs {most_seqs} at this page size, or --block-size {smallest_page} for "
                   f"{seqs} sequences, or a shorter --max-model-len.")
        out.append(Suggestion(kind="max_num_seqs", severity="blocking", confidence="exact", message=message,
                              evidence=f"max_num_seqs {seqs}, max_model_len {length:,}, block_size {page}",
                              code=_vllm(settings, f"--max-num-seqs {most_seqs}")))
    else:
        shown = ", ".join(f"{name} {value:,}" for name, value in
                          (("max_num_seqs", seqs), ("max_model_len", length), ("block_size", page)) if value)
        out.append(Suggestion(
            kind="max_num_seqs", severity="blocking", confidence="exact",
            message=(f"{used}: {fact}. Lower --max-num-seqs, raise --block-size (fewer, larger pages per request; "
                     "the TPU recipes use 256) or shorten --max-model-len until max_num_seqs x pages x 4 B fits"
                     + (f" (the log shows {shown})." if shown else ".")),
            evidence=used, code=_vllm(settings, "--block-size 256")))
    return out


def _vmem(report: OomReport, settings) -> list[Suggestion]:
    """What the serving settings add to the generic scratch-memory advice: the tokens one kernel call sees."""
    from tpuprof import targets
    from tpuprof.errors import UserError

    vmem = None
    if settings.tpu:
        try:
            vmem = VMEM_PER_CORE.get(targets.get(settings.tpu).name)
        except UserError:
            vmem = None
    chip = f" A {settings.tpu} core has {fmt(vmem)} of VMEM (jax tpu_info)." if vmem else ""
    tokens = settings.max_num_batched_tokens
    return [Suggestion(
        kind="max_num_batched_tokens", severity="improve", confidence="estimated",
        message=("A serving kernel's VMEM scratch grows with the tokens of one call: a prefill chunk of up to "
                 f"--max-num-batched-tokens{' ' + format(tokens, ',') if tokens else ''}, or one image's patches in "
                 f"a multimodal encoder.{chip} Lower --max-num-batched-tokens (or the image size the processor allows)."),
        evidence=report.headline[:200],
        code=_vllm(settings, f"--max-num-batched-tokens {max(16, tokens // 2)}") if tokens else "")]


def _more_devices(settings, why: str) -> Suggestion:
    tp = settings.tensor_parallel_size
    return Suggestion(
        kind="tensor_parallel", severity="improve", confidence="estimated",
        message=(f"More devices: {why}. A larger --tensor-parallel-size"
                 + (f" than {tp}" if tp else "") + " (a larger slice when the slice is full) gives each device less "
                 "to hold; past the model's KV heads the KV heads are replicated, not split."),
        code=_vllm(settings, f"--tensor-parallel-size {2 * tp}") if tp else "")


def _quantize(settings, found: str) -> Suggestion:
    vllm_code = _runs_vllm_model_code(settings)
    if vllm_code:
        # tpu-inference applies qwix rules to its JAX models only, and its fp8 method quantizes no bf16 experts.
        return Suggestion(
            kind="quantization", severity="improve", confidence="estimated",
            message=("Weights in 8 bits halve bf16 weights: tpu-inference runs "
                     f"{settings.architecture or settings.model} with vLLM's model code, which quantizes no bf16 checkpoint as it loads (the qwix rules of "
                     "--additional-config apply to its JAX models only), so serve a checkpoint stored in fp8; "
                     f"{found}."))
    which = ("" if vllm_code is False else
             " (for the models tpu-inference runs as its own JAX models: one it runs with vLLM's model code needs a "
             "checkpoint stored in fp8)")
    return Suggestion(
        kind="quantization", severity="improve", confidence="estimated",
        message=(f"Weights in 8 bits halve bf16 weights: an fp8 checkpoint, or a bf16 one quantized as it loads (qwix "
                 f"rules in --additional-config{which}: vLLM TPU takes --quantization only for a checkpoint already "
                 f"quantized); {found}."),
        code=_vllm(settings, "--additional-config " + shlex.quote(vllm_quantization("fp8"))))


def _runs_vllm_model_code(settings) -> bool | None:
    """Whether tpu-inference runs the log's model with vLLM's model code (True) or its own JAX model (False), from the
    architecture the log resolved or the built-in config of its hub id; None when the log says neither."""
    if settings.architecture:
        return runs_vllm_model_code(None, settings.architecture)
    return hub_id_runs_vllm_model_code(settings.model or "")


def _plan(report: OomReport, settings) -> Suggestion:
    missing = [name for name, value in (("the model", settings.model), ("the TPU slice", settings.tpu))
               if not value]
    message = ("Plan the server before starting it again: `tpuprof serve` compiles the programs this engine loads for "
               "the slice on this machine (no TPU needed) and gives the KV cache in tokens, the largest safe "
               "--gpu-memory-utilization and the SMEM/VMEM limits of these settings.")
    if missing:
        message += f" The log does not name {' or '.join(missing)}: fill {'them' if len(missing) > 1 else 'it'} in."
    return Suggestion(kind="serve_plan", severity="info", confidence="exact", message=message,
                      code=report.serving.serve_command)
