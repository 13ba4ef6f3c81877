"""How fast a slice serves the workload, and at what cost: a band and a point for the decode step and the prefill
chunks, from the compiled weights per device, the engine's KV bytes per token and the chip's published rates.
Pure functions.

Decode step of B requests (one token each) on one device of a tensor-parallel engine:
- HBM: the weights on the device plus the K/V of every request's context, read once per step
  (`weights + B x context x kv_bytes_per_token`) / HBM bandwidth per device; of an MoE's experts only those some
  token is routed to (the grouped matmul skips empty groups): `1 - (1 - top_k / experts)^B` of them, routing taken
  as uniform;
- compute: `2 x active parameters x B / TP` plus attention `4 x B x context x heads x head_dim x layers / TP` FLOPs /
  the bf16 peak per device;
- ICI: two all-reduces per layer (after attention's output projection and the MLP) of `B x hidden x 2` bytes over the
  TP devices, ring algorithm over bidirectional links, each with a fixed latency.
The step is bound by the larger of HBM and compute (they overlap on a TPU), plus the all-reduces (a decode step
cannot hide them: each layer waits for its sum). The band's ends take the rates at their published peaks and no
collective latency (low), and at the efficiencies below (high); the point lies between, at efficiencies that
bench/bench_serve.py compares with published TPU serving runs.

Prefill of one request: its input_len tokens in chunks of max_num_batched_tokens, each `2 x active parameters x
chunk / TP` FLOPs plus attention over the prefix, at the MXU efficiency below, never faster than one read of the
weights. With continuous batching every decode step also carries prefill chunks: B / output_len requests' prefill per
step on average, which is what TPOT adds on top of the decode step. TTFT = the request's prefill + one decode step.
"""

from __future__ import annotations

from tpuprof.analyses.serve_memory import mla_attention_parameters
from tpuprof.models.serve import Band, ServeEstimate

# (low, point, high) ends of the band: fractions of the published peak reached.
HBM_EFFICIENCY = (1.0, 0.8, 0.55)
MXU_EFFICIENCY = (0.7, 0.5, 0.3)  # prefill matmuls
ALL_REDUCE_LATENCY_US = (0.0, 10.0, 25.0)  # per all-reduce, on top of its bytes over the links


def active_parameters(config) -> int:
    """Parameters one token's matmuls use: attention projections, the MLP (an MoE: router, top-k experts, shared
    expert) and the LM head."""
    if config.global_head_dim or config.global_kv_heads:  # Gemma 4: layers of two widths, its MoE's dense MLP
        return config.matmul_parameter_count()  # the LM head is the tied embedding, counted there
    d, h, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    dense = 3 * d * config.intermediate_size
    routed = config.moe_layer_count() if config.moe else 0
    moe = (d * config.num_experts + config.num_experts_per_tok * 3 * d * config.moe_intermediate_size
           + 3 * d * config.shared_expert_intermediate_size) if config.moe else 0
    mlp = routed * moe + (config.num_hidden_layers - routed) * dense
    attention = sum(mla_attention_parameters(config)) if config.mla else 2 * d * h * hd + 2 * d * kv * hd
    return config.num_hidden_layers * attention + mlp + config.vocab_size * d


def attention_dim(config) -> int:
    """The width per head of a context token's two attention matmuls, averaged (4 x context x heads x this FLOPs per
    token and layer): head_dim, or with MLA absorbed into the latent, the latent with its RoPE key for the scores
    and the latent alone for the values."""
    if config.mla:
        return (2 * config.kv_lora_rank + config.qk_rope_head_dim) // 2
    if config.global_head_dim:  # Gemma 4: its full layers' heads are wider; the mean over the layers
        widths = [config.attention_shape("full" if kind.startswith("full") else "sliding")[1]
                  for kind in config.layer_kinds()]
        return sum(widths) // len(widths)
    return config.head_dim


def _all_reduce_s(bytes_: float, tp: int, target, latency_us: float) -> float:
    if tp <= 1:
        return 0.0
    link = (target.ici_link_gbps or 50.0) * 1e9 * 2  # a ring uses both directions of its links
    return 2 * (tp - 1) / tp * bytes_ / link + latency_us * 1e-6


def experts_touched(config, batch: int) -> float:
    """The expected fraction of an MoE layer's experts that BATCH tokens are routed to (uniform top-k routing)."""
    if not config.moe:
        return 1.0
    return 1 - (1 - config.num_experts_per_tok / config.num_experts) ** batch


