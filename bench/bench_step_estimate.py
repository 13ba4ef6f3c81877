"""The step-time estimate against published MaxText training results (not part of the test suite).

    nice .venv/bin/python bench/bench_step_estimate.py [NAME ...]

For each configuration, one decoder layer of the published model (MaxText's default "llama2"-style block:
RMSNorm, multi-head attention with head_dim 128 through the Pallas TPU flash-attention kernel, gated SiLU
MLP; weights in f32, activations in bf16, remat of the whole layer when the config says remat_policy=full,
AdamW state in f32) is written here from the published dimensions, compiled with libtpu for one device at
the published per-device batch, estimated by tpuprof.analyses.step_estimate, and scaled by the layer count.
Embedding and logits (about 1% of the FLOPs at these sizes) and collectives are not in the compile.

Published step time = MaxText's model FLOPs per device per step (its calculate_tflops_training_per_device:
6 x tokens x matmul parameters + 6 x causal attention) / the published TFLOP/s per chip. Sources:
- https://github.com/AI-Hypercomputer/maxtext/blob/main/MaxText/configs/v5e/README.md (1x v5e-256:
  16B 120 TFLOP/s/chip, 32B 132), configs v5e/16b.sh (per_device_batch_size=6, global_parameter_scale=16,
  remat_policy=full), v5e/32b.sh (4, 32, full); max_target_length=2048.
- https://github.com/AI-Hypercomputer/maxtext/blob/main/MaxText/configs/v5p/README.md (1x v5p-128: 32B
  328 TFLOP/s/chip), v5p/32b.sh (per_device_batch_size=7, scale 32, remat_policy=minimal).
- base.yml: base_emb_dim 2048, base_num_query_heads 16, base_mlp_dim 7168, base_num_decoder_layers 16,
  head_dim 128, vocab 32000; global_parameter_scale 2^k doubles heads and mlp, then emb, then layers in turn.
Pass: the published step time lies inside the band and the point is within 25% of it.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEQ = 2048
VOCAB = 32000
HEAD_DIM = 128


@dataclass
class Config:
    name: str
    target: str
    scale: int  # MaxText global_parameter_scale
    batch: int  # per_device_batch_size
    remat_full: bool
    published_tflops_per_chip: float
    source: str

    def dims(self):
        log2 = int(math.log2(self.scale))
        base, rem = divmod(log2, 3)
        heads_scale = base + int(rem > 0)
        emb_scale = base + int(rem > 1)
        return {"emb": 2048 * 2**emb_scale, "heads": 16 * 2**heads_scale, "mlp": 7168 * 2**heads_scale,
                "layers": 16 * 2**base}


CONFIGS = [
    Config("v5e-16B", "v5e", 16, 6, True, 120, "MaxText configs/v5e/README.md, 1x v5e-256"),
    Config("v5e-32B", "v5e", 32, 4, True, 132, "MaxText configs/v5e/README.md, 1x v5e-256"),
    Config("v5p-32B", "v5p", 32, 7, False, 328, "MaxText configs/v5p/README.md, 1x v5p-128"),
]


def model_flops_per_device(config: Config) -> float:
    """MaxText's accounting: matmul FLOPs x 3 (forward and backward) plus causal attention."""
    d = config.dims()
    tokens = config.batch * SEQ
    q = d["heads"] * HEAD_DIM
    per_layer = 2 * tokens * (d["emb"] * 3 * q + q * d["emb"] + 3 * d["emb"] * d["mlp"])
    attention = 4 * config.batch * SEQ * SEQ * q / 2  # causal: half the score matrix
    embedding = 2 * tokens * d["emb"] * VOCAB
    return 3 * (d["layers"] * (per_layer + attention) + embedding)


