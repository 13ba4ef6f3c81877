"""Compile (once, cached) a large real XLA:TPU module for the memory benchmarks and print its path.

    python bench/make_large_module.py        # -> bench/.cache/transformer48_v5p/<...>.after_optimizations.hlo.pb

A 48-layer bf16 transformer training step (sample_profiles/models/transformer.py, layers unrolled)
compiled with libtpu for one TensorCore of v5p: an HloProto of several MB with tens of thousands of
instructions and its buffer assignment, the size of a real model's dump. Compile-only, no TPU.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_profiles" / "models"))

CACHE = ROOT / "bench" / ".cache" / "transformer48_v5p"
LAYERS, BATCH, D_MODEL, HEADS, SEQ = 48, 8, 1024, 16, 1024


def large_module() -> Path:
    """The cached after_optimizations.hlo.pb, compiled on first use."""
    found = sorted(CACHE.glob("*.after_optimizations.hlo.pb"))
    if found:
        return found[0]
    import transformer

    from tpuprof.sources import tpu_compile

    staging = CACHE.with_name(CACHE.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    fn, args = transformer.build(BATCH, layers=LAYERS, d_model=D_MODEL, heads=HEADS, seq=SEQ)
    result = tpu_compile.compile_jax(fn, args, "v5p", staging)
    figures = {**result.memory_analysis(), "required_bytes": result.required_bytes}
    (staging / "memory_analysis.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    staging.rename(CACHE)  # complete or absent: an interrupted compile leaves only .partial
    return sorted(CACHE.glob("*.after_optimizations.hlo.pb"))[0]


if __name__ == "__main__":
    print(large_module())
