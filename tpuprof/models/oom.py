"""What a TPU out-of-memory message says, and what tpuprof works out from it.

Sizes are bytes. A field is None when the message does not give it; `to_json` then omits it, so the
JSON never claims a number the log does not contain (recomputed numbers live under their own keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kinds of failure.
COMPILE = "compile"  # XLA:TPU found at compile time that the program does not fit
EARLY_ABORT = "early_abort"  # compiler gave up before assigning buffers: "Aborting compilation early"
RUNTIME_ALLOCATION = "runtime_allocation"  # a device buffer could not be allocated at run time
RESERVATION = "reservation"  # the program's memory could not be reserved when loading it
NOT_TPU = "not_tpu"  # an out-of-memory error of another device (a GPU's allocator): not triaged here
KV_BUDGET = "kv_budget"  # a serving engine's start-up check: the KV cache (or the weights) does not fit its budget


@dataclass
class OomAllocation:
    """One entry of "Largest program allocations in hbm:"."""

    index: int | None = None
    size_bytes: int | None = None
    size_text: str | None = None  # as printed ("14.00G"): its precision bounds the comparison
    shape: str | None = None
    unpadded_bytes: int | None = None
    unpadded_text: str | None = None
    padding_bytes: int | None = None  # "Extra memory due to padding"
    expansion: float | None = None
    op_type: str | None = None
    op_name: str | None = None
    source: str | None = None  # file:line from the operator metadata
    xla_label: str | None = None
    allocation_type: str | None = None
    # Recomputed from the shape with XLA's tiling math (tpuprof.models.shape).
    recomputed_padded_bytes: int | None = None
    recomputed_unpadded_bytes: int | None = None
    assumed_tiling: str | None = None  # set when the log printed no tiles and a default TPU tile was assumed
    padded_dims: list[tuple[int, int, int]] = field(default_factory=list)  # (dim, size, padded size)
    dims: tuple[int, ...] = ()
    dtype: str | None = None
    disagreements: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {
            "index": self.index,
            "size_bytes": self.size_bytes,
            "shape": self.shape,
            "unpadded_bytes": self.unpadded_bytes,
            "padding_bytes": self.padding_bytes,
            "expansion": self.expansion,
            "op_type": self.op_type,
            "op_name": self.op_name,
            "source": self.source,
            "xla_label": self.xla_label,
            "allocation_type": self.allocation_type,
            "recomputed_padded_bytes": self.recomputed_padded_bytes,
            "recomputed_unpadded_bytes": self.recomputed_unpadded_bytes,
            "assumed_tiling": self.assumed_tiling,
            "padded_dims": [
                {"dim": d, "size": s, "padded": p} for d, s, p in self.padded_dims
            ] or None,
            "disagreements": self.disagreements or None,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class OomReport:
    kind: str
    headline: str  # the line that says what failed, cleaned of log prefixes
    memory_space: str | None = None  # hbm, vmem, smem
    used_bytes: int | None = None
    required_bytes: int | None = None  # "Requires X, has Y available": the compiler's estimate when it gave up
    capacity_bytes: int | None = None
    exceeded_bytes: int | None = None
    requested_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None  # "Total hbm usage >= X" (reserved + program + arguments)
    reserved_bytes: int | None = None
    program_bytes: int | None = None
    arguments_bytes: int | None = None
    arguments_unknown: bool = False
    output_bytes: int | None = None
    output_shared_bytes: int | None = None  # "Output size X; shares Y with arguments": Y, what donation saved
    currently_allocated_bytes: int | None = None
    global_bytes: int | None = None
    scoped_bytes: int | None = None
    hlo_temp_bytes: int | None = None
    unpadded_bytes: int | None = None  # HLO temp, unpadded
    padded_bytes: int | None = None  # HLO temp, padded
    utilization: float | None = None  # percent
    fragmentation_bytes: int | None = None
    kernel: str | None = None  # the instruction whose scratch allocation failed ("allocating on stack for %X")
    scoped_limit: bool = False  # capacity is one kernel's scoped limit ("Scoped allocation with size X and limit Y")
    tensorcore_bytes: int | None = None
    sparsecore_bytes: int | None = None
    largest_free_bytes: int | None = None  # "the largest contiguous region of free memory is X": fragmentation
    reservable_bytes: int | None = None  # "Y free, 0B reserved, and Z reservable" when loading a program
    program_name: str | None = None  # "Error loading program 'jit_step'"
    program_unknown: bool = False  # "program unknown size" in the total's breakdown
    error_code: str | None = None  # XLA's error code ("E1000"), documented at openxla.org/xla/errors
    error_name: str | None = None  # its name ("CompileTimeHbmOom")
    allocations: list[OomAllocation] = field(default_factory=list)
    framework: str | None = None  # jax, keras, tf2, tf1, pytorch_xla, vllm (tpuprof.analyses.framework)
    training: bool | None = None  # True: a training step; False: inference/serving; None: cannot tell
    device: str | None = None  # for NOT_TPU: the device the log names ("GTX 1080", "GPU")
    line_number: int | None = None  # where the message starts in the log (1-based)
    failed_in: str | None = None  # the framework call the traceback ends in, when the log shows it ("xm.mark_step")
    messages_found: int = 1  # out-of-memory messages in the whole log
    notes: list[str] = field(default_factory=list)
    serving: "ServingFailure | None" = None  # a serving engine's start-up failure: its cause and the server's settings

    def to_json(self) -> dict:
        keys = (
            "kind", "memory_space", "used_bytes", "required_bytes", "capacity_bytes", "exceeded_bytes", "requested_bytes",
            "free_bytes", "hlo_temp_bytes", "unpadded_bytes", "padded_bytes", "total_bytes",
            "reserved_bytes", "program_bytes", "arguments_bytes", "output_bytes", "output_shared_bytes",
            "currently_allocated_bytes", "global_bytes", "scoped_bytes", "utilization",
            "fragmentation_bytes", "tensorcore_bytes", "sparsecore_bytes", "largest_free_bytes", "reservable_bytes",
            "program_name", "error_code", "error_name", "kernel", "framework", "training", "headline",
            "line_number", "messages_found",
        )
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.arguments_unknown:
            out["arguments_unknown"] = True
        if self.program_unknown:
            out["program_unknown"] = True
        if self.scoped_limit:
            out["scoped_limit"] = True
        out["allocations"] = [a.to_json() for a in self.allocations]
        if self.notes:
            out["notes"] = list(self.notes)
        if self.serving is not None:
            out["serving"] = self.serving.to_json()
        return out


@dataclass
class ServingFailure:
    """What a serving engine's failure to start means (tpuprof.analyses.oom_serving): the cause and the settings
    the log shows (tpuprof.sources.serving_log.ServingSettings)."""

    engine: str  # vllm
    cause: str  # program_load, kv_budget, weights_over_cap, compile_hbm, smem, vmem, runtime_buffer
    settings: object  # ServingSettings
    estimated_max_model_len: int | None = None  # vLLM's own estimate when the KV cache cannot hold one request
    serve_command: str = ""  # the `tpuprof serve` command that plans this server before it is started again

    def to_json(self) -> dict:
        out = {"engine": self.engine, "cause": self.cause, "settings": self.settings.to_json()}
        if self.estimated_max_model_len is not None:
            out["estimated_max_model_len"] = self.estimated_max_model_len
        if self.serve_command:
            out["serve_command"] = self.serve_command
        return out


@dataclass
class BatchEstimate:
    """How far the batch must shrink for the program to fit, if memory scales with the batch."""

    scale: float | None  # fraction of the current batch that fits (None: cannot tell)
    confidence: str  # high | medium | low | none
    reason: str
    fixed_bytes: int | None = None  # what does not scale with the batch (arguments, reserved, globals)
    scaling_bytes: int | None = None  # what does (HLO temporaries)
    batch_dim: int | None = None  # a dimension size shared by most of the large buffers
    batch_dim_share: float | None = None  # fraction of the listed allocation bytes with that dim
    current_batch: int | None = None
    fitting_batch: int | None = None
    batch_source: str | None = None  # where current_batch comes from: "--batch", or the log's own line

    def to_json(self) -> dict:
        out = {
            "scale": None if self.scale is None else round(self.scale, 4),
            "confidence": self.confidence,
            "reason": self.reason,
            "fixed_bytes": self.fixed_bytes,
            "scaling_bytes": self.scaling_bytes,
            "batch_dim": self.batch_dim,
            "batch_dim_share": None if self.batch_dim_share is None else round(self.batch_dim_share, 3),
            "current_batch": self.current_batch,
            "fitting_batch": self.fitting_batch,
            "batch_source": self.batch_source,
        }
        return {k: v for k, v in out.items() if v is not None}
