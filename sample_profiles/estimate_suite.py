"""Compile a suite of programs with libtpu and keep what tests/test_hlo_estimate.py needs to check the
HLO-text memory estimate against the exact figures (compile-only: no TPU needed).

    nice python sample_profiles/estimate_suite.py                 # every program, each in its own process
    nice python sample_profiles/estimate_suite.py --only scan_remat_v5e

Per program, `estimate/<name>.after_optimizations.txt.gz` is the after-optimizations HLO text libtpu dumps
(what users paste into issues), and `estimate/manifest.json` holds the exact figures of the same compile:
the peak from the HloProto's buffer assignment (tpuprof's HloProto path, equal to XProf's memory viewer to
the byte: tests/test_memory.py), its argument/output/temporary bytes, and the compiler's own
`memory_analysis()`. The HloProto itself is not kept (too large to commit for the whole suite).

A few programs are also compiled for the host CPU with XLA's dump flags: `estimate/cpu/<name>/` keeps that
dump's module proto before optimization and the CPU after-optimizations HloProto (which carries a CPU buffer
assignment), the kind of dump users make on the machine they develop on.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tpuprof, when run from a checkout
sys.path.insert(0, str(HERE / "models"))

OUT = HERE / "estimate"
MANIFEST = OUT / "manifest.json"


# --- the programs: factory(target) -> (function or jitted function, example arguments, donate_argnums) -------

def scan_remat(target):
    """A 12-layer residual MLP scanned with jax.lax.scan, each layer rematerialised, SGD train step."""
    import jax
    import jax.numpy as jnp

    layers, width, batch = 12, 2048, 8192

    def layer(x, p):
        return x + jax.nn.gelu(x @ p["w"] + p["b"]), None

    def loss(params, x):
        y, _ = jax.lax.scan(jax.checkpoint(layer), x, params)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)

    params = {"w": jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16),
              "b": jax.ShapeDtypeStruct((layers, width), jnp.bfloat16)}
    return step, (params, jax.ShapeDtypeStruct((batch, width), jnp.bfloat16)), ()


def while_loop(target):
    """A data-dependent while loop carrying three arrays (power iteration until convergence)."""
    import jax
    import jax.numpy as jnp

    def f(a, v):
        def cond(state):
            i, _, delta = state
            return (i < 50) & (delta > 1e-6)

        def body(state):
            i, v, _ = state
            w = a @ v
            w = w / jnp.linalg.norm(w, axis=0, keepdims=True)
            return i + 1, w, jnp.max(jnp.abs(w - v))

        _, v, _ = jax.lax.while_loop(cond, body, (0, v, jnp.float32(1.0)))
        return v, a @ v

    return f, (jax.ShapeDtypeStruct((4000, 4000), jnp.float32), jax.ShapeDtypeStruct((4000, 512), jnp.float32)), ()


def multi_output(target):
    """LayerNorm + softmax statistics: reductions that XLA fuses into multi-output fusions, train step."""
    import jax
    import jax.numpy as jnp

    def loss(w, x):
        h = x @ w
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        h = (h - mean) * jax.lax.rsqrt(var + 1e-5)
        logits = h @ w.T
        return jax.nn.logsumexp(logits, axis=-1).mean() + (h.max(-1) - h.min(-1)).mean()

    def step(w, x):
        value, grad = jax.value_and_grad(loss)(w, x)
        return value, w - 1e-2 * grad

    return step, (jax.ShapeDtypeStruct((768, 768), jnp.float32), jax.ShapeDtypeStruct((16384, 768), jnp.float32)), ()


def _attention(head_dim):
    def factory(target):
        import jax
        import jax.numpy as jnp

        batch, seq, heads = 2, 2048, 8
        d_model = heads * head_dim

        def loss(p, x):
            q, k, v = (jnp.einsum("bsd,dhe->bshe", x, p[n]) for n in ("q", "k", "v"))
            scores = jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(jnp.float32) / head_dim ** 0.5
            mask = jnp.tril(jnp.ones((seq, seq), bool))
            weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1).astype(x.dtype)
            out = jnp.einsum("bhqk,bkhe->bqhe", weights, v)
            y = jnp.einsum("bqhe,hed->bqd", out, p["o"])
            return jnp.mean(y.astype(jnp.float32) ** 2)

        def step(p, x):
            grads = jax.grad(loss)(p, x)
            return jax.tree_util.tree_map(lambda a, g: a - 1e-3 * g, p, grads)

        bf16 = jnp.bfloat16
        params = {n: jax.ShapeDtypeStruct((d_model, heads, head_dim), bf16) for n in ("q", "k", "v")}
        params["o"] = jax.ShapeDtypeStruct((heads, head_dim, d_model), bf16)
        return step, (params, jax.ShapeDtypeStruct((batch, seq, d_model), bf16)), ()

    factory.__doc__ = f"Causal multi-head attention with head dim {head_dim} (8 heads, seq 2048), bf16 train step."
    return factory


def collectives_2x2(target):
    """An MLP train step sharded over a 2x2 mesh of the 4 devices (data x model): all-gathers, reduce-scatters
    and all-reduces; the figures are per device."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    mesh = Mesh(np.array(tpu_compile.topology_devices(target)[:4]).reshape(2, 2), ("data", "model"))

    def loss(p, x):
        h = jax.nn.relu(x @ p["up"])
        return jnp.mean((h @ p["down"]).astype(jnp.float32) ** 2)

    def step(p, x):
        grads = jax.grad(loss)(p, x)
        return jax.tree_util.tree_map(lambda a, g: a - 1e-3 * g, p, grads)

    bf16 = jnp.bfloat16
    params = {"up": jax.ShapeDtypeStruct((2048, 8192), bf16, sharding=NamedSharding(mesh, P("data", "model"))),
              "down": jax.ShapeDtypeStruct((8192, 2048), bf16, sharding=NamedSharding(mesh, P("model", "data")))}
    x = jax.ShapeDtypeStruct((8192, 2048), bf16, sharding=NamedSharding(mesh, P("data", None)))
    out = {"up": params["up"].sharding, "down": params["down"].sharding}
    return jax.jit(step, out_shardings=out), (params, x), ()


