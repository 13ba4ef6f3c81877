"""Out-of-memory failures of a serving engine (vLLM on TPU): the forms only servers print, what caused the failure,
and the `tpuprof serve` command that plans the same server before it is started again.

A serving engine fails to start in ways a training job does not (tpuprof.advice.oom_serving says what to change):

* program_load: vLLM TPU gives the KV cache `limit x gpu_memory_utilization - weights` before it compiles anything,
  then loads its bucket programs into what is left; one that cannot reserve its room "at the bottom of memory"
  fails with E0101 (RuntimeProgramAllocationFailure), "Attempting to reserve X", with or without "There are Y free,
  0B reserved, and Z reservable", or "Attempting to allocate X" while loading a program.
* runtime_buffer: a device buffer allocation (E0100) once the KV cache holds its share.
* kv_budget: vLLM's own check, "To serve at least one request with the model's max seq len (L), (X GiB KV cache is
  needed, which is larger than the available KV cache memory (Y GiB)...".
* weights_over_cap: tpu-inference's check, "total_hbm_used_gb=U exceeds total_hbm_limit_cap_gb=C by E".
* compile_hbm: a program does not fit HBM at compile time (E1000, "Ran out of memory in memory space hbm", a bare
  "Used X of Y hbm" quoted in a heading or a sentence).
* smem / vmem: the paged-attention page table or a kernel's scratch (E1001) at compile time.

Messages reduced to their code ("E0101: RuntimeProgramAllocationFailure:" with nothing after it, behind
"(EngineCore pid=...)") are recognised by the code: XLA's error codes (openxla.org/xla/errors) name the failure.
"""

from __future__ import annotations

import math
import re

from tpuprof.models.oom import (
    COMPILE, EARLY_ABORT, KV_BUDGET, RESERVATION, RUNTIME_ALLOCATION, OomReport, ServingFailure,
)
from tpuprof.sources import serving_log

GIB = 1 << 30

# XLA's memory error codes -> (kind, memory space): openxla/xla docs/errors/error_0100.md ... error_1002.md.
MEMORY_CODES = {
    "E0100": (RUNTIME_ALLOCATION, "hbm"),  # a device buffer could not be allocated
    "E0101": (RESERVATION, "hbm"),  # RuntimeProgramAllocationFailure: a program could not be loaded
    "E1000": (COMPILE, "hbm"),  # CompileTimeHbmOom
    "E1001": (COMPILE, "vmem"),  # CompileTimeScopedVmemOom
    "E1002": (COMPILE, "hbm"),  # TensorCore + SparseCore HBM
}
_CODE = re.compile(r"\b(E\d{4}):\s*([A-Z][A-Za-z0-9]+):")
_KV_BUDGET = re.compile(
    r"To serve at least one request with the models?'s max seq len \((\d+)\),?\s*\(([\d.]+) GiB KV cache is needed,"
    r" which is larger than the available KV cache memory \(([\d.]+) GiB\)"
    r"(?:\.\s*Based on the available memory,\s*the estimated maximum model length is (\d+))?")
_OVER_CAP = re.compile(
    r"total_hbm_used_gb=([\d.]+)GiB exceeds total_hbm_limit_cap_gb=([\d.]+)GiB by (-?[\d.]+)GiB"
    r"(?:.*?increasing --gpu-memory-utilization from ([\d.]+))?")


def headline(flat, size_pattern: str, size_bytes) -> OomReport | None:
    """The forms tpuprof.analyses.oom's headline parser does not know (FLAT: its _Flat of the message; SIZE_PATTERN
    and SIZE_BYTES: its reading of XLA's sizes, the number and unit groups and their bytes)."""
    text = flat.text
    match = _KV_BUDGET.search(text)
    if match:
        report = OomReport(KV_BUDGET, flat.line(match.start()), memory_space="hbm")
        report.required_bytes = int(round(float(match.group(2)) * GIB))
        report.capacity_bytes = int(round(float(match.group(3)) * GIB))
        report.notes.append(f"vLLM's KV cache check: one request of max_model_len {int(match.group(1)):,} tokens "
                            f"needs {match.group(2)} GiB of KV cache, {match.group(3)} GiB is available")
        return report
    match = _OVER_CAP.search(text)
    if match:
        report = OomReport(KV_BUDGET, flat.line(match.start()), memory_space="hbm")
        report.used_bytes = int(round(float(match.group(1)) * GIB))
        report.capacity_bytes = int(round(float(match.group(2)) * GIB))
        report.exceeded_bytes = max(0, int(round(float(match.group(3)) * GIB)))
        return report
    match = re.search(rf"\bUsed\s+{size_pattern}\s+of\s+{size_pattern}\s+hbm\b", text)
    if match:
        used, capacity = size_bytes(*match.groups()[:2]), size_bytes(*match.groups()[2:4])
        if used <= capacity:
            return None  # a memory report of a program that fitted, not a failure
        report = OomReport(COMPILE, flat.line(match.start()), memory_space="hbm")
        report.used_bytes, report.capacity_bytes = used, capacity
        report.notes.append("only 'Used X of Y hbm' is quoted: the rest of the compiler's message is not in the input")
        return report
    match = _CODE.search(text)
    if match and match.group(1) in MEMORY_CODES:
        kind, space = MEMORY_CODES[match.group(1)]
        report = OomReport(kind, flat.line(match.start()), memory_space=space)
        report.notes.append(f"the message is only its code, {match.group(1)} {match.group(2)}: it gives no sizes")
        return report
    return None


