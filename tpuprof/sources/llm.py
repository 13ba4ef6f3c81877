"""A decoder-only LLM's full train step, built from a Hugging Face config and shapes alone (no weights), sharded
over a TPU slice: what `tpuprof preflight --model llama3.1-8b` (or `--model config.json`) compiles.

The step is what TPU users run (MaxText's layout): token embedding, `num_hidden_layers` decoder layers scanned
with `jax.lax.scan` (one layer's program, compiled once), each RMSNorm -> GQA attention with RoPE through the
Pallas splash-attention kernel (jax.experimental.pallas.ops.tpu.splash_attention, causal) -> RMSNorm -> gated
MLP (SwiGLU; GeGLU for Gemma) or a top-k routed mixture of experts; final RMSNorm, LM head, causal-LM
cross-entropy computed over pieces of the sequence so the fp32 [batch, seq, vocab] logits are never whole in
memory (MaxText's vocabulary tiling), the backward pass, and an AdamW update (fp32 master weights and moments, as MaxText keeps them;
a few lines here rather than a dependency on optax). Weights are fp32, matmuls run in bf16 (`--dtype bf16`)
or with fp8 operands (`--dtype fp8`: e4m3 casts before each matmul, bf16 accumulation).

Sharding (MaxText's default rules, https://github.com/AI-Hypercomputer/maxtext configs/base.yml
logical_axis_rules): parameters and optimizer state are sharded over `fsdp` on their embedding dimension and
over `tensor` on heads / MLP width / vocabulary; experts over `expert`; activations' batch over data x fsdp x
expert. A dimension that an axis does not divide stays whole on that axis.

Not modelled (the figures say so): Gemma's logit soft-capping and sliding-window layers (every layer is full
causal attention), Qwen3's QK-norm weights (a few KB), RoPE scaling variants (same shapes), sequence / context
parallelism, pipeline stages; MoE routes with a capacity factor of 1.25 over groups of tokens (GShard-style
one-hot dispatch einsums), so dropped tokens and load balance are not the real run's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tpuprof.errors import UserError
from tpuprof.sources.mesh import MESH_AXES, make_mesh, parse_mesh  # noqa: F401 - the LLM step's mesh

REMAT_POLICIES = ("none", "full", "dots", "offload")
DTYPES = ("bf16", "fp8")
OFFLOADED = ("decoder_layer_input", "query_proj", "key_proj", "value_proj")  # --remat offload, as MaxText names them
CAPACITY_FACTOR = 1.25
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
    """The fields of a Hugging Face config.json that set the shapes of the train step."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_experts: int = 0  # 0: dense MLP
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 0  # 0: the config does not say (serve's default max model length)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    def parameter_count(self) -> int:
        """Exact for this definition (norm weights included; no biases but Qwen2's q/k/v)."""
        d, h, kv, hd = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attention = d * h * hd + 2 * d * kv * hd + h * hd * d + (h * hd + 2 * kv * hd if self.attention_bias else 0)
        if self.moe:
            mlp = d * self.num_experts + self.num_experts * 3 * d * self.moe_intermediate_size
            if self.shared_expert_intermediate_size:
                mlp += 3 * d * self.shared_expert_intermediate_size + d  # shared expert and its gate
        else:
            mlp = 3 * d * self.intermediate_size
        layer = attention + mlp + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + d

    def digest(self) -> str:
        # The shapes' fields only: the name and the positions trained for change no program.
        fields = {k: v for k, v in self.__dict__.items() if k not in ("name", "max_position_embeddings")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


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
    if key not in names:
        raise UserError(f"unknown model {text!r}: give a Hugging Face config.json or one of {', '.join(names)}.")
    data = json.loads((resources.files("tpuprof") / "llm_configs" / f"{key}.json").read_text())
    return parse_config(data, key, f"tpuprof built-in config {key}"), f"built-in:{key}"


def parse_config(data: Any, name: str, where: str) -> ModelConfig:
    if not isinstance(data, dict):
        raise UserError(f"{where}: a Hugging Face config is a JSON object.")
    if isinstance(data.get("text_config"), dict):  # Gemma 3 and other multimodal configs: the language model
        data = {**data, **data["text_config"]}
    model_type = str(data.get("model_type", ""))

    def number(key, *alternatives, default=None, kind=int):
        for k in (key, *alternatives):
            if data.get(k) is not None:
                value = data[k]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise UserError(f"{where}: {k} must be a positive number, not {value!r}.")
                return kind(value)
        if default is None:
            raise UserError(f"{where}: the config has no {key}; a decoder-only LLM config (Llama, Qwen, Mistral, "
                            f"Gemma, Mixtral) names vocab_size, hidden_size, intermediate_size, num_hidden_layers "
                            f"and num_attention_heads.")
        return default

    hidden = number("hidden_size", "d_model")
    heads = number("num_attention_heads")
    experts = number("num_local_experts", "num_experts", default=0) if any(
        data.get(k) for k in ("num_local_experts", "num_experts")) else 0
    config = ModelConfig(
        name=name, model_type=model_type,
        vocab_size=number("vocab_size"), hidden_size=hidden,
        intermediate_size=number("intermediate_size", default=number("moe_intermediate_size", default=4 * hidden)),
        num_hidden_layers=number("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=number("num_key_value_heads", default=heads),
        head_dim=number("head_dim", default=hidden // heads),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", model_type.startswith("gemma"))),
        attention_bias=bool(data.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        hidden_act=str(data.get("hidden_activation") or data.get("hidden_act") or "silu"),
        rope_theta=number("rope_theta", default=10000.0, kind=float),
        rms_norm_eps=number("rms_norm_eps", default=1e-6, kind=float),
        num_experts=experts,
        num_experts_per_tok=number("num_experts_per_tok", default=2) if experts else 0,
        moe_intermediate_size=(number("moe_intermediate_size", default=number("intermediate_size", default=4 * hidden))
                               if experts else 0),
        shared_expert_intermediate_size=number("shared_expert_intermediate_size", default=0) if experts else 0,
        max_position_embeddings=number("max_position_embeddings", "n_positions", default=0),
    )
    if config.num_attention_heads % config.num_key_value_heads:
        raise UserError(f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                        f"({config.num_key_value_heads}).")
    if experts and config.num_experts_per_tok > experts:
        raise UserError(f"{where}: num_experts_per_tok exceeds the number of experts.")
    return config


# --- state arithmetic ------------------------------------------------------------------------------

def state_bytes_per_device(config: ModelConfig, sizes: dict[str, int]) -> int:
    """fp32 weights and AdamW's two fp32 moments per device, from the sharding rules (no compile): every
    parameter is divided over fsdp x tensor (x expert for the experts' weights) when those divide it; this
    upper-bounds nothing else (gradients, activations, temporaries come on top)."""
    return sum(_per_device(shape, axes, sizes) for shape, axes in _parameter_layout(config, sizes).values()) \
        * ADAM_STATE_BYTES


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
    state_bytes_per_device: int  # their fp32 weights and AdamW moments per device, beyond an even split
    dimensions: dict[str, list[int]]  # mesh axis -> the dimensions it does not divide
    mesh: str | None  # a --mesh for the same devices whose axes divide them all, if there is one

    def to_json(self, per_chip: int) -> dict:
        return {"parameters": self.parameters, "state_bytes_per_chip": self.state_bytes_per_device * per_chip,
                "dimensions": self.dimensions, "mesh": self.mesh}


def unsharded(config: ModelConfig, sizes: dict[str, int]) -> Unsharded | None:
    """What the mesh SIZES leaves whole of CONFIG's parameters (None: every parameter is divided as meant), and
    the largest fsdp/expert axes that would divide it all, the rest of the devices moved to the data axis."""
    meant, placed = _parameter_layout(config, sizes, even_only=False), _parameter_layout(config, sizes)
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
    return Unsharded(names, extra * ADAM_STATE_BYTES, dimensions, mesh)


def _parameter_layout(config: ModelConfig, sizes: dict[str, int],
                      even_only: bool = True) -> dict[str, tuple[tuple, tuple]]:
    """name -> (shape, per-dimension mesh axes) for every parameter (layers stacked on a leading axis). An axis
    that does not divide its dimension is dropped (even_only, as JAX shards); without even_only, the axes meant."""
    c = config
    L, d, h, kv, hd = c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def spec(shape, *axes):
        if not even_only:
            return tuple(shape), tuple(a if a and math.prod(sizes[x] for x in a) > 1 else None for a in axes)
        return tuple(shape), tuple(_fits(dim, a, sizes) if a else None for dim, a in zip(shape, axes))

    fsdp, tensor, expert = ("fsdp",), ("tensor",), ("expert",)
    layout = {
        "embed": spec((c.vocab_size, d), tensor, fsdp),
        "final_norm": spec((d,), None),
        "attn_norm": spec((L, d), None, None),
        "mlp_norm": spec((L, d), None, None),
        "wq": spec((L, d, h * hd), None, fsdp, tensor),
        "wk": spec((L, d, kv * hd), None, fsdp, tensor),
        "wv": spec((L, d, kv * hd), None, fsdp, tensor),
        "wo": spec((L, h * hd, d), None, tensor, fsdp),
    }
    if c.attention_bias:
        layout.update({"bq": spec((L, h * hd), None, tensor), "bk": spec((L, kv * hd), None, tensor),
                       "bv": spec((L, kv * hd), None, tensor)})
    if c.moe:
        e, f = c.num_experts, c.moe_intermediate_size
        layout.update({
            "router": spec((L, d, e), None, fsdp, None),
            "we_gate": spec((L, e, d, f), None, expert, fsdp, tensor),
            "we_up": spec((L, e, d, f), None, expert, fsdp, tensor),
            "we_down": spec((L, e, f, d), None, expert, tensor, fsdp),
        })
        if c.shared_expert_intermediate_size:
            s = c.shared_expert_intermediate_size
            layout.update({"ws_gate": spec((L, d, s), None, fsdp, tensor), "ws_up": spec((L, d, s), None, fsdp, tensor),
                           "ws_down": spec((L, s, d), None, tensor, fsdp), "ws_router": spec((L, d, 1), None, fsdp, None)})
    else:
        f = c.intermediate_size
        layout.update({"w_gate": spec((L, d, f), None, fsdp, tensor), "w_up": spec((L, d, f), None, fsdp, tensor),
                       "w_down": spec((L, f, d), None, tensor, fsdp)})
    if not c.tie_word_embeddings:
        layout["lm_head"] = spec((d, c.vocab_size), fsdp, tensor)
    return layout


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

    def key(self) -> str:
        own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        parts = [self.config.digest(), self.seq_len, self.remat, self.dtype, sorted(self.mesh_sizes.items()), own]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def build(step: Step, devices, batch_per_device: int):
    """(jitted train step, [params, optimizer state, tokens] as sharded ShapeDtypeStructs) for the slice."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    config, sizes = step.config, step.mesh_sizes
    mesh = make_mesh(devices, sizes)
    tensor = sizes["tensor"]
    if config.num_attention_heads % tensor or config.num_key_value_heads % tensor:
        raise UserError(f"--mesh tensor={tensor} must divide the attention heads ({config.num_attention_heads}) and "
                        f"key/value heads ({config.num_key_value_heads}) of {config.name}.")
    if step.seq_len % 128:
        raise UserError(f"--seq must be a multiple of 128 (the attention kernel's tile), not {step.seq_len}.")
    layout = _parameter_layout(config, sizes)
    batch_axes = tuple(axis for axis in ("data", "fsdp", "expert") if sizes[axis] > 1) or None

    def sharded(shape, spec, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))

    params = {name: sharded(shape, spec, jnp.float32) for name, (shape, spec) in layout.items()}
    opt = {"mu": params, "nu": params, "count": sharded((), (), jnp.int32)}
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
    activations = NamedSharding(mesh, P(batch_axes, None, None))
    batch_shards = 1
    for axis in batch_axes or ():
        batch_shards *= mesh.shape[axis]
    # The loss: the LM head gathered once in bf16 (over fsdp; vocabulary kept over tensor, as the weight is),
    # hidden states cut into [chunk, batch, token, embed] pieces (see cross_entropy).
    vocab_axis = _fits(config.vocab_size, ("tensor",), step.mesh_sizes)
    vocab_shards = mesh.shape["tensor"] if vocab_axis else 1
    gathered_head = NamedSharding(mesh, P(None, vocab_axis))
    chunk_sharding = NamedSharding(mesh, P(None, batch_axes, None, None))
    attention = _attention(config, step.seq_len, mesh, batch_axes)
    moe = _moe(config, mesh, batch_axes) if config.moe else None

    def matmul(x, w, spec):
        if step.dtype == "fp8":
            x, w = x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)
        else:
            w = w.astype(compute)
        return jnp.einsum(spec, x, w, preferred_element_type=compute)

    def norm(x, weight):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + config.rms_norm_eps)
        return (x32 * weight).astype(compute)

    def act(x):
        return jax.nn.gelu(x, approximate=True) if "gelu" in config.hidden_act else jax.nn.silu(x)

    def layer(x, w):
        x = checkpoint_name(x, "decoder_layer_input")
        y = norm(x, w["attn_norm"])
        q, k, v = (checkpoint_name(matmul(y, w[n], "bsd,df->bsf"), name)
                   for n, name in (("wq", "query_proj"), ("wk", "key_proj"), ("wv", "value_proj")))
        if config.attention_bias:
            q, k, v = q + w["bq"].astype(compute), k + w["bk"].astype(compute), v + w["bv"].astype(compute)
        o = attention(q, k, v)
        x = jax.lax.with_sharding_constraint(x + checkpoint_name(matmul(o, w["wo"], "bsf,fd->bsd"), "out_proj"),
                                             activations)
        y = norm(x, w["mlp_norm"])
        if moe is not None:
            out = moe(y, w, matmul, act)
        else:
            out = matmul(act(matmul(y, w["w_gate"], "bsd,df->bsf")) * matmul(y, w["w_up"], "bsd,df->bsf"),
                         w["w_down"], "bsf,fd->bsd")
        return jax.lax.with_sharding_constraint(x + out, activations), None

    policy = {
        "none": None,
        "full": jax.checkpoint_policies.nothing_saveable,
        "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        # MaxText's `remat_policy: custom` of the published Llama 3.1 70B v6e-256 recipe: each layer's input
        # and its q/k/v projections go to host memory, everything else is recomputed.
        "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(OFFLOADED),
            offload_src="device", offload_dst="pinned_host"),
    }[step.remat]
    body = layer if step.remat == "none" else jax.checkpoint(layer, policy=policy, prevent_cse=False)
    stacked = [n for n, (shape, _) in _parameter_layout(config, step.mesh_sizes).items()
               if n not in ("embed", "final_norm", "lm_head")]

    def loss_fn(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = jnp.take(params["embed"].astype(compute), inputs, axis=0)
        x = jax.lax.with_sharding_constraint(x, activations)
        x, _ = jax.lax.scan(body, x, {n: params[n] for n in stacked})
        x = norm(x, params["final_norm"])
        head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
        head = jax.lax.with_sharding_constraint(head.astype(compute), gathered_head)
        chunks = loss_chunks(step.seq_len, x.shape[0] // batch_shards, config.vocab_size // vocab_shards)
        return cross_entropy(lambda chunk: matmul(chunk, head, "bsd,dv->bsv").astype(jnp.float32), x, targets,
                             chunks, chunk_sharding)

    def train_step(params, opt, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
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


def _adamw(params, grads, opt, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1):
    """AdamW (decoupled weight decay, bias-corrected moments), fp32 state, one fused update per parameter."""
    import jax
    import jax.numpy as jnp

    count = opt["count"] + 1
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
    new = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * p), params, mu, nu)
    return new, {"mu": mu, "nu": nu, "count": count}


def _rope(x, theta: float):
    import jax.numpy as jnp

    _, s, _, hd = x.shape
    frequencies = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * frequencies[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def generation_of(devices) -> str:
    """The TPU generation (v6e) of the devices a step is compiled for."""
    from tpuprof import targets

    return targets.from_device_type(devices[0].device_kind) or ""


def compiler_options(generation: str) -> dict:
    """The flags a --model step is compiled with on GENERATION (see COMPILER_OPTIONS, RECIPE_VMEM_LIMIT)."""
    return {**COMPILER_OPTIONS, **RECIPE_VMEM_LIMIT.get(generation, {})}


def _attention(config: ModelConfig, seq_len: int, mesh, batch_axes):
    """Causal GQA attention through the Pallas splash-attention kernel, inside shard_map (batch over the
    batch axes, heads over `tensor`), tiled for the mesh's TPU generation (SPLASH_BLOCK)."""
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    from jax.sharding import PartitionSpec as P

    h, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    local_heads = h // mesh.shape["tensor"]
    generation = generation_of(mesh.devices.flat)
    # A tile divides the sequence (a multiple of 128).
    block = math.gcd(seq_len, SPLASH_BLOCK.get(generation, DEFAULT_SPLASH_BLOCK))
    # The fused backward kernel computes dQ with dK and dV; otherwise dQ has a kernel and blocks of its own.
    dq = ({"use_fused_bwd_kernel": True} if SPLASH_FUSED_BACKWARD.get(generation, False)
          else {"block_q_dq": block, "block_kv_dq": block})
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, **dq)
    mask = masks.MultiHeadMask([masks.CausalMask((seq_len, seq_len)) for _ in range(local_heads)])
    kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
    spec = P(batch_axes, "tensor", None, None)

    @jax.shard_map(mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
    def local(q, k, v):
        return jax.vmap(kernel)(q, k, v)

    def attention(q, k, v):
        b, s, _ = q.shape
        q = _rope(q.reshape(b, s, h, hd), config.rope_theta) * (hd ** -0.5)
        k = _rope(k.reshape(b, s, kv, hd), config.rope_theta)
        v = v.reshape(b, s, kv, hd)
        out = local(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
        return out.transpose(0, 2, 1, 3).reshape(b, s, h * hd)

    return attention


def _moe(config: ModelConfig, mesh, batch_axes):
    """Top-k routing with a capacity per expert, dispatched and combined by one-hot einsums over groups of
    MOE_GROUP tokens (GShard / MaxText's dense-matmul MoE); a shared expert (Qwen-MoE) is added, gated."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    e, k = config.num_experts, config.num_experts_per_tok
    grouped = NamedSharding(mesh, P(batch_axes, None, None))
    expert_side = NamedSharding(mesh, P("expert" if mesh.shape["expert"] > 1 else None, None, None, None))

    def moe(y, w, matmul, act):
        b, s, d = y.shape
        group = min(MOE_GROUP, s)
        capacity = max(1, int(-(-k * group * CAPACITY_FACTOR // e)))
        tokens = jax.lax.with_sharding_constraint(y.reshape(b * s // group, group, d), grouped)
        logits = jnp.einsum("gtd,de->gte", tokens.astype(jnp.float32), w["router"])
        weights, chosen = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)  # [g, t, k]
        onehot = jax.nn.one_hot(chosen, e, dtype=jnp.int32)  # [g, t, k, e]
        position = jnp.cumsum(onehot.reshape(onehot.shape[0], group * k, e), axis=1).reshape(onehot.shape) - 1
        keep = (position < capacity) & (onehot > 0)
        slot = jax.nn.one_hot(jnp.where(keep, position, capacity), capacity, dtype=y.dtype)  # [g, t, k, e, c]
        dispatch = jnp.einsum("gtke,gtkec->gtec", keep.astype(y.dtype), slot)
        combine = jnp.einsum("gtk,gtke,gtkec->gtec", weights.astype(y.dtype), keep.astype(y.dtype), slot)
        routed = jnp.einsum("gtd,gtec->egcd", tokens, dispatch)
        routed = jax.lax.with_sharding_constraint(routed, expert_side)
        hidden = act(matmul(routed, w["we_gate"], "egcd,edf->egcf")) * matmul(routed, w["we_up"], "egcd,edf->egcf")
        out = matmul(hidden, w["we_down"], "egcf,efd->egcd")
        out = jnp.einsum("egcd,gtec->gtd", out, combine).reshape(b, s, d)
        if config.shared_expert_intermediate_size:
            shared = matmul(act(matmul(y, w["ws_gate"], "bsd,df->bsf")) * matmul(y, w["ws_up"], "bsd,df->bsf"),
                            w["ws_down"], "bsf,fd->bsd")
            gate = jax.nn.sigmoid(jnp.einsum("bsd,do->bso", y.astype(jnp.float32), w["ws_router"])).astype(y.dtype)
            out = out + gate * shared
        return out

    return moe


class Spec:
    """The LLM step as preflight's Compiler sees a user's SPEC: `program(batch)` builds the step for that many
    sequences per device over all the slice's devices; `digest` keys the compile cache (config, seq, remat,
    dtype, mesh, this file)."""

    kind = "jax"
    batch_step = 1  # the max-batch search counts sequences, not multiples of 8
    preferred_batch = 1
    batch_limit = 256  # sequences per device: the search stops there (a tiny model fits far more than is useful)
    # When even one sequence's offloaded activations exceed the host's memory (the verdict's advice).
    host_advice = "use --remat full (nothing offloaded: each layer's input stays in HBM) or a shorter --seq"

    def __init__(self, step: Step, target: str):
        from tpuprof.sources import tpu_compile

        self.step = step
        self.target = target
        self.devices = tpu_compile.topology_devices(target)
        self.text = f"--model {step.config.name}"
        self.factory_name = "llm"
        self.digest = step.key()
        self.state_bytes_per_device = state_bytes_per_device(step.config, step.mesh_sizes)

    def program(self, batch_size: int, dtype: str | None = None, target: str | None = None):
        from tpuprof.sources.tpu_compile import Program

        fn, args = build(self.step, self.devices, batch_size)
        return Program("jax", (fn, args), self.text, compiler_options=compiler_options(generation_of(self.devices)))

    def model_info(self) -> dict:
        config = self.step.config
        info = {"name": config.name, "source": self.step.source, "parameters": config.parameter_count(),
                "family": config.model_type, "layers": config.num_hidden_layers, "implementation": IMPLEMENTATION,
                "attention": "Pallas splash attention (causal)", "remat": self.step.remat, "dtype": self.step.dtype,
                "heads": config.num_attention_heads, "head_dim": config.head_dim}
        # The MFU's model FLOPs count, as MaxText does, the weights one token's matmuls use: attention's
        # projections, the MLP (an MoE: router, its top-k experts and any shared expert) and the logits, not
        # the embedding lookup or norms; attention's own matmuls come from heads x head_dim.
        d, h, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        if config.moe:
            mlp = (d * config.num_experts + config.num_experts_per_tok * 3 * d * config.moe_intermediate_size
                   + 3 * d * config.shared_expert_intermediate_size)
        else:
            mlp = 3 * d * config.intermediate_size
        info["active_parameters"] = config.num_hidden_layers * (2 * d * h * hd + 2 * d * kv * hd + mlp) + config.vocab_size * d
        if config.moe:
            info["experts"] = config.num_experts
            info["experts_per_token"] = config.num_experts_per_tok
        return info