def data_parallel_2x2(target):
    """A 4-layer MLP train step, data parallel over a 2x2 mesh of the 4 devices: the weights replicated, the batch
    split; the gradients of several layers are all-reduced by one all-reduce of a tuple, in place."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    mesh = Mesh(np.array(tpu_compile.topology_devices(target)[:4]).reshape(2, 2), ("data", "model"))
    width, batch, layers, bf16 = 4096, 8192, 4, jnp.bfloat16

    def loss(params, x):
        for w in params:
            x = jax.nn.relu(x @ w)
        return jnp.mean(x.astype(jnp.float32) ** 2)

    def step(params, x):
        return jax.tree_util.tree_map(lambda a, g: a - 1e-3 * g, params, jax.grad(loss)(params, x))

    params = [jax.ShapeDtypeStruct((width, width), bf16, sharding=NamedSharding(mesh, P())) for _ in range(layers)]
    x = jax.ShapeDtypeStruct((batch, width), bf16, sharding=NamedSharding(mesh, P(("data", "model"), None)))
    return jax.jit(step), (params, x), ()


def host_offload(target):
    """Activations saved for the backward pass are offloaded to pinned host memory (remat offload policy) in a
    scanned MLP; the weights' update comes back to HBM."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    layers, width, batch = 6, 2048, 8192

    def layer(x, w):
        h = checkpoint_name(jnp.tanh(x @ w), "hidden")
        return x + h, None

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["hidden"],
        offload_src="device", offload_dst="pinned_host")

    def loss(w, x):
        y, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, w)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def step(w, x):
        return w - 1e-3 * jax.grad(loss)(w, x)

    bf16 = jnp.bfloat16
    return step, (jax.ShapeDtypeStruct((layers, width, width), bf16), jax.ShapeDtypeStruct((batch, width), bf16)), ()


