"""A decoder-only LLM's full train step, built from a Hugging Face config and shapes alone (no weights), sharded
over a TPU slice: what `tpuprof preflight --model llama3.1-8b` (or `--model config.json`) compiles.

The step is what TPU users run (MaxText's layout): token embedding (+ learned positions for GPT-3), the decoder's
layers as a plan of segments, each a block of layer kinds scanned with `jax.lax.scan` (Gemma 3's five sliding
layers and a global one, Llama 4's chunked/global and dense/MoE interleave, DeepSeek's dense first layers then
its MoE layers); each layer: norm (RMSNorm, or LayerNorm with a bias) -> attention through the Pallas
splash-attention kernel (jax.experimental.pallas.ops.tpu.splash_attention) with the layer's mask (causal, sliding
window, chunked), the model's logit soft-cap and sinks; projections GQA (biases, per-head QK-norm) or DeepSeek's
multi-head latent attention (low-rank q, compressed kv, a shared RoPE key) -> norm -> gated MLP (SwiGLU, GeGLU,
GPT-OSS's clamped SwiGLU), GPT-3's GELU MLP with biases, or a top-k routed mixture of experts (router/expert
biases, shared experts, Gemma 4's dense MLP beside them); Gemma's norms after attention and MLP; Gemma 4's full
layers with their own head size and key/value heads, keys as values, proportional RoPE; final norm, LM head (Gemma 2's final soft-cap),
causal-LM cross-entropy computed over pieces of the sequence so the fp32 [batch, seq, vocab] logits are never whole
in memory (MaxText's vocabulary tiling), the backward pass, and an AdamW update (weights and moments in fp32, or in
bf16 with --weight-dtype bfloat16, as MaxText's weight_dtype, the first moment in --mu-dtype; a few lines here
rather than a dependency on optax).
Matmuls run in bf16 (`--dtype bf16`) or with fp8 operands (`--dtype fp8`: e4m3 casts before each matmul, bf16
accumulation).

Sharding (MaxText's default rules, https://github.com/AI-Hypercomputer/maxtext configs/base.yml
logical_axis_rules): parameters and optimizer state are sharded over `fsdp` on their embedding dimension and
over `tensor` on heads / MLP width / vocabulary; experts over `expert`; the residual stream between and inside
the layers (what remat keeps of each layer) has its batch over data x fsdp x expert and its embedding over
`tensor` (activation_embed). A dimension that an axis does not divide stays whole on that axis.

Not modelled (same shapes, so memory holds; the figures say so where it matters): RoPE scaling variants (YaRN,
Llama 4's NoPE layers get RoPE's cheap elementwise work too), Llama 4's weightless L2 QK-norm, DeepSeek's
group-limited sigmoid routing (softmax top-k here, with V3's selection bias) and its multi-token-prediction module
(counted apart: `mtp_layers`), sequence / context parallelism, pipeline stages; MoE routes with a capacity factor
of 1.25 over groups of tokens (GShard-style one-hot dispatch einsums) or dropless (`--moe dropless`: megablox
grouped matmuls over each device's own tokens, without expert parallelism); the routing's load balance is not the
real run's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuprof.errors import UserError
from tpuprof.models.preflight import TrainingState, custom_remat
from tpuprof.sources.mesh import MESH_AXES, make_mesh, parse_mesh  # noqa: F401 - the LLM step's mesh

if TYPE_CHECKING:
    from tpuprof import slices

OFFLOADED = ("decoder_layer_input", "query_proj", "key_proj", "value_proj")  # --remat offload, as MaxText names them
CAPACITY_FACTOR = 1.25
# --moe: how a mixture of experts routes its tokens (what the document's model.moe says).
MOE_KINDS = {"capacity": "capacity factor {factor}: tokens beyond it dropped, one-hot dispatch einsums",
             "dropless": "dropless: megablox grouped matmuls over the tokens each expert received"}
MOE_GROUP = 512  # tokens routed together (the one-hot dispatch tensors grow with the group squared)
# Splash attention's tiles and backward kernel. On v6e as tpu-recipes' published Llama 3.1 8B and 70B runs set
# them (sa_block_* = 2048, sa_use_fused_bwd_kernel = True: dQ, dK and dV from one kernel), with the scoped VMEM
# limit those runs set (MaxText benchmarks/xla_flags_library.py DENSE_VMEM_LIMIT_FLAG): at libtpu's default of
# 32 MiB the fused backward kernel of 2048-blocks does not compile (it asks for 36 MiB at 3 x 8192 tokens per
# chip). Elsewhere MaxText's defaults (blocks of 512, separate dQ and dK/dV kernels, libtpu's VMEM limit): no
# published run sets more, and on v4 (16 MiB of VMEM) the fused 2048-block kernel asks for 30.8 MiB.
SPLASH_BLOCK = {"v6e": 2048}
SPLASH_FUSED_BACKWARD = {"v6e": True}
DEFAULT_SPLASH_BLOCK = 512
RECIPE_VMEM_LIMIT = {"v6e": {"xla_tpu_scoped_vmem_limit_kib": 98304}}  # DENSE_VMEM_LIMIT_FLAG
# The published 8B runs also turn off collective matmuls (DISABLE_COLLECTIVE_MATMUL): by default libtpu splits
# the FSDP-gathered MLP matmuls into windowed einsums whose partial sums re-read and re-write the
# [batch, seq, mlp] output once per window.
# Both published runs also set four of MaxText's flag sets (benchmarks/xla_flags_library.py; their names in the
# comments below), set here as they are there. They matter for memory, not only for speed: Llama 3.1 70B on
# v6e-256 at 4 sequences of 8,192 tokens per chip with --remat offload needs 32.64 GiB per chip without them
# and 24.41 GiB with them (libtpu 0.0.42.1); with them the recipe's 5 sequences fit (29.85 of 31.25 GiB), as
# the recipe runs. libtpu accepts them for every generation.
COMPILER_OPTIONS = {
    "xla_jf_spmd_threshold_for_windowed_einsum_mib": 1000000,  # DISABLE_COLLECTIVE_MATMUL (the 8B runs)
    # LAYOUT_FOR_ALL_REDUCE_SCATTER
    "xla_tpu_use_minor_sharding_for_major_trivial_input": True,
    "xla_tpu_relayout_group_size_threshold_for_reduce_scatter": 1,
    "xla_tpu_assign_all_reduce_scatter_layout": True,
    # DATA_PARALLEL_OVERLAP
    "xla_tpu_enable_data_parallel_all_reduce_opt": True,
    "xla_tpu_data_parallel_opt_different_sized_ops": True,
    # CF_FOR_ALL_GATHER
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
    "xla_enable_async_all_gather": True,
    # HOST_OFFLOAD_FLAGS
    "xla_tpu_enable_all_experimental_scheduler_features": True,
    "xla_tpu_enable_scheduler_memory_pressure_tracking": True,
    "xla_tpu_host_transfer_overlap_limit": 24,
    "xla_tpu_aggressive_opt_barrier_removal": "ENABLED",
    "xla_lhs_prioritize_async_depth_over_stall": "ENABLED",
    "xla_tpu_enable_ag_backward_pipelining": True,
    "xla_should_allow_loop_variant_parameter_in_chain": "ENABLED",
    "xla_should_add_loop_invariant_op_in_chain": "ENABLED",
    "xla_max_concurrent_host_send_recv": 100,
    "xla_tpu_scheduler_percent_shared_memory_limit": 100,
    "xla_latency_hiding_scheduler_rerun": 2,
}
LOSS_CHUNK_BYTES = 512 * 2**20  # fp32 logits of one piece of the loss per device (see cross_entropy)
ADAM_STATE_BYTES = 12  # per parameter: fp32 weights + fp32 first and second moments
IMPLEMENTATION = "tpuprof compact JAX definition (tpuprof/sources/llm.py)"


# --- configs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """The fields of a Hugging Face config.json that set the shapes of the train step.

    `layer_plan` lists the decoder's layers as (block, repeats) segments: a block is a tuple of layer kinds
    ("<attention>+<mlp>": attention full / sliding / chunked, mlp dense / moe) that repeats `repeats` times, as
    MaxText scans a repeating block (Gemma 3's five sliding layers and one global, Llama 4's interleaved MoE) and
    DeepSeek's first dense layers apart from its MoE layers."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP width
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_experts: int = 0  # 0: dense MLP
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 0  # 0: the config does not say (serve's default max model length)
    layer_plan: tuple = ()  # ((kinds...), repeats), ...; () -> every layer "full+dense" (or "full+moe")
    # attention
    output_bias: bool = False  # the output projection's bias (GPT-3, GPT-OSS)
    qk_norm: bool = False  # RMSNorm weights on each head's q and k (Qwen3, Gemma 3)
    attention_sinks: bool = False  # a learned logit per head in the softmax's denominator (GPT-OSS)
    sliding_window: int = 0
    attention_chunk_size: int = 0
    attn_logit_softcapping: float = 0.0
    final_logit_softcapping: float = 0.0
    query_pre_attn_scalar: float = 0.0  # Gemma's query scale (0: head_dim)
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek): 0 without a low-rank query
    kv_lora_rank: int = 0  # > 0: MLA
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # norms, MLP, positions
    norm_type: str = "rms"  # or "layer" (LayerNorm with a bias: GPT-3)
    sandwich_norm: bool = False  # norms after attention and after the MLP too (Gemma 2/3)
    mlp_gated: bool = True  # gate x up (SwiGLU/GeGLU); False: up -> activation -> down (GPT-3)
    mlp_bias: bool = False
    shared_expert_gate: bool = False  # a sigmoid gate on the shared expert (Qwen-MoE)
    router_bias: bool = False  # GPT-OSS
    router_score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias (selection only)
    expert_bias: bool = False  # biases in each expert's projections (GPT-OSS)
    learned_positions: int = 0  # rows of a learned position table (GPT-3); 0: RoPE
    mtp_layers: int = 0  # DeepSeek-V3's multi-token-prediction modules: counted apart, not in the step
    # Gemma 4: the full-attention layers' own head size and key/value heads (0: as the others), their keys also
    # their values (attention_k_eq_v: no value projection), their RoPE's base and the fraction of each head it
    # turns ("proportional" RoPE: the rest of the frequencies are 0); values RMS-normed without a scale; a learned
    # scalar on each layer's output.
    global_head_dim: int = 0
    global_kv_heads: int = 0
    global_k_eq_v: bool = False
    global_rope_theta: float = 0.0  # 0: rope_theta
    global_rope_fraction: float = 1.0
    v_norm: bool = False
    layer_scalar: bool = False
    # Gemma 4's MoE layers: the dense MLP (intermediate_size) beside the routed experts, each normed before and
    # after on its own; the router reads the unscaled RMS norm of the layer's input times a learned scale [d], and
    # its top-k weights are renormalised and multiplied by a learned per-expert scale.
    moe_dense_mlp: bool = False

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def plan(self) -> tuple:
        return self.layer_plan or (((f"full+{'moe' if self.moe else 'dense'}",), self.num_hidden_layers),)

    def layer_kinds(self) -> list[str]:
        return [kind for block, repeats in self.plan for _ in range(repeats) for kind in block]

    def attention_shape(self, attention: str) -> tuple[int, int]:
        """(key/value heads, head size) of a layer of ATTENTION kind (Gemma 4's full layers have their own)."""
        if attention == "full":
            return self.global_kv_heads or self.num_key_value_heads, self.global_head_dim or self.head_dim
        return self.num_key_value_heads, self.head_dim

    def parameter_count(self) -> int:
        """Every parameter of the language model, from the same layout the step is built and sharded with
        (norms and biases included; DeepSeek-V3's multi-token-prediction module and vision towers not)."""
        return sum(math.prod(shape) for shape, _ in _parameter_layout(self, dict.fromkeys(MESH_AXES, 1)).values())

    def active_parameter_count(self) -> int:
        """The parameters one token uses, as model cards count them: all of them but the routed experts a token
        is not sent to (num_experts - num_experts_per_tok of them in each MoE layer)."""
        if not self.moe:
            return self.parameter_count()
        d, f = self.hidden_size, self.moe_intermediate_size
        per_expert = (3 if self.mlp_gated else 2) * d * f + ((2 * f if self.mlp_gated else f) + d if self.expert_bias else 0)
        unused = (self.num_experts - self.num_experts_per_tok) * per_expert
        return self.parameter_count() - self.moe_layer_count() * unused

    def moe_layer_count(self) -> int:
        """Decoder layers with routed experts: all of an MoE's but the dense ones its config names (DeepSeek's first
        layers, Llama 4 Maverick's every other one)."""
        return sum(kind.endswith("+moe") for kind in self.layer_kinds())

    def matmul_parameter_count(self) -> int:
        """Active parameters a token's matmuls use (MaxText's model FLOPs): not the embedding lookup, the learned
        positions, norms or biases."""
        lookup = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        top = ("embed", "positions", "lm_head")
        vectors = sum(math.prod(shape) for name, (shape, _) in _parameter_layout(self, dict.fromkeys(MESH_AXES, 1)).items()
                      if name not in top and len(shape) <= 2)  # norms, biases, sinks: [d] or [layers, d]
        # GPT-OSS's expert biases ([layers, experts, width]: rank 3) are added, not multiplied: MaxText's
        # calculate_ffn_mamtul_tflops_per_device counts the k experts' matmuls alone.
        f = self.moe_intermediate_size
        per_expert = (2 * f if self.mlp_gated else f) + self.hidden_size
        biases = self.moe_layer_count() * self.num_experts_per_tok * per_expert if self.moe and self.expert_bias else 0
        return self.active_parameter_count() - lookup - self.learned_positions * self.hidden_size - vectors - biases

    def digest(self) -> str:
        # The shapes' fields only: the name and the positions trained for change no program.
        fields = {k: v for k, v in self.__dict__.items() if k not in ("name", "max_position_embeddings")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


# Names a user may expect and the step does not build, with why.
NOT_BUILT = {name: "Gemma 4's per-layer input embeddings and KV-shared layers (E2B, E4B) are not in tpuprof's step; "
             "gemma4-31b and gemma4-26b-a4b are built-in." for name in ("gemma4-e2b", "gemma4-e4b")}


def builtin_names() -> list[str]:
    folder = resources.files("tpuprof") / "llm_configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_config(text: str) -> tuple[ModelConfig, str]:
    """`llama3.1-8b` (a built-in config, tpuprof/llm_configs/), `path/to/config.json` (Hugging Face format) or a
    model folder holding one -> (config, source). Both go through the same parser."""
    path = Path(text).expanduser()
    if path.is_dir():  # a Hugging Face model folder (a checkout, a snapshot): its config.json
        if not (path / "config.json").is_file():
            raise UserError(f"{text} is a folder without a config.json: give a Hugging Face model folder or its "
                            "config.json.")
        path = path.resolve() / "config.json"
        text = str(path)
    if text.endswith(".json") or path.is_file():
        if not path.is_file():
            raise UserError(f"{text} does not exist." if not path.exists() else f"{text} is not a file.")
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError, UnicodeDecodeError) as error:
            raise UserError(f"{text} is not a JSON config: {error}.") from None
        return parse_config(data, path.stem if path.name != "config.json" else path.parent.name or "config",
                            str(path)), str(path)
    key = text.strip().lower()
    names = builtin_names()
    if key in NOT_BUILT:
        raise UserError(f"{key} is not built: {NOT_BUILT[key]}")
    if key not in names:
        raise UserError(f"unknown model {text!r}: give a Hugging Face config.json or one of {', '.join(names)}.")
    data = json.loads((resources.files("tpuprof") / "llm_configs" / f"{key}.json").read_text())
    return parse_config(data, key, f"tpuprof built-in config {key}"), f"built-in:{key}"


