"""Regenerate the sample XLA:TPU dumps and OOM texts with libtpu (compile-only: no TPU needed).

    python sample_profiles/generate.py            # every sample, each in its own process
    python sample_profiles/generate.py --only conv18_f32_v5e

Each sample compiles a model of `sample_profiles/models/` for one device of a TPU topology and keeps
only the main module's files in `dumps/<sample>/` (after_optimizations HloProto, HLO text with TPU
layouts, buffer assignment, memory-usage report), plus `memory_analysis.json` (the compiler's own
figures from `compiled.memory_analysis()`) and `sample.json` (how it was made). OOM cases save the
compiler's RESOURCE_EXHAUSTED text to `oom/libtpu_<case>.txt`.

Every sample runs in a fresh process, so module numbering in file names is the same on every run;
a sample's folder is replaced only once its new contents are complete.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tpuprof, when run from a checkout
sys.path.insert(0, str(HERE / "models"))

DUMPS = HERE / "dumps"
OOM = HERE / "oom"


@dataclass(frozen=True)
class Sample:
    name: str
    model: str  # module in sample_profiles/models
    target: str
    batch: int
    dtype: str | None
    kind: str  # jax | keras | tf_hlo_text | oom_jax | oom_keras | oom_llm (compiled as preflight --model does)
    note: str


SAMPLES = [
    Sample("conv18_f32_v5e", "conv18", "v5e", 256, "float32", "jax",
           "NHWC conv net, 18 output channels, SGD training step (value_and_grad)"),
    Sample("onehot10_v5e", "onehot10", "v5e", 65536, "float32", "jax",
           "MLP classifier, loss on one_hot(labels, 10), SGD training step (libtpu lays f32[65536,10] out "
           "as {0,1}: the 10 classes are second-minor and tile to 16)"),
    Sample("transformer_bf16_v6e", "transformer", "v6e", 8, "bfloat16", "jax",
           "one bf16 transformer block (attention + MLP, d_model 512, seq 512), SGD training step"),
    Sample("int8_matmul_v5e", "int8_matmul", "v5e", 1000, "int8", "jax",
           "int8[1000,300] x int8[300,77] -> int32 dot_general"),
    Sample("keras_mlp_v5e", "keras_mlp", "v5e", 256, "float32", "keras",
           "Keras 3 (TF backend) MLP 784-1000-1000-10, Adam train step via TF -> HLO -> libtpu"),
    Sample("tf_hlo_cpu", "tf_conv18", "v5e", 128, "float32", "tf_hlo_text",
           "TensorFlow conv net with 18 channels: HLO text from experimental_get_compiler_ir(stage='hlo'), "
           "no TPU layouts"),
    # The same model at two batch sizes, for `tpuprof diff` (per-example growth of the peak).
    Sample("diff_b64", "transformer", "v5e", 64, "bfloat16", "jax", "one bf16 transformer block, batch 64 (diff base)"),
    Sample("diff_b128", "transformer", "v5e", 128, "bfloat16", "jax", "one bf16 transformer block, batch 128 (diff new)"),
    Sample("oom_transformer_v5e", "transformer", "v5e", 4096, "bfloat16", "oom_jax",
           "one bf16 transformer block's train step, batch 4096 per chip"),
    Sample("oom_keras_mlp_v5e", "keras_mlp", "v5e", 10_000_000, "float32", "oom_keras",
           "Keras MLP train step, batch 10,000,000 per chip"),
    # Host memory, not HBM: what a remat policy offloads has a budget of its own.
    Sample("oom_host_offload_v6e", "offload_llm", "v6e-4", 8, None, "oom_llm",
           "tpuprof's LLM train step of a 2,000-layer toy on v6e-4, --remat offload, 8 x 8,192 tokens per chip"),
]
BY_NAME = {s.name: s for s in SAMPLES}


def _libtpu_version() -> str:
    from importlib.metadata import version

    return version("libtpu")


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _sample_json(sample: Sample, **extra) -> dict:
    from tpuprof import targets

    target = targets.get(sample.target)
    return {
        "sample": sample.name,
        "model": f"sample_profiles/models/{sample.model}.py:factory",
        "target": target.name,
        "topology": target.topology,
        "device": target.device,
        "batch_size": sample.batch,
        "dtype": sample.dtype,
        "note": sample.note,
        "libtpu": _libtpu_version(),
        **extra,
    }


def _compile(sample: Sample, dump_dir: Path | None):
    import importlib

    from tpuprof.sources import tpu_compile

    factory = importlib.import_module(sample.model).factory
    if sample.kind in ("jax", "oom_jax"):
        if sample.model == "int8_matmul":
            fn, args = factory(sample.batch)
        else:
            fn, args = factory(sample.batch, dtype=sample.dtype)
        return tpu_compile.compile_jax(fn, args, sample.target, dump_dir)
    if sample.kind == "oom_llm":  # sharded over the slice's devices, with the flags preflight --model uses
        from tpuprof import targets
        from tpuprof.sources import llm

        fn, args = factory(sample.batch)
        options = llm.compiler_options(targets.get(sample.target).name)
        return tpu_compile.compile_jax(fn, args, sample.target, dump_dir, options=options)
    if sample.kind in ("keras", "oom_keras"):
        model, x_spec, y_spec = factory(sample.batch)
        return tpu_compile.compile_keras(model, x_spec, y_spec, sample.target, dump_dir)
    raise ValueError(sample.kind)


def repo_relative_paths(folder: Path) -> None:
    """Source paths in the dump's metadata as a reader's machine would see them, not this one's: files of this
    checkout relative to its root (sample_profiles/models/conv18.py), library files from their package
    (tensorflow/python/framework/ops.py). In the HLO text and in the HloProto (op metadata and stack frames)."""
    from tpuprof.protos import hlo_pb2

    prefix = re.compile(r"(?:/[^\s\"']*?/(?:site|dist)-packages/|" + re.escape(str(HERE.parent)) + "/)")
    for path in sorted(folder.iterdir()):
        if path.name.endswith(".hlo.pb"):
            proto = hlo_pb2().HloProto.FromString(path.read_bytes())
            module = proto.hlo_module
            for computation in module.computations:
                for instruction in computation.instructions:
                    instruction.metadata.source_file = prefix.sub("", instruction.metadata.source_file)
            files = module.stack_frame_index.file_names
            files[:] = [prefix.sub("", name) for name in files]
            path.write_bytes(proto.SerializeToString(deterministic=True))
        elif path.suffix == ".txt":
            text = path.read_text()
            path.write_text(prefix.sub("", text))


def generate(sample: Sample) -> Path:
    from tpuprof.sources import tpu_compile

    if sample.kind.startswith("oom_"):
        OOM.mkdir(exist_ok=True)
        out = OOM / f"libtpu_{sample.name[len('oom_'):]}.txt"
        try:
            _compile(sample, None)
        except tpu_compile.CompileResourceExhausted as error:
            which = "every device" if sample.kind == "oom_llm" else "one device"
            header = (f"# Real compiler output: libtpu {_libtpu_version()} compile-only for {which} of "
                      f"{sample.target} ({sample.note}); produced by sample_profiles/generate.py "
                      f"--only {sample.name}\n")
            out.write_text(header + error.message.rstrip("\n") + "\n")
            return out
        raise SystemExit(f"{sample.name}: expected RESOURCE_EXHAUSTED, but the program compiled")

    DUMPS.mkdir(exist_ok=True)
    final = DUMPS / sample.name
    staging = Path(tempfile.mkdtemp(prefix=f".{sample.name}.", dir=DUMPS))
    try:
        if sample.kind == "tf_hlo_text":
            import importlib

            fn, specs = importlib.import_module(sample.model).factory(sample.batch)
            text = fn.experimental_get_compiler_ir(*specs)(stage="hlo", platform_name="CPU")
            (staging / f"{sample.model}.hlo.txt").write_text(text)
            _write_json(staging / "sample.json", _sample_json(sample, source="TensorFlow HLO text (CPU)"))
        else:
            dump = staging / "xla_dump"
            result = _compile(sample, dump)
            for name in result.files:
                shutil.move(name, staging / Path(name).name)
            shutil.rmtree(dump)
            _write_json(staging / "memory_analysis.json", {
                **result.memory_analysis(),
                "required_bytes": result.required_bytes,
            })
            _write_json(staging / "sample.json", _sample_json(sample))
        repo_relative_paths(staging)
        if final.exists():
            shutil.rmtree(final)
        staging.chmod(0o755)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(BY_NAME), help="generate this sample only")
    options = parser.parse_args()
    if options.only:
        path = generate(BY_NAME[options.only])
        size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
        print(f"{options.only}: {path.relative_to(HERE.parent)} ({size / 1024:.0f} KiB)")
        return
    # One process per sample: stable module numbers in file names, and TF/JAX state never leaks.
    for sample in SAMPLES:
        subprocess.run([sys.executable, __file__, "--only", sample.name], check=True)


if __name__ == "__main__":
    main()
