"""`tpuprof preflight`: what the user asked (PreflightOptions, validated once by `preflight_options`, which the
command line and `tpuprof.preflight()` both call). A bad value raises PreflightOptionError naming the keyword
(`batch_per_chip=`); the command line re-raises it naming the flag (`--batch-per-chip`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from tpuprof import targets
from tpuprof.models import options

# The LLM train step's closed sets (tpuprof/sources/llm.py builds the step from them).
REMAT_POLICIES = ("none", "full", "dots", "offload")
# `--remat custom:NAME=device|offload,...`: MaxText's `remat_policy: custom`, one decision per named activation of
# a layer (those not named are recomputed); the step marks these names as MaxText's decoder layer does.
REMAT_NAMES = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "qkv_proj", "context", "out_proj",
               "mlpwi", "mlpwo")
REMAT_PLACES = ("device", "offload", "remat")


def custom_remat(policy: str) -> dict[str, str] | None:
    """`custom:context=device,mlpwo=offload` -> {"context": "device", "mlpwo": "offload"}; None for another
    policy; ValueError naming what is wrong."""
    if not policy.startswith("custom:"):
        return None
    chosen = {}
    for part in policy.removeprefix("custom:").split(","):
        name, _, place = part.strip().partition("=")
        if name not in REMAT_NAMES or place not in REMAT_PLACES:
            raise ValueError(f"{part.strip()!r} is not NAME=device|offload|remat with NAME one of "
                             f"{', '.join(REMAT_NAMES)}")
        chosen[name] = place
    return chosen
DTYPES = ("bf16", "fp8")
# --moe: capacity-dropped one-hot routing, or MaxText's dropless sparse_matmul with megablox grouped matmuls.
MOE_ROUTINGS = ("capacity", "dropless")
WEIGHT_DTYPES = {"float32": 4, "bfloat16": 2}  # MaxText's weight_dtype, mu_dtype and grad_dtype -> bytes per element


@dataclass(frozen=True)
class TrainingState:
    """What the step keeps of each parameter from one step to the next, as MaxText stores it: the weights in
    weight_dtype, AdamW's first moment in mu_dtype (optax's `mu_dtype`; None: the weights' dtype) and its second
    moment in the weights' dtype (optax has no setting for it)."""

    weights: str = "float32"
    mu: str | None = None
    # MaxText's shard_exp_on_fsdp (fsdp_shard_on_exp before): the experts' weights stored with the expert
    # dimension over fsdp rather than the embedding
    experts_on_fsdp: bool = False

    @property
    def first_moment(self) -> str:
        return self.mu or self.weights

    def bytes_per_parameter(self) -> int:
        return 2 * WEIGHT_DTYPES[self.weights] + WEIGHT_DTYPES[self.first_moment]


# The Python keyword of each option and what sets it on the command line.
FLAGS = {
    "fn_or_model": "FILE.py:FACTORY", "tpu": "--tpu", "batch": "--batch", "max_batch": "--max-batch",
    "compare_bf16": "--compare-bf16", "top": "--top", "cache": "--no-cache",
    "tokens_per_example": "--tokens-per-example", "price": "--price", "model": "--model", "seq": "--seq",
    "batch_per_chip": "--batch-per-chip", "global_batch": "--global-batch", "remat": "--remat", "dtype": "--dtype",
    "mesh": "--mesh", "weight_dtype": "--weight-dtype", "mu_dtype": "--mu-dtype", "grad_dtype": "--grad-dtype",
    "shard_exp_on_fsdp": "--shard-exp-on-fsdp", "vocab_tiling": "--vocab-tiling", "moe": "--moe", "full": "--full", "ray": "--ray",
}


class PreflightOptionError(options.OptionError):
    """A bad preflight option: `batch_per_chip=` for the API, `--batch-per-chip` through `for_flags`."""

    FLAGS = FLAGS
    KEYWORD = "{}="  # preflight(fn, *args, tpu=...): a keyword argument, told apart from the positional ones
    VALUES = {"batch": "N", "batch_per_chip": "N", "global_batch": "N", "model": "NAME|config.json"}