def host_output(target):
    """A jitted function whose result is placed in pinned host memory (memory kind pinned_host)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from tpuprof.sources import tpu_compile

    device = tpu_compile.device(target)

    def f(x, w):
        h = jnp.tanh(x @ w)
        return h, h.sum(0)

    out = (SingleDeviceSharding(device, memory_kind="pinned_host"), SingleDeviceSharding(device))
    args = (jax.ShapeDtypeStruct((4096, 1024), jnp.float32), jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    return jax.jit(f, out_shardings=out), args, ()


def donation(target):
    """Adam update of a 2-layer MLP whose parameters and optimizer state are donated (updated in place)."""
    import jax
    import jax.numpy as jnp

    def loss(p, x):
        return jnp.mean((jnp.tanh(x @ p["a"]) @ p["b"]) ** 2)

    def step(p, m, v, x):
        g = jax.grad(loss)(p, x)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return p, m, v

    f32 = jnp.float32
    tree = {"a": jax.ShapeDtypeStruct((1000, 3000), f32), "b": jax.ShapeDtypeStruct((3000, 500), f32)}
    return step, (tree, tree, tree, jax.ShapeDtypeStruct((8192, 1000), f32)), (0, 1, 2)


def int4_fp8(target):
    """int4 weights and float8_e4m3fn activations: a quantised matmul chain (sub-byte and fp8 arrays)."""
    import jax
    import jax.numpy as jnp

    def f(w4, scale, x8, w8):
        w = w4.astype(jnp.bfloat16) * scale
        h = jnp.dot(x8.astype(jnp.bfloat16), w)
        h8 = jnp.clip(h, -400, 400).astype(jnp.float8_e4m3fn)
        y = jnp.dot(h8, w8, preferred_element_type=jnp.float32)
        return y, h8, (w4.astype(jnp.int8) + 1).astype(jnp.int4)

    args = (jax.ShapeDtypeStruct((2048, 3000), jnp.int4), jax.ShapeDtypeStruct((3000,), jnp.bfloat16),
            jax.ShapeDtypeStruct((8192, 2048), jnp.float8_e4m3fn),
            jax.ShapeDtypeStruct((3000, 500), jnp.float8_e4m3fn))
    return f, args, ()


def transformer_scan(target):
    """A 4-layer bf16 transformer (attention + MLP) scanned over layers with remat, Adam-free SGD step."""
    import jax
    import jax.numpy as jnp

    layers, batch, seq, d, heads = 4, 8, 1024, 768, 12

    def block(x, p):
        b, s, _ = x.shape
        hd = d // heads
        q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(b, s, heads, hd) for t in (q, k, v))
        w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / hd ** 0.5, -1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w.astype(x.dtype), v).reshape(b, s, d)
        x = x + a @ p["o"]
        return x + jax.nn.gelu(x @ p["up"]) @ p["down"], None

    def loss(p, x):
        y, _ = jax.lax.scan(jax.checkpoint(block), x, p)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)

    bf16 = jnp.bfloat16
    params = {"qkv": jax.ShapeDtypeStruct((layers, d, 3 * d), bf16), "o": jax.ShapeDtypeStruct((layers, d, d), bf16),
              "up": jax.ShapeDtypeStruct((layers, d, 4 * d), bf16),
              "down": jax.ShapeDtypeStruct((layers, 4 * d, d), bf16)}
    return step, (params, jax.ShapeDtypeStruct((batch, seq, d), bf16)), (0,)


def llm8b_scan(target, remat: bool = True, seq: int = 2048):
    """A Qwen3-8B-shaped decoder (hidden 4096, MLP 12288, 32 query / 8 KV heads of 128, vocab 151936) scanned over
    its 36 layers with remat, bf16 SGD train step, FSDP over the 8 devices of the topology (batch 8 x 2048)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    layers, d, mlp, heads, kv, hd, vocab, batch = 36, 4096, 12288, 32, 8, 128, 151936, 8
    devices = tpu_compile.topology_devices(target)
    mesh = Mesh(np.array(devices), ("fsdp",))
    bf16 = jnp.bfloat16

    def rms(x):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype(x.dtype)

    def block(x, p):
        b, s, _ = x.shape
        h = rms(x)
        q = (h @ p["q"]).reshape(b, s, heads, hd)
        k = jnp.repeat((h @ p["k"]).reshape(b, s, kv, hd), heads // kv, axis=2)
        v = jnp.repeat((h @ p["v"]).reshape(b, s, kv, hd), heads // kv, axis=2)
        w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / hd ** 0.5, -1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w.astype(bf16), v).reshape(b, s, heads * hd)
        x = x + a @ p["o"]
        h = rms(x)
        return x + (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"], None

    def loss(params, tokens):
        x = params["embed"][tokens]
        x, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, x, params["layers"])
        logits = rms(x) @ params["unembed"]
        return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])

    def step(params, tokens):
        grads = jax.grad(loss)(params, tokens)
        return jax.tree_util.tree_map(lambda a, g: a - 1e-4 * g, params, grads)

    def spec(shape, partition):
        return jax.ShapeDtypeStruct(shape, bf16, sharding=NamedSharding(mesh, partition))

    shard_last = P(None, None, "fsdp")
    params = {
        "embed": spec((vocab, d), P("fsdp", None)), "unembed": spec((d, vocab), P(None, "fsdp")),
        "layers": {"q": spec((layers, d, heads * hd), shard_last), "k": spec((layers, d, kv * hd), shard_last),
                   "v": spec((layers, d, kv * hd), shard_last), "o": spec((layers, heads * hd, d), shard_last),
                   "gate": spec((layers, d, mlp), shard_last), "up": spec((layers, d, mlp), shard_last),
                   "down": spec((layers, mlp, d), shard_last)},
    }
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P("fsdp", None)))
    shardings = jax.tree_util.tree_map(lambda a: a.sharding, params)
    return jax.jit(step, out_shardings=shardings, donate_argnums=(0,)), (params, tokens), ()


