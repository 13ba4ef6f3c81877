"""`tpuprof serve`: what the user asked (ServeOptions, validated once by `serve_options`) and what tpuprof answers
per slice (ServeTarget with its KV layout, compiled programs and estimate). Plain dataclasses: the analyses
(tpuprof/analyses/serve_*.py) fill them, tpuprof/documents_serve.py turns them into the `tpuprof.serve/1` document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from tpuprof.models import options

ENGINES = ("vllm", "sglang-jax", "jetstream")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's names for one byte per value
QUANTIZATIONS = ("bf16", "fp8", "int8")
# Checkpoint formats sized as the engine stores them: QUANTIZATIONS, and GPT-OSS's MXFP4 experts on vLLM TPU (its
# other weights bf16), which no flag produces.
CHECKPOINT_FORMATS = QUANTIZATIONS + ("mxfp4",)
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = 1024, 256
# Families with sliding-window or chunked layers that SGLang-JAX has no model of (python/sgl_jax/srt/models @
# cddbf6f1: Gemma 2 and Gemma 4 are there, these are not).
# How the other engines run Gemma 4, whose cache tpuprof has not modelled for them.
GEMMA4_ELSEWHERE = {
    "sglang-jax": "which SGLang-JAX serves with a pool of its own for the sliding layers (python/sgl_jax/srt/models/"
                  "gemma4.py, configs/gemma4.py, model_executor/model_runner_kv_cache_mixin.py SWAKVPool @ cddbf6f1)",
    "jetstream": "which MaxText builds (src/maxtext/models/gemma4.py @ e591f30c)",
}
SGLANG_JAX_WITHOUT_MODEL = {"gemma3": "Gemma 3", "llama4": "Llama 4", "gpt_oss": "GPT-OSS"}

# The Python keyword of each option and the command-line flag that sets it: errors name the one the caller used.
FLAGS = {
    "model": "--model", "tpu": "--tpu", "engine": "--engine", "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
    "tensor_parallel_size": "--tensor-parallel-size", "enable_expert_parallel": "--enable-expert-parallel",
    "kv_cache_dtype": "--kv-cache-dtype", "quantization": "--quantization",
    "gpu_memory_utilization": "--gpu-memory-utilization", "block_size": "--block-size", "input_len": "--input-len",
    "output_len": "--output-len", "concurrency": "--concurrency", "prices": "--price",
}


class OptionError(options.OptionError):
    """A bad serving option: named by its keyword (`max_model_len`) or, through `for_flags`, its flag."""

    FLAGS = FLAGS


@dataclass(frozen=True)
class ServeOptions:
    """One serving question, validated: the model, the slices, the engine's settings and the workload."""

    model: Any  # tpuprof.sources.llm.ModelConfig
    model_source: str  # built-in:NAME or the config.json path
    slices: tuple  # tpuprof.slices.Slice, in the order given
    engine: str = "vllm"
    max_model_len: int | None = None  # None: the model's max_position_embeddings (the engine's default)
    max_num_seqs: int | None = None  # None: the engine's default
    max_num_batched_tokens: int | None = None  # None: the engine's default for the generation
    tensor_parallel_size: int | None = None  # None: every device of the slice
    enable_expert_parallel: bool = False
    kv_cache_dtype: str = "auto"
    quantization: str = "bf16"
    gpu_memory_utilization: float | None = None  # None: tpuprof recommends one
    block_size: int | None = None  # None: the engine's page size rule
    input_len: int | None = None  # None: 1024, at most half the max model length
    output_len: int | None = None  # None: 256, at most what the max model length leaves
    concurrency: int | None = None  # None: max_num_seqs, as far as the KV cache holds them
    prices: Mapping = field(default_factory=dict)  # generation -> tpuprof.prices.Price overriding the table
    compile: bool = True  # False: weights from shapes, no programs (no JAX)
    quantized_checkpoint: bool = False  # the weights are stored in `quantization` already (no flag quantizes them)
    not_compiled: str | None = None  # why tpuprof does not compile this model's programs (None: compiled if asked)
    architecture: str | None = None  # the config's architectures[0] (the engine picks its model code by it)
    hub_id: str | None = None  # the Hugging Face id the model was named by (the launch command loads it)