# The Hugging Face model types whose modelling code the step follows (docs/preflight-families.md). Another family's
# config names the same fields, but its layers are not these: built as a Llama, its figures would be another model's.
MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
               "gemma3_text", "gemma4", "gemma4_text", "deepseek_v2", "deepseek_v3", "llama4", "llama4_text", "gpt_oss", "gpt2", "gpt3",
               "openai-gpt")
# What transformers' config class gives a field the config.json leaves out. A multimodal config writes its
# text_config as a diff against that class's defaults: google/gemma-3-12b-it's names no vocab_size, head_dim or
# query_pre_attn_scalar, and transformers fills them in when it loads the model. Gemma3TextConfig.__init__
# (huggingface/transformers src/transformers/models/gemma3/configuration_gemma3.py).
CONFIG_DEFAULTS = {
    "gemma3": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "attention_bias": False,
               "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6},
    # Gemma4TextConfig (huggingface/transformers src/transformers/models/gemma4/configuration_gemma4.py): its
    # __post_init__ also gives full-attention layers global_head_dim 512, and num_global_key_value_heads where
    # attention_k_eq_v is set; rope_parameters default to 10,000 (sliding) and proportional 1,000,000 x 0.25 (full).
    "gemma4": {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 512,
               "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256, "attention_k_eq_v": False,
               "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
               "global_head_dim": 512},
}
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}