def llm8b_scan_saved(target):
    """llm8b_scan without remat, sequences of 1024: the scan saves every layer's activations for the backward pass
    in stacked [36, ...] buffers that live from the forward loop to the backward loop (the public Qwen3-8B text's
    kind; at 2048 tokens they take 46.79G of HLO temporaries, more than a v6e chip has)."""
    return llm8b_scan(target, remat=False, seq=1024)


def keras_mlp(target):
    """The Keras 3 (TF backend) MLP of sample_profiles/models/keras_mlp.py, Adam train step via TF -> HLO."""
    import keras_mlp as model_file

    return model_file.factory(4096)


PROGRAMS = {
    "scan_remat": scan_remat,
    "while_loop": while_loop,
    "multi_output": multi_output,
    "attention_hd80": _attention(80),
    "attention_hd96": _attention(96),
    "collectives_2x2": collectives_2x2,
    "host_offload": host_offload,
    "host_output": host_output,
    "donation": donation,
    "int4_fp8": int4_fp8,
    "transformer_scan": transformer_scan,
    "keras_mlp": keras_mlp,
    "llm8b_scan": llm8b_scan,
    "llm8b_scan_saved": llm8b_scan_saved,
    "data_parallel_2x2": data_parallel_2x2,
}
# (program, generation): v5e and v6e get every program; v5p, v4 and v2 a spread of them.
SUITE = [(p, "v5e") for p in PROGRAMS] + [(p, "v6e") for p in PROGRAMS] + [
    (p, "v5p") for p in ("scan_remat", "attention_hd80", "collectives_2x2", "int4_fp8", "transformer_scan",
                         "multi_output")
] + [(p, "v4") for p in ("scan_remat", "attention_hd96", "while_loop", "donation", "collectives_2x2")] + [
    (p, "v2") for p in ("multi_output", "attention_hd80", "keras_mlp")
] + [("llm8b_scan", "v6e:2x4"), ("llm8b_scan_saved", "v6e:2x4"), ("data_parallel_2x2", "v5p")]
# Programs also dumped on the host CPU (single-device ones whose HLO the TPU compiler takes back).
CPU_PROGRAMS = ("multi_output", "donation", "attention_hd96")


def case_name(program: str, target: str) -> str:
    return f"{program}_{target.replace(':', '.')}"  # v6e:2x4 -> llm8b_scan_v6e.2x4


def _libtpu_version() -> str:
    from importlib.metadata import version

    return version("libtpu")


