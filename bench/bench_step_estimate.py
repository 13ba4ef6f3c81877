"""The step-time estimate against published MaxText training results (not part of the test suite).

    nice .venv/bin/python bench/bench_step_estimate.py [--one-device] [NAME ...]

For each configuration, one decoder layer of the published model (MaxText's default "llama2"-style block:
RMSNorm, multi-head attention with head_dim 128 through the Pallas TPU flash-attention kernel, gated SiLU
MLP; weights in f32, activations in bf16, remat of the whole layer when the config says remat_policy=full,
AdamW state in f32) is written here from the published dimensions and compiled with libtpu on the published
slice, sharded as the config shards it (ici_fsdp_parallelism=-1 and ici_tensor_parallelism: weights and
optimizer state over fsdp x tensor, the batch over fsdp, the attention kernel per shard through shard_map),
at the published per-device batch, as a step runs it (the layer's output value and its gradient: forward,
the recomputed forward under remat, backward, AdamW); tpuprof.analyses.step_estimate estimates it (compute band and point plus
the layer's all-gathers and reduce-scatters on the slice's ICI torus, overlapped as scheduled) and the
layer's figures are scaled by the layer count. A multi-slice configuration adds the all-reduce of each
device's gradient shard (f32, all parameters / the slice's devices) across slices over DCN. Embedding and
logits (about 1% of the FLOPs at these sizes) are not in the compile. `--one-device` compiles the layer for
one device instead (no collectives), as this bench did before collectives were modelled.

Published step time = MaxText's model FLOPs per device per step (its calculate_tflops_training_per_device:
6 x tokens x matmul parameters + 6 x causal attention) / the published TFLOP/s per chip. The runs, their
settings (per_device_batch_size, global_parameter_scale, remat_policy, ici_tensor_parallelism) and sources
(MaxText configs/v5e/README.md and configs/v5p/README.md, the v5e/*.sh and v5p/*.sh run scripts) are the
"MaxText configs README table" entries of bench/training_published.json; by default the six this bench has
always run (16B, 32B, 64B on 1x v5e-256, 16B on 2x v5e-256, 32B on 1x and 2x v5p-128), any of them by name.
base.yml: base_emb_dim 2048, base_num_query_heads 16, base_mlp_dim 7168, base_num_decoder_layers 16,
head_dim 128, vocab 32000; global_parameter_scale 2^k doubles heads and mlp, then emb, then layers in turn.
Pass: the point is within 25% of the published step time (whether the band holds it is reported too).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEQ = 2048
VOCAB = 32000
HEAD_DIM = 128


PUBLISHED = Path(__file__).resolve().parent / "training_published.json"
DEFAULT_RUNS = ("maxtext 16b v5e-256", "maxtext 32b v5e-256", "maxtext 64b v5e-256", "maxtext 32b v5p-128",
                "maxtext 16b 2xv5e-256", "maxtext 32b 2xv5p-128")


def dims(scale: int) -> dict:
    """MaxText's 'default' model at global_parameter_scale (base.yml): heads and mlp double first, then emb, then
    layers, in turn."""
    log2 = int(math.log2(scale))
    base, rem = divmod(log2, 3)
    heads_scale = base + int(rem > 0)
    emb_scale = base + int(rem > 1)
    return {"emb": 2048 * 2**emb_scale, "heads": 16 * 2**heads_scale, "mlp": 7168 * 2**heads_scale,
            "layers": 16 * 2**base}


def model_flops_per_device(scale: int, batch: int, seq: int = SEQ) -> float:
    """MaxText's accounting: matmul FLOPs x 3 (forward and backward) plus causal attention."""
    d = dims(scale)
    tokens = batch * seq
    q = d["heads"] * HEAD_DIM
    per_layer = 2 * tokens * (d["emb"] * 3 * q + q * d["emb"] + 3 * d["emb"] * d["mlp"])
    attention = 4 * batch * seq * seq * q / 2  # causal: half the score matrix
    embedding = 2 * tokens * d["emb"] * VOCAB
    return 3 * (d["layers"] * (per_layer + attention) + embedding)


@dataclass
class Config:
    name: str
    target: str
    scale: int  # MaxText global_parameter_scale
    batch: int  # per_device_batch_size
    remat_full: bool
    published_tflops_per_chip: float
    source: str
    slice: str = ""  # the published slice, as Cloud TPU names it
    num_slices: int = 1
    tensor: int = 1  # ici_tensor_parallelism (fsdp takes the rest)
    flags: str = ""  # how the bench compiled it (set by run)

    def dims(self):
        return dims(self.scale)

    @classmethod
    def from_published(cls, run: dict) -> "Config":
        """A "MaxText configs README table" entry of bench/training_published.json."""
        generation = "v5e" if run["generation"] == "v5e" else run["generation"]
        return cls(run["name"], generation, run["maxtext_global_parameter_scale"], run["batch_per_device"],
                   (run.get("remat") or {}).get("policy") == "full", run["published"]["tflops_per_chip"],
                   run["source"], run["slice"], run["num_slices"],
                   (run.get("parallelism") or {}).get("ici_tensor_parallelism", 1))