def parse_config(data: Any, name: str, where: str) -> ModelConfig:
    if not isinstance(data, dict):
        raise UserError(f"{where}: a Hugging Face config is a JSON object.")
    if isinstance(data.get("text_config"), dict):  # Gemma 3, Llama 4 and other multimodal configs: the language model
        data = {**data, **data["text_config"]}
    model_type = str(data.get("model_type") or "")
    if model_type not in MODEL_TYPES:
        named = f"model_type {model_type!r}" if model_type else "no model_type"
        raise UserError(f"{where} names {named}, not a family tpuprof builds ({', '.join(MODEL_TYPES)}): its layers "
                        "would be built as another model's.")
    family = model_type.removesuffix("_text")
    data = {**CONFIG_DEFAULTS.get(family, {}), **data}
    gemma4 = family == "gemma4"
    if gemma4 and (data.get("hidden_size_per_layer_input") or data.get("num_kv_shared_layers")):
        raise UserError(f"{where}: a Gemma 4 with per-layer input embeddings (hidden_size_per_layer_input) or "
                        "KV-shared layers (num_kv_shared_layers), as E2B and E4B have, is not built by tpuprof's "
                        "step; the 31B and 26B-A4B are.")
    if gemma4 and not data.get("enable_moe_block"):  # the 31B names num_experts: null; only the block builds experts
        data = {k: v for k, v in data.items() if k not in ("num_experts", "top_k_experts")}

    def number(key, *alternatives, default=None, kind=int):
        for k in (key, *alternatives):
            if data.get(k) is not None:
                value = data[k]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise UserError(f"{where}: {k} must be a positive number, not {value!r}.")
                return kind(value)
        if default is None:
            raise UserError(f"{where}: the config has no {key}; a decoder-only LLM config (Llama, Qwen, Mistral, "
                            f"Gemma, Mixtral, DeepSeek, GPT-OSS, GPT-2/3) names vocab_size, hidden_size, "
                            f"intermediate_size, num_hidden_layers and num_attention_heads.")
        return default

    hidden = number("hidden_size", "d_model", "n_embd")
    heads = number("num_attention_heads", "n_head")
    layers = number("num_hidden_layers", "n_layer")
    expert_keys = ("num_local_experts", "num_experts", "n_routed_experts")
    experts = number(*expert_keys, default=0) if any(data.get(k) for k in expert_keys) else 0
    gpt = family in ("gpt2", "gpt3", "openai-gpt")
    dense_width = number("intermediate_size_mlp", "intermediate_size", "n_inner",
                         default=number("moe_intermediate_size", default=4 * hidden))
    expert_width = number("moe_intermediate_size", "intermediate_size", default=4 * hidden) if experts else 0
    shared = 0
    if experts and family == "llama4":  # one shared expert as wide as a routed one
        shared = expert_width
    elif gemma4:  # its dense MLP runs beside the experts (moe_dense_mlp), not a shared expert
        shared = 0
    elif experts and data.get("n_shared_experts"):  # DeepSeek: n_shared_experts x the routed width, ungated
        shared = number("n_shared_experts") * expert_width
    elif experts:
        shared = number("shared_expert_intermediate_size", default=0)
    mla = bool(data.get("kv_lora_rank"))
    attention_bias = bool(data.get("attention_bias", model_type in ("qwen2", "qwen2_moe") or gpt))
    fields = dict(
        name=name, model_type=model_type,
        vocab_size=number("vocab_size"), hidden_size=hidden, intermediate_size=dense_width,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=number("num_key_value_heads", default=heads),
        head_dim=(number("qk_nope_head_dim") + number("qk_rope_head_dim") if mla
                  else number("head_dim", default=hidden // heads)),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", family.startswith("gemma") or gpt)),
        attention_bias=attention_bias,
        hidden_act=str(data.get("hidden_activation") or data.get("hidden_act") or data.get("activation_function")
                       or ("gelu" if gpt else "silu")),
        rope_theta=number("rope_theta", default=10000.0, kind=float),
        rms_norm_eps=number("rms_norm_eps", "layer_norm_epsilon", default=1e-6, kind=float),
        num_experts=experts,
        num_experts_per_tok=number("num_experts_per_tok", "experts_per_token", "top_k_experts", default=2)
        if experts else 0,
        moe_intermediate_size=expert_width,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=bool(shared) and family in ("qwen2_moe",),
        max_position_embeddings=number("max_position_embeddings", "n_positions", "n_ctx", default=0),
        output_bias=(attention_bias and family == "gpt_oss") or gpt,
        qk_norm=family in ("qwen3", "qwen3_moe", "gemma3", "gemma4"),
        attention_sinks=family == "gpt_oss",
        sliding_window=number("sliding_window", default=0) if data.get("sliding_window") else 0,
        attention_chunk_size=number("attention_chunk_size", default=0) if family == "llama4" else 0,
        attn_logit_softcapping=number("attn_logit_softcapping", default=0.0, kind=float),
        final_logit_softcapping=number("final_logit_softcapping", default=0.0, kind=float),
        # Gemma 4 does not scale its queries (Gemma4TextAttention.scaling = 1.0): its QK-norm sets their size.
        query_pre_attn_scalar=1.0 if gemma4 else number("query_pre_attn_scalar", default=0.0, kind=float),
        q_lora_rank=number("q_lora_rank", default=0) if mla else 0,
        kv_lora_rank=number("kv_lora_rank") if mla else 0,
        qk_nope_head_dim=number("qk_nope_head_dim") if mla else 0,
        qk_rope_head_dim=number("qk_rope_head_dim") if mla else 0,
        v_head_dim=number("v_head_dim") if mla else 0,
        norm_type="layer" if gpt else "rms",
        sandwich_norm=family in ("gemma2", "gemma3", "gemma4"),
        mlp_gated=not gpt,
        mlp_bias=gpt,
        router_bias=family == "gpt_oss",
        router_score_bias=family == "deepseek_v3",
        expert_bias=family == "gpt_oss",
        learned_positions=number("n_positions", "max_position_embeddings") if gpt else 0,
        mtp_layers=number("num_nextn_predict_layers", default=0) if family == "deepseek_v3" else 0,
    )
    if gemma4:
        fields.update(_gemma4_fields(data, number, where))
    kinds = _layer_kinds(data, family, layers, experts, where)
    fields["layer_plan"] = _plan(kinds, number("first_k_dense_replace", default=0) if experts else 0)
    config = ModelConfig(**fields)
    if config.num_attention_heads % config.num_key_value_heads:
        raise UserError(f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                        f"({config.num_key_value_heads}).")
    if experts and config.num_experts_per_tok > experts:
        raise UserError(f"{where}: num_experts_per_tok exceeds the number of experts.")
    return config


def _gemma4_fields(data: dict, number, where: str) -> dict:
    """Gemma 4's attention and MoE fields, as Gemma4TextAttention, Gemma4TextRotaryEmbedding and
    Gemma4TextDecoderLayer read the config (transformers src/transformers/models/gemma4/modeling_gemma4.py)."""
    rope = data.get("rope_parameters") if isinstance(data.get("rope_parameters"), dict) else GEMMA4_ROPE
    local, full = rope.get("sliding_attention") or {}, rope.get("full_attention") or {}
    fraction = full.get("partial_rotary_factor", 1.0) if full.get("rope_type") == "proportional" else 1.0
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise UserError(f"{where}: rope_parameters.full_attention.partial_rotary_factor must be in (0, 1], not "
                        f"{fraction!r}.")
    k_eq_v = bool(data.get("attention_k_eq_v"))
    return dict(
        rope_theta=float(local.get("rope_theta") or 10_000.0),
        global_rope_theta=float(full.get("rope_theta") or 1e6),
        global_rope_fraction=float(fraction),
        global_head_dim=number("global_head_dim"),
        # The full layers' own key/value heads only where their keys are their values (Gemma4TextAttention:
        # use_alternative_attention), as the config class's per-layer override does.
        global_kv_heads=number("num_global_key_value_heads") if k_eq_v and data.get("num_global_key_value_heads")
        else 0,
        global_k_eq_v=k_eq_v,
        v_norm=True,
        layer_scalar=True,
        moe_dense_mlp=bool(data.get("enable_moe_block")),
    )


def _layer_kinds(data: dict, family: str, layers: int, experts: int, where: str) -> list[str]:
    """Each layer's kind, "<attention>+<mlp>", as the family's modelling code decides it from the config."""
    types = data.get("layer_types")
    if isinstance(types, list) and len(types) == layers:  # newer configs (Gemma 3, GPT-OSS) list them
        attention = ["sliding" if "sliding" in str(t) else "chunked" if "chunk" in str(t) else "full" for t in types]
    elif family == "gemma2":  # even layers slide (Gemma2DecoderLayer: not layer_idx % 2)
        attention = ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
    elif family in ("gemma3", "gemma4"):  # every sliding_window_pattern-th layer is global
        pattern = data.get("sliding_window_pattern") or 6
        attention = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers)]
    elif family == "gpt_oss":
        attention = ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
    elif family == "llama4" and data.get("attention_chunk_size"):  # RoPE layers chunk, every 4th (NoPE) is global
        rope = data.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        if len(rope) != layers:
            raise UserError(f"{where}: no_rope_layers has {len(rope)} entries for {layers} layers.")
        attention = ["chunked" if r else "full" for r in rope]
    elif data.get("sliding_window") and data.get("use_sliding_window"):  # Qwen2-style: the top layers slide
        start = data.get("max_window_layers") or 0
        attention = ["sliding" if i >= start else "full" for i in range(layers)]
    else:
        attention = ["full"] * layers
    if family == "gemma4" and attention:  # Gemma4TextConfig.__post_init__ makes the last layer global
        attention[-1] = "full"
    if not data.get("sliding_window"):
        attention = ["full" if a == "sliding" else a for a in attention]
    if not experts:
        mlp = ["dense"] * layers
    elif family == "llama4":  # MoE every interleave_moe_layer_step-th layer
        step = data.get("interleave_moe_layer_step") or 1
        mlp = ["moe" if (i + 1) % step == 0 else "dense" for i in range(layers)]
    else:  # DeepSeek: dense first layers, then MoE every moe_layer_freq-th layer
        first, frequency = data.get("first_k_dense_replace") or 0, data.get("moe_layer_freq") or 1
        mlp = ["moe" if i >= first and i % frequency == 0 else "dense" for i in range(layers)]
    return [f"{a}+{m}" for a, m in zip(attention, mlp)]


