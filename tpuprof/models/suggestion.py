"""One suggestion model for every command and the report.

A suggestion says what to change, why (the evidence from the user's own dump, log or capture), what it
saves (bytes of HBM or milliseconds per step, with a range when it is an estimate) and the concrete call in
the user's framework. Every command ranks its suggestions with `rank`, so the order means the same thing
everywhere: first the fixes that can make a job that does not fit fit, largest saving first; then the rest
by saving; then advice that carries no number (how to get more detail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What blocks the user first. "blocking": the job does not fit (or the step is bound) and this fix addresses
# that; "improve": worth doing; "info": context or how to learn more.
SEVERITIES = ("blocking", "improve", "info")

# How a saving was obtained: "exact" (the compiler's own figure or arithmetic on it), "estimated" (a model of
# how the bytes or time scale, with a range), "rough" (an order of magnitude), "measured" (the changed program
# compiled here: its peak against this one's).
CONFIDENCES = ("exact", "estimated", "rough", "measured")

# The frameworks a job, a log or a suggestion's code is written for, as people name them.
FRAMEWORK_NAMES = {"jax": "JAX", "keras": "Keras", "tf2": "TensorFlow 2", "tf1": "TensorFlow 1 (TPUEstimator)",
                   "pytorch_xla": "PyTorch/XLA", "vllm": "vLLM",
                   "tf": "TensorFlow/Keras"}  # "tf": what a capture shows (tpuprof.advice.steps)
# How each kind is titled for people (renderers): never the internal label.
KIND_TITLES = {
    "padding": "Tile padding", "bf16": "bfloat16", "remat": "Rematerialisation", "attention": "Fused attention",
    "sharding": "Sharding", "donation": "Buffer donation", "fragmentation": "Fragmentation",
    "batch_size": "Batch size", "live_buffers": "Live buffers", "vmem": "vmem (on-chip scratch)",
    "smem": "smem (on-chip scalar memory)", "sparsecore": "SparseCore", "shape_bug": "A shape far too large",
    "largest_ops": "Largest ops", "more_detail": "More detail", "offload": "Host offload",
    "one_hot": "One-hot padding", "input_pipeline": "Input pipeline", "steps_per_execution": "Steps per execution",
    "host_transfer": "Host transfers", "collective": "Collectives", "compile": "Compilation",
    "straggler": "Straggler", "memory_bound": "Memory-bound ops", "precision": "Precision",
    "host_memory": "Host memory",
    # A serving engine's options (tpuprof.advice.oom_serving).
    "gpu_memory_utilization": "--gpu-memory-utilization", "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs", "max_model_len": "--max-model-len", "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel": "--tensor-parallel-size", "quantization": "Weight quantization",
    "serve_plan": "Plan with tpuprof serve",
}

# Frameworks whose API a suggestion can speak; None is framework-neutral wording.
FRAMEWORKS = ("jax", "keras", "tf2", "tf1", "pytorch_xla", "vllm")


@dataclass
class Suggestion:
    kind: str  # padding, bf16, remat, attention, batch_size, sharding, donation, fragmentation, offload, ...
    message: str  # what to change and why, in the user's terms, one or two sentences
    severity: str = "improve"
    saving_bytes: int | None = None  # HBM freed (point estimate)
    saving_bytes_range: tuple[int, int] | None = None
    saving_ms_per_step: float | None = None  # step time saved (point estimate)
    saving_ms_range: tuple[float, float] | None = None
    confidence: str = "estimated"
    evidence: str = ""  # the figures from the input that support it
    code: str = ""  # the concrete call in the user's framework, e.g. "jax.jit(step, donate_argnums=(0,))"
    framework: str | None = None
    source_line: str = ""  # file:line of the buffer or op it is about, when known
    extra: dict = field(default_factory=dict)  # kind-specific figures (e.g. {"batch": 96})

    def to_dict(self) -> dict:
        out: dict = {"kind": self.kind, "severity": self.severity, "message": self.message,
                     "confidence": self.confidence}
        if self.saving_bytes is not None:
            out["saving_bytes"] = int(self.saving_bytes)
        if self.saving_bytes_range is not None:
            out["saving_bytes_range"] = [int(v) for v in self.saving_bytes_range]
        if self.saving_ms_per_step is not None:
            out["saving_ms_per_step"] = round(float(self.saving_ms_per_step), 3)
        if self.saving_ms_range is not None:
            out["saving_ms_range"] = [round(float(v), 3) for v in self.saving_ms_range]
        for key in ("evidence", "code", "framework", "source_line"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out.update(self.extra)
        return out


def say_per_device(items: list[Suggestion], devices_per_chip: int) -> None:
    """A program is one device's: where a chip holds two (TPU7x, v2, v3: a TensorCore each), the batch a fix names
    is the device's, half the chip's."""
    if devices_per_chip == 1:
        return
    for item in items:
        if item.kind == "batch_size":
            item.message = item.message.replace("per-chip batch", "per-device batch")
            item.evidence = item.evidence.replace("per-chip batch", "per-device batch")
            if item.code:
                item.code = item.code.replace("per-chip batch", "per-device batch")


def rank(suggestions: list[Suggestion], *, shortfall_bytes: int | None = None) -> list[Suggestion]:
    """Order suggestions the same way in every command.

    With `shortfall_bytes` (the job needs that much more HBM than it has), a fix whose saving covers the
    shortfall on its own (counting the low end of an estimate's range, so a rough guess does not outrank an
    exact figure) comes first, largest first; then every other fix by its saving (bytes and
    milliseconds are never compared with each other: a document is about one or the other), then advice
    without a number, by severity. Python's sort is stable: equal keys keep the order they were given in.
    """
    severity_order = {name: i for i, name in enumerate(SEVERITIES)}

    def key(s: Suggestion):
        counted = _counted(s)
        covers = bool(shortfall_bytes and counted is not None and s.saving_bytes is not None
                      and counted >= shortfall_bytes)
        saving = counted if covers else _point(s)
        return (not covers, saving is None, -(saving or 0), severity_order.get(s.severity, len(SEVERITIES)))

    return sorted(suggestions, key=key)


def _point(s: Suggestion):
    return s.saving_bytes if s.saving_bytes is not None else s.saving_ms_per_step


def _counted(s: Suggestion):
    """The saving a fix can be counted on: the low end of an estimate's range, else its figure."""
    if s.saving_bytes is not None:
        return s.saving_bytes_range[0] if s.saving_bytes_range else s.saving_bytes
    if s.saving_ms_per_step is not None:
        return s.saving_ms_range[0] if s.saving_ms_range else s.saving_ms_per_step
    return None


def rank_across(groups: list[tuple[list[Suggestion], int | None]]) -> list[tuple[int, Suggestion]]:
    """Suggestions of several inputs (a report) in one order: (group index, suggestion).

    Each group is (its suggestions, its shortfall in bytes: > 0 when that input does not fit, 0 when it fits,
    None when unknown). The fixes of inputs that do not fit come first, and among them those whose saving
    covers their own input's shortfall, largest first; then the others by saving; then the inputs that fit.
    """
    severity_order = {name: i for i, name in enumerate(SEVERITIES)}
    keyed = []
    for index, (suggestions, shortfall) in enumerate(groups):
        for order, s in enumerate(suggestions):
            counted = _counted(s)
            blocked = bool(shortfall and shortfall > 0)
            covers = blocked and s.saving_bytes is not None and counted >= shortfall
            saving = counted if covers else _point(s)
            keyed.append(((not blocked, not covers, saving is None, -(saving or 0),
                           severity_order.get(s.severity, len(SEVERITIES)), index, order), index, s))
    keyed.sort(key=lambda item: item[0])
    return [(index, s) for _, index, s in keyed]