@dataclass(frozen=True)
class PreflightOptions:
    """One preflight question, validated: the step (a FILE.py:FACTORY text, or for the API a function, a Keras model
    or a factory with its example arguments) or an LLM (`model`), the slices, and how to search and report."""

    slices: tuple  # tpuprof.slices.Slice, in the order given, once each
    step: Any = None  # "file.py:factory", a function, a Keras model or a factory; None with `model`
    example_args: tuple = ()
    model: str | None = None  # a built-in LLM name or a config.json (loaded by the command)
    batch: int | None = None  # per device, for a step
    max_batch: bool = False
    compare_bf16: bool = False
    top: int = 10
    use_cache: bool = True
    tokens_per_example: int | None = None
    prices: Mapping = field(default_factory=dict)  # generation -> tpuprof.prices.Price overriding the table
    seq: int = 2048
    batch_per_chip: int | None = None
    global_batch: int | None = None
    remat: str = "full"  # a policy of REMAT_POLICIES, or "all" (with max_batch: one search per policy)
    dtype: str = "bf16"
    mesh: str | None = None  # AXIS=N,... (checked against each slice's devices when the step is built)
    weight_dtype: str = "float32"
    mu_dtype: str | None = None  # --model: AdamW's first moment (None: the weights' dtype)
    full: bool = False
    ray: str | None = None  # --model: a sweep's compiles as tasks on this Ray cluster
    vocab_tiling: int | None = None  # --model: the loss in this many pieces (None: tpuprof's fewest within budget)
    moe: str = "capacity"  # --model: how a mixture of experts routes (MOE_ROUTINGS)
    grad_dtype: str = "float32"  # --model: MaxText's grad_dtype, the fp32 gradients' dtype before the optimizer
    shard_exp_on_fsdp: bool = False  # --model, an MoE: the experts' weights stored with their expert dimension over fsdp

    @property
    def remat_policies(self) -> tuple:
        return REMAT_POLICIES if self.remat == "all" else (self.remat,)