def layer_step(config: Config):
    """One decoder layer's training step: forward, backward, AdamW update, at the published shapes."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    d = config.dims()
    emb, heads, mlp = d["emb"], d["heads"], d["mlp"]
    q_dim = heads * HEAD_DIM

    def rms_norm(x, scale):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt((x32 ** 2).mean(-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16) * scale

    def layer(p, x):
        b = x.shape[0]
        w = {k: v.astype(jnp.bfloat16) for k, v in p.items()}
        h = rms_norm(x, w["norm1"])
        q, k, v = (jnp.einsum("bse,ed->bsd", h, w[n]).reshape(b, SEQ, heads, HEAD_DIM).transpose(0, 2, 1, 3)
                   for n in ("wq", "wk", "wv"))
        attended = flash_attention(q, k, v, causal=True, sm_scale=HEAD_DIM ** -0.5)
        x = x + jnp.einsum("bsd,de->bse", attended.transpose(0, 2, 1, 3).reshape(b, SEQ, q_dim), w["wo"])
        h = rms_norm(x, w["norm2"])
        gate = jax.nn.silu(jnp.einsum("bse,em->bsm", h, w["wi0"])) * jnp.einsum("bse,em->bsm", h, w["wi1"])
        return x + jnp.einsum("bsm,me->bse", gate, w["wout"])

    if config.remat_full:
        layer = jax.checkpoint(layer)

    def step(params, mu, nu, x, cotangent):
        def objective(p):
            return jnp.vdot(layer(p, x).astype(jnp.float32), cotangent.astype(jnp.float32))

        grads = jax.grad(objective)(params)
        mu = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, mu, grads)
        nu = jax.tree_util.tree_map(lambda n, g: 0.95 * n + 0.05 * g * g, nu, grads)
        params = jax.tree_util.tree_map(lambda p, m, n: p - 1e-4 * (m / (jnp.sqrt(n) + 1e-8) + 0.1 * p),
                                        params, mu, nu)
        return params, mu, nu

    f32 = jnp.float32
    shapes = {"norm1": (emb,), "norm2": (emb,), "wq": (emb, q_dim), "wk": (emb, q_dim), "wv": (emb, q_dim),
              "wo": (q_dim, emb), "wi0": (emb, mlp), "wi1": (emb, mlp), "wout": (mlp, emb)}
    params = {k: jax.ShapeDtypeStruct(s, f32) for k, s in shapes.items()}
    x = jax.ShapeDtypeStruct((config.batch, SEQ, emb), jnp.bfloat16)
    return step, (params, params, params, x, x)


def run(config: Config) -> dict:
    from tpuprof.analyses import step_estimate
    from tpuprof.sources import tpu_compile

    fn, args = layer_step(config)
    folder = Path(tempfile.mkdtemp(prefix=f"bench-{config.name}-")) / "dump"
    started = time.perf_counter()
    tpu_compile.compile_jax(fn, args, config.target, folder, donate_argnums=(0, 1, 2))
    compile_s = time.perf_counter() - started
    estimate = step_estimate.estimate(step_estimate.load(folder), config.target)
    layers = config.dims()["layers"]
    published = model_flops_per_device(config) / (config.published_tflops_per_chip * 1e12)
    low, high, point = (layers * v for v in (estimate.low_s, estimate.high_s, estimate.point_s))
    return {"config": config, "published_s": published, "low_s": low, "high_s": high, "point_s": point,
            "roofline_s": layers * estimate.roofline_s, "compiler_s": layers * (estimate.compiler_s or 0),
            "kernels_without_estimate": estimate.kernels_without_estimate, "compile_s": compile_s}


def main(names: list[str]) -> int:
    chosen = [c for c in CONFIGS if not names or c.name in names]
    failures = 0
    print(f"{'config':9} {'published':>10} {'roofline':>9} {'compiler':>9} {'point':>8} {'point/pub':>9}  in band")
    for config in chosen:
        r = run(config)
        inside = r["low_s"] <= r["published_s"] <= r["high_s"]
        ratio = r["point_s"] / r["published_s"]
        ok = inside and abs(ratio - 1) <= 0.25
        failures += not ok
        print(f"{config.name:9} {r['published_s']:9.3f}s {r['roofline_s']:8.3f}s {r['compiler_s']:8.3f}s "
              f"{r['point_s']:7.3f}s {ratio:9.2f}  {'yes' if inside else 'NO'}{'' if ok else '  FAIL'}"
              f"   ({config.source}; compile {r['compile_s']:.0f} s"
              + (f"; no estimate: {', '.join(r['kernels_without_estimate'])}" if r["kernels_without_estimate"] else "")
              + ")", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