def _plan(kinds: list[str], prefix: int) -> tuple:
    """(block, repeats) segments covering KINDS: the first PREFIX layers (DeepSeek's dense ones) apart, then the
    shortest block that repeats through the rest, and what is left of it at the end."""
    plan = []
    if prefix:
        plan.append(((kinds[0],), prefix))
        if any(kind != kinds[0] for kind in kinds[:prefix]):
            plan = [((kind,), 1) for kind in kinds[:prefix]]
    rest = kinds[prefix:]
    if rest:
        period = next(p for p in range(1, len(rest) + 1) if all(k == rest[i % p] for i, k in enumerate(rest)))
        plan.append((tuple(rest[:period]), len(rest) // period))
        if len(rest) % period:
            plan.append((tuple(rest[:len(rest) % period]), 1))
    if len(plan) == 1 and plan[0][0] in (("full+dense",), ("full+moe",)):
        return ()  # the plain case: one scanned layer
    return tuple(plan)


# --- state arithmetic ------------------------------------------------------------------------------

def state_bytes_per_device(config: ModelConfig, sizes: dict[str, int],
                           state: TrainingState = TrainingState()) -> int:
    """The weights and AdamW's two moments per device (12 bytes a parameter in fp32, 6 in bf16, 10 with fp32
    weights and a bf16 first moment), from the sharding rules (no compile): every parameter is divided over fsdp x
    tensor (x expert for the experts' weights) when those divide it; gradients, activations and temporaries come
    on top."""
    layout = _parameter_layout(config, sizes, experts_on_fsdp=state.experts_on_fsdp)
    return sum(_per_device(shape, axes, sizes) for shape, axes in layout.values()) \
        * state.bytes_per_parameter()


def _per_device(shape: tuple, axes: tuple, sizes: dict[str, int]) -> int:
    """Elements of one device's shard of a parameter of SHAPE placed on the mesh AXES (per dimension, or None)."""
    return math.prod(-(-dim // math.prod(sizes[axis] for axis in dim_axes or ())) for dim, dim_axes in zip(shape, axes))


def _fits(dim: int, axes: tuple[str, ...], sizes: dict[str, int]) -> tuple[str, ...] | None:
    shards = 1
    for axis in axes:
        shards *= sizes[axis]
    return axes if shards > 1 and dim % shards == 0 else None


@dataclass
class Unsharded:
    """Parameters that a mesh axis was meant to divide and does not: JAX shards a dimension only evenly, so the
    dimension stays whole on every device of that axis (the weights and their AdamW state are replicated)."""

    parameters: list[str]  # their names, as in the layout
    state_bytes_per_device: int  # their weights and AdamW moments per device, beyond an even split
    dimensions: dict[str, list[int]]  # mesh axis -> the dimensions it does not divide
    mesh: str | None  # a --mesh for the same devices whose axes divide them all, if there is one

    def to_json(self, per_chip: int) -> dict:
        return {"parameters": self.parameters, "state_bytes_per_chip": self.state_bytes_per_device * per_chip,
                "dimensions": self.dimensions, "mesh": self.mesh}


def unsharded(config: ModelConfig, sizes: dict[str, int], state: TrainingState = TrainingState()) -> Unsharded | None:
    """What the mesh SIZES leaves whole of CONFIG's parameters (None: every parameter is divided as meant), and
    the largest fsdp/expert axes that would divide it all, the rest of the devices moved to the data axis."""
    meant = _parameter_layout(config, sizes, even_only=False, experts_on_fsdp=state.experts_on_fsdp)
    placed = _parameter_layout(config, sizes, experts_on_fsdp=state.experts_on_fsdp)
    names, extra, dimensions = [], 0, {}
    for name, (shape, wanted) in meant.items():
        got = placed[name][1]
        if got == wanted:
            continue
        names.append(name)
        extra += _per_device(shape, got, sizes) - _per_device(shape, wanted, sizes)
        for dim, want, have in zip(shape, wanted, got):
            for axis in (want if want != have else ()):
                undivided = dimensions.setdefault(axis, [])
                if dim not in undivided:
                    undivided.append(dim)
    if not names:
        return None
    better = dict(sizes)
    for axis, dims in dimensions.items():
        if axis == "tensor":  # the tensor axis divides the heads (checked): kept as given
            continue
        size = next(n for n in range(sizes[axis], 0, -1) if sizes[axis] % n == 0 and all(d % n == 0 for d in dims))
        better["data"] *= sizes[axis] // size
        better[axis] = size
    mesh = None
    if better != sizes and "tensor" not in dimensions:
        mesh = ",".join(f"{axis}={n}" for axis, n in better.items() if n > 1)
    return Unsharded(names, extra * state.bytes_per_parameter(), dimensions, mesh)


# MaxText's shard_exp_on_fsdp (moe.py: wi ("embed_no_exp", None, "mlp"), wo ("embed_no_exp", "mlp", None)): the
# experts' weights stored with the expert dimension over fsdp, the embedding whole, the width over tensor.
EXPERTS_ON_FSDP = {"we_gate": (("fsdp",), None, ("tensor",)), "we_up": (("fsdp",), None, ("tensor",)),
                   "we_down": (("fsdp",), ("tensor",), None)}


def _parameter_layout(config: ModelConfig, sizes: dict[str, int], even_only: bool = True,
                      experts_on_fsdp: bool = False) -> dict[str, tuple[tuple, tuple]]:
    """name -> (shape, per-dimension mesh axes) for every parameter (each segment's layers stacked on a leading
    axis). An axis that does not divide its dimension is dropped (even_only, as JAX shards); without even_only,
    the axes meant. EXPERTS_ON_FSDP: the experts' weights as MaxText's shard_exp_on_fsdp stores them."""
    c = config

    def spec(shape, *axes):
        if not even_only:
            return tuple(shape), tuple(a if a and math.prod(sizes[x] for x in a) > 1 else None for a in axes)
        return tuple(shape), tuple(_fits(dim, a, sizes) if a else None for dim, a in zip(shape, axes))

    d = c.hidden_size
    fsdp, tensor = ("fsdp",), ("tensor",)
    layout = {"embed": spec((c.vocab_size, d), tensor, fsdp)}
    if c.learned_positions:
        layout["positions"] = spec((c.learned_positions, d), None, fsdp)
    layout["final_norm"] = spec((d,), None)
    if c.norm_type == "layer":
        layout["final_norm_bias"] = spec((d,), None)
    for prefix, kind, repeats in layer_slots(c):
        for name, (shape, axes) in _layer_layout(c, kind).items():
            axes = EXPERTS_ON_FSDP[name] if experts_on_fsdp and name in EXPERTS_ON_FSDP else axes
            layout[prefix + name] = spec((repeats, *shape), None, *axes)
    if not c.tie_word_embeddings:
        layout["lm_head"] = spec((d, c.vocab_size), fsdp, tensor)
    return layout


def layer_slots(config: ModelConfig) -> list[tuple[str, str, int]]:
    """(parameter-name prefix, layer kind, repeats) for each layer of each segment's block. The plain one-kind
    model keeps bare names (wq, w_up, ...)."""
    plan = config.plan
    if len(plan) == 1 and len(plan[0][0]) == 1:
        return [("", plan[0][0][0], plan[0][1])]
    return [(f"segment{s}.layer{j}.", kind, repeats) for s, (block, repeats) in enumerate(plan)
            for j, kind in enumerate(block)]


def _layer_layout(c: ModelConfig, kind: str) -> dict[str, tuple[tuple, tuple]]:
    """One layer's parameters of KIND: name -> (shape, per-dimension axes meant), MaxText's sharding rules."""
    attention = kind.split("+")[0]
    d, h = c.hidden_size, c.num_attention_heads
    kv, hd = c.attention_shape(attention)
    fsdp, tensor, expert = ("fsdp",), ("tensor",), ("expert",)
    out: dict[str, tuple[tuple, tuple]] = {"attn_norm": ((d,), (None,)), "mlp_norm": ((d,), (None,))}
    if c.norm_type == "layer":
        out.update({"attn_norm_bias": ((d,), (None,)), "mlp_norm_bias": ((d,), (None,))})
    if c.sandwich_norm:
        out.update({"post_attn_norm": ((d,), (None,)), "post_mlp_norm": ((d,), (None,))})
    if c.mla:
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank:
            out.update({"wq_a": ((d, c.q_lora_rank), (fsdp, None)), "q_a_norm": ((c.q_lora_rank,), (None,)),
                        "wq_b": ((c.q_lora_rank, h * qk), (fsdp, tensor))})
        else:
            out["wq"] = ((d, h * qk), (fsdp, tensor))
        out.update({"wkv_a": ((d, c.kv_lora_rank + c.qk_rope_head_dim), (fsdp, None)),
                    "kv_a_norm": ((c.kv_lora_rank,), (None,)),
                    "wkv_b": ((c.kv_lora_rank, h * (c.qk_nope_head_dim + c.v_head_dim)), (fsdp, tensor)),
                    "wo": ((h * c.v_head_dim, d), (tensor, fsdp))})
    else:
        out.update({"wq": ((d, h * hd), (fsdp, tensor)), "wk": ((d, kv * hd), (fsdp, tensor)),
                    "wv": ((d, kv * hd), (fsdp, tensor)), "wo": ((h * hd, d), (tensor, fsdp))})
        if c.attention_bias:
            out.update({"bq": ((h * hd,), (tensor,)), "bk": ((kv * hd,), (tensor,)), "bv": ((kv * hd,), (tensor,))})
        if attention == "full" and c.global_k_eq_v:  # the keys are the values: no value projection
            out.pop("wv")
            out.pop("bv", None)
        if c.qk_norm:
            out.update({"q_norm": ((hd,), (None,)), "k_norm": ((hd,), (None,))})
    if c.output_bias:
        out["bo"] = ((d,), (None,))
    if c.attention_sinks:
        out["sinks"] = ((h,), (tensor,))
    if c.layer_scalar:
        out["layer_scalar"] = ((1,), (None,))
    if kind.endswith("+moe"):
        e, f = c.num_experts, c.moe_intermediate_size
        out["router"] = ((d, e), (fsdp, None))
        if c.moe_dense_mlp:
            out.update({"router_scale": ((d,), (None,)), "expert_scale": ((e,), (None,)),
                        "pre_mlp_norm_2": ((d,), (None,)), "post_mlp_norm_1": ((d,), (None,)),
                        "post_mlp_norm_2": ((d,), (None,))})
            out.update(_dense_mlp_layout(c))
        if c.router_bias:
            out["router_bias"] = ((e,), (None,))
        if c.router_score_bias:
            out["router_score_bias"] = ((e,), (None,))
        out.update({"we_gate": ((e, d, f), (expert, fsdp, tensor)), "we_up": ((e, d, f), (expert, fsdp, tensor)),
                    "we_down": ((e, f, d), (expert, tensor, fsdp))})
        if c.expert_bias:
            out.update({"be_gate": ((e, f), (expert, tensor)), "be_up": ((e, f), (expert, tensor)),
                        "be_down": ((e, d), (expert, None))})
        if c.shared_expert_intermediate_size:
            s = c.shared_expert_intermediate_size
            out.update({"ws_gate": ((d, s), (fsdp, tensor)), "ws_up": ((d, s), (fsdp, tensor)),
                        "ws_down": ((s, d), (tensor, fsdp))})
            if c.shared_expert_gate:
                out["ws_router"] = ((d, 1), (fsdp, None))
    else:
        out.update(_dense_mlp_layout(c))
    return out


def _dense_mlp_layout(c: ModelConfig) -> dict[str, tuple[tuple, tuple]]:
    d, f = c.hidden_size, c.intermediate_size
    fsdp, tensor = ("fsdp",), ("tensor",)
    out: dict[str, tuple[tuple, tuple]] = {}
    if c.mlp_gated:
        out["w_gate"] = ((d, f), (fsdp, tensor))
    out.update({"w_up": ((d, f), (fsdp, tensor)), "w_down": ((f, d), (tensor, fsdp))})
    if c.mlp_bias:
        out.update({"b_up": ((f,), (tensor,)), "b_down": ((d,), (None,))})
        if c.mlp_gated:
            out["b_gate"] = ((f,), (tensor,))
    return out


# --- the step --------------------------------------------------------------------------------------

@dataclass
class Step:
    """Everything that decides the compiled program (and so the compile cache key)."""

    config: ModelConfig
    source: str
    seq_len: int
    remat: str = "full"
    dtype: str = "bf16"
    mesh_sizes: dict[str, int] = field(default_factory=dict)
    weight_dtype: str = "float32"  # MaxText's weight_dtype: the weights' and AdamW moments' storage
    mu_dtype: str | None = None  # MaxText's mu_dtype: AdamW's first moment (None: the weights' dtype)
    vocab_tiling: int | None = None  # MaxText's num_vocab_tiling: the loss in this many pieces (None: loss_chunks)
    moe: str = "capacity"  # MoE_KINDS: capacity-dropped one-hot einsums, or dropless grouped matmuls (MaxText's
    # sparse_matmul with megablox)
    grad_dtype: str = "float32"  # MaxText's grad_dtype: the fp32 gradients cast to it before the optimizer
    shard_exp_on_fsdp: bool = False  # MaxText's shard_exp_on_fsdp: the experts' weights stored over fsdp by expert

    @property
    def state(self) -> TrainingState:
        return TrainingState(self.weight_dtype, self.mu_dtype, self.shard_exp_on_fsdp)

    def key(self) -> str:
        own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        parts = [self.config.digest(), self.seq_len, self.remat, self.dtype, sorted(self.mesh_sizes.items()), own]
        if self.weight_dtype != "float32":
            parts.append(self.weight_dtype)
        if self.vocab_tiling is not None:
            parts.append(["vocab_tiling", self.vocab_tiling])
        if self.moe != "capacity":
            parts.append(["moe", self.moe])
        if self.mu_dtype is not None:
            parts.append(["mu_dtype", self.mu_dtype])
        if self.grad_dtype != "float32":
            parts.append(["grad_dtype", self.grad_dtype])
        if self.shard_exp_on_fsdp:
            parts.append("shard_exp_on_fsdp")
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def build(step: Step, devices, batch_per_device: int):
    """(jitted train step, [params, optimizer state, tokens] as sharded ShapeDtypeStructs) for the slice."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    config, sizes = step.config, step.mesh_sizes
    mesh = make_mesh(devices, sizes)
    tensor = sizes["tensor"]
    kv_heads = sorted({config.attention_shape(kind.split("+")[0])[0] for kind in config.layer_kinds()})
    if config.num_attention_heads % tensor or (not config.mla and any(n % tensor for n in kv_heads)):
        raise UserError(f"--mesh tensor={tensor} must divide the attention heads ({config.num_attention_heads}) and "
                        f"key/value heads ({' and '.join(map(str, kv_heads))}) of {config.name}.")
    if step.seq_len % 128:
        raise UserError(f"--seq must be a multiple of 128 (the attention kernel's tile), not {step.seq_len}.")
    if config.learned_positions and step.seq_len > config.learned_positions:
        raise UserError(f"--seq {step.seq_len} is longer than the {config.learned_positions} learned positions of "
                        f"{config.name}.")
    layout = _parameter_layout(config, sizes, experts_on_fsdp=step.shard_exp_on_fsdp)
    batch_axes = tuple(axis for axis in ("data", "fsdp", "expert") if sizes[axis] > 1) or None

    def sharded(shape, spec, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))

    params = {name: sharded(shape, spec, jnp.dtype(step.weight_dtype)) for name, (shape, spec) in layout.items()}
    mu = {name: sharded(shape, spec, jnp.dtype(step.state.first_moment)) for name, (shape, spec) in layout.items()}
    opt = {"mu": mu, "nu": params, "count": sharded((), (), jnp.int32)}
    global_batch = batch_per_device * len(devices)
    tokens = sharded((global_batch, step.seq_len + 1), (batch_axes, None), jnp.int32)
    train_step = _train_step(config, step, mesh, batch_axes)
    shardings = jax.tree_util.tree_map(lambda s: s.sharding, (params, opt))
    jitted = jax.jit(train_step, donate_argnums=(0, 1), out_shardings=(*shardings, None))
    return jitted, [params, opt, tokens]


def _train_step(config: ModelConfig, step: Step, mesh, batch_axes):
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import NamedSharding, PartitionSpec as P

    compute = jnp.bfloat16
    # MaxText's activation_embed rule: the residual stream's embedding over `tensor`. Left whole, every device of
    # a tensor group would keep the same full-width copy of each layer's input: 8x the saved activations at
    # tensor=8 (GPT-3 175B on v5p-1024, fsdp 64 x tensor 8: 144 GiB of layer inputs per device instead of 18).
    activations = NamedSharding(mesh, P(batch_axes, None, _fits(config.hidden_size, ("tensor",), step.mesh_sizes)))
    batch_shards = 1
    for axis in batch_axes or ():
        batch_shards *= mesh.shape[axis]
    # The loss: the LM head gathered once in bf16 (over fsdp; vocabulary kept over tensor, as the weight is),
    # hidden states cut into [chunk, batch, token, embed] pieces (see cross_entropy), or in one piece MaxText's
    # untiled loss (see whole_cross_entropy).
    vocab_axis = _fits(config.vocab_size, ("tensor",), step.mesh_sizes)
    vocab_shards = mesh.shape["tensor"] if vocab_axis else 1
    gathered_head = NamedSharding(mesh, P(None, vocab_axis))
    chunk_sharding = NamedSharding(mesh, P(None, batch_axes, None, None))
    whole_logits = NamedSharding(mesh, P(batch_axes, None, vocab_axis))  # MaxText's logits: batch, length, vocab
    attention = _attention(config, step.seq_len, mesh, batch_axes)
    moe = (_dropless_moe if step.moe == "dropless" else _moe)(config, mesh, batch_axes) if config.moe else None

    def matmul(x, w, spec):
        if step.dtype == "fp8":
            x, w = x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)
        else:
            w = w.astype(compute)
        return jnp.einsum(spec, x, w, preferred_element_type=compute)

    def norm(x, w, name):
        x32 = x.astype(jnp.float32)
        if config.norm_type == "layer":
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
            x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + config.rms_norm_eps)
            return (x32 * w[name] + w[name + "_bias"]).astype(compute)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + config.rms_norm_eps)
        return (x32 * w[name]).astype(compute)

    def act(x):
        return jax.nn.gelu(x, approximate=True) if "gelu" in config.hidden_act else jax.nn.silu(x)

    def glu(gate, up):
        if config.expert_bias:  # GPT-OSS's clamped SwiGLU: (up + 1) * gate * sigmoid(1.702 gate)
            gate, up = jnp.minimum(gate, 7.0), jnp.clip(up, -7.0, 7.0)
            return (up + 1) * gate * jax.nn.sigmoid(1.702 * gate)
        return act(gate) * up

    def dense_mlp(y, w):
        up = matmul(y, w["w_up"], "bsd,df->bsf") + (w["b_up"].astype(compute) if config.mlp_bias else 0)
        if config.mlp_gated:
            gate = matmul(y, w["w_gate"], "bsd,df->bsf") + (w["b_gate"].astype(compute) if config.mlp_bias else 0)
            hidden = glu(checkpoint_name(gate, "mlpwi"), checkpoint_name(up, "mlpwi"))
        else:
            hidden = act(checkpoint_name(up, "mlpwi"))
        return checkpoint_name(matmul(hidden, w["w_down"], "bsf,fd->bsd")
                               + (w["b_down"].astype(compute) if config.mlp_bias else 0), "mlpwo")

    def layer(kind, x, w):
        window, mlp_kind = kind.split("+")
        x = checkpoint_name(x, "decoder_layer_input")
        y = norm(x, w, "attn_norm")
        o = attention(y, w, window, matmul, lambda v, weight, name: norm(v, {name: weight}, name))
        o = checkpoint_name(matmul(checkpoint_name(o, "context"), w["wo"], "bsf,fd->bsd"), "out_proj")
        if config.output_bias:
            o = o + w["bo"].astype(compute)
        if config.sandwich_norm:
            o = norm(o, w, "post_attn_norm")
        x = jax.lax.with_sharding_constraint(x + o, activations)
        y = norm(x, w, "mlp_norm")
        if mlp_kind == "moe" and config.moe_dense_mlp:
            out = dense_and_experts(x, y, w)
        else:
            out = moe(y, w, matmul, glu, dense_mlp) if mlp_kind == "moe" else dense_mlp(y, w)
        if config.sandwich_norm:
            out = norm(out, w, "post_mlp_norm")
        x = x + out
        if config.layer_scalar:
            x = x * w["layer_scalar"].astype(compute)
        return jax.lax.with_sharding_constraint(x, activations)

    def dense_and_experts(x, y, w):
        """Gemma 4's MoE layer (Gemma4TextDecoderLayer): the dense MLP on the layer's normed input and the routed
        experts on the input normed on its own, each normed after, summed; the router reads the input's RMS norm
        without a scale, times its own learned scale and 1 / sqrt(d)."""
        dense = norm(dense_mlp(y, w), w, "post_mlp_norm_1")
        x32 = x.astype(jnp.float32)
        unscaled = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + config.rms_norm_eps)
        router_input = unscaled * w["router_scale"].astype(jnp.float32) * config.hidden_size ** -0.5
        routed = moe(norm(x, w, "pre_mlp_norm_2"), w, matmul, glu, dense_mlp, router_input)
        return dense + norm(routed, w, "post_mlp_norm_2")

    custom = custom_remat(step.remat)
    if custom is not None:  # MaxText's `remat_policy: custom`; its fused qkv_proj is q, k and v here
        def named(place):
            names = {name for name, chosen in custom.items() if chosen == place}
            if "qkv_proj" in names:
                names = names - {"qkv_proj"} | {"query_proj", "key_proj", "value_proj"}
            return sorted(names)

        step_policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=named("device"), names_which_can_be_offloaded=named("offload"),
            offload_src="device", offload_dst="pinned_host")
    policy = step_policy if custom is not None else {
        "none": None,
        "full": jax.checkpoint_policies.nothing_saveable,
        "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        # MaxText's `remat_policy: custom` of the published Llama 3.1 70B v6e-256 recipe: each layer's input
        # and its q/k/v projections go to host memory, everything else is recomputed.
        "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(OFFLOADED),
            offload_src="device", offload_dst="pinned_host"),
    }[step.remat]
    slots = layer_slots(config)
    segments = []  # (repeats, [(prefix, kind)]) in the plan's order
    for prefix, kind, repeats in slots:
        segment = prefix.split(".")[0]
        if not segments or segments[-1][0] != segment:
            segments.append((segment, repeats, []))
        segments[-1][2].append((prefix, kind))

    def segment_body(members):
        def body(x, w):
            for prefix, kind in members:
                own = {name[len(prefix):]: value for name, value in w.items() if name.startswith(prefix)}
                one = (lambda k: lambda h, p: layer(k, h, p))(kind)
                one = one if step.remat == "none" else jax.checkpoint(one, policy=policy, prevent_cse=False)
                x = one(x, own)
            return x, None
        return body

    top = {"embed", "positions", "final_norm", "final_norm_bias", "lm_head"}

    def loss_fn(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = jnp.take(params["embed"].astype(compute), inputs, axis=0)
        if config.learned_positions:
            x = x + params["positions"][: step.seq_len].astype(compute)[None]
        if config.model_type.startswith("gemma"):  # Gemma scales the embeddings by sqrt(hidden_size)
            x = x * jnp.asarray(config.hidden_size ** 0.5, compute)
        x = jax.lax.with_sharding_constraint(x, activations)
        for segment, _, members in segments:
            names = [n for n in params if n not in top and any(n.startswith(p) for p, _ in members)]
            x, _ = jax.lax.scan(segment_body(members), x, {n: params[n] for n in names})
        x = norm(x, params, "final_norm")
        head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
        head = jax.lax.with_sharding_constraint(head.astype(compute), gathered_head)
        chunks = step.vocab_tiling or loss_chunks(step.seq_len, x.shape[0] // batch_shards,
                                                  config.vocab_size // vocab_shards)
        cap = config.final_logit_softcapping

        if chunks == 1:  # MaxText's num_vocab_tiling=1: its output head and cross-entropy as they are
            logits = jax.lax.with_sharding_constraint(matmul(x, head, "bsd,dv->bsv"), whole_logits)
            if cap:  # decoders.py apply_output_head: the soft cap in the logits' dtype, then cast_logits_to_fp32
                logits = jnp.tanh(logits / cap) * cap
            return whole_cross_entropy(logits.astype(jnp.float32), targets)

        def logits_of(chunk):
            logits = matmul(chunk, head, "bsd,dv->bsv").astype(jnp.float32)
            return cap * jnp.tanh(logits / cap) if cap else logits

        return cross_entropy(logits_of, x, targets, chunks, chunk_sharding)

    def train_step(params, opt, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        # MaxText's grad_dtype (train.py's train_step): the fp32 gradients cast right after value_and_grad, before
        # the optimizer; gradients of bf16 weights are left as they are.
        grad_dtype = jnp.dtype(step.grad_dtype)
        grads = jax.tree_util.tree_map(lambda g: g.astype(grad_dtype) if g.dtype == jnp.float32 else g, grads)
        params, opt = _adamw(params, grads, opt)
        return params, opt, loss

    return train_step


def loss_chunks(seq_len: int, batch_per_device: int, vocab_per_device: int) -> int:
    """How many pieces of the sequence the loss is computed in: the fewest that divide `seq_len` and keep one
    piece's fp32 logits per device within LOSS_CHUNK_BYTES (MaxText's vocabulary tiling, `num_vocab_tiling`)."""
    for chunks in range(1, seq_len + 1):
        if seq_len % chunks == 0 and batch_per_device * (seq_len // chunks) * vocab_per_device * 4 <= LOSS_CHUNK_BYTES:
            return chunks
    return seq_len


def cross_entropy(logits_of, x, targets, chunks: int, sharding=None):
    """Mean causal-LM cross-entropy, logsumexp(logits) - logits[target] over all tokens, computed over `chunks`
    pieces of the sequence under `jax.lax.scan` with a rematerialised body: the forward keeps only each piece's
    hidden states, the backward recomputes one piece's logits at a time, so the [batch, seq, vocab] logits and
    their gradient are never whole in memory. `logits_of([batch, piece, embed]) -> fp32 [batch, piece, vocab]`;
    `sharding` places the [chunk, batch, piece, embed] stack."""
    import jax
    import jax.numpy as jnp

    batch, seq, embed = x.shape
    pieces = x.reshape(batch, chunks, seq // chunks, embed).swapaxes(0, 1)
    if sharding is not None:
        pieces = jax.lax.with_sharding_constraint(pieces, sharding)
    labels = targets.reshape(batch, chunks, seq // chunks).swapaxes(0, 1)

    @jax.checkpoint
    def piece_loss(total, inputs):
        hidden, label = inputs
        logits = logits_of(hidden)
        picked = jnp.take_along_axis(logits, label[..., None], axis=-1)[..., 0]
        return total + jnp.sum(jax.nn.logsumexp(logits, axis=-1) - picked), None

    total, _ = jax.lax.scan(piece_loss, jnp.zeros((), jnp.float32), (pieces, labels))
    return total / (batch * seq)


def whole_cross_entropy(logits, targets):
    """Mean causal-LM cross-entropy of fp32 [batch, seq, vocab] logits as MaxText computes it without vocabulary
    tiling (train.py `loss_fn`): one-hot targets into max_utils `cross_entropy_with_logits`, whose custom VJP
    keeps exp(logits - max) and its sum for the backward and returns softmax - one_hot as the logits' gradient.
    No rematerialisation: the forward's logits are kept for the backward, not recomputed from the hidden states.
    Compiled, libtpu keeps one [batch, seq, vocab] array in the logits' matmul dtype (bf16) between the two and
    recomputes the fp32 exponentials from it; `cross_entropy` in one rematerialised piece, picking the target with
    `take_along_axis`, held an fp32 [batch, seq, vocab] besides (tests/test_llm_loss.py)."""
    import jax
    import jax.numpy as jnp

    batch, seq, vocab = logits.shape
    loss = _maxtext_cross_entropy(logits, jax.nn.one_hot(targets, vocab, dtype=logits.dtype))
    return jnp.sum(loss) / (batch * seq)


def _maxtext_cross_entropy(logits, one_hot):
    """MaxText max_utils.cross_entropy_with_logits (T5X's) without the z-loss (base.yml z_loss_multiplier: 0):
    per-token -sum(one_hot * log_softmax(logits)), with its custom VJP."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def xent(logits, one_hot):
        return -jnp.sum(one_hot * jax.nn.log_softmax(logits, axis=-1), axis=-1)

    def forward(logits, one_hot):
        shifted = logits - logits.max(axis=-1, keepdims=True)
        exp_shifted = jnp.exp(shifted)
        sum_exp = jnp.sum(exp_shifted, axis=-1, keepdims=True)
        return -jnp.sum(one_hot * (shifted - jnp.log(sum_exp)), axis=-1), (one_hot, exp_shifted, sum_exp)

    def backward(residuals, g):
        one_hot, exp_shifted, sum_exp = residuals
        return g[..., None] * (exp_shifted / sum_exp - one_hot), None

    xent.defvjp(forward, backward)
    return xent(logits, one_hot)


def _adamw(params, grads, opt, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1):
    """AdamW (decoupled weight decay, bias-corrected moments), the state in the dtypes OPT holds (optax's default,
    which MaxText keeps: the weights'; the first moment in --mu-dtype), one fused update per parameter."""
    import jax
    import jax.numpy as jnp

    count = opt["count"] + 1
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)
    # Computed in fp32 and stored back in each moment's own dtype.
    mu = jax.tree_util.tree_map(lambda m, g: (b1 * m + (1 - b1) * g.astype(jnp.float32)).astype(m.dtype),
                                opt["mu"], grads)
    nu = jax.tree_util.tree_map(lambda v, g: (b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32))).astype(v.dtype),
                                opt["nu"], grads)
    new = jax.tree_util.tree_map(
        lambda p, m, v: (p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * p)).astype(p.dtype),
        params, mu, nu)
    return new, {"mu": mu, "nu": nu, "count": count}