def _whole(option: str, value: Any, least: int, words: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise PreflightOptionError(option, f"{{option}} must be {words}, not {value!r}.")


def preflight_options(fn_or_model: Any = None, example_args: tuple = (), *, tpu: Any, batch: int | None = None,
                      max_batch: bool = False, compare_bf16: bool = False, top: int = 10, cache: bool = True,
                      tokens_per_example: int | None = None, price: Any = None, model: str | None = None,
                      seq: int = 2048, batch_per_chip: int | None = None, global_batch: int | None = None,
                      remat: str = "full", dtype: str = "bf16", mesh: str | None = None,
                      weight_dtype: str = "float32", mu_dtype: str | None = None, full: bool = False,
                      ray: str | None = None, vocab_tiling: int | None = None,
                      moe: str = "capacity", grad_dtype: str = "float32",
                      shard_exp_on_fsdp: bool = False) -> PreflightOptions:
    """The one validation of a preflight question (what needs the step or the model loaded is checked where they
    are); raises PreflightOptionError naming the keyword at fault."""
    error = PreflightOptionError
    _whole("top", top, 0, "a number of rows (0 or more)")
    _whole("batch", batch, 1, "a positive number of examples per chip")
    _whole("tokens_per_example", tokens_per_example, 1, "a positive number of tokens")
    _whole("seq", seq, 1, "a positive number")
    _whole("batch_per_chip", batch_per_chip, 1, "a positive number")
    _whole("global_batch", global_batch, 1, "a positive number")
    _whole("vocab_tiling", vocab_tiling, 1, "a positive number of pieces")
    slices = options.tpu_slices(tpu, error, f"{{option}} needs a TPU generation ({' '.join(targets.TARGETS)}) or a "
                                            "topology like v5e:2x2.")
    prices = options.price_overrides(price, error, "price")
    if model is not None:
        if fn_or_model is not None or example_args or batch is not None or compare_bf16 or tokens_per_example:
            raise error("model", "{model_n} compiles a built-in LLM step: give it without {fn_or_model}, {batch}, "
                                 "{compare_bf16} or {tokens_per_example} (use {batch_per_chip} or {global_batch}, "
                                 "{seq}).")
        if seq % 128:
            raise error("seq", f"{{option}} must be a multiple of 128 (the attention kernel's tile), not {seq}.")
        if [batch_per_chip is not None, global_batch is not None, bool(max_batch)].count(True) != 1:
            raise error("batch_per_chip", "give one of {batch_per_chip_n}, {global_batch_n} or {max_batch}.")
        try:
            custom = custom_remat(remat)
        except ValueError as wrong:
            raise error("remat", f"{{option}} custom: {wrong}.") from None
        if remat not in (*REMAT_POLICIES, "all") and custom is None:
            raise error("remat", f"{{option}} must be one of {', '.join(REMAT_POLICIES)}, all or "
                                 f"custom:NAME=device|offload,..., not {remat!r}.")
        if remat == "all" and not max_batch:
            raise error("remat", "{option} all searches the largest batch of each policy: give it with {max_batch}.")
        if dtype not in DTYPES:
            raise error("dtype", f"{{option}} must be one of {', '.join(DTYPES)}, not {dtype!r}.")
        if weight_dtype not in WEIGHT_DTYPES:
            raise error("weight_dtype", f"{{option}} must be one of {', '.join(WEIGHT_DTYPES)}, not {weight_dtype!r}.")
        if mu_dtype is not None and mu_dtype not in WEIGHT_DTYPES:
            raise error("mu_dtype", f"{{option}} must be one of {', '.join(WEIGHT_DTYPES)}, not {mu_dtype!r}.")
        if grad_dtype not in WEIGHT_DTYPES:
            raise error("grad_dtype", f"{{option}} must be one of {', '.join(WEIGHT_DTYPES)}, not {grad_dtype!r}.")
        if moe not in MOE_ROUTINGS:
            raise error("moe", f"{{option}} must be one of {', '.join(MOE_ROUTINGS)}, not {moe!r}.")
        if vocab_tiling is not None and seq % vocab_tiling:
            raise error("vocab_tiling", f"{{option}} {vocab_tiling} must divide {{seq}} {seq}: the loss is computed "
                                        "over pieces of each sequence.")
    else:
        given = {"weight_dtype": weight_dtype != "float32", "mu_dtype": mu_dtype is not None, "full": full,
                 "ray": ray, "vocab_tiling": vocab_tiling is not None, "moe": moe != "capacity",
                 "grad_dtype": grad_dtype != "float32", "shard_exp_on_fsdp": shard_exp_on_fsdp}
        wrong = next((keyword for keyword, set_ in given.items() if set_), None)
        if wrong:
            raise error(wrong, f"{{{wrong}}} goes with {{model}} (tpuprof's LLM train step).")
        if fn_or_model is None:
            raise error("fn_or_model", "give {fn_or_model} (your step) or {model_n} (an LLM train step).")
        if batch_per_chip is not None or global_batch is not None:
            raise error("batch_per_chip" if batch_per_chip is not None else "global_batch",
                        "{batch_per_chip} and {global_batch} go with {model}; a {fn_or_model} takes {batch}.")
        if batch is not None and max_batch:
            raise error("batch", "give either {batch_n} or {max_batch}, not both.")
        if batch is None and not max_batch and not (example_args and not isinstance(fn_or_model, (str, os.PathLike))):
            raise error("batch", "give {batch_n} (the batch size per device) or {max_batch} to search for it.")
    return PreflightOptions(slices, fn_or_model, tuple(example_args), model, batch, bool(max_batch),
                            bool(compare_bf16), top, bool(cache), tokens_per_example, prices, seq, batch_per_chip,
                            global_batch, remat, dtype, mesh, weight_dtype, mu_dtype, bool(full), ray or None,
                            vocab_tiling, moe, grad_dtype, bool(shard_exp_on_fsdp))


# --- results -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CurvePoint:
    """One compile of the step: its batch, what it needs per device, and whether that fits."""

    batch_size: int
    required_bytes: int | None  # None: the compiler refused it (RESOURCE_EXHAUSTED)
    fits: bool
    host_bytes: int = 0  # offloaded to the host's memory (not HBM)


@dataclass(frozen=True)
class CompilerFigures:
    """The compiler's memory_analysis() of the compile at the reported batch, per device."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int


@dataclass(frozen=True)
class HostMemory:
    """What the program holds in the host's memory (offloaded activations, pinned arguments) against what one
    device may hold there."""

    bytes: int
    capacity_bytes: int | None  # None: no host budget known for the generation
    fits: bool | None


@dataclass(frozen=True)
class BatchSearch:
    """The largest batch that fits (--max-batch), what bounds it, and the preferred multiple below it."""

    max_batch_size: int | None  # None: not even the smallest batch fits
    recommended_batch_size: int | None
    limited: bool  # the search stopped at its limit: the largest is at least this
    bound: str | None  # "hbm", "host", "batch_limit", or a memory space the compiler named


@dataclass(frozen=True)
class OomAtBatch:
    """The compiler's RESOURCE_EXHAUSTED at the reported batch, through the OOM triage when it reads it."""

    message: str
    report: Any = None  # tpuprof.analyses.oom's report (None: the triage could not read the message)
    batch_estimate: Any = None
    suggestions: tuple = ()


@dataclass(frozen=True)
class Compiled:
    """One dtype's compiles of the step for one slice, at the reported batch."""

    batch_size: int | None  # per device; None when no batch fits and none was given
    fits: bool
    required_bytes: int | None  # arguments + outputs - aliased + temporaries + code (None: refused)
    compiles: int  # compiles this run (cached ones not counted)
    curve: tuple = ()  # CurvePoint by batch
    curve_fit: Any = None  # tpuprof.analyses.preflight.Curve: fixed bytes + bytes per example
    figures: CompilerFigures | None = None
    host: HostMemory | None = None
    memory: Any = None  # tpuprof.models.memory.ModuleMemory: where the memory goes at the peak
    dump_dir: str | None = None
    search: BatchSearch | None = None
    parameter_bytes: int | None = None  # weights and optimizer state alone (said with a verdict or an OOM)
    oom: OomAtBatch | None = None
    verdict: str | None = None  # why no batch fits
    stage: str = "code"  # "buffer_assignment": the reported compile stopped before code generation (FastAnswer)

    @property
    def runs(self) -> bool:
        """Whether the step can run: it fits HBM and, where it offloads, the host's memory."""
        return bool(self.fits) and (self.host is None or self.host.fits is not False)


@dataclass(frozen=True)
class FastAnswer:
    """A --model compile stopped once the compiler had laid out the program's memory (its buffer assignment),
    before code generation, because the layout alone needs more than the HBM offered plus MARGIN_BYTES: it does not
    fit, and its figures are a lower bound (code generation adds to them)."""

    margin_bytes: int


def stated_rate(value: float | None) -> float | None:
    """Examples or tokens per second as the document states them: two decimals below 1,000, whole above."""
    if value is None:
        return None
    return round(value, 2) if value < 1000 else round(value)


@dataclass(frozen=True)
class TargetEstimate:
    """One slice's step time at the reported batch (tpuprof.analyses.preflight_step.estimate) and what its throughput,
    utilisation and cost follow from; the document's `estimate` (tpuprof.documents_preflight.estimate) states it."""

    step: Any  # tpuprof.analyses.step_estimate.StepEstimate: the band, the point, the ops, the collectives
    batch_size: int  # per device: the reported compile's
    tokens_per_example: int | None = None  # an LLM's sequence length, a step's --tokens-per-example
    price: Any = None  # tpuprof.prices.Price per chip-hour; None: no price known
    top: int = 5  # ops and collectives listed
    model_flops_per_device: float | None = None  # an LLM's MaxText FLOPs (the MFU's); None: the program's own
    model_flops_basis: str = ""  # what those FLOPs count, in words and figures (analyses.preflight.model_flops_basis)
    gradient_source: str = ""  # how the gradient bytes of the timed all-reduces were found ("": none timed)

    @property
    def devices_per_chip(self) -> int:
        return targets.get(self.step.target).devices_per_chip

    @property
    def examples_per_s(self) -> float | None:
        """Per chip: a device's batch over the step time, times the devices a chip holds."""
        step = self.step.point_s
        return self.batch_size * self.devices_per_chip / step if step > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        """Per chip; None without tokens per example."""
        examples = self.examples_per_s
        return examples * self.tokens_per_example if examples and self.tokens_per_example else None


@dataclass(frozen=True)
class PreflightTarget:
    """One slice's answer: the step's compiles, the batches they mean for the slice, the step time and cost."""

    slice: Any  # tpuprof.slices.Slice
    compiled: Compiled
    cache: str  # the compile cache's folder
    bf16: Compiled | None = None  # --compare-bf16
    batch_per_chip: int | None = None
    global_batch: int | None = None  # the whole job's (every device of every slice); None for a bare generation
    searched: bool = False  # the largest batch was asked (--max-batch)
    estimate: TargetEstimate | None = None  # None for a step that cannot run, without a dump to time, or timed at 0
    # An LLM's train step (--model):
    model: Mapping | None = None  # tpuprof.sources.llm.Spec.model_info()
    mesh: Mapping | None = None  # axis -> size over the slice
    seq_len: int | None = None
    state_bytes_per_chip: int | None = None  # weights and AdamW state
    unsharded: Mapping | None = None  # what stays whole on each device, and the mesh that divides it
    max_batch_per_chip: int | None = None
    remat_table: tuple = ()  # --remat all: the answer under each policy (PreflightTarget), this one among them
    fast: FastAnswer | None = None
    batch_from: str | None = None  # a function's example arguments: which dimension was taken as the batch
    # --model, a step that does not fit: compiled again at its batch with a smaller training state (--mu-dtype or
    # --weight-dtype bfloat16: the fix, measured)
    state_change: Compiled | None = None
    # --model, a step that does not fit: compiled again at the smaller batch its memory advice names (the fix, measured)
    batch_check: Compiled | None = None

    @property
    def generation(self):
        """tpuprof.targets.Target of the slice."""
        return self.slice.target

    @property
    def fits(self) -> bool:
        return self.compiled.fits

    @property
    def compiles(self) -> int:
        return sum(c.compiles for c in (self.compiled, self.bf16, self.state_change, self.batch_check) if c is not None)
