"""An LLM serving engine's programs, built from a Hugging Face config and shapes alone (no weights), tensor-parallel
over a TPU slice's compile-only devices: what `tpuprof serve` compiles.

The programs are those vLLM TPU (tpu-inference) compiles at start-up
(`tpu_inference/runner/compilation_manager.py`, `capture_model`):
- the *backbone*, one program per token padding (`num_tokens_paddings`): token embedding, the decoder layers, each
  RMSNorm -> q/k/v projections -> RoPE -> new K/V written into the paged cache -> the Pallas ragged paged attention
  kernel (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`, the kernel vLLM's TPU backends are built on)
  over the pages of up to `max_num_seqs` requests -> output projection -> RMSNorm -> gated MLP (or routed experts);
  the attention metadata is `max_num_seqs` wide in every backbone program, as the engine passes it;
- the *logits and sampling* step, one program per request padding (`num_reqs_paddings`): the final norm, the
  vocabulary-parallel LM head and a greedy pick over the gathered logits.

Tensor parallelism is Megatron's, as vLLM shards: q heads, KV heads, MLP width and vocabulary over the `tensor` axis
of `tensor_parallel_size` devices, an all-reduce after the attention output and the MLP down projection; KV heads are
replicated up to the TP degree when there are fewer of them (`get_num_kv_heads_by_tp`). The KV cache of each layer is
one array `[pages, page_size, combined_heads, head_dim]` per device, combined (K and V interleaved) heads padded to
the dtype's packing and head_dim padded as the engine pads it (tpuprof.analyses.serve_memory says how), donated so
the program updates it in place.

The layers are unrolled, as the engine runs them; `layers` compiles fewer (bench/bench_serve_layers.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tpuprof.sources.llm import ModelConfig

IMPLEMENTATION = "tpuprof compact JAX serving step (tpuprof/sources/llm_serve.py)"
DTYPES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn", "int8": "int8"}
GMM_TILE = 128  # the megablox grouped matmul's (m, k, n) tile, at most: its default, given explicitly


@dataclass(frozen=True)
class ServeProgram:
    """One program the engine compiles, as tpuprof builds it (everything its shapes depend on)."""

    kind: str  # "backbone" (the forward over `tokens` tokens) or "logits" (LM head + sampling for `requests`)
    tokens: int  # token padding (backbone) ; 0 for logits
    requests: int  # the attention metadata's width (max_num_seqs) for the backbone; the request padding for logits
    layers: int  # decoder layers compiled
    pages_per_request: int  # ceil(max_model_len / page_size)
    page_size: int
    kv_pages: int  # pages per layer passed in (their bytes are known exactly; the count is nominal)
    combined_kv_heads: int  # per device, K and V interleaved, padded to the KV dtype's packing
    head_dim: int  # as the engine pads it
    kv_merged: bool  # a head's K and V side by side in the last dimension (vLLM's head_dim-64 layout)
    kv_dtype: str  # bf16 | fp8
    weight_dtype: str  # bf16 | fp8 | int8
    tensor_parallel_size: int
    expert_parallel: bool
    num_kv_pages_per_block: int
    num_queries_per_block: int
    vmem_limit_bytes: int
    # Where the layers' caches differ (Gemma 4's full-attention layers): (attention kind, combined heads per device,
    # head_dim as stored) of each kind; empty: combined_kv_heads and head_dim serve every layer.
    kind_caches: tuple = ()

    def key(self, config: ModelConfig, topology: str) -> str:
        source = Path(__file__).read_bytes()
        parts = [config.digest(), topology, asdict(self), hashlib.sha256(source).hexdigest()[:16]]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _config_data(source: str) -> dict:
    """The config.json behind SOURCE ("built-in:NAME" or the config's path), which load_config read already."""
    from importlib import resources

    if source.startswith("built-in:"):
        text = (resources.files("tpuprof") / "llm_configs" / f"{source.removeprefix('built-in:')}.json").read_text()
    else:
        text = Path(source).read_text()
    return json.loads(text)


def checkpoint_architecture(source: str) -> str | None:
    """The model class the config names (`architectures[0]`, what vLLM resolves the model by), or None."""
    found = _config_data(source).get("architectures")
    return str(found[0]) if isinstance(found, list) and found else None


def checkpoint_quantization(source: str) -> str | None:
    """The format of the checkpoint's weights its config.json names (`quantization_config`, as vLLM and SGLang-JAX
    read it): "fp8", "int8", another method's name ("mxfp4", "awq", "compressed-tensors 4-bit", ...), or None for
    unquantized weights. SOURCE: what load_config returned ("built-in:NAME" or the config's path)."""
    data = _config_data(source)
    found = data.get("quantization_config") or (data.get("text_config") or {}).get("quantization_config")
    if not isinstance(found, dict):
        return None
    method = str(found.get("quant_method", "")).lower()
    if method == "compressed-tensors":  # the weights' bits and type per group (llm-compressor's format)
        weights = [g.get("weights") or {} for g in (found.get("config_groups") or {}).values() if isinstance(g, dict)]
        kinds = {(w.get("num_bits"), w.get("type")) for w in weights}
        if kinds == {(8, "float")}:
            return "fp8"
        if kinds == {(8, "int")}:
            return "int8"
        bits = sorted({b for b, _ in kinds if isinstance(b, int)})
        return f"compressed-tensors {'/'.join(map(str, bits)) or 'unknown'}-bit"
    return method or None


def build(config: ModelConfig, program: ServeProgram, devices):
    """(jitted function, arguments as sharded ShapeDtypeStructs, donated argument numbers, mesh)."""
    if program.kind == "logits":
        return _logits_program(config, program, devices)
    return _backbone(config, program, devices)


def _mesh(devices, tp: int):
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(list(devices)[:tp]), ("tensor",))