def generate(program: str, target: str) -> dict:
    from tpuprof.analyses import memory as analysis
    from tpuprof.sources import tpu_compile

    factory = PROGRAMS[program]
    dump = Path(tempfile.mkdtemp(prefix="tpuprof-suite-")) / "dump"
    try:
        made = factory(target)
        if program == "keras_mlp":
            result = tpu_compile.compile_keras(*made, target, dump)
        else:
            fn, args, donate = made
            result = tpu_compile.compile_jax(fn, args, target, dump, donate_argnums=donate)
        text = next(Path(f) for f in result.files if f.endswith(".after_optimizations.txt"))
        exact = analysis.dump_memory(Path(result.hlo_proto))[0]
        name = case_name(program, target)
        OUT.mkdir(exist_ok=True)
        # mtime=0: the same compile gives the same bytes (no spurious diffs when regenerated).
        (OUT / f"{name}.after_optimizations.txt.gz").write_bytes(gzip.compress(text.read_bytes(), 9, mtime=0))
        return {
            "program": program,
            "target": result.target,  # the generation; the topology below
            "topology": result.topology,
            "note": (factory.__doc__ or "").strip(),
            "libtpu": _libtpu_version(),
            "exact": {  # tpuprof's HloProto path on the same compile (equal to XProf's memory viewer)
                "peak_heap_bytes": exact.peak_heap_bytes,
                "argument_bytes": exact.argument_bytes,
                "output_bytes": exact.output_bytes,
                "temp_bytes": exact.temp_bytes,
            },
            "memory_analysis": result.memory_analysis(),
        }
    finally:
        shutil.rmtree(dump.parent, ignore_errors=True)


def generate_cpu(program: str) -> list[str]:
    """Compile PROGRAM for the host CPU with XLA's dump flags; keep the module proto before optimization and
    the CPU HloProto after it (CPU buffer assignment)."""
    import jax

    fn, args, donate = PROGRAMS[program]("v5e")
    cpu = jax.devices("cpu")[0]
    args = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(cpu)), args)
    dump = Path(tempfile.mkdtemp(prefix="tpuprof-cpu-"))
    final = OUT / "cpu" / program
    try:
        jax.jit(fn, donate_argnums=donate).lower(*args).compile(compiler_options={
            "xla_dump_to": str(dump), "xla_dump_hlo_as_proto": True})
        before = max(dump.glob("*.before_optimizations.hlo.pb"), key=lambda p: p.stat().st_size)
        prefix = before.name[: -len(".before_optimizations.hlo.pb")]
        after = next(dump.glob(prefix + ".*after_optimizations.hlo.pb"))
        if final.exists():
            shutil.rmtree(final)
        final.mkdir(parents=True)
        kept = []
        for path in (before, after):
            shutil.copy(path, final / path.name)
            kept.append(path.name)
        return kept
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def _update_manifest(name: str, entry: dict) -> None:
    import fcntl

    lock_path = Path(tempfile.gettempdir()) / "tpuprof-estimate-manifest.lock"
    with open(lock_path, "w") as lock:  # two runs may finish cases at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
        manifest[name] = entry
        MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one case, e.g. scan_remat_v5e, or cpu:multi_output")
    parser.add_argument("--missing", action="store_true", help="only the cases not in the manifest yet")
    options = parser.parse_args()
    if options.only:
        if options.only.startswith("cpu:"):
            program = options.only[4:]
            print(program, generate_cpu(program))
            return
        program, _, target = options.only.rpartition("_")
        entry = generate(program, target.replace(".", ":"))
        _update_manifest(options.only, entry)
        print(options.only, entry["exact"]["peak_heap_bytes"])
        return
    done = json.loads(MANIFEST.read_text()) if options.missing and MANIFEST.exists() else {}
    # One process per case: TF/JAX state never leaks from one compile into the next.
    for program, target in SUITE:
        name = case_name(program, target)
        if name not in done:
            subprocess.run([sys.executable, __file__, "--only", name], check=False)
    for program in CPU_PROGRAMS:
        if not options.missing or not (OUT / "cpu" / program).exists():
            subprocess.run([sys.executable, __file__, "--only", f"cpu:{program}"], check=False)


if __name__ == "__main__":
    main()