def serve_options(model: tuple, tpu: str | list | tuple, *, engine: str = "vllm", max_model_len: int | None = None,
                  max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                  tensor_parallel_size: int | None = None, enable_expert_parallel: bool = False,
                  kv_cache_dtype: str = "auto", quantization: str = "bf16",
                  gpu_memory_utilization: float | None = None, block_size: int | None = None,
                  input_len: int | None = None, output_len: int | None = None, concurrency: int | None = None, prices: Any = None,
                  compile: bool = True, checkpoint: str | None = None, architecture: str | None = None,
                  hub_id: str | None = None) -> ServeOptions:
    """The one validation of a serving question; raises OptionError naming the keyword at fault. MODEL: the
    model's (tpuprof.sources.llm.ModelConfig, source), read at the edge (tpuprof.commands.serve.options), with
    CHECKPOINT the format its config's quantization_config names (None: unquantized)."""
    if engine not in ENGINES:
        raise OptionError("engine", f"{{option}} {engine!r} is not an engine tpuprof knows: use one of {', '.join(ENGINES)}.")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise OptionError("kv_cache_dtype", f"{{option}} {kv_cache_dtype!r}: use auto (the model's bf16) or fp8 "
                                               "(fp8_e4m3, fp8_e5m2).")
    if quantization not in QUANTIZATIONS:
        raise OptionError("quantization", f"{{option}} {quantization!r}: use one of {', '.join(QUANTIZATIONS)} "
                                          "(int4 weights are not modelled).")
    for option, value, least in (("max_model_len", max_model_len, 16), ("max_num_seqs", max_num_seqs, 1),
                                 ("max_num_batched_tokens", max_num_batched_tokens, 16),
                                 ("tensor_parallel_size", tensor_parallel_size, 1), ("block_size", block_size, 1),
                                 ("input_len", input_len, 1), ("output_len", output_len, 1),
                                 ("concurrency", concurrency, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise OptionError(option, f"{{option}} must be a whole number of at least {least}, not {value!r}.")
    if block_size is not None and block_size & (block_size - 1):
        raise OptionError("block_size", f"{{option}} must be a power of two (the engine's page size), not {block_size}.")
    if gpu_memory_utilization is not None and not (isinstance(gpu_memory_utilization, (int, float))
                                                   and 0 < gpu_memory_utilization <= 1):
        raise OptionError("gpu_memory_utilization", "{option} is the fraction of HBM the engine may use: a number "
                                                    f"above 0 and at most 1, not {gpu_memory_utilization!r}.")
    parsed = options.tpu_slices(tpu, OptionError, "{option} needs a slice such as v6e-8 (or several: v6e-8,v5p-8).")
    for chosen in parsed:
        if not chosen.explicit:  # slices.parse takes a generation alone as its smallest topology: name the slice
            from tpuprof.slices import NAMING

            naming = NAMING[chosen.generation]
            sizes = ", ".join(f"{naming.prefix}-{naming.count(c)}" for c in naming.chip_counts[:3])
            raise OptionError("tpu", f"{{option}} {chosen.name} names a TPU generation, not a slice: give the slice "
                                     f"to plan, such as {sizes} (or a topology such as {chosen.topology}).")
        if not chosen.target.pallas_kernels:  # every engine here runs the ragged paged attention kernel
            raise OptionError("tpu", f"{{option}} {chosen.name}: the engines' ragged paged attention kernel does not "
                                     f"compile for {chosen.generation} (Mosaic, the Pallas TPU compiler, refuses its "
                                     "tiles there): serve on v4 or newer.")
        if tensor_parallel_size is not None and chosen.devices % tensor_parallel_size:
            raise OptionError("tensor_parallel_size", f"{{option}} {tensor_parallel_size} does not divide the "
                                                      f"{chosen.devices} devices of {chosen.name}.")
    config, source = model
    limit = config.max_position_embeddings
    if max_model_len is not None and limit and max_model_len > limit:
        raise OptionError("max_model_len", f"{{option}} {max_model_len} is beyond the {limit} positions "
                                           f"{config.name} was trained for (max_position_embeddings).")
    if max_model_len is None and not limit:
        raise OptionError("max_model_len", f"{config.name}'s config gives no max_position_embeddings: give {{option}}.")
    length = max_model_len or limit
    if input_len is not None and output_len is not None and input_len + output_len > length:
        raise OptionError("input_len", f"{{option}} {input_len} plus {{output_len}} {output_len} exceed the max "
                                       f"model length {length}.")
    if input_len is not None and output_len is None and input_len >= length:
        raise OptionError("input_len", f"{{option}} {input_len} leaves no tokens to generate within the max model "
                                       f"length {length}.")
    input_len = input_len or min(DEFAULT_INPUT_LEN, length // 2)
    output_len = output_len or min(DEFAULT_OUTPUT_LEN, length - input_len)
    if input_len + output_len > length:
        raise OptionError("input_len", f"{{option}} {input_len} plus {{output_len}} {output_len} exceed the max "
                                       f"model length {length}.")
    if config.mla and engine == "jetstream":
        raise OptionError("engine", f"{{option}} jetstream: tpuprof does not model how MaxText's JetStream engine "
                                    f"caches {config.name}'s multi-head latent attention (MLA); use --engine vllm or "
                                    "sglang-jax, whose MLA caches it sizes.")
    if (config.global_head_dim or config.global_kv_heads) and engine != "vllm":
        raise OptionError("engine", f"{{option}} {engine}: {config.name}'s full-attention layers have their own head "
                                    f"size and key/value heads (Gemma 4), {GEMMA4_ELSEWHERE[engine]}, whose cache "
                                    "tpuprof has not modelled; use --engine vllm, whose cache of it tpuprof sizes.")
    if checkpoint is not None and checkpoint not in CHECKPOINT_FORMATS:
        raise OptionError("model", f"{{option}}: {config.name}'s checkpoint stores its weights as {checkpoint} (the "
                                   "quantization_config of its config), which tpuprof does not model (bf16, fp8 or "
                                   "int8 weights, MXFP4 experts on vLLM TPU): counted as bf16, its weights per device "
                                   "would be several times too large.")
    if checkpoint == "mxfp4" and engine != "vllm":
        why = ("SGLang-JAX has no GPT-OSS model (python/sgl_jax/srt/models @ cddbf6f1)" if engine == "sglang-jax"
               else "tpuprof has not read how MaxText stores MXFP4 experts")
        raise OptionError("engine", f"{{option}} {engine}: {config.name}'s experts are MXFP4 and {why}; use --engine "
                                    "vllm, whose storage of them tpuprof sizes.")
    family = config.model_type.removesuffix("_text")
    if engine == "sglang-jax" and family in SGLANG_JAX_WITHOUT_MODEL:
        raise OptionError("engine", f"{{option}} sglang-jax: SGLang-JAX has no {SGLANG_JAX_WITHOUT_MODEL[family]} "
                                    "model (python/sgl_jax/srt/models @ cddbf6f1), so how it would cache "
                                    f"{config.name}'s sliding-window or chunked layers is not known; use --engine vllm "
                                    "or jetstream.")
    if checkpoint is not None and quantization not in ("bf16", checkpoint):
        raise OptionError("quantization", f"{{option}} {quantization}: {config.name}'s checkpoint stores its weights "
                                          f"as {checkpoint} already (the quantization_config of its config).")
    if checkpoint is not None:  # the engines load the stored format; no flag is needed or taken
        quantization = checkpoint
    if enable_expert_parallel and not config.moe:
        raise OptionError("enable_expert_parallel", f"{{option}}: {config.name} has no experts.")
    overrides = options.price_overrides(prices, OptionError)
    not_compiled = None
    if compile and (config.mla or checkpoint == "mxfp4"):
        not_compiled = (f"{config.name} is sized from its shapes, not compiled: tpuprof's serving step builds "
                        + ("grouped-query attention, not the engines' multi-head latent attention kernel"
                           if config.mla else "bf16, fp8 or int8 experts, not tpu-inference's fp4 experts with "
                                              "their block scales")
                        + ", so a compile would size programs the engine does not run.")
    return ServeOptions(config, source, parsed, engine, max_model_len, max_num_seqs, max_num_batched_tokens,
                        tensor_parallel_size, bool(enable_expert_parallel), kv_cache_dtype, quantization,
                        None if gpu_memory_utilization is None else float(gpu_memory_utilization), block_size,
                        input_len, output_len, concurrency, overrides, bool(compile) and not_compiled is None,
                        checkpoint is not None, not_compiled, architecture, hub_id)


# --- results -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineRules:
    """An engine's sizing rules and the version of its code they were read from."""

    name: str  # vllm | sglang-jax | jetstream
    version: str  # the release or commit the rules follow
    source: str  # where in the engine's code they are
    option_names: Mapping  # tpuprof field -> the engine's own flag (for the command line to paste)


@dataclass(frozen=True)
class KvWindow:
    """The layers that attend within a window of tokens (sliding window, Llama 4's chunks) and how the engine caches
    them."""

    layers: int  # layers attending within the window
    window: int  # tokens: the sliding window or the chunk
    kind: str  # "sliding" | "chunked"
    kept: bool  # the engine holds only the window's pages of these layers (False: every token, as full attention)
    rule: str  # what the engine does with them, and where in its code
    # vLLM's hybrid KV cache manager: the layers are cut into KV cache groups of group_size layers of one kind
    # (padding the last group of a kind); a block is one page of every layer of a group, one block pool for all.
    group_size: int = 0
    full_groups: int = 0
    window_groups: int = 0
    # SGLang-JAX's SWA pool holds this fraction of the full pool's tokens (--swa-full-tokens-ratio).
    swa_full_tokens_ratio: float = 0.0


@dataclass(frozen=True)
class KvLayerKind:
    """The cache of one kind of layer where the kinds differ in head size or key/value heads (Gemma 4's full-attention
    layers: heads of 512 and their own, fewer, key/value heads), each kind laid out by the engine's rule."""

    attention: str  # "sliding" | "full"
    layers: int
    head_dim: int  # the model's
    padded_head_dim: int  # as the engine stores it
    kv_heads: int  # the model's
    kv_heads_per_device: int
    replicated: bool
    cache_slots: int  # K and V heads per device as stored (the keys stored apart from the values even where equal)
    page_bytes_per_layer: int  # one page of one layer of this kind on one device


@dataclass(frozen=True)
class KvLayout:
    """How one token's K and V sit in one device's cache, by the engine's rules. Where the layers differ in head
    size or key/value heads (`kinds`), the top-level head, slot and page fields are the first kind's."""

    head_dim: int  # the model's
    padded_head_dim: int  # as the engine stores it
    kv_heads: int  # the model's
    kv_heads_per_device: int  # after tensor parallelism (replicated up to TP when fewer)
    replicated: bool  # TP exceeds the KV heads: each device holds a copy of one
    packing: int  # values per 32-bit word of the KV dtype (bf16 2, fp8 4): combined heads pad to it
    cache_slots: int  # K and V heads per device as stored (2 x heads, padded to the packing)
    dtype: str  # bf16 | fp8
    dtype_bytes: int
    page_size: int  # tokens per page (block size)
    page_size_rule: str  # how the page size was chosen
    page_bytes_per_layer: int  # one page of one layer on one device
    layers: int
    # What one more token of a request adds to one device's cache: every layer, or with window.kept the layers the
    # engine keeps every token of (the window layers hold a bounded number per request); with page_shards > 1
    # averaged over the devices holding pages.
    kv_bytes_per_token_per_device: int
    # Multi-head latent attention (MLA): the latent dimensions stored per token and layer (kv_lora_rank and the RoPE
    # key, each padded to 128); 0 for K/V heads.
    latent_dim: int = 0
    # Devices the pages are split over, each holding whole pages of its own requests (vLLM TPU's attention data
    # parallelism for MLA); 1: every device holds a part of every page.
    page_shards: int = 1
    layout_rule: str = ""  # how the engine lays out one token's cache, and where in its code
    window: KvWindow | None = None  # sliding-window or chunked layers (None: every layer attends to every token)
    kinds: tuple[KvLayerKind, ...] = ()  # the layers' own layouts where they differ (empty: one layout for all)

    @property
    def page_bytes(self) -> int:
        """One page of every layer on one device."""
        if self.kinds:
            return sum(kind.page_bytes_per_layer * kind.layers for kind in self.kinds)
        return self.page_bytes_per_layer * self.layers

    @property
    def kv_bytes_per_token_on_its_device(self) -> int:
        """All layers of one token on the device that holds it (a page's bytes over its tokens)."""
        return self.page_bytes // self.page_size


@dataclass(frozen=True)
class Capacity:
    """The KV cache the engine allocates at a utilization, per device, and what it holds."""

    bytes_limit: int  # what the runtime lets one device use
    gpu_memory_utilization: float
    weights_bytes_per_device: int
    state_bytes_per_device: int  # besides the weights, in use before the cache is sized
    kv_budget_bytes_per_device: int  # limit x u - weights - state (negative: nothing left)
    pages: int
    tokens: int
    max_concurrency: float  # requests of max_model_len tokens at once
    largest_max_model_len: int  # for the requested concurrency (0: not even one page each)
    window_tokens: int = 0  # SGLang-JAX's SWA pool for the sliding layers (0: no such pool)
    how: str = ""  # how the pages, tokens and concurrency follow from the budget, by the engine's rule


@dataclass(frozen=True)
class ProgramRecord:
    """One program the engine compiles at start-up, as tpuprof compiled it for one device."""

    kind: str  # backbone | logits
    tokens: int  # the token padding (backbone)
    requests: int  # the request padding (logits) or the metadata's width (backbone)
    temp_bytes: int | None  # the compiler's, for the program with every layer (None: refused)
    code_bytes: int | None
    how: str  # "compiled whole (80 layers)", "compiled", "refused by the compiler"
    failure_space: str | None = None  # "smem" / "vmem" / "hbm": the compiler refused it
    failure: str | None = None  # the compiler's sentence
    fix: str | None = None  # the setting that avoids it
    compiled_layers: tuple = ()
    seconds: float = 0.0  # compile time here (0 when cached)
    cached: bool = False

    @property
    def reserve_bytes(self) -> int:
        """What the runtime reserves to load it: temporaries + code (XLA error 0101)."""
        return (self.temp_bytes or 0) + (self.code_bytes or 0)


@dataclass(frozen=True)
class ProgramSet:
    """The programs the engine compiles at start-up and what tpuprof compiled of them."""

    token_paddings: tuple
    request_paddings: tuple
    engine_count: int  # how many programs the engine compiles (its helpers included)
    engine_count_rule: str
    records: tuple  # ProgramRecord, compiled by tpuprof
    weights_bytes_per_device: int | None  # compiled argument bytes of the weights (None without a compile)
    weights_how: str
    kv_page_bytes_per_layer: int | None  # the compiled cache's bytes per page and layer (aliased arguments)

    @property
    def largest(self) -> ProgramRecord | None:
        ok = [r for r in self.records if r.failure is None and r.temp_bytes is not None]
        return max(ok, key=lambda r: r.reserve_bytes) if ok else None

    @property
    def failures(self) -> list:
        return [r for r in self.records if r.failure is not None]

    @property
    def largest_temp_bytes(self) -> int:
        return max((r.temp_bytes or 0 for r in self.records if r.failure is None), default=0)

    @property
    def all_code_bytes(self) -> int:
        """The code of every program compiled: loaded programs keep it resident, side by side."""
        return sum(r.code_bytes or 0 for r in self.records if r.failure is None)


@dataclass(frozen=True)
class Band:
    point: float
    low: float
    high: float


@dataclass(frozen=True)
class ServeEstimate:
    """Speed and cost at the workload, per engine replica and per chip."""

    concurrency: int  # requests decoded together
    context_tokens: float  # mean context a decode step attends over
    decode_step_ms: Band
    prefill_ms: Band  # one request's input_len tokens, in chunks of max_num_batched_tokens
    tpot_ms: Band
    ttft_ms: float
    output_tokens_per_s: float  # whole slice (every replica)
    output_tokens_per_s_per_chip: float
    cost_per_million_output_tokens: float | None
    price_usd_per_chip_hour: float | None
    price_source: str | None
    bound: str  # what sets the decode step: "hbm", "compute" or "ici"
    decode_breakdown_ms: Mapping  # hbm, compute, ici (per step)
    how: str


@dataclass(frozen=True)
class ServeTarget:
    """One slice's answer."""

    slice: Any  # tpuprof.slices.Slice
    engine: EngineRules
    tensor_parallel_size: int
    replicas: int  # engine copies over the slice's devices (devices / TP)
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv: KvLayout
    capacity: Capacity  # at the utilization used
    utilization_given: bool  # the user set --gpu-memory-utilization
    safe_gpu_memory_utilization: float | None  # 1 - (largest temp + all code + margin) / limit
    margin_bytes: int
    programs: ProgramSet | None
    fits: bool
    verdict: str
    problems: tuple = ()  # sentences: what stops it, each with the setting that avoids it
    estimate: ServeEstimate | None = None
    # Requests per engine: asked (--concurrency's share, None when not given), planned (decoded together: the speed
    # and cost are for them), held (what the KV cache holds at input + output tokens each), and the sentence saying
    # why planned is below asked (None when it is not).
    concurrency_asked: int | None = None
    concurrency_planned: int = 0
    requests_held: int = 0
    concurrency_note: str | None = None
    command: str = ""  # the engine's launch command, ready to paste
    smem_page_table_bytes: int = 0
    smem_limit_bytes: int = 0
    headroom_bytes: int | None = None  # below the KV cache: largest temp + all code + margin (None: not compiled)
    weights_how: str = ""  # how the weights per device were obtained


@dataclass
class ServeAnswer:
    """Everything `tpuprof serve` answers, in the order of the slices given (the document ranks them)."""

    options: ServeOptions
    targets: list