def _weight(shape, spec, dtype_name, mesh):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.ShapeDtypeStruct(shape, jnp.dtype(DTYPES[dtype_name]), sharding=NamedSharding(mesh, P(*spec)))


def attention_kind(config: ModelConfig, layer_kind: str) -> str:
    """"full" or "sliding": the attention of a layer of LAYER_KIND ("sliding+dense", "full+moe", ...) where the kinds
    differ in head size or key/value heads (Gemma 4); "" where one shape serves every layer."""
    if not (config.global_head_dim or config.global_kv_heads):
        return ""
    return "full" if layer_kind.split("+")[0] == "full" else "sliding"


def _layer_shapes(config: ModelConfig, program: ServeProgram, moe: bool,
                  attention: str = "") -> dict[str, tuple[tuple, tuple, str]]:
    """name -> (global shape, partition spec, dtype) of one decoder layer's weights, with routed experts when MOE
    (an MoE's dense layers, Llama 4 Maverick's every other one, have the dense MLP). KV projections carry
    `kv_per_device x TP` heads: the replicated heads each device holds when TP exceeds the model's KV heads.
    ATTENTION ("full" | "sliding", Gemma 4): that kind's heads, as tpu-inference's JAX Gemma 4 holds them: k (and v,
    none where the keys are the values) split over TP by heads or, with fewer heads than TP, by the head's width:
    never copied."""
    d, h, hd = config.hidden_size, config.num_attention_heads, config.head_dim
    tp = program.tensor_parallel_size
    kv_global = max(config.num_key_value_heads, tp)
    if attention:
        kv_global, hd = config.attention_shape(attention)
    w = program.weight_dtype
    shapes = {
        "attn_norm": ((d,), (None,), "bf16"),
        "mlp_norm": ((d,), (None,), "bf16"),
        "wq": ((d, h * hd), (None, "tensor"), w),
        "wk": ((d, kv_global * hd), (None, "tensor"), w),
        "wv": ((d, kv_global * hd), (None, "tensor"), w),
        "wo": ((h * hd, d), ("tensor", None), w),
    }
    if attention == "full" and config.global_k_eq_v:
        del shapes["wv"]
    if moe:
        e, f = config.num_experts, config.moe_intermediate_size
        expert_axis = ("tensor", None, None) if program.expert_parallel else (None, None, "tensor")
        down_axis = ("tensor", None, None) if program.expert_parallel else (None, "tensor", None)
        shapes.update({
            "router": ((d, e), (None, None), "bf16"),
            "we_gate": ((e, d, f), expert_axis, w),
            "we_up": ((e, d, f), expert_axis, w),
            "we_down": ((e, f, d), down_axis, w),
        })
        if config.shared_expert_intermediate_size:
            s = config.shared_expert_intermediate_size
            shapes.update({"ws_gate": ((d, s), (None, "tensor"), w), "ws_up": ((d, s), (None, "tensor"), w),
                           "ws_down": ((s, d), ("tensor", None), w), "ws_router": ((d, 1), (None, None), "bf16")})
    if not moe or config.moe_dense_mlp:  # Gemma 4's MoE layers run the dense MLP beside the experts
        i = config.intermediate_size
        shapes.update({"w_gate": ((d, i), (None, "tensor"), w), "w_up": ((d, i), (None, "tensor"), w),
                       "w_down": ((i, d), ("tensor", None), w)})
    if config.attention_bias:
        shapes.update({"bq": ((h * hd,), ("tensor",), "bf16"), "bk": ((kv_global * hd,), ("tensor",), "bf16"),
                       "bv": ((kv_global * hd,), ("tensor",), "bf16")})
    if w != "bf16":  # per-output-channel scales of the quantized 2-D weights
        shapes.update({f"{n}_scale": ((shape[1],), (spec[1],), "bf16") for n, (shape, spec, dtype) in list(shapes.items())
                       if dtype == w and len(shape) == 2})
    return shapes