def configs() -> list[Config]:
    runs = json.loads(PUBLISHED.read_text())["runs"]
    return [Config.from_published(r) for r in runs if r["source_kind"] == "MaxText configs README table"]


# MaxText's run scripts set these libtpu flags (v5e/*.sh, v5p/*.sh LIBTPU_INIT_ARGS): async collective fusion and
# collective/compute overlap. Passed as compile options when libtpu accepts them.
MAXTEXT_FLAGS = {"xla_tpu_enable_async_collective_fusion": True,
                 "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
                 "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
                 "xla_tpu_overlap_compute_collective_tc": True, "xla_enable_async_all_gather": True,
                 "xla_tpu_enable_data_parallel_all_reduce_opt": True,
                 "xla_tpu_data_parallel_opt_different_sized_ops": True}


def parameters(config: Config) -> float:
    """All parameters (matmul weights of every layer, embedding and logits), for the gradient bytes."""
    d = config.dims()
    q = d["heads"] * HEAD_DIM
    return d["layers"] * (4 * d["emb"] * q + 3 * d["emb"] * d["mlp"]) + 2 * VOCAB * d["emb"]


def layer_step(config: Config, mesh=None):
    """One decoder layer's training step: forward, backward, AdamW update, at the published shapes; on
    `mesh` (fsdp, tensor) sharded as MaxText shards it, else for one device."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    from jax.sharding import NamedSharding, PartitionSpec as P

    def constrain(value, *spec):
        return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, P(*spec))) if mesh is not None else value

    def attention(q, k, v):
        kernel = lambda q, k, v: flash_attention(q, k, v, causal=True, sm_scale=HEAD_DIM ** -0.5)  # noqa: E731
        if mesh is None:
            return kernel(q, k, v)
        spec = P("fsdp", "tensor", None, None)
        return jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(q, k, v)

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
        q, k, v = (constrain(jnp.einsum("bse,ed->bsd", h, w[n]), "fsdp", None, "tensor")
                   .reshape(b, SEQ, heads, HEAD_DIM).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
        attended = attention(q, k, v)
        x = x + jnp.einsum("bsd,de->bse", attended.transpose(0, 2, 1, 3).reshape(b, SEQ, q_dim), w["wo"])
        x = constrain(x, "fsdp", None, None)
        h = rms_norm(x, w["norm2"])
        gate = jax.nn.silu(jnp.einsum("bse,em->bsm", h, w["wi0"])) * jnp.einsum("bse,em->bsm", h, w["wi1"])
        gate = constrain(gate, "fsdp", None, "tensor")
        return constrain(x + jnp.einsum("bsm,me->bse", gate, w["wout"]), "fsdp", None, None)

    if config.remat_full:
        layer = jax.checkpoint(layer)

    def step(params, mu, nu, x, cotangent):
        def objective(p):
            return jnp.vdot(layer(p, x).astype(jnp.float32), cotangent.astype(jnp.float32))

        # The value too, as the next layer of a real step consumes this layer's output: with jax.grad alone
        # XLA drops the primal forward (a linear objective's gradient needs no output), and under remat the
        # step would hold only the recomputed forward, one forward pass short of the real step.
        value, grads = jax.value_and_grad(objective)(params)
        mu = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, mu, grads)
        nu = jax.tree_util.tree_map(lambda n, g: 0.95 * n + 0.05 * g * g, nu, grads)
        params = jax.tree_util.tree_map(lambda p, m, n: p - 1e-4 * (m / (jnp.sqrt(n) + 1e-8) + 0.1 * p),
                                        params, mu, nu)
        return params, mu, nu, value

    f32 = jnp.float32
    shapes = {"norm1": (emb,), "norm2": (emb,), "wq": (emb, q_dim), "wk": (emb, q_dim), "wv": (emb, q_dim),
              "wo": (q_dim, emb), "wi0": (emb, mlp), "wi1": (emb, mlp), "wout": (mlp, emb)}
    if mesh is None:
        params = {k: jax.ShapeDtypeStruct(s, f32) for k, s in shapes.items()}
        x = jax.ShapeDtypeStruct((config.batch, SEQ, emb), jnp.bfloat16)
        return step, (params, params, params, x, x)
    specs = {"norm1": P(None), "norm2": P(None), "wo": P("tensor", "fsdp"), "wout": P("tensor", "fsdp")}
    params = {k: jax.ShapeDtypeStruct(s, f32, sharding=NamedSharding(mesh, specs.get(k, P("fsdp", "tensor"))))
              for k, s in shapes.items()}
    x = jax.ShapeDtypeStruct((config.batch * mesh.devices.size, SEQ, emb), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P("fsdp", None, None)))
    return step, (params, params, params, x, x)


def compile_sharded(config: Config, folder: Path) -> None:
    """The layer on the published slice's devices, with MaxText's collective flags when libtpu takes them."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from tpuprof.sources import tpu_compile

    devices = np.array(tpu_compile.topology_devices(config.slice))
    mesh = Mesh(devices.reshape(devices.size // config.tensor, config.tensor), ("fsdp", "tensor"))
    fn, args = layer_step(config, mesh)
    lowered = jax.jit(fn, donate_argnums=(0, 1, 2)).lower(*args)
    dump = {"xla_dump_to": str(folder), "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}
    try:
        lowered.compile({**dump, **MAXTEXT_FLAGS})
        config.flags = "MaxText's collective flags"
    except Exception:  # noqa: BLE001 - an unknown option: compile with the defaults
        shutil.rmtree(folder, ignore_errors=True)
        lowered.compile(dump)
        config.flags = "default flags"


LAYER_VERSION = 3  # bump when layer_step changes: cached compiles are then redone


def cache_folder(config: Config, one_device: bool) -> Path:
    """Where a configuration's compile is kept: compiles of 256 devices take minutes on a small machine."""
    import hashlib
    import os
    from importlib.metadata import version

    key = json.dumps([config.target, config.scale, config.batch, config.remat_full, config.slice, config.tensor,
                      one_device, version("libtpu"), LAYER_VERSION])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tpuprof" / "bench"
    # One folder for the 1x and 2x runs of a configuration: a 2x run compiles its 1x run's program.
    return base / f"{config.scale}b-{config.slice}-{hashlib.sha256(key.encode()).hexdigest()[:12]}" / "dump"


def run(config: Config, one_device: bool = False) -> dict:
    from tpuprof import targets
    from tpuprof.analyses import collectives, step_estimate
    from tpuprof.sources import tpu_compile

    folder = cache_folder(config, one_device)
    started = time.perf_counter()
    if any(folder.glob("*.after_codegen.hlo.pb")):  # compiled before (a 2x row shares its 1x row's program)
        pass
    elif one_device:
        shutil.rmtree(folder, ignore_errors=True)
        fn, args = layer_step(config)
        tpu_compile.compile_jax(fn, args, config.target, folder, donate_argnums=(0, 1, 2))
        config.flags = "one device"
    else:
        shutil.rmtree(folder, ignore_errors=True)
        compile_sharded(config, folder)
    flags = folder.parent / "flags.txt"
    if config.flags:
        flags.write_text(config.flags)
    elif flags.is_file():
        config.flags = flags.read_text() + ", cached"
    compile_s = time.perf_counter() - started
    estimate = step_estimate.estimate(step_estimate.load(folder), config.target)
    layers = config.dims()["layers"]
    published = model_flops_per_device(config.scale, config.batch) / (config.published_tflops_per_chip * 1e12)
    devices = 1 if one_device else len(tpu_compile.topology_devices(config.slice))
    dcn = collectives.dcn_all_reduce_seconds(4 * parameters(config) / devices, config.num_slices,
                                             targets.get(config.target)) if not one_device else 0.0
    low, high, point = (layers * v + dcn for v in (estimate.low_s, estimate.high_s, estimate.point_s))
    return {"config": config, "published_s": published, "low_s": low, "high_s": high, "point_s": point,
            "roofline_s": layers * estimate.roofline_s, "compiler_s": layers * (estimate.compiler_s or 0),
            "collective_s": layers * estimate.collective_s, "exposed_s": layers * estimate.exposed_collective_s,
            "dcn_s": dcn, "kernels_without_estimate": estimate.kernels_without_estimate, "compile_s": compile_s}


def main(arguments: list[str]) -> int:
    one_device = "--one-device" in arguments
    names = [a for a in arguments if not a.startswith("--")]
    chosen = [c for c in configs() if (c.name in names if names else c.name in DEFAULT_RUNS)
              and (c.num_slices == 1 or not one_device)]
    failures = 0
    print(f"{'config':10} {'published':>10} {'low':>8} {'high':>8} {'point':>8} {'point/pub':>9}  in band  "
          f"{'collectives (exposed)':>22} {'DCN':>7}")
    for config in chosen:
        r = run(config, one_device)
        inside = r["low_s"] <= r["published_s"] <= r["high_s"]
        ratio = r["point_s"] / r["published_s"]
        ok = abs(ratio - 1) <= 0.25
        failures += not ok
        print(f"{config.name:10} {r['published_s']:9.3f}s {r['low_s']:7.3f}s {r['high_s']:7.3f}s "
              f"{r['point_s']:7.3f}s {ratio:9.2f}  {'yes' if inside else 'NO ':7}"
              f"{r['collective_s']:10.3f}s ({r['exposed_s']:.3f}s) {r['dcn_s']:6.3f}s{'' if ok else '  FAIL'}"
              f"   ({config.source}; {config.flags}; roofline {r['roofline_s']:.3f}s, compiler "
              f"{r['compiler_s']:.3f}s; compile {r['compile_s']:.0f} s"
              + (f"; no estimate: {', '.join(r['kernels_without_estimate'])}" if r["kernels_without_estimate"] else "")
              + ")", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