def attach(report: OomReport, near: str, head: str = "") -> None:
    """Mark REPORT as a serving engine's failure when NEAR (the message and the log around it) shows a server, with
    the cause and the settings the log states (HEAD: the log's start, where a server prints them)."""
    if report.framework not in (None, "vllm") or serving_log.read(near).engine is None and report.framework is None:
        return  # another framework's job: a log that only mentions vLLM somewhere is not a server's
    text = head + "\n" + near if head and not near.startswith(head[:200]) else near
    settings = serving_log.read(text)
    engine = settings.engine or "vllm"
    report.framework = report.framework or engine
    if report.training is None:
        report.training = False
    estimated = _KV_BUDGET.search(" ".join(report.headline.split()) + " " + " ".join(text.split()))
    if report.kind == KV_BUDGET and settings.gpu_memory_utilization is None:
        over = _OVER_CAP.search(" ".join(text.split()))
        if over and over.group(4):
            settings.gpu_memory_utilization = float(over.group(4))
    if report.kind == KV_BUDGET and report.used_bytes is None and estimated:
        settings.max_model_len = settings.max_model_len or int(estimated.group(1))
    report.serving = ServingFailure(
        engine, cause(report), settings,
        estimated_max_model_len=int(estimated.group(4)) if estimated and estimated.group(4) else None)
    report.serving.serve_command = serve_command(settings)


def cause(report: OomReport) -> str:
    if report.kind == KV_BUDGET:
        return "weights_over_cap" if report.used_bytes is not None else "kv_budget"
    if report.memory_space in ("smem", "vmem"):
        return report.memory_space
    if report.kind == RESERVATION or report.program_name \
            or "ProgramAllocation" in (report.error_name or ""):
        return "program_load"
    if report.kind == RUNTIME_ALLOCATION:
        return "runtime_buffer"
    if report.kind in (COMPILE, EARLY_ABORT):
        return "compile_hbm"
    return "other"


def devices(settings) -> int | None:
    """Devices the server spans: its mesh, else its slice's."""
    if settings.devices:
        return settings.devices
    if settings.tpu:
        from tpuprof import slices
        from tpuprof.errors import UserError

        try:
            return slices.parse(settings.tpu).devices
        except (UserError, KeyError, ValueError):
            return None
    return None


def hbm_per_device(settings) -> int | None:
    """One device's HBM limit as the engine read it (its "Memory statistics" sum over the devices), else the
    runtime limit tpuprof knows for the slice's generation."""
    count = devices(settings)
    if settings.hbm_limit_bytes and count:
        return settings.hbm_limit_bytes // count
    if settings.tpu:
        from tpuprof import targets
        from tpuprof.errors import UserError

        try:
            return targets.get(settings.tpu).compiler_hbm_bytes
        except UserError:
            return None
    return None


_FLAGS = (("max_model_len", "--max-model-len"), ("max_num_seqs", "--max-num-seqs"),
          ("max_num_batched_tokens", "--max-num-batched-tokens"), ("tensor_parallel_size", "--tensor-parallel-size"),
          ("kv_cache_dtype", "--kv-cache-dtype"), ("quantization", "--quantization"), ("block_size", "--block-size"),
          ("gpu_memory_utilization", "--gpu-memory-utilization"))


# vLLM's --quantization names as `tpuprof serve --quantization` takes them (fp8, int8: weights quantized when
# loaded). The rest (compressed-tensors, awq, gptq...) name a checkpoint's own format, which serve reads from the
# model's config.json: passed through, serve refused the command as a usage error.
_SERVE_QUANTIZATION = {"fp8": "fp8", "tpu_int8": "int8", "int8": "int8"}


def serve_command(settings, **changes) -> str:
    """`tpuprof serve --model M --tpu SLICE ...` with the settings the log shows (CHANGES override them).
    MODEL and SLICE stand where the log does not name them."""
    values = {name: getattr(settings, name) for name, _ in _FLAGS}
    values.update(changes)
    parts = ["tpuprof serve", f"--model {_quote(settings.model) if settings.model else 'MODEL'}",
             f"--tpu {settings.tpu or 'SLICE'}"]
    if settings.engine and settings.engine != "vllm":
        parts.append(f"--engine {settings.engine}")
    for name, flag in _FLAGS:
        value = values.get(name)
        if name == "quantization" and value is not None:
            value = _SERVE_QUANTIZATION.get(value)
        if value is None or (name == "kv_cache_dtype" and value == "auto"):
            continue
        parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(parts)


def _quote(text: str) -> str:
    return text if re.fullmatch(r"[\w./:@+-]+", text) else "'" + text.replace("'", "'\\''") + "'"


def utilization_for_room(settings, room_bytes: int) -> tuple[float, float] | None:
    """(current utilization, the utilization that leaves ROOM_BYTES more per device outside the KV cache),
    rounded down to the 0.01 vLLM's flag is usually given in; None when the log gives neither."""
    current = settings.utilization()
    limit = hbm_per_device(settings)
    if current is None or not limit:
        return None
    return current, math.floor((current - room_bytes / limit) * 100 + 1e-9) / 100
