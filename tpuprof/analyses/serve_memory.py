"""How a serving engine sizes its KV cache on TPU, and which programs it compiles: the engines' own rules, each keyed
to the engine version it was read from (the one place tpuprof knows them). Pure functions on typed inputs.

vLLM TPU = vllm-project/tpu-inference 0.32.0 (see ../shared/reference/serving-facts.md for line numbers):
- KV cache shape, RPA v3 `get_kv_cache_shape`: `(pages, page_size, align(2 x kv_heads_per_device, packing) / packing,
  packing, padded head_dim)`, packing = 32 / dtype bits (bf16 2, fp8 4); `get_padded_head_dim`: head_dim 64 stays,
  others round up to 128; `get_num_kv_heads_by_tp`: KV heads are replicated up to TP when TP exceeds them.
  head_dim 64 has its own kernel and layout (`runner/kv_cache.get_kv_cache_shape_with_mesh` -> RPA v3
  `kernel_hd64.get_kv_cache_shape`): `(pages, page_size, align(kv_heads_per_device, packing) / packing, packing,
  128)`, each head's K and V side by side in 128 lanes: the heads, not the K/V slots, pad to the packing.
- page size, `flash_attn.get_page_size`: 16 when max_model_len > 8192, else next_pow2(max_model_len) / 16 clamped
  to [16, 256]; `--block-size` overrides it. SMEM: the int32 page table `[max_num_seqs, ceil(L / page)]` must fit
  half of the 1 MiB SMEM (`get_min_page_size`, `get_max_num_seqs`).
- budget, `tpu_worker.determine_available_memory`: bytes_limit x gpu_memory_utilization - bytes in use (the weights)
  after the weights load, before any compile; no profiling run. `num_blocks = avail // (layers x page bytes)`.
- layers of different head sizes or KV heads (Gemma 4's full-attention layers): each layer its own pages of its own
  layout, one block count for all (KINDS_SOURCE below).
- buckets: token paddings double from 16 to max_num_batched_tokens (`runner/utils.get_token_paddings`), request
  paddings from 8 (`MIN_NUM_SEQS`) to max_num_seqs.
vLLM TPU with multi-head latent attention (DeepSeek; read at tpu-inference commit b8692ff0 of 2026-08-22, the
snapshot whose line numbers ../shared/reference/serving-facts.md gives; the v0.27.0 release branch has the same):
- one latent per token and layer, no heads: `runner/kv_cache_manager.get_kv_cache_spec` pads kv_lora_rank and the
  RoPE key to 128 each (512 + 64 -> 640 for DeepSeek), `kernels/mla/v2/kernel.get_kv_cache_shape` stores
  `(pages, align(page_size, 32) / 32, 32, align128(latent))` (MLA_KV_PACKING_SIZE 32: pages hold a multiple of 32
  tokens, in bf16 and fp8 alike), the page 1024 tokens unless --block-size (`flash_attn_mla.get_page_size`);
- `platforms/tpu_platform.check_and_update_config` refuses an MLA model without NEW_MODEL_DESIGN=1 and
  `enable_dp_attention`; then `ShardingConfigManager.from_vllm_config` turns the TP degree into attention data
  parallelism (one latent "head" fills a device's cache row: attn_dp = TP, the model axis 1), so
  `runner/kv_cache.create_kv_caches` splits the pages over the TP devices (PartitionSpec(BATCH, KV_CONTEXT)) and
  `core/sched/dp_scheduler` gives each device num_blocks / TP of them and its own --max-num-seqs requests: a token's
  latent is on one device, not split and not copied. The attention weights, the dense MLPs and the shared experts
  are sharded over ATTN_HEAD (the model axis, 1) and so held whole on every device; the routed experts, the
  embedding and the LM head over every device (`models/jax/deepseek_v3.py`).
vLLM TPU with GPT-OSS's MXFP4 experts (`layers/vllm/quantization/mxfp4.py`, `layers/common/process_weights/
moe_weights.quantize_moe_weights`, b8692ff0): the checkpoint's MXFP4 (blocks of 32) is dequantized and requantized to
float4_e2m1fn in blocks of MXFP4_REQUANTIZED_BLOCK_SIZE = 512 along each matmul's contracting dimension, which is
padded to a multiple of 512 (GPT-OSS's 2880 -> 3072, hidden and expert width alike), with one float32 scale per
block and float32 biases; attention, router, embedding and LM head stay bf16. libtpu 0.0.42.1 stores float4_e2m1fn at
half a byte a value (an fp4 [128, 3072, 3072] argument: 603,979,776 B, compiled for v6e).
SGLang-JAX (`model_runner_kv_cache_mixin.py` @ cddbf6f1): per token `kv_heads_per_device x align128(head_dim) x 2 x
layers x bytes`, no page packing; budget `available - total x (1 - mem_fraction_static)`. MLA
(`_compute_cell_size`, `mem_cache/memory_pool.MLATokenToKVPool`): `align128(kv_lora_rank) + align128(rope)` per token
and layer, pages padded to the dtype's packing, the cache replicated on every TP device (pages split by DP only).
JetStream / MaxText (`src/maxtext/inference/kvcache.py` @ e591f30c, MAXTEXT_COMMIT: the snapshot the launch line is
read from too): a contiguous cache per slot, `batch x max_target_length` tokens preallocated, heads over the tensor
axis.
Sliding-window and chunked layers (kv_window): vLLM TPU keeps them to their window through vLLM's hybrid KV cache
manager where it runs vLLM's model code, and caches them in full where it runs its own JAX model; SGLang-JAX keeps
Gemma 2's in an SWA pool; MaxText caches every layer in full (the sources are named at the rules below).
"""

from __future__ import annotations

import json
import math

from tpuprof.models.serve import Capacity, EngineRules, KvLayout, KvWindow