def _rope(x, theta: float, fraction: float = 1.0):
    """Rotary positions; FRACTION < 1: Gemma 4's "proportional" RoPE, whose frequencies past that fraction of the
    head's pairs are 0 (those dimensions are not turned)."""
    import jax.numpy as jnp

    _, s, _, hd = x.shape
    frequencies = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    if fraction < 1:
        frequencies = jnp.where(jnp.arange(hd // 2) < int(fraction * hd // 2), frequencies, 0.0)
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * frequencies[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _pallas_kernels(generation: str) -> bool:
    """Whether Mosaic compiles the step's Pallas kernels (splash attention) for GENERATION."""
    from tpuprof import targets

    target = targets.TARGETS.get(generation)
    return target is None or target.pallas_kernels


def generation_of(devices) -> str:
    """The TPU generation (v6e) of the devices a step is compiled for."""
    from tpuprof import targets

    return targets.from_device_type(devices[0].device_kind) or ""


def compiler_options(generation: str) -> dict:
    """The flags a --model step is compiled with on GENERATION (see COMPILER_OPTIONS, RECIPE_VMEM_LIMIT), but for
    those the job's LIBTPU_INIT_ARGS set: libtpu reads that variable as it loads, and a compile's own options
    override it, so a flag of the user's recipe (the TPU7x recipes' scheduler memory limit of 150%) would give way
    to tpuprof's default for it."""
    import os

    named = {word.lstrip("-").split("=", 1)[0] for word in os.environ.get("LIBTPU_INIT_ARGS", "").split()}
    chosen = {**COMPILER_OPTIONS, **RECIPE_VMEM_LIMIT.get(generation, {})}
    return {flag: value for flag, value in chosen.items() if flag not in named}


def _attention(config: ModelConfig, seq_len: int, mesh, batch_axes):
    """Attention through the Pallas splash-attention kernel, inside shard_map (batch over the batch axes, heads
    over `tensor`), tiled for the mesh's TPU generation (SPLASH_BLOCK), one kernel per mask the layers use:
    causal (full), causal within `sliding_window` tokens (sliding), causal within chunks of
    `attention_chunk_size` tokens (chunked). The kernel applies Gemma 2's logit soft-cap and GPT-OSS's sinks.
    Projections: GQA (q, k, v; optional biases and per-head QK-norm) or DeepSeek's multi-head latent attention
    (low-rank q and a compressed kv, a shared RoPE key)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    from jax.sharding import PartitionSpec as P

    c = config
    h, hd = c.num_attention_heads, c.head_dim
    local_heads = h // mesh.shape["tensor"]
    generation = generation_of(mesh.devices.flat)
    # A tile divides the sequence (a multiple of 128).
    block = math.gcd(seq_len, SPLASH_BLOCK.get(generation, DEFAULT_SPLASH_BLOCK))
    # The fused backward kernel computes dQ with dK and dV; otherwise dQ has a kernel and blocks of its own.
    dq = ({"use_fused_bwd_kernel": True} if SPLASH_FUSED_BACKWARD.get(generation, False)
          else {"block_q_dq": block, "block_kv_dq": block})
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, **dq)
    shape = (seq_len, seq_len)
    mask_of = {"full": lambda: masks.CausalMask(shape),
               "sliding": lambda: masks.LocalMask(shape, window_size=(c.sliding_window, 0), offset=0),
               "chunked": lambda: masks.ChunkedCausalMask(shape, chunk_size=c.attention_chunk_size)}
    spec = P(batch_axes, "tensor", None, None)

    def kernel_for(window):
        # A new kernel at each call: one kept and called again (by the next layer of its kind, under remat) has
        # its mask arrays traced as values, and jit (0.10.2) then makes every such array an argument of the
        # program instead of a constant in it, so the compiled module no longer says which blocks each kernel
        # skips (tpuprof.analyses.attention_kernels reads them). Splash caches the processed mask: it is worked
        # out once.
        if not _pallas_kernels(generation):  # v2, v3: splash's XLA reference, holding [seq, seq] fp32 scores a head
            kernel = _xla_attention(c, window, shape)
        else:
            mask = masks.MultiHeadMask([mask_of[window]() for _ in range(local_heads)])
            kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                            attn_logits_soft_cap=c.attn_logit_softcapping or None)
        if c.attention_sinks:
            @jax.shard_map(mesh=mesh, in_specs=(spec, spec, spec, P("tensor")), out_specs=spec, check_vma=False)
            def local(q, k, v, sinks):
                return jax.vmap(lambda q, k, v: kernel(q, k, v, sinks=sinks))(q, k, v)
        else:
            @jax.shard_map(mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
            def local(q, k, v):
                return jax.vmap(kernel)(q, k, v)
        return local

    qk_dim = c.qk_nope_head_dim + c.qk_rope_head_dim if c.mla else hd
    scale = (c.query_pre_attn_scalar or qk_dim) ** -0.5
    theta = c.rope_theta

    def heads_first(x):
        return x.transpose(0, 2, 1, 3)

    def attention(y, w, window, matmul, norm):
        b, s, _ = y.shape
        if c.mla:
            q = (matmul(norm(matmul(y, w["wq_a"], "bsd,dr->bsr"), w["q_a_norm"], "q_a_norm"), w["wq_b"], "bsr,rf->bsf")
                 if c.q_lora_rank else matmul(y, w["wq"], "bsd,df->bsf"))
            q = checkpoint(q, "query_proj").reshape(b, s, h, qk_dim)
            q = jnp.concatenate([q[..., :c.qk_nope_head_dim], _rope(q[..., c.qk_nope_head_dim:], theta)], axis=-1)
            compressed = checkpoint(matmul(y, w["wkv_a"], "bsd,dr->bsr"), "key_proj")
            latent = norm(compressed[..., :c.kv_lora_rank], w["kv_a_norm"], "kv_a_norm")
            k_rope = _rope(compressed[..., c.kv_lora_rank:].reshape(b, s, 1, c.qk_rope_head_dim), theta)
            kv_up = checkpoint(matmul(latent, w["wkv_b"], "bsr,rf->bsf"), "value_proj")
            kv_up = kv_up.reshape(b, s, h, c.qk_nope_head_dim + c.v_head_dim)
            k = jnp.concatenate([kv_up[..., :c.qk_nope_head_dim],
                                 jnp.broadcast_to(k_rope, (b, s, h, c.qk_rope_head_dim))], axis=-1)
            v = kv_up[..., c.qk_nope_head_dim:]
            value_dim = c.v_head_dim
        else:
            kv_heads, head = c.attention_shape(window)
            shared = window == "full" and c.global_k_eq_v  # Gemma 4's full layers: the keys are the values
            q, k = (checkpoint(matmul(y, w[n], "bsd,df->bsf"), name)
                    for n, name in (("wq", "query_proj"), ("wk", "key_proj")))
            v = k if shared else checkpoint(matmul(y, w["wv"], "bsd,df->bsf"), "value_proj")
            if c.attention_bias:
                q, k = q + w["bq"].astype(q.dtype), k + w["bk"].astype(q.dtype)
                v = k if shared else v + w["bv"].astype(q.dtype)
            q, k, v = q.reshape(b, s, h, head), k.reshape(b, s, kv_heads, head), v.reshape(b, s, kv_heads, head)
            if c.qk_norm:
                q, k = norm(q, w["q_norm"], "q_norm"), norm(k, w["k_norm"], "k_norm")
            if c.v_norm:  # an RMS norm without a scale
                v32 = v.astype(jnp.float32)
                v = (v32 * jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + c.rms_norm_eps)).astype(v.dtype)
            if not c.learned_positions:
                full = window == "full" and c.global_rope_theta
                layer_theta = c.global_rope_theta if full else theta
                fraction = c.global_rope_fraction if full else 1.0
                q, k = _rope(q, layer_theta, fraction), _rope(k, layer_theta, fraction)
            value_dim = head
        q = q * jnp.asarray(scale, q.dtype)
        args = [heads_first(q), heads_first(k), heads_first(v)]
        if c.attention_sinks:
            args.append(w["sinks"].astype(jnp.float32))
        out = kernel_for(window)(*args)
        return heads_first(out).reshape(b, s, h * value_dim)

    def checkpoint(x, name):
        from jax.ad_checkpoint import checkpoint_name

        return checkpoint_name(x, name)

    return attention


def _xla_attention(config: ModelConfig, window: str, shape: tuple[int, int]):
    """Splash's XLA reference attention (splash_attention_kernel.attention_reference) over one sequence's heads,
    called as a splash kernel is (q [heads, seq, d], k and v [kv heads, seq, d][, sinks [heads]]), query head i
    reading kv head i // (heads / kv heads) as splash does, with the layer's mask (causal, sliding, chunked)
    computed from positions rather than held as a [seq, seq] constant."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    query, key = jnp.arange(shape[0])[:, None], jnp.arange(shape[1])[None, :]
    allowed = query >= key
    if window == "sliding":
        allowed &= query - key <= config.sliding_window  # splash's LocalMask(window_size=(window, 0))
    elif window == "chunked":
        allowed &= query // config.attention_chunk_size == key // config.attention_chunk_size

    def one_head(q, k, v, sink):
        return splash.attention_reference(allowed, q, k, v, None, sink,
                                          attn_logits_soft_cap=config.attn_logit_softcapping or None)

    def attend(q, k, v, sinks=None):
        heads, groups = q.shape[0], k.shape[0]
        q = q.reshape(groups, heads // groups, *q.shape[1:])
        sinks = None if sinks is None else sinks.reshape(groups, heads // groups)
        each = jax.vmap(jax.vmap(one_head, in_axes=(0, None, None, 0 if sinks is not None else None)),
                        in_axes=(0, 0, 0, 0 if sinks is not None else None))
        out = each(q, k, v, sinks)
        return out.reshape(heads, *out.shape[2:]).astype(q.dtype)

    return attend


def _moe(config: ModelConfig, mesh, batch_axes):
    """Top-k routing with a capacity per expert, dispatched and combined by one-hot einsums over groups of
    MOE_GROUP tokens (GShard / MaxText's dense-matmul MoE); router and expert biases where the model has them
    (GPT-OSS; DeepSeek-V3's selection bias), and a shared expert (Qwen-MoE's gated, DeepSeek's and Llama 4's not)."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import NamedSharding, PartitionSpec as P

    c = config
    e, k = c.num_experts, c.num_experts_per_tok
    grouped = NamedSharding(mesh, P(batch_axes, None, None))
    masks = NamedSharding(mesh, P(batch_axes, None, None, None))  # [groups, tokens, experts, capacity]
    # The experts' side [experts, groups, capacity, width] keeps its groups on the batch axes the experts are
    # not over (MaxText's activation_exp x activation_batch_no_exp). Constrained on the experts alone, it leaves
    # the partitioner free to meet the experts' weights (divided over fsdp) by gathering every device's groups,
    # and the expert MLP's activations are the whole slice's: Mixtral 8x7B on v6e-256 holds
    # bf16[8,24576,160,14336] values of 840 GiB each per device, where its own 96 groups are 3.3 GiB.
    expert_axis = _fits(e, ("expert",), mesh.shape)
    own_groups = tuple(axis for axis in batch_axes or () if not (expert_axis and axis == "expert")) or None
    expert_side = NamedSharding(mesh, P(expert_axis, own_groups, None, None))
    expert_hidden = NamedSharding(mesh, P(expert_axis, own_groups, None,
                                          _fits(c.moe_intermediate_size, ("tensor",), mesh.shape)))
    # Over an expert axis the dispatch and combine einsums run on the device's own groups for every expert, and
    # the experts' side is reached by an all-to-all between the two layouts; left to choose, the partitioner
    # gathers the whole slice's tokens for the einsum instead (DeepSeek-V3 on tpu7x-256 at fsdp 64 x expert 4:
    # bf16[16384,512,7168], 112 GiB per device).
    local = NamedSharding(mesh, P(None, batch_axes, None, None)) if expert_axis else None

    def moe(y, w, matmul, glu, dense_mlp, router_input=None):
        b, s, d = y.shape
        group = min(MOE_GROUP, s)
        capacity = max(1, int(-(-k * group * CAPACITY_FACTOR // e)))
        tokens = jax.lax.with_sharding_constraint(y.reshape(b * s // group, group, d), grouped)
        routed_by = tokens if router_input is None else jax.lax.with_sharding_constraint(
            router_input.reshape(b * s // group, group, d), grouped)
        logits = jnp.einsum("gtd,de->gte", routed_by.astype(jnp.float32), w["router"].astype(jnp.float32))
        if c.router_bias:
            logits = logits + w["router_bias"].astype(jnp.float32)
        scores = jax.nn.softmax(logits, axis=-1)
        selection = scores + w["router_score_bias"].astype(jnp.float32) if c.router_score_bias else scores
        _, chosen = jax.lax.top_k(selection, k)  # [g, t, k]
        weights = _expert_weights(c, scores, chosen, w)
        onehot = jax.nn.one_hot(chosen, e, dtype=jnp.int32)  # [g, t, k, e]
        position = jnp.cumsum(onehot.reshape(onehot.shape[0], group * k, e), axis=1).reshape(onehot.shape) - 1
        keep = (position < capacity) & (onehot > 0)
        slot = jax.nn.one_hot(jnp.where(keep, position, capacity), capacity, dtype=y.dtype)  # [g, t, k, e, c]
        dispatch = jnp.einsum("gtke,gtkec->gtec", keep.astype(y.dtype), slot)
        combine = jnp.einsum("gtk,gtke,gtkec->gtec", weights.astype(y.dtype), keep.astype(y.dtype), slot)
        dispatch = jax.lax.with_sharding_constraint(dispatch, masks)
        combine = jax.lax.with_sharding_constraint(combine, masks)
        routed = jnp.einsum("gtd,gtec->egcd", tokens, dispatch)
        if local is not None:
            routed = jax.lax.with_sharding_constraint(routed, local)
        routed = jax.lax.with_sharding_constraint(routed, expert_side)
        gate = matmul(routed, w["we_gate"], "egcd,edf->egcf")
        up = matmul(routed, w["we_up"], "egcd,edf->egcf")
        if c.expert_bias:
            gate = gate + w["be_gate"].astype(gate.dtype)[:, None, None, :]
            up = up + w["be_up"].astype(up.dtype)[:, None, None, :]
        gate = jax.lax.with_sharding_constraint(gate, expert_hidden)
        up = jax.lax.with_sharding_constraint(up, expert_hidden)
        # Named as the dense MLP's activations (and MaxText's dense_matmul MoE's), for a custom remat policy.
        out = matmul(glu(checkpoint_name(gate, "mlpwi"), checkpoint_name(up, "mlpwi")), w["we_down"],
                     "egcf,efd->egcd")
        if c.expert_bias:
            out = out + w["be_down"].astype(out.dtype)[:, None, None, :]
        out = checkpoint_name(jax.lax.with_sharding_constraint(out, expert_side), "mlpwo")
        if local is not None:
            out = jax.lax.with_sharding_constraint(out, local)
        out = jnp.einsum("egcd,gtec->gtd", out, combine)
        out = jax.lax.with_sharding_constraint(out, grouped).reshape(b, s, d)
        if c.shared_expert_intermediate_size:
            out = out + _shared_expert(c, y, w, matmul, glu)
        return out

    return moe


def _dropless_moe(config: ModelConfig, mesh, batch_axes, interpret: bool = False):
    """MaxText's dropless MoE (sparse_matmul with megablox): each device sorts its own tokens' top-k choices by
    expert and runs the experts' MLP as grouped matmuls over the group sizes the routing counted
    (jax.experimental.pallas.ops.tpu.megablox.gmm, tiles of at most MaxText's defaults, tile_batch_seq 512 and
    tile_activation_dim / tile_weight_dim 1024), so no token is dropped and no one-hot dispatch is
    built. As MaxText's shard_map does: the experts' weights whole on each device (gathered over fsdp), their
    width over `tensor` with a sum over `tensor` after the down projection; routing, biases and the shared expert
    as in `_moe`. No expert parallelism (refused where the options are read). INTERPRET: Pallas' interpreter, to
    run the kernels on a CPU (tests)."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.experimental.pallas.ops.tpu.megablox import gmm
    from jax.sharding import PartitionSpec as P

    c = config
    e, k = c.num_experts, c.num_experts_per_tok
    width = _fits(c.moe_intermediate_size, ("tensor",), mesh.shape)
    specs = {"router": P(), "router_bias": P(), "router_score_bias": P(), "expert_scale": P(),
             "we_gate": P(None, None, width),
             "we_up": P(None, None, width), "we_down": P(None, width, None), "be_gate": P(None, width),
             "be_up": P(None, width), "be_down": P()}
    tokens_spec = P(batch_axes, None, None)
    # The backward pass runs the kernels with the same tiles over the transposed shapes, so one tile serves the
    # embedding and the expert width alike: a multiple of 128 (the TPU's lane width) within both (the last tile
    # of a width that is not a multiple is partial).
    local_width = c.moe_intermediate_size // (mesh.shape["tensor"] if width else 1)
    if min(c.hidden_size, local_width) < 128:
        raise UserError(f"--moe dropless needs an embedding and a per-device expert width (moe_intermediate_size "
                        f"{c.moe_intermediate_size} / tensor) of at least 128, the grouped matmul's tile: "
                        f"{c.name} has {c.hidden_size} and {local_width}.")
    tile = min(1024, min(c.hidden_size, local_width) // 128 * 128)

    def moe(y, w, matmul, glu, dense_mlp, router_input=None):
        compute = y.dtype
        # The experts' weights enter the shard_map in the compute dtype, as MaxText's generate_kernels casts them
        # (jnp.asarray(kernel, dtype)) before its sparse_matmul's shard_map: the fsdp gather of each layer's
        # experts, and their gradients' reduction, then move bf16 rather than the fp32 weights (half the bytes,
        # and half the gathered temporaries: 7 GiB per DeepSeek-V3 expert weight, not 14).
        experts = {name: w[name].astype(compute) if name.startswith("we_") else w[name]
                   for name in specs if name in w}

        @jax.shard_map(mesh=mesh, in_specs=(tokens_spec, tokens_spec, {name: specs[name] for name in experts}),
                       out_specs=tokens_spec, check_vma=False)
        def local(y, routed_by, w):
            b, s, d = y.shape
            x = y.reshape(b * s, d)
            logits = routed_by.reshape(b * s, d).astype(jnp.float32) @ w["router"].astype(jnp.float32)
            if c.router_bias:
                logits = logits + w["router_bias"].astype(jnp.float32)
            scores = jax.nn.softmax(logits, axis=-1)
            selection = scores + w["router_score_bias"].astype(jnp.float32) if c.router_score_bias else scores
            _, chosen = jax.lax.top_k(selection, k)  # [tokens, k]
            weights = _expert_weights(c, scores, chosen, w)
            expert_of = chosen.reshape(-1)
            order = jnp.argsort(expert_of, stable=True)  # the token-choices, grouped by expert
            sorted_expert = expert_of[order]
            sizes = jnp.bincount(expert_of, length=e).astype(jnp.int32)
            rows = x[order // k]

            def grouped(lhs, weight):
                tiling = (math.gcd(lhs.shape[0], 512), tile, tile)
                return gmm(lhs, weight.astype(compute), sizes, preferred_element_type=compute, tiling=tiling,
                           interpret=interpret)

            gate, up = grouped(rows, w["we_gate"]), grouped(rows, w["we_up"])
            if c.expert_bias:
                gate = gate + w["be_gate"].astype(compute)[sorted_expert]
                up = up + w["be_up"].astype(compute)[sorted_expert]
            # The names the dense MLP's activations have (MaxText names the grouped matmuls' outputs so too), for
            # a custom remat policy to save or offload.
            hidden = glu(checkpoint_name(gate, "mlpwi"), checkpoint_name(up, "mlpwi"))
            out = grouped(hidden, w["we_down"])  # [tokens x k, d]: partial sums over `tensor`
            if width:
                out = jax.lax.psum(out, width)
            if c.expert_bias:
                out = out + w["be_down"].astype(compute)[sorted_expert]
            out = checkpoint_name(out, "mlpwo")
            out = out[jnp.argsort(order)].reshape(b * s, k, d)
            return jnp.einsum("tkd,tk->td", out, weights.astype(compute)).reshape(b, s, d)

        out = local(y, y if router_input is None else router_input, experts)
        if c.shared_expert_intermediate_size:
            out = out + _shared_expert(c, y, w, matmul, glu)
        return out

    return moe


def _expert_weights(config: ModelConfig, scores, chosen, w):
    """The chosen experts' weights: their router probabilities; Gemma 4 (Gemma4TextRouter) renormalises them over
    the top k and multiplies each by its expert's learned scale."""
    import jax.numpy as jnp

    weights = jnp.take_along_axis(scores, chosen, axis=-1)
    if config.moe_dense_mlp:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True) * w["expert_scale"].astype(jnp.float32)[chosen]
    return weights


def _shared_expert(config: ModelConfig, y, w, matmul, glu):
    """The shared expert every token also runs (Qwen-MoE's gated by a sigmoid, DeepSeek's and Llama 4's not)."""
    import jax
    import jax.numpy as jnp

    shared = matmul(glu(matmul(y, w["ws_gate"], "bsd,df->bsf"), matmul(y, w["ws_up"], "bsd,df->bsf")),
                    w["ws_down"], "bsf,fd->bsd")
    if config.shared_expert_gate:
        shared = shared * jax.nn.sigmoid(
            jnp.einsum("bsd,do->bso", y.astype(jnp.float32), w["ws_router"])).astype(y.dtype)
    return shared


class Spec:
    """The LLM step as preflight's Compiler sees a user's SPEC: `program(batch)` builds the step for that many
    sequences per device over all the slice's devices; `digest` keys the compile cache (config, seq, remat,
    dtype, mesh, this file)."""

    kind = "jax"
    batch_step = 1  # the max-batch search counts sequences, not multiples of 8
    preferred_batch = 1
    batch_limit = 256  # sequences per device: the search stops there (a tiny model fits far more than is useful)
    compiles_in_a_child = True  # it pickles: preflight's Compiler compiles it in a child process (compile_child)
    # When even one sequence's offloaded activations exceed the host's memory (the verdict's advice).
    host_advice = "use --remat full (nothing offloaded: each layer's input stays in HBM) or a shorter --seq"

    def __init__(self, step: Step, target: "slices.Slice"):
        from tpuprof.sources import tpu_compile

        self.step = step
        self.target = target
        self.devices = tpu_compile.topology_devices(target)
        self.text = f"--model {step.config.name}"
        self.factory_name = "llm"
        self.digest = step.key()
        self.state_bytes_per_device = state_bytes_per_device(step.config, step.mesh_sizes, step.state)

    def __getstate__(self) -> dict:  # for a compile in a child process: the topology's devices do not pickle
        return {name: value for name, value in self.__dict__.items() if name != "devices"}

    def __setstate__(self, state: dict) -> None:
        from tpuprof.sources import tpu_compile

        self.__dict__.update(state, devices=tpu_compile.topology_devices(state["target"]))

    def program(self, batch_size: int, dtype: str | None = None, target: "slices.Slice | None" = None):
        from tpuprof.sources.tpu_compile import Program

        fn, args = build(self.step, self.devices, batch_size)
        return Program("jax", (fn, args), self.text, compiler_options=compiler_options(generation_of(self.devices)))

    def _attention(self) -> str:
        generation = generation_of(self.devices)
        if not _pallas_kernels(generation):
            return f"XLA attention (splash's reference: Pallas kernels do not compile for {generation})"
        return "Pallas splash attention (causal)"

    def model_info(self) -> dict:
        config = self.step.config
        info = {"name": config.name, "source": self.step.source, "parameters": config.parameter_count(),
                "weight_dtype": self.step.weight_dtype,
                "family": config.model_type, "layers": config.num_hidden_layers, "implementation": IMPLEMENTATION,
                "attention": self._attention(), "remat": self.step.remat, "dtype": self.step.dtype,
                "heads": config.num_attention_heads, "head_dim": config.head_dim}
        # The MFU's model FLOPs count, as MaxText does, the weights one token's matmuls use: attention's
        # projections, the MLP (an MoE: router, its top-k experts and any shared expert) and the logits, not
        # the embedding lookup or norms; attention's own matmuls come from heads x (q.k width + value width) / 2.
        info["active_parameters"] = config.matmul_parameter_count()
        if self.step.vocab_tiling is not None:
            info["vocab_tiling"] = self.step.vocab_tiling
        if self.step.mu_dtype is not None:
            info["mu_dtype"] = self.step.mu_dtype
        if self.step.grad_dtype != "float32":
            info["grad_dtype"] = self.step.grad_dtype
        if self.step.shard_exp_on_fsdp:
            info["shard_exp_on_fsdp"] = True
        if config.mla:
            info["attention_width"] = config.num_attention_heads * (config.head_dim + config.v_head_dim) // 2
        kinds = config.layer_kinds()
        widths = {kind.split("+")[0]: config.num_attention_heads * config.attention_shape(kind.split("+")[0])[1]
                  for kind in kinds}
        if len(set(widths.values())) > 1:  # Gemma 4's full layers have heads of their own size
            info["attention_widths"] = dict(sorted(widths.items()))
        if len(set(kinds)) > 1 or config.layer_plan:
            info["layer_kinds"] = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
        windows = {"sliding": config.sliding_window, "chunked": config.attention_chunk_size}
        used = {kind.split("+")[0] for kind in kinds}
        if info.get("layer_kinds") and any(windows[kind] for kind in used if kind in windows):
            info["attention_windows"] = {kind: windows[kind] for kind in sorted(used) if windows.get(kind)}
        not_modelled = [text for flag, text in (
            (config.mtp_layers, f"{config.mtp_layers} multi-token-prediction module(s) (not in the step or the count)"),
            (config.moe and self.step.moe == "dropless" and self.step.dtype == "fp8",
             "fp8 in the experts' grouped matmuls (megablox takes bf16: run in bf16)"),
        ) if flag]
        if not_modelled:
            info["not_modelled"] = not_modelled
        if config.moe:
            info["experts"] = config.num_experts
            info["experts_per_token"] = config.num_experts_per_tok
            info["moe"] = MOE_KINDS[self.step.moe].format(factor=CAPACITY_FACTOR)
        return info