def decode_step_s(config, target, tp: int, weights: int, kv_per_token: float, batch: int, context: float,
                  end: int, expert_bytes: int = 0) -> dict:
    """Seconds of one decode step on one device at band end END (0 low, 1 point, 2 high): hbm, compute, ici, total.
    EXPERT_BYTES: the routed experts' share of WEIGHTS (only the experts tokens are routed to are read)."""
    bw = target.hbm_gbps_per_device * 1e9 * HBM_EFFICIENCY[end]
    peak = target.peak_bf16_tflops_per_device * 1e12 * (1.0 if end == 0 else MXU_EFFICIENCY[end])
    read = weights - expert_bytes * (1 - experts_touched(config, batch))
    hbm = (read + batch * context * kv_per_token) / bw
    attention = 4 * batch * context * config.num_attention_heads * attention_dim(config) * config.num_hidden_layers
    compute = (2 * active_parameters(config) * batch + attention) / tp / peak
    ici = 2 * config.num_hidden_layers * _all_reduce_s(batch * config.hidden_size * 2, tp, target,
                                                       ALL_REDUCE_LATENCY_US[end])
    return {"hbm": hbm, "compute": compute, "ici": ici, "total": max(hbm, compute) + ici}


def prefill_s(config, target, tp: int, weights: int, tokens: int, chunk: int, end: int,
              compute_only: bool = False) -> float:
    """Seconds to prefill one request of TOKENS in chunks of CHUNK on one device of the engine."""
    peak = target.peak_bf16_tflops_per_device * 1e12 * MXU_EFFICIENCY[end]
    bw = target.hbm_gbps_per_device * 1e9 * HBM_EFFICIENCY[end]
    total, done = 0.0, 0
    while done < tokens:
        n = min(chunk, tokens - done)
        prefix = done + n / 2
        flops = (2 * active_parameters(config) * n
                 + 4 * n * prefix * config.num_attention_heads * attention_dim(config) * config.num_hidden_layers) / tp
        compute = flops / peak
        ici = 2 * config.num_hidden_layers * _all_reduce_s(n * config.hidden_size * 2, tp, target,
                                                           ALL_REDUCE_LATENCY_US[end])
        total += (compute if compute_only else max(compute, weights / bw)) + ici
        done += n
    return total


def estimate(config, slice_, tp: int, replicas: int, weights: int, kv_per_token: float, concurrency: int,
             input_len: int, output_len: int, chunk: int, price, expert_bytes: int = 0,
             weights_compiled: bool = True) -> ServeEstimate:
    context = input_len + output_len / 2  # a request's mean context over its decode steps
    steps = [decode_step_s(config, slice_.target, tp, weights, kv_per_token, concurrency, context, end, expert_bytes)
             for end in range(3)]
    prefills = [prefill_s(config, slice_.target, tp, weights, input_len, chunk, end) for end in range(3)]
    interference = [concurrency / output_len * prefill_s(config, slice_.target, tp, weights, input_len, chunk, end,
                                                         compute_only=True) for end in range(3)]
    tpots = [steps[end]["total"] + interference[end] for end in range(3)]
    point = steps[1]
    bound = "ici" if point["ici"] > max(point["hbm"], point["compute"]) else (
        "hbm" if point["hbm"] >= point["compute"] else "compute")
    per_replica = concurrency / tpots[1]
    total = per_replica * replicas
    chips = slice_.total_chips
    cost = None
    if price is not None and total > 0:
        cost = price.usd_per_chip_hour * chips / 3600 / total * 1e6
    ms = lambda values: Band(values[1] * 1e3, values[0] * 1e3, values[2] * 1e3)  # noqa: E731
    return ServeEstimate(
        concurrency=concurrency, context_tokens=context,
        decode_step_ms=ms([s["total"] for s in steps]), prefill_ms=ms(prefills), tpot_ms=ms(tpots),
        ttft_ms=(prefills[1] + steps[1]["total"]) * 1e3, output_tokens_per_s=total,
        output_tokens_per_s_per_chip=total / chips, cost_per_million_output_tokens=cost,
        price_usd_per_chip_hour=None if price is None else price.usd_per_chip_hour,
        price_source=None if price is None else price.source, bound=bound,
        decode_breakdown_ms={k: round(point[k] * 1e3, 4) for k in ("hbm", "compute", "ici")},
        how=("roofline of the decode step (weights (of an MoE, the experts tokens are routed to) + KV read from HBM, FLOPs at the bf16 peak, 2 all-reduces per "
             "layer over ICI) at the efficiencies of tpuprof/analyses/serve_estimate.py; weights per device "
             + ("from the compile" if weights_compiled else "from the shapes (not compiled)")))


def concurrency_for(requested: int | None, max_num_seqs: int, held: int) -> int:
    """Requests decoded together: the requested number (default max_num_seqs), no more than max_num_seqs and than the
    KV cache holds at input_len + output_len tokens each (HELD, serve_memory.requests_held)."""
    wanted = requested or max_num_seqs
    return max(min(wanted, max_num_seqs, held), 0)