MiB = 1 << 20
SMEM_BYTES = 1 * MiB  # per core on v4 and later (jax _src/pallas/mosaic/tpu_info.py)
SMEM_PAGE_TABLE_SHARE = 2  # vLLM keeps the page table within half of SMEM (get_min_page_size)
# JAX's ragged paged attention kernel (the one tpuprof compiles) takes the page table as a 2D int32 scalar prefetch,
# which Mosaic lays out in SMEM with each request's row padded to 128 entries: [4096, 16] took 2 MiB (libtpu
# 0.0.42.1, v5e). vLLM's tpu-inference kernel keeps the table flat, as vLLM's rule counts it.
SMEM_ROW_ENTRIES = 128
# vLLM TPU's utilization when --gpu-memory-utilization is not given: 0.92 of the limit in public start-up logs
# (tests/fixtures/serving: "total_hbm_limit_cap_gb=14.49GiB" of 15.75 on v5e, 28.74 of 31.24 on v6e).
DEFAULT_UTILIZATION = 0.92
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default for `vllm serve`
# `vllm serve`'s max_num_batched_tokens on TPU, on every generation. vLLM's arg_utils has a TPU row (V6E 1024, V5E
# 512, V5P 256 for the API server) that it takes only where current_platform.get_device_name() is "V6E", "V5E" or
# "V5P", and tpu-inference's TpuPlatform.get_device_name (b8692ff0) returns "TPU V6E" (its own fp8_dtype compares
# with "tpu v6e"): no TPU matches, and the defaults are those of a device whose memory vLLM cannot read
# (TpuPlatform.get_device_total_memory raises NotImplementedError): 2048 for the API server, 8192 for the LLM class,
# max_num_seqs 256. The Keras guide's log shows it: the LLM class on v5e-1, vLLM 0.26.0, "max_num_batched_tokens=8192"
# where the V5E row gives 1024 (tests/fixtures/serving/keras_io_gemma3_1b_v5e1_tp1.txt).
VLLM_MAX_NUM_BATCHED_TOKENS = 2048
# SGLang-JAX's --chunked-prefill-size when not given (server_args.py @ cddbf6f1), on every generation.
SGLANG_JAX_CHUNKED_PREFILL_SIZE = 4096
# The MaxText snapshot every JetStream rule is read from: the cache (inference/kvcache.py, layers/attentions.py) and
# the server, flags and model names of the launch line (serve_plan.launch_command). The cache shapes are the same as
# at 01739beb (2025-09), which the rules were first read from.
MAXTEXT_COMMIT = "e591f30c"
MIN_TOKEN_BUCKET = 16  # tpu_inference envs.py MIN_TOKEN_BUCKET
MIN_NUM_SEQS = 8  # tpu_runner.py MIN_NUM_SEQS

ENGINES = {
    "vllm": EngineRules(
        "vllm", "tpu-inference 0.32.0",
        "vllm-project/tpu-inference: runner/kv_cache.py get_attention_page_size_bytes, kernels/ragged_paged_attention/"
        "v3/kernel.py get_kv_cache_shape, utils.py get_padded_head_dim/get_num_kv_heads_by_tp, layers/vllm/backends/"
        "flash_attn.py get_page_size/get_min_page_size, worker/tpu_worker.py determine_available_memory, "
        "runner/compilation_manager.py capture_model",
        {"tensor_parallel_size": "--tensor-parallel-size", "max_model_len": "--max-model-len",
         "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
         "gpu_memory_utilization": "--gpu-memory-utilization", "kv_cache_dtype": "--kv-cache-dtype",
         "block_size": "--block-size", "quantization": "--quantization",
         "enable_expert_parallel": "--enable-expert-parallel"}),
    "sglang-jax": EngineRules(
        "sglang-jax", "sgl-project/sglang-jax cddbf6f1",
        "python/sgl_jax/srt/model_executor/model_runner_kv_cache_mixin.py (_compute_cell_size, "
        "_profile_available_bytes)",
        {"tensor_parallel_size": "--tp-size", "max_model_len": "--context-length",
         "max_num_seqs": "--max-running-requests", "max_num_batched_tokens": "--chunked-prefill-size",
         "gpu_memory_utilization": "--mem-fraction-static", "kv_cache_dtype": "--kv-cache-dtype",
         "block_size": "--page-size", "quantization": "--quantization"}),
    "jetstream": EngineRules(
        "jetstream", f"AI-Hypercomputer/maxtext {MAXTEXT_COMMIT}",
        "src/maxtext/inference/kvcache.py (contiguous prefill + AR cache per slot)",
        {"tensor_parallel_size": "ici_tensor_parallelism", "max_model_len": "max_target_length",
         "max_num_seqs": "per_device_batch_size", "quantization": "quantization",
         "kv_cache_dtype": "quantize_kvcache"}),
}

DTYPE_BYTES = {"bf16": 2, "fp8": 1}
MLA_PAGE_SIZE = 1024  # tpu-inference flash_attn_mla.PallasMLAttentionBackend.get_page_size
MLA_KV_PACKING = 32  # tpu-inference envs.MLA_KV_PACKING_SIZE: tokens per packed row of the MLA cache
MLA_SOURCE = ("tpu-inference b8692ff0: runner/kv_cache_manager.py get_kv_cache_spec, kernels/mla/v2/"
              "kernel.py get_kv_cache_shape, layers/common/sharding.py (enable_dp_attention), core/sched/"
              "dp_scheduler.py")
MXFP4_BLOCK = 512  # tpu-inference MXFP4_REQUANTIZED_BLOCK_SIZE: fp4 values per float32 scale


def kv_dtype(kv_cache_dtype: str) -> str:
    """--kv-cache-dtype auto is the model's dtype (bf16 here); fp8, fp8_e4m3 and fp8_e5m2 store one byte a value."""
    return "fp8" if kv_cache_dtype.startswith("fp8") else "bf16"