def lanes(combined: int, head_dim: int) -> int:
    """How many 128-lane slices each head is handed to JAX's ragged paged attention kernel as: 1, or, for heads wider
    than 128 with more than one KV head per device, their width over 128. Mosaic refuses the kernel there ("The last
    dim size is not 128 in original base memref", libtpu 0.0.42.1: 256-wide heads compile with one KV head per
    device, not with two, whatever the TP), where vLLM's own RPA v3 kernel takes them. The cache's bytes, the
    queries' and the ratio of query to KV heads are unchanged; the kernel's work is that of the narrower heads."""
    return head_dim // 128 if head_dim > 128 and combined > 2 else 1


def _backbone(config: ModelConfig, program: ServeProgram, devices):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention
    from jax.sharding import NamedSharding, PartitionSpec as P

    tp = program.tensor_parallel_size
    mesh = _mesh(devices, tp)
    d, h = config.hidden_size, config.num_attention_heads
    q_per_device = h // tp
    kv_dtype = jnp.dtype(DTYPES[program.kv_dtype])
    tokens, requests = program.tokens, program.requests
    kinds = [(attention_kind(config, kind), kind.endswith("+moe")) for kind in config.layer_kinds()][:program.layers]
    shapes = {key: _layer_shapes(config, program, key[1], key[0]) for key in dict.fromkeys(kinds)}
    layers = [{name: _weight(shape, spec, dtype, mesh) for name, (shape, spec, dtype) in shapes[key].items()}
              for key in kinds]
    embed = _weight((config.vocab_size, d), ("tensor", None), "bf16", mesh)
    # (model's KV heads, head_dim, heads per device, combined heads per device, head_dim as stored) of each layer.
    stored = {attention: (combined, head_dim) for attention, combined, head_dim in program.kind_caches}
    geometry = []
    for attention, _ in kinds:
        kv, hd = config.attention_shape(attention) if attention else (config.num_key_value_heads, config.head_dim)
        combined, hd_pad = stored.get(attention, (program.combined_kv_heads, program.head_dim))
        geometry.append((kv, hd, max(kv // tp, 1), combined, hd_pad))
    caches = [jax.ShapeDtypeStruct((program.kv_pages, program.page_size, combined * tp * lanes(combined, hd_pad),
                                    hd_pad // lanes(combined, hd_pad)), kv_dtype,
                                   sharding=NamedSharding(mesh, P(None, None, "tensor", None)))
              for _, _, _, combined, hd_pad in geometry]

    def replicated(shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))

    metadata = {"input_ids": replicated((tokens,)), "positions": replicated((tokens,)),
                "slots": replicated((tokens,)), "kv_lens": replicated((requests,)),
                "page_indices": replicated((requests, program.pages_per_request)),
                "cu_q_lens": replicated((requests + 1,)), "num_seqs": replicated((1,))}
    vocab_per_device = config.vocab_size // tp

    def matmul(x, weights, name):
        w = weights[name]
        if program.weight_dtype != "bf16":
            return (x @ w.astype(jnp.bfloat16)) * weights[f"{name}_scale"].astype(jnp.bfloat16)
        return x @ w

    def norm(x, weight):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + config.rms_norm_eps)
        return (x32 * weight.astype(jnp.float32)).astype(jnp.bfloat16)

    def act(x):
        return jax.nn.gelu(x, approximate=True) if "gelu" in config.hidden_act else jax.nn.silu(x)

    def rope(x, positions):
        half = x.shape[-1] // 2
        frequencies = 1.0 / (config.rope_theta ** (jnp.arange(0, half, dtype=jnp.float32) / half))
        angles = positions.astype(jnp.float32)[:, None] * frequencies[None, :]
        sin, cos = jnp.sin(angles)[:, None, :], jnp.cos(angles)[:, None, :]
        x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(jnp.bfloat16)

    def pad_head(x, hd_pad):
        return x if hd_pad == x.shape[-1] else jnp.pad(x, ((0, 0), (0, 0), (0, hd_pad - x.shape[-1])))

    def own_heads(x, kv, hd, kv_per_device):
        """This device's KV heads [tokens, heads, hd] of a projection split over TP: by heads, or, where TP exceeds
        the heads (Gemma 4's full layers), by the head's width, gathered back and the device's head taken."""
        if kv % tp == 0 or not kinds[0][0]:
            return x.reshape(tokens, kv_per_device, hd)
        whole = jax.lax.all_gather(x, "tensor", axis=1, tiled=True).reshape(tokens, kv, hd)
        return jax.lax.dynamic_slice_in_dim(whole, jax.lax.axis_index("tensor") * kv // tp, 1, axis=1)

    def experts(y, w):
        # Routed as tpu-inference runs MoE on TPU (layers/common/fused_moe_gmm.py): top-k routing, the (token,
        # expert) pairs sorted by expert, the megablox grouped matmul (jax.experimental.pallas.ops.tpu.megablox
        # gmm) over each expert's rows (gate, up, then down), the rows put back and weighted, and a psum. Tensor
        # parallel: every device holds every expert's slice of the intermediate width; expert parallel
        # (--enable-expert-parallel): each device holds whole experts and computes only their rows.
        from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm

        top_k = config.num_experts_per_tok
        logits = (y @ w["router"]).astype(jnp.float32)
        weights, chosen = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat)
        rows = y[order // top_k]
        group_sizes = jnp.bincount(flat, length=config.num_experts).astype(jnp.int32)
        local = w["we_gate"].shape[0]
        offset = (jax.lax.axis_index("tensor") * local).astype(jnp.int32) if program.expert_parallel else None
        pairs = rows.shape[0]
        tiling = lambda m, k, n: (min(GMM_TILE, m), min(GMM_TILE, k), min(GMM_TILE, n))  # noqa: E731

        def grouped(x, weight):
            return gmm(x, weight.astype(jnp.bfloat16), group_sizes, preferred_element_type=jnp.bfloat16,
                       tiling=tiling, group_offset=offset)

        hidden = act(grouped(rows, w["we_gate"])) * grouped(rows, w["we_up"])
        out_rows = grouped(hidden, w["we_down"])
        if program.expert_parallel:  # rows of other devices' experts are not computed here
            bounds = jnp.cumulative_sum(group_sizes, include_initial=True)
            index = jnp.arange(pairs)
            out_rows = jnp.where(((index >= bounds[offset]) & (index < bounds[offset + local]))[:, None], out_rows, 0)
        unsorted = out_rows[jnp.argsort(order)].reshape(-1, top_k, out_rows.shape[-1])
        out = jnp.sum(unsorted.astype(jnp.float32) * weights[..., None], axis=1).astype(jnp.bfloat16)
        if config.shared_expert_intermediate_size:
            shared = matmul(act(matmul(y, w, "ws_gate")) * matmul(y, w, "ws_up"), w, "ws_down")
            out = out + jax.nn.sigmoid((y @ w["ws_router"]).astype(jnp.float32)).astype(jnp.bfloat16) * shared
        return out

    def local_step(embed, layers, caches, meta):
        ids = meta["input_ids"]
        first = jax.lax.axis_index("tensor") * vocab_per_device
        inside = (ids >= first) & (ids < first + vocab_per_device)
        x = jnp.where(inside[:, None], jnp.take(embed, jnp.clip(ids - first, 0, vocab_per_device - 1), axis=0), 0)
        x = jax.lax.psum(x, "tensor")
        new_caches = []
        for w, kv_cache, (kv, hd, kv_per_device, combined, hd_pad) in zip(layers, caches, geometry):
            y = norm(x, w["attn_norm"])
            q, k = matmul(y, w, "wq"), matmul(y, w, "wk")
            v = matmul(y, w, "wv") if "wv" in w else k  # Gemma 4's full layers: the keys are the values
            if config.attention_bias:
                q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
            q = rope(q.reshape(tokens, q_per_device, hd), meta["positions"]) * (hd ** -0.5)
            k = rope(own_heads(k, kv, hd, kv_per_device), meta["positions"])
            v = own_heads(v, kv, hd, kv_per_device)
            if program.kv_merged:  # [K | V] of each head in the 128 lanes, heads padded to the packing
                new = jnp.concatenate([k, v], axis=-1)
                used = kv_per_device
            else:  # K and V both stored, also where they are one projection (tpu-inference writes both)
                new = jnp.stack([pad_head(k, hd_pad), pad_head(v, hd_pad)], axis=2).reshape(
                    tokens, 2 * kv_per_device, hd_pad)
                used = 2 * kv_per_device
            if combined > used:  # slots the dtype's packing adds (fp8 with one KV head: 2 of 4 used)
                new = jnp.pad(new, ((0, 0), (0, combined - used), (0, 0)))
            flat = kv_cache.reshape(-1, combined, hd_pad).at[meta["slots"]].set(new.astype(kv_dtype))
            kv_cache = flat.reshape(kv_cache.shape)
            new_caches.append(kv_cache)
            if program.kv_merged:  # the kernel reads combined / 2 heads: the q heads, a multiple of them
                q_heads = -(-q_per_device // max(combined // 2, 1)) * max(combined // 2, 1)
            elif combined == 2 * kv_per_device:
                q_heads = q_per_device
            else:
                q_heads = combined // 2 * max(q_per_device // kv_per_device, 1)
            q_in = pad_head(q, hd_pad) if q_heads == q_per_device else jnp.pad(
                pad_head(q, hd_pad), ((0, 0), (0, q_heads - q_per_device), (0, 0)))
            split = lanes(combined, hd_pad)
            q_in = q_in.reshape(tokens, q_heads * split, hd_pad // split)
            scales = {} if program.kv_dtype == "bf16" else {"k_scale": 1.0, "v_scale": 1.0}
            o = ragged_paged_attention(q_in, kv_cache, meta["kv_lens"], meta["page_indices"], meta["cu_q_lens"],
                                       meta["num_seqs"], sm_scale=1.0,
                                       num_kv_pages_per_block=program.num_kv_pages_per_block,
                                       num_queries_per_block=program.num_queries_per_block,
                                       vmem_limit_bytes=program.vmem_limit_bytes, **scales)
            o = o.reshape(tokens, q_heads, hd_pad)[:, :q_per_device, :hd].reshape(tokens, q_per_device * hd)
            x = x + jax.lax.psum(matmul(o, w, "wo"), "tensor")
            y = norm(x, w["mlp_norm"])
            out = experts(y, w) if "we_gate" in w else 0
            if "w_gate" in w:  # the dense MLP (beside the experts in Gemma 4's MoE layers)
                out = out + matmul(act(matmul(y, w, "w_gate")) * matmul(y, w, "w_up"), w, "w_down")
            x = x + jax.lax.psum(out, "tensor")
        return x, new_caches

    weight_specs = jax.tree_util.tree_map(lambda s: s.sharding.spec, layers)
    cache_spec = [P(None, None, "tensor", None)] * program.layers
    meta_specs = {name: P() for name in metadata}
    fn = jax.shard_map(local_step, mesh=mesh, in_specs=(P("tensor", None), weight_specs, cache_spec, meta_specs),
                       out_specs=(P(), cache_spec), check_vma=False)
    jitted = jax.jit(fn, donate_argnums=(2,))
    return jitted, [embed, layers, caches, metadata], mesh


def _logits_program(config: ModelConfig, program: ServeProgram, devices):
    """The final norm, the vocabulary-parallel LM head over the requests' last hidden states, and a greedy pick."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    tp = program.tensor_parallel_size
    mesh = _mesh(devices, tp)
    d = config.hidden_size
    hidden = jax.ShapeDtypeStruct((program.requests, d), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    final_norm = _weight((d,), (None,), "bf16", mesh)
    head = _weight((d, config.vocab_size), (None, "tensor"), "bf16", mesh)
    vocab_per_device = config.vocab_size // tp

    def local(hidden, final_norm, head):
        x32 = hidden.astype(jnp.float32)
        x = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + config.rms_norm_eps)
             * final_norm.astype(jnp.float32)).astype(jnp.bfloat16)
        logits = (x @ head).astype(jnp.float32)
        best, index = jnp.max(logits, -1), jnp.argmax(logits, -1) + jax.lax.axis_index("tensor") * vocab_per_device
        bests, indices = jax.lax.all_gather(best, "tensor"), jax.lax.all_gather(index, "tensor")
        return jnp.take_along_axis(indices, jnp.argmax(bests, 0)[None], 0)[0].astype(jnp.int32)

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None), P(None, "tensor")), out_specs=P(), check_vma=False)
    return jax.jit(fn), [hidden, final_norm, head], mesh


def compile_program(config: ModelConfig, program: ServeProgram, slice_) -> dict:
    """Compile PROGRAM for the topology of SLICE_ (a tpuprof.slices.Slice, or its name), compile-only; returns the
    compiler's figures for one device ({"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
    "code_bytes", "seconds"}) or, when the compiler refuses it for lack of memory, {"failure": its message,
    "space": "smem" | "vmem" | "hbm" | None}."""
    import time

    import jax

    from tpuprof.sources import tpu_compile

    devices = tpu_compile.topology_devices(slice_)
    fn, args, mesh = build(config, program, devices)
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh):  # Pallas reads the TPU generation from the mesh it lowers under
            compiled = fn.lower(*args).compile()
    except Exception as error:  # noqa: BLE001 - jaxlib raises JaxRuntimeError with the status text
        text = str(error)
        if "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text:
            return {"failure": " ".join(text.split())[:2000], "space": memory_space(text),
                    "seconds": time.perf_counter() - start}
        raise tpu_compile.CompileFailed(text) from error
    stats = compiled.memory_analysis()
    return {"argument_bytes": int(stats.argument_size_in_bytes), "output_bytes": int(stats.output_size_in_bytes),
            "alias_bytes": int(stats.alias_size_in_bytes), "temp_bytes": int(stats.temp_size_in_bytes),
            "code_bytes": int(stats.generated_code_size_in_bytes), "seconds": time.perf_counter() - start}


def memory_space(text: str) -> str | None:
    """The memory space a RESOURCE_EXHAUSTED compile names: "smem", "vmem" or "hbm" ("space=smem" in Mosaic's
    allocation message, "memory space vmem" in XLA's)."""
    import re

    found = re.search(r"(?:space=|memory space )(smem|vmem|hbm)", text, re.IGNORECASE)
    return found.group(1).lower() if found else None