def padded_head_dim(head_dim: int, engine: str) -> int:
    """vLLM: 64 stays (it has its own kernel), anything else rounds up to 128; SGLang-JAX: align 128; MaxText keeps
    the model's (the TPU tile pads the minor dimension to 128 in memory)."""
    if engine == "vllm" and head_dim == 64:
        return 64
    return -(-head_dim // 128) * 128


def kv_heads_per_device(kv_heads: int, tp: int) -> tuple[int, bool]:
    """(heads per device, replicated): replicated up to TP when TP exceeds the model's KV heads."""
    if tp > kv_heads:
        return 1, True
    return kv_heads // tp, False


def min_page_size(max_model_len: int, max_num_seqs: int) -> int:
    """vLLM get_min_page_size: the smallest power-of-two page whose page table fits half of SMEM."""
    pages_per_request = SMEM_BYTES // SMEM_PAGE_TABLE_SHARE // max_num_seqs // 4
    least = -(-max_model_len // max(pages_per_request, 1))
    return 1 << (least - 1).bit_length()


def page_size(max_model_len: int, block_size: int | None, engine: str, max_num_seqs: int = 1) -> tuple[int, str]:
    """(tokens per page, how it was chosen). vLLM raises any page size (--block-size included) to get_min_page_size
    ("Increase the page size ... to make sure there's no SMEM OOM", its TPU platform's check_and_update_config)."""
    if engine == "vllm":
        if block_size is not None:
            size, rule = block_size, "--block-size"
        elif max_model_len > 8192:
            size, rule = 16, "vLLM get_page_size: 16 when max_model_len > 8192"
        else:
            size = max(min(max(1 << (max_model_len - 1).bit_length(), 16 * 16) // 16, 256), 16)
            rule = "vLLM get_page_size: next_pow2(max_model_len)/16 within [16, 256]"
        least = min_page_size(max_model_len, max_num_seqs)
        if least > size:
            return least, (f"{rule} ({size}), raised by vLLM to get_min_page_size {least} so that the page table of "
                           f"{max_num_seqs} requests fits half of SMEM")
        return size, rule
    if block_size is not None:
        return block_size, "--block-size"
    if engine == "sglang-jax":
        return 128, "SGLang-JAX recipes' --page-size 128"
    return 1, "MaxText: contiguous per-slot cache (no pages)"


def mla_latent_dim(config) -> int:
    """The latent one MLA token stores per layer: kv_lora_rank and the RoPE key, each padded to 128 (vLLM TPU and
    SGLang-JAX alike)."""
    return -(-config.kv_lora_rank // 128) * 128 + -(-config.qk_rope_head_dim // 128) * 128


def kv_layout(config, engine: str, tp: int, kv_cache_dtype: str, max_model_len: int,
              block_size: int | None, max_num_seqs: int = 1, architecture: str | None = None) -> KvLayout:
    """ARCHITECTURE: the config's architectures[0], which picks the engine's model code (and so whether it keeps
    only the window of sliding-window layers); None: told by the config's model_type."""
    dtype = kv_dtype(kv_cache_dtype)
    if config.mla:
        return _mla_layout(config, engine, tp, dtype, block_size)
    packing = 32 // (8 * DTYPE_BYTES[dtype]) if engine == "vllm" else 1
    hd, per_device, replicated, slots = _heads_layout(config.num_key_value_heads, config.head_dim, engine, tp, packing)
    page, rule = page_size(max_model_len, block_size, engine, max_num_seqs)
    page_bytes = page * slots * hd * DTYPE_BYTES[dtype]
    layers = config.num_hidden_layers
    if engine == "vllm" and (config.global_head_dim or config.global_kv_heads):
        return _vllm_kinds_layout(config, tp, dtype, packing, page, rule)
    window = kv_window(config, engine, architecture)
    # With the window layers' pages bounded per request, a token adds a page's share of the layers that keep every
    # token: vLLM's full-attention groups (padding layers included). SGLang-JAX sizes its cell over every layer.
    kept = window.full_groups * window.group_size if window and window.kept and engine == "vllm" else layers
    return KvLayout(config.head_dim, hd, config.num_key_value_heads, per_device, replicated, packing, slots, dtype,
                    DTYPE_BYTES[dtype], page, rule, page_bytes, layers, page_bytes * kept // page, window=window)


def _heads_layout(kv_heads: int, head_dim: int, engine: str, tp: int, packing: int) -> tuple[int, int, bool, int]:
    """(head_dim as stored, KV heads per device, replicated, cache slots per device) of layers of KV_HEADS heads of
    HEAD_DIM."""
    hd = padded_head_dim(head_dim, engine)
    per_device, replicated = kv_heads_per_device(kv_heads, tp)
    if engine == "vllm" and hd == 64:  # K|V of a head in 128 lanes, heads padded to the packing (kernel_hd64)
        slots = 2 * (-(-per_device // packing) * packing)
    else:
        slots = -(-2 * per_device // packing) * packing
    return hd, per_device, replicated, slots


# tpu-inference b8692ff0 runner/kv_cache_manager.py get_kv_cache_spec (the JAX-model path: Gemma 4 runs its JAX model,
# models/jax/gemma4.py) gives each layer a FullAttentionSpec of its own head size and key/value heads
# (utils.get_layer_kv_params: global_head_dim and, with attention_k_eq_v, num_global_key_value_heads on the
# full-attention layers), each padded as any layer's (get_padded_num_heads, get_padded_head_dim), page_size_padded
# its RPA v3 page (runner/kv_cache.py get_attention_page_size_bytes). Every spec being a FullAttentionSpec of one
# block size, vLLM 001cabc1 (v1/kv_cache_interface.py UniformTypeKVCacheSpecs.is_uniform_type) puts all layers in
# one KV cache group whose page is the sum of the layers' pages; get_kv_cache_config_from_groups gives num_blocks =
# available // that sum and each layer a tensor of num_blocks of its own pages, which initialize_kv_cache allocates
# as one array per layer of its own shape. Keys equal to values (attention_k_eq_v) are still stored twice: the model
# writes k and v (v = the unnormed projection, RMS-normed without a scale; k normed and roped) into 2 x heads slots.
KINDS_SOURCE = ("tpu-inference b8692ff0 runner/kv_cache_manager.py get_kv_cache_spec (a FullAttentionSpec per layer, "
                "its heads and head size from utils.get_layer_kv_params) and initialize_kv_cache (one array per "
                "layer), models/jax/gemma4.py (K and V both written when the keys are the values); vllm-project/vllm "
                "001cabc1 v1/kv_cache_interface.py UniformTypeKVCacheSpecs (one group, its page the sum of the "
                "layers'), v1/core/kv_cache_utils.py get_kv_cache_config_from_groups (num_blocks = available // that "
                "sum, every layer num_blocks pages of its own)")


def layer_kinds_count(config) -> dict[str, int]:
    """Layers by attention kind ("sliding" | "full"; a chunked layer counts as sliding), in the order they come."""
    counts: dict[str, int] = {}
    for kind in config.layer_kinds():
        attention = "full" if kind.split("+")[0] == "full" else "sliding"
        counts[attention] = counts.get(attention, 0) + 1
    return counts


def _vllm_kinds_layout(config, tp: int, dtype: str, packing: int, page: int, rule: str) -> KvLayout:
    """Layers whose kinds differ in head size or key/value heads (Gemma 4), as vLLM TPU caches them: each layer its
    own pages of its own layout, one block count for all (KINDS_SOURCE). Every layer keeps every token: tpu-inference
    runs Gemma 4 as its JAX model, whose sliding layers are cached in full."""
    from tpuprof.models.serve import KvLayerKind

    width = DTYPE_BYTES[dtype]
    kinds = []
    for attention, layers in layer_kinds_count(config).items():
        heads, head_dim = config.attention_shape(attention)
        hd, per_device, replicated, slots = _heads_layout(heads, head_dim, "vllm", tp, packing)
        kinds.append(KvLayerKind(attention, layers, head_dim, hd, heads, per_device, replicated, slots,
                                 page * slots * hd * width))
    first = kinds[0]
    per_token = sum(k.page_bytes_per_layer * k.layers for k in kinds) // page
    how = (f"each layer its own pages of its own layout, one block count for all: num_blocks = budget // the sum of "
           f"every layer's page ({per_token * page:,} B): {KINDS_SOURCE}")
    sliding, span, kind = window_layers(config)
    window = KvWindow(sliding, span, kind, False,
                      f"{sliding} {kind} layers (window of {span} tokens) cached in full, as full attention: "
                      "tpu-inference gives every layer of its JAX model a FullAttentionSpec, and on vLLM's model code "
                      "drops the window where the layers' padded head sizes differ (tpu-inference b8692ff0 "
                      "runner/kv_cache_manager.py get_kv_cache_spec, disable_sliding_window)") if sliding else None
    return KvLayout(first.head_dim, first.padded_head_dim, first.kv_heads, first.kv_heads_per_device, first.replicated,
                    packing, first.cache_slots, dtype, width, page, rule, first.page_bytes_per_layer,
                    config.num_hidden_layers, per_token, layout_rule=how, window=window, kinds=tuple(kinds))


def _mla_layout(config, engine: str, tp: int, dtype: str, block_size: int | None) -> KvLayout:
    """One latent per token and layer (no KV heads): on vLLM TPU pages of align(page, 32) tokens split over the TP
    devices by attention data parallelism, on SGLang-JAX pages padded to the dtype's packing, copied on every TP
    device."""
    latent, width = mla_latent_dim(config), DTYPE_BYTES[dtype]
    layers = config.num_hidden_layers
    if engine == "vllm":
        page, rule = (block_size, "--block-size") if block_size else (
            MLA_PAGE_SIZE, f"vLLM TPU's MLA page, {MLA_PAGE_SIZE} tokens (flash_attn_mla.get_page_size)")
        packing, shards = MLA_KV_PACKING, tp
        how = (f"one latent of {latent} dims per token and layer (kv_lora_rank {config.kv_lora_rank} and RoPE "
               f"{config.qk_rope_head_dim}, each padded to 128), pages of a multiple of {packing} tokens, the pages "
               f"split over the {tp} TP devices by attention data parallelism (each device holds its own requests' "
               f"tokens, --max-num-seqs of them): {MLA_SOURCE}")
    else:
        page, rule = page_size(0, block_size, engine)
        packing, shards = 32 // (8 * width), 1
        how = (f"one latent of {latent} dims per token and layer (kv_lora_rank {config.kv_lora_rank} and RoPE "
               f"{config.qk_rope_head_dim}, each padded to 128), pages padded to {packing} tokens, the cache copied "
               "on every TP device: sglang-jax cddbf6f1 model_runner_kv_cache_mixin.py _compute_cell_size, "
               "mem_cache/memory_pool.py MLATokenToKVPool")
    page_bytes = -(-page // packing) * packing * latent * width
    return KvLayout(latent, latent, 1, 1, shards == 1 and tp > 1, packing, 1, dtype, width, page, rule, page_bytes,
                    layers, page_bytes * layers // page // shards, latent_dim=latent, page_shards=shards,
                    layout_rule=how)


# --- layers attending within a window (sliding window, Llama 4's chunks) ------------------------------------------
# tpu-inference b8692ff0, models/common/model_loader.py: an architecture in its JAX registry (_MODEL_REGISTRY) runs
# its JAX model unless _VLLM_PREFERRED_ARCHITECTURES names it; any other falls back to vLLM's own model code.
# runner/kv_cache_manager.py get_kv_cache_spec gives each layer of a JAX model a FullAttentionSpec ("TODO(kwang3939):
# Re-enable sliding_window"), and each sliding layer of vLLM's model code a SlidingWindowSpec (unless the layers'
# padded head sizes differ). KerasHub registers its KerasHubForCausalLM with that JAX registry (register_model).
TPU_INFERENCE_JAX_ARCHITECTURES = frozenset({
    "Llama4ForCausalLM", "DeepseekV3ForCausalLM", "LlamaForCausalLM", "Llama4ForConditionalGeneration",
    "Qwen3ForCausalLM", "Qwen2_5_VLForConditionalGeneration", "Eagle3LlamaForCausalLM", "Qwen2ForCausalLM",
    "Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "KerasHubForCausalLM"})
TPU_INFERENCE_VLLM_PREFERRED = frozenset({"GptOssForCausalLM", "Qwen3MoeForCausalLM"})
# Without architectures in the config: the model types whose architectures are in that JAX registry.
TPU_INFERENCE_JAX_MODEL_TYPES = frozenset({"llama", "llama4", "llama4_text", "qwen2", "qwen3", "deepseek_v3", "gemma4",
                                           "gemma4_text", "qwen2_5_vl"})
# vLLM counts the tokens a request may have scheduled and not yet processed, whose pages a sliding or chunked layer
# cannot free yet, as max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens (vllm/config/vllm.py
# @ 000fc94b; SlidingWindowSpec and ChunkedLocalAttentionSpec.max_admission_blocks_per_request size the pool and
# admit requests by it; 001cabc1, before it, counted max_num_batched_tokens once). max_concurrent_batches is 2 under
# async scheduling with one pipeline stage, 1 without. Async scheduling is vLLM's default, and the vLLM that
# tpu-inference b8692ff0 is verified with (d626108b, verified_commit_hashes.csv) runs it on the single-host
# executor tpu-inference uses (UniProcExecutor.supports_async_scheduling: tpu-inference issue 3456); tpu-recipes'
# vLLM recipes (Ironwood GPT-OSS, Qwen3-32B; Trillium Llama 3.x) and tpu-inference's benchmark cases pass
# --async-scheduling, as serve's launch command does where the figures rest on it (a window kept).
VLLM_BATCHES_IN_FLIGHT = 2
HYBRID_SOURCE = ("vLLM v1 KV cache manager (vllm-project/vllm 001cabc1: v1/core/kv_cache_utils.py "
                 "_get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups, get_num_blocks, "
                 "get_max_concurrency_for_kv_cache_config; v1/kv_cache_interface.py SlidingWindowSpec, "
                 "ChunkedLocalAttentionSpec max_memory_usage_bytes; 000fc94b: config/vllm.py max_in_flight_tokens), "
                 "tpu-inference b8692ff0 "
                 "platforms/tpu_platform.py support_hybrid_kv_cache (True), runner/kv_cache_manager.py "
                 "initialize_kv_cache (one array of num_blocks pages per group position, shared by the groups)")
# SGLang-JAX cddbf6f1: models with a sliding window it implements (python/sgl_jax/srt/models: gemma2.py; no Gemma 3,
# GPT-OSS or Llama 4 model), and its SWA pool's share of the full pool's tokens (server_args.py swa_full_tokens_ratio).
SGLANG_JAX_WINDOW_MODEL_TYPES = frozenset({"gemma2"})
SGLANG_JAX_SWA_FULL_TOKENS_RATIO = 0.8


def window_layers(config) -> tuple[int, int, str]:
    """(layers attending within a window, the window in tokens, "sliding" | "chunked") from the config's layer
    kinds; (0, 0, "") when every layer attends to every token."""
    kinds = [kind.split("+")[0] for kind in config.layer_kinds()]
    chunked, sliding = kinds.count("chunked"), kinds.count("sliding")
    if chunked and config.attention_chunk_size:
        return chunked, config.attention_chunk_size, "chunked"
    if sliding and config.sliding_window:
        return sliding, config.sliding_window, "sliding"
    return 0, 0, ""


def runs_vllm_model_code(config, architecture: str | None) -> bool:
    """Whether tpu-inference runs vLLM's model code (True: its attention layers carry their sliding windows into
    SlidingWindowSpec) rather than its own JAX model (False: FullAttentionSpec for every layer)."""
    if architecture:
        return architecture in TPU_INFERENCE_VLLM_PREFERRED or architecture not in TPU_INFERENCE_JAX_ARCHITECTURES
    return config.model_type not in TPU_INFERENCE_JAX_MODEL_TYPES


def kv_window(config, engine: str, architecture: str | None = None) -> KvWindow | None:
    """How ENGINE caches the model's sliding-window or chunked layers (None: it has none)."""
    layers, window, kind = window_layers(config)
    if not layers:
        return None
    full = config.num_hidden_layers - layers
    what = f"{layers} {kind} layers ({'window' if kind == 'sliding' else 'chunks'} of {window} tokens)"
    if engine == "vllm":
        if not runs_vllm_model_code(config, architecture):
            return KvWindow(layers, window, kind, False,
                            f"{what} cached in full, as full attention: tpu-inference runs its JAX model of "
                            f"{architecture or config.model_type}, whose every layer gets a FullAttentionSpec "
                            "(tpu-inference b8692ff0 runner/kv_cache_manager.py get_kv_cache_spec; "
                            "models/common/model_loader.py)")
        # vLLM groups the layers by kind into KV cache groups of one size: the fewer kind's count, or the larger
        # one's when it is under 1.5 times the fewer (the last group of a kind padded with empty layers).
        counts = [n for n in (full, layers) if n]
        group = min(counts) if max(counts) >= 1.5 * min(counts) else max(counts)
        full_groups, window_groups = -(-full // group), -(-layers // group)
        held = ("ceil((window - 1 + max_in_flight_tokens) / page) + 1" if kind == "sliding"
                else "ceil((chunk + max_in_flight_tokens) / page)")
        return KvWindow(layers, window, kind, True,
                        f"{what} kept to their window: tpu-inference gives vLLM's {architecture or config.model_type} "
                        f"layers {'SlidingWindowSpec' if kind == 'sliding' else 'ChunkedLocalAttentionSpec'}, and "
                        f"vLLM's hybrid KV cache manager cuts the layers into {full_groups} full-attention and "
                        f"{window_groups} {kind} group(s) of {group} layers sharing one pool of blocks (a block: one "
                        f"page of each layer of a group); a request holds ceil(tokens / page) blocks of each "
                        f"full-attention group and at most {held} of each {kind} group, the most vLLM reserves, "
                        f"max_in_flight_tokens being {VLLM_BATCHES_IN_FLIGHT} x max_num_batched_tokens (vLLM's async "
                        "scheduling, on by default, schedules a step while the one before runs): "
                        f"{HYBRID_SOURCE}",
                        group_size=group, full_groups=full_groups, window_groups=window_groups)
    if engine == "sglang-jax":
        if kind == "sliding" and config.model_type in SGLANG_JAX_WINDOW_MODEL_TYPES:
            return KvWindow(layers, window, kind, True,
                            f"{what}: SGLang-JAX sizes its token capacity over every layer, then splits it into a "
                            f"pool for the {full} full-attention layers and an SWA pool holding "
                            f"{SGLANG_JAX_SWA_FULL_TOKENS_RATIO:g} as many tokens for the {kind} ones "
                            "(--swa-full-tokens-ratio), whose tokens outside the window it frees: sglang-jax cddbf6f1 "
                            "model_executor/model_runner.py set_num_token_hybrid, managers/schedule_batch.py "
                            "maybe_evict_swa",
                            swa_full_tokens_ratio=SGLANG_JAX_SWA_FULL_TOKENS_RATIO)
        return KvWindow(layers, window, kind, False,
                        f"{what} cached in full: SGLang-JAX's {config.model_type} model attends every layer to "
                        "every token (sglang-jax cddbf6f1 python/sgl_jax/srt/models)")
    return KvWindow(layers, window, kind, False,
                    f"{what} cached in full: MaxText gives every layer the same per-slot cache of max_target_length "
                    f"tokens and applies the window as a mask (maxtext {MAXTEXT_COMMIT} inference/kvcache.py KVCache, "
                    "layers/attentions.py init_kv_caches, layers/attention_op.py)")


def window_blocks_per_request(kv: KvLayout, tokens: int, in_flight_tokens: int) -> int:
    """vLLM's reservation for one request of TOKENS in each window group, in pages, with IN_FLIGHT_TOKENS scheduled
    and not yet processed (SlidingWindowSpec / ChunkedLocalAttentionSpec.max_admission_blocks_per_request)."""
    w = kv.window
    if w.kind == "sliding":
        return -(-min(w.window - 1 + in_flight_tokens, tokens) // kv.page_size) + 1
    return -(-min(w.window + in_flight_tokens, tokens) // kv.page_size)


def vllm_in_flight_tokens(max_num_batched_tokens: int) -> int:
    """vLLM's max_in_flight_tokens: VLLM_BATCHES_IN_FLIGHT steps of max_num_batched_tokens."""
    return VLLM_BATCHES_IN_FLIGHT * max_num_batched_tokens


def vllm_blocks_per_request(kv: KvLayout, tokens: int, in_flight_tokens: int) -> int:
    """Blocks of vLLM's shared pool one request of TOKENS takes: every full-attention group's pages plus each window
    group's reservation (get_max_concurrency_for_kv_cache_config)."""
    w = kv.window
    return (w.full_groups * -(-tokens // kv.page_size)
            + w.window_groups * window_blocks_per_request(kv, tokens, in_flight_tokens))


def sglang_swa_pools(kv: KvLayout, tokens: int) -> tuple[int, int]:
    """(full pool, SWA pool) tokens SGLang-JAX makes of the TOKENS its cell size over every layer gives
    (set_num_token_hybrid: full = tokens x layers / (ratio x swa layers + full layers), both page-aligned)."""
    w, page = kv.window, kv.page_size
    full_layers = kv.layers - w.layers
    full = int(tokens * kv.layers / (w.swa_full_tokens_ratio * w.layers + full_layers))
    full -= full % page
    swa = int(full * w.swa_full_tokens_ratio)
    return full, swa - swa % page


def requests_held(kv: KvLayout, cap: Capacity, tokens: int, engine: str) -> int:
    """Requests of TOKENS each the KV cache holds at once while they decode, by the engine's rule: on vLLM's hybrid
    allocator a decoding request keeps one token in flight, so a sliding layer holds at most ceil(window / page) + 1
    pages of it (SlidingWindowManager frees the pages behind the window)."""
    if tokens <= 0:
        return 0
    if kv.window and kv.window.kept and engine == "vllm":
        return cap.pages // vllm_blocks_per_request(kv, tokens, 1)
    if kv.window and kv.window.kept and engine == "sglang-jax":  # the SWA pool holds each request's window
        return min(cap.tokens // tokens, cap.window_tokens // min(tokens, kv.window.window))
    return cap.tokens // tokens


def kv_read_bytes_per_token(kv: KvLayout, context: float) -> float:
    """KV bytes per token of context one decode step reads for a request of CONTEXT tokens: every layer, or with the
    window kept the full-attention layers over the context and the window layers over the window alone. Gemma 4 on
    vLLM TPU caches its sliding layers in full but reads only their window: its JAX model passes the window to the
    kernel (models/jax/gemma4.py attention_chunk_size -> layers/common/attention_interface.py sliding_window), whose
    loop over the KV blocks starts at (kv_q_gap - sliding_window) // bkv_sz (kernels/ragged_paged_attention/v3/
    kernel.py; tpu-inference b8692ff0)."""
    if kv.kinds and kv.window and context > 0:
        per_token = {k.attention: k.page_bytes_per_layer * k.layers / kv.page_size for k in kv.kinds}
        return (per_token.get("full", 0) * context
                + per_token.get("sliding", 0) * min(context, kv.window.window)) / context
    if not (kv.window and kv.window.kept) or context <= 0:
        return kv.kv_bytes_per_token_per_device
    per_layer = kv.page_bytes_per_layer / kv.page_size
    full = kv.layers - kv.window.layers
    return per_layer * (full * context + kv.window.layers * min(context, kv.window.window)) / context


def smem_page_table_bytes(max_num_seqs: int, max_model_len: int, page: int, padded: bool = False) -> int:
    """The int32 page table `[max_num_seqs, ceil(max_model_len / page)]` the attention kernel prefetches to SMEM:
    flat, as vLLM counts it, or PADDED as the compiled JAX kernel holds it (SMEM_ROW_ENTRIES)."""
    pages = -(-max_model_len // page)
    if padded:
        pages = -(-pages // SMEM_ROW_ENTRIES) * SMEM_ROW_ENTRIES
    return max_num_seqs * pages * 4


# JetStream's cache is contiguous (one slot of max_target_length per request: page size 1 in KvLayout's terms). Its
# programs are compiled with the paged kernel over pages of this many tokens: the same KV bytes per token, and a
# page table of [max_num_seqs, max_model_len / 128] instead of one entry per token, which no contiguous cache holds
# and which SMEM cannot (256 requests x 2,048 tokens is 2 MiB).
CONTIGUOUS_COMPILED_PAGE = 128


def compiled_page_size(kv: KvLayout) -> int:
    """Tokens per page of the programs tpuprof compiles: the engine's page, or for a contiguous cache (JetStream)
    CONTIGUOUS_COMPILED_PAGE."""
    return kv.page_size if kv.page_size > 1 else CONTIGUOUS_COMPILED_PAGE


def smem_limit_bytes() -> int:
    return SMEM_BYTES // SMEM_PAGE_TABLE_SHARE


def largest_max_num_seqs(max_model_len: int, page: int, padded: bool = False) -> int:
    """vLLM get_max_num_seqs: the most requests whose page table (PADDED: as the compiled kernel holds it) fits the
    SMEM share."""
    return max(smem_limit_bytes() // smem_page_table_bytes(1, max_model_len, page, padded), 0)


def smallest_page_for(max_num_seqs: int, max_model_len: int, padded: bool = False) -> int | None:
    """The smallest power-of-two page size whose page table fits the SMEM share (None: none up to 4096; PADDED: a
    larger page does not help once a request's pages fit one padded row)."""
    page = 16
    while page <= 4096:
        if smem_page_table_bytes(max_num_seqs, max_model_len, page, padded) <= smem_limit_bytes():
            return page
        page *= 2
    return None


def capacity(kv: KvLayout, bytes_limit: int, utilization: float, weights: int, state: int, max_model_len: int,
             concurrency: int, engine: str, position_limit: int = 0, max_num_batched_tokens: int = 0) -> Capacity:
    """The KV cache at UTILIZATION: the engine's budget, whole pages, tokens and concurrency; the longest request
    the cache holds CONCURRENCY of (at most POSITION_LIMIT, the model's positions, when known). Window layers the
    engine keeps to their window (vLLM's hybrid allocator, SGLang-JAX's SWA pool) follow its own rule, which for
    vLLM reserves MAX_NUM_BATCHED_TOKENS past the window."""
    budget = int(bytes_limit * utilization) - weights - state
    if kv.window and kv.window.kept and engine == "vllm":
        return _vllm_hybrid_capacity(kv, bytes_limit, utilization, weights, state, budget, max_model_len,
                                     concurrency, position_limit, max_num_batched_tokens)
    if kv.window and kv.window.kept and engine == "sglang-jax":
        return _sglang_swa_capacity(kv, bytes_limit, utilization, weights, state, budget, max_model_len, concurrency,
                                    position_limit)
    if engine == "jetstream":  # contiguous: whole slots of max_model_len tokens
        per_slot = kv.kv_bytes_per_token_per_device * max_model_len
        slots = max(budget, 0) // per_slot if per_slot else 0
        tokens = slots * max_model_len
        pages = slots
    else:
        # Pages split over devices (vLLM TPU's MLA): each holds budget // page bytes of its own; the engine's count
        # (`num_blocks`, rounded down to a multiple of the devices) is that times the devices.
        pages = (max(budget, 0) // kv.page_bytes if kv.page_bytes else 0) * kv.page_shards
        tokens = pages * kv.page_size
    # A request's pages lie on one device: CONCURRENCY requests put ceil(CONCURRENCY / shards) on each.
    per_shard = -(-max(concurrency, 1) // kv.page_shards)
    longest = tokens // kv.page_shards // per_shard // kv.page_size * kv.page_size
    return Capacity(bytes_limit, utilization, weights, state, budget, pages, tokens, tokens / max_model_len,
                    min(longest, position_limit) if position_limit else longest)


def _longest(fits, page: int, limit: int) -> int:
    """The largest multiple of PAGE up to LIMIT for which FITS(length) holds (0: none); FITS is monotone."""
    low, high = 0, max(limit // page, 0)
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid * page):
            low = mid
        else:
            high = mid - 1
    return low * page


def _vllm_hybrid_capacity(kv, bytes_limit, utilization, weights, state, budget, max_model_len, concurrency,
                          position_limit, batched) -> Capacity:
    """vLLM's hybrid allocator: num_blocks = budget // (group_size x page bytes of a layer), one pool shared by
    every group; max concurrency = num_blocks / the blocks a request of max_model_len takes; the tokens vLLM logs
    are that concurrency x max_model_len (its _report_kv_cache_config)."""
    w = kv.window
    pages = max(budget, 0) // (w.group_size * kv.page_bytes_per_layer) if kv.page_bytes_per_layer else 0
    in_flight = vllm_in_flight_tokens(batched)
    per_request = vllm_blocks_per_request(kv, max_model_len, in_flight)
    concurrency_ = pages / per_request
    wanted = max(concurrency, 1)
    limit = position_limit or max(pages * kv.page_size, max_model_len)
    longest = _longest(lambda n: wanted * vllm_blocks_per_request(kv, n, in_flight) <= pages, kv.page_size, limit)
    how = (f"{pages:,} blocks of {w.group_size} layers' pages ({w.group_size} x "
           f"{kv.page_bytes_per_layer:,} B) in the budget; a request of {max_model_len:,} tokens takes {per_request:,} "
           f"of them ({w.full_groups} full-attention group(s) x {-(-max_model_len // kv.page_size):,} pages + "
           f"{w.window_groups} {w.kind} group(s) x {window_blocks_per_request(kv, max_model_len, in_flight):,}, with "
           f"{in_flight:,} tokens in flight: max_num_batched_tokens {batched:,} x {VLLM_BATCHES_IN_FLIGHT} steps under "
           "async scheduling); tokens = that concurrency x max_model_len, as vLLM logs them")
    return Capacity(bytes_limit, utilization, weights, state, budget, pages, int(concurrency_ * max_model_len),
                    concurrency_, longest, how=how)


def _sglang_swa_capacity(kv, bytes_limit, utilization, weights, state, budget, max_model_len, concurrency,
                         position_limit) -> Capacity:
    """SGLang-JAX's SWA memory pool: the tokens of a cell over every layer, split into a full pool and an SWA pool
    of swa_full_tokens_ratio as many; a request takes its tokens of the full pool and its window of the SWA pool."""
    w = kv.window
    total = (max(budget, 0) // kv.page_bytes if kv.page_bytes else 0) * kv.page_size
    full, swa = sglang_swa_pools(kv, total)
    concurrency_ = min(full / max_model_len, swa / min(max_model_len, w.window))
    wanted = max(concurrency, 1)
    limit = position_limit or max(full, max_model_len)
    longest = _longest(lambda n: wanted * n <= full and wanted * min(n, w.window) <= swa, kv.page_size, limit)
    how = (f"{total:,} tokens of every layer in the budget, split into {full:,} tokens for the "
           f"{kv.layers - w.layers} full-attention layers and {swa:,} for the {w.layers} sliding ones; a request of "
           f"{max_model_len:,} tokens takes {max_model_len:,} of the first and {min(max_model_len, w.window):,} of the "
           "second")
    return Capacity(bytes_limit, utilization, weights, state, budget, full // kv.page_size, full, concurrency_,
                    longest, window_tokens=swa, how=how)


def token_paddings(max_num_batched_tokens: int) -> tuple[int, ...]:
    """tpu-inference get_token_paddings: 16, 32, ... doubling until max_num_batched_tokens is covered."""
    out, size = [], MIN_TOKEN_BUCKET
    while True:
        out.append(size)
        if size >= max_num_batched_tokens:
            return tuple(out)
        size *= 2


def request_paddings(max_num_seqs: int) -> tuple[int, ...]:
    """8, 16, ... doubling until max_num_seqs is covered."""
    out, size = [], MIN_NUM_SEQS
    while True:
        out.append(min(size, max(max_num_seqs, MIN_NUM_SEQS)) if size >= max_num_seqs else size)
        if size >= max_num_seqs:
            return tuple(dict.fromkeys(out))
        size *= 2


def engine_program_count(tokens: tuple, requests: tuple) -> tuple[int, str]:
    """How many programs vLLM TPU compiles at start-up (capture_model, text-only model, greedy and random sampling,
    no speculative decoding or structured output): a backbone per token padding, select_from_array per (tokens,
    requests) pair with requests <= tokens, then per request padding compute_logits, sampling and gather_logprobs."""
    pairs = sum(1 for t in tokens for r in requests if r <= t)
    count = len(tokens) + pairs + 3 * len(requests)
    rule = (f"{len(tokens)} backbone (one per token padding) + {pairs} select_from_array + {len(requests)} x "
            "(compute_logits, sampling, gather_logprobs), as tpu-inference's compilation_manager.capture_model")
    return count, rule


def page_shards(config, engine: str, tp: int) -> int:
    """Devices an engine splits the KV pages (and the requests) over: vLLM TPU's MLA, by attention data parallelism
    over the TP devices; 1 elsewhere."""
    return tp if config.mla and engine == "vllm" else 1


# What tpu-inference requires of an MLA model's launch (tpu_platform.check_and_update_config), in --additional-config.
VLLM_MLA_SHARDING = {"sharding": {"sharding_strategy": {"enable_dp_attention": True}}}


def vllm_quantization(quantization: str) -> str:
    """vLLM TPU's setting that quantizes a bf16 checkpoint's weights as it loads them (qwix rules in
    --additional-config, tpu-inference's qwix_utils): its platform takes --quantization only for checkpoints already
    quantized (supported_quantization has fp8 and no int8: `--quantization int8` is refused)."""
    qtype = {"fp8": "float8_e4m3fn", "int8": "int8"}[quantization]
    return json.dumps({"quantization": {"qwix": {"rules": [{"module_path": ".*", "weight_qtype": qtype}]}}})


def default_max_num_batched_tokens(engine: str = "vllm") -> int:
    """Tokens per step when --max-num-batched-tokens is not given: SGLang-JAX's chunked prefill, else vLLM TPU's."""
    if engine == "sglang-jax":
        return SGLANG_JAX_CHUNKED_PREFILL_SIZE
    return VLLM_MAX_NUM_BATCHED_TOKENS


def headroom_bytes(largest_temp: int, all_code: int, margin: int) -> int:
    """What must lie below the KV cache for every program to load (XLA error 0101): a loaded program keeps its code
    resident, and the one being loaded reserves its temporaries + code contiguously "at the bottom of memory" next
    to them (the failures in public logs show memory already held by the programs loaded before: 459.6 MiB of the
    0.79 GiB headroom in xbill9's gemma-4-E2B log, 1.37 GiB of 1.85 GiB in tpu-inference PR #3408). So the largest
    temporaries, the code of every program, and a margin for what is not compiled and for fragmentation."""
    return largest_temp + all_code + margin


def safe_utilization(bytes_limit: int, headroom: int) -> float:
    """The largest utilization whose `(1 - u) x limit` below the KV cache holds HEADROOM, rounded down to 0.01."""
    return math.floor((1 - headroom / bytes_limit) * 100) / 100


def expert_weights_bytes_per_device(config, tp: int, quantization: str) -> int:
    """The routed experts' weights on one device (gate, up and down of every expert, split over the TP devices by
    width or, with expert parallelism, by whole experts: the same bytes when the experts divide evenly)."""
    if not config.moe:
        return 0
    if quantization == "mxfp4":
        return config.moe_layer_count() * mxfp4_expert_bytes(config) // tp
    w = {"bf16": 2, "fp8": 1, "int8": 1}[quantization]
    return config.moe_layer_count() * config.num_experts * 3 * config.hidden_size * config.moe_intermediate_size * w // tp


def mxfp4_expert_bytes(config) -> int:
    """One MoE layer's routed experts as vLLM TPU stores an MXFP4 checkpoint's: float4_e2m1fn (half a byte) with the
    hidden size and the expert width each padded to a multiple of MXFP4_BLOCK, one float32 scale per MXFP4_BLOCK
    values of a contracting dimension, float32 biases (GPT-OSS's experts have them)."""
    d = -(-config.hidden_size // MXFP4_BLOCK) * MXFP4_BLOCK
    f = -(-config.moe_intermediate_size // MXFP4_BLOCK) * MXFP4_BLOCK
    values = 3 * d * f  # gate and up [2f, d], down [d, f]
    scales = (2 * f * d + d * f) // MXFP4_BLOCK
    biases = (2 * f + d) if config.expert_bias else 0
    return config.num_experts * (values // 2 + 4 * scales + 4 * biases)


def mla_attention_parameters(config) -> tuple[int, int]:
    """(parameters held whole, parameters split by heads) of one MLA layer's attention: the low-rank query and the
    compressed KV projection (with their norms) are whole; the query's up-projection, kv_b and the output
    projection are per head."""
    d, h = config.hidden_size, config.num_attention_heads
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    whole = d * (config.kv_lora_rank + config.qk_rope_head_dim) + config.kv_lora_rank
    if config.q_lora_rank:
        whole += d * config.q_lora_rank + config.q_lora_rank
        heads = config.q_lora_rank * h * qk
    else:
        heads = d * h * qk
    heads += config.kv_lora_rank * h * (config.qk_nope_head_dim + config.v_head_dim) + h * config.v_head_dim * d
    return whole, heads


def gemma4_attention_bytes(config, kind: str, tp: int, quantization: str) -> int:
    """One Gemma 4 layer's attention weights of KIND ("sliding" | "full") on one device, as tpu-inference's JAX model
    holds them (models/jax/gemma4.py Gemma4Attention): q [d, heads, head] and o split by heads over TP, k (and v,
    none where the keys are the values) split by key/value heads or, where TP exceeds them, by the head's width (its
    `_shard_kv_on_k`): never copied; q and k norms of one head's width."""
    d, h = config.hidden_size, config.num_attention_heads
    kv, head = config.attention_shape(kind)
    w = {"bf16": 2, "fp8": 1, "int8": 1, "mxfp4": 2}[quantization]
    projections = 2 if kind == "full" and config.global_k_eq_v else 3  # k and v, or k alone, beside q
    weights = (2 * d * h * head + (projections - 1) * d * kv * head) * w // tp + 2 * head * 2
    if quantization not in ("bf16", "mxfp4"):  # per-output-channel scales of q, k(, v), o
        weights += (h * head + (projections - 1) * kv * head) * 2 // tp + d * 2
    return weights


def shape_weights_how(config, quantization: str, engine: str) -> str:
    """How shape_weights_bytes_per_device counted, in words."""
    how = "estimated from the shapes and the engine's sharding (not compiled; unpadded"
    if quantization == "mxfp4":
        how += (f", but the routed experts: float4_e2m1 padded to multiples of {MXFP4_BLOCK}, a float32 scale per "
                f"{MXFP4_BLOCK} values and float32 biases, as tpu-inference requantizes MXFP4; the rest bf16")
    if config.mla and engine == "vllm":
        how += ("; the attention, dense MLPs and shared experts whole on every device, as tpu-inference's attention "
                "data parallelism holds them")
    return how + ")"


def shape_weights_bytes_per_device(config, tp: int, quantization: str, expert_parallel: bool,
                                   engine: str = "vllm") -> int:
    """Weights per device from the shapes and the engine's sharding (no compile): q/o over TP, k/v over TP with
    replication, MLP over TP, vocabulary over TP; norms replicated. Unpadded (the compile gives the padded figure),
    but for MXFP4 experts, whose padding is the engine's (mxfp4_expert_bytes). MLA on vLLM TPU: the attention, the
    dense MLPs and the shared experts whole on every device (attention data parallelism)."""
    d, h, hd, kv = config.hidden_size, config.num_attention_heads, config.head_dim, config.num_key_value_heads
    w = {"bf16": 2, "fp8": 1, "int8": 1, "mxfp4": 2}[quantization]  # MXFP4: only the experts are fp4
    whole_mlp = config.mla and engine == "vllm"  # ATTN_HEAD sharding under attention data parallelism
    kinds = layer_kinds_count(config) if config.global_head_dim or config.global_kv_heads else {}
    if config.mla:
        whole, heads = mla_attention_parameters(config)
        attention = (whole + heads // (1 if whole_mlp else tp)) * w
    elif kinds:  # Gemma 4: each kind of layer its own attention (gemma4_attention_bytes), averaged over the layers
        attention = sum(n * gemma4_attention_bytes(config, kind, tp, quantization) for kind, n in kinds.items()) \
            // config.num_hidden_layers
    else:
        per_kv, _ = kv_heads_per_device(kv, tp)
        attention = (2 * d * h * hd // tp + 2 * d * per_kv * hd) * w
        if quantization not in ("bf16", "mxfp4"):
            attention += (h * hd // tp * 2 + 2 * per_kv * hd + d) * 2
    mlp_tp = 1 if whole_mlp else tp
    dense = 3 * d * config.intermediate_size * w // mlp_tp
    moe = 0
    if config.moe:
        experts = mxfp4_expert_bytes(config) if quantization == "mxfp4" else \
            config.num_experts * 3 * d * config.moe_intermediate_size * w
        moe = experts // tp + d * config.num_experts * 2
        if config.shared_expert_intermediate_size:
            moe += 3 * d * config.shared_expert_intermediate_size * w // mlp_tp \
                + (2 * d if config.shared_expert_gate else 0)  # Qwen-MoE's sigmoid gate, [d, 1] in bf16
    routed = config.moe_layer_count()
    norms = 2 * d * 2
    if config.moe_dense_mlp:  # Gemma 4's MoE layers run the dense MLP beside the experts, each normed on its own
        moe += dense + (3 * d + d + config.num_experts) * 2  # 3 more norms, the router's scale, per-expert scales
    if kinds:
        norms = 4 * d * 2 + 2  # Gemma 4: norms before and after attention and MLP, a learned scalar on the output
    layers = (config.num_hidden_layers * (attention + norms) + routed * moe
              + (config.num_hidden_layers - routed) * dense)
    vocab = config.vocab_size * d * 2 * (1 if config.tie_word_embeddings else 2) // tp
    return layers + vocab + d * 2
