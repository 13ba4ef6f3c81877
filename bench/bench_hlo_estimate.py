"""The HLO-text memory estimate's time on a ~1 MB and a ~10 MB after-optimizations HLO text, and how far it is from
the exact peak of the same compile (the HloProto's buffer assignment, equal to XProf's memory viewer).

    nice .venv/bin/python bench/bench_hlo_estimate.py [--runs 3]

The texts come from libtpu compiles (one TensorCore of v5p) of bf16 transformer training steps with the layers
unrolled (sample_profiles/models/transformer.py): 6 layers give about 1 MB of text, 60 layers about 10 MB. They
are compiled on first use and cached in bench/.cache/ (never committed). Times are medians after one warm-up,
in-process (parse + dataflow + liveness), and for the whole `tpuprof memory --json` process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_profiles" / "models"))

from timing import median_time  # noqa: E402  (bench/ is on sys.path when run as a script)

CACHE = HERE / ".cache"
SIZES = {"1MB": 6, "10MB": 60}  # label -> unrolled layers
BATCH, D_MODEL, HEADS, SEQ = 4, 512, 8, 512


def compiled(layers: int) -> Path:
    """The cached dump folder of the LAYERS-layer step (after-optimizations text and HloProto)."""
    folder = CACHE / f"hlo_text_transformer{layers}_v5p"
    if next(folder.glob("*.after_optimizations.txt"), None) is not None:
        return folder
    import shutil

    import transformer

    from tpuprof.sources import tpu_compile

    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    fn, args = transformer.build(BATCH, layers=layers, d_model=D_MODEL, heads=HEADS, seq=SEQ)
    tpu_compile.compile_jax(fn, args, "v5p", staging)
    staging.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()

    from tpuprof.analyses import hlo_estimate
    from tpuprof.analyses import memory as analysis

    for label, layers in SIZES.items():
        folder = compiled(layers)
        text_path = next(folder.glob("*.after_optimizations.txt"))
        text = text_path.read_text()
        exact = analysis.dump_memory(next(folder.glob("*.after_optimizations.hlo.pb")))[0]
        estimate = hlo_estimate.from_text(text, str(text_path), "v5p")
        seconds = median_time(lambda: hlo_estimate.from_text(text, str(text_path), "v5p"), options.runs)
        command = [sys.executable, "-m", "tpuprof", "memory", str(text_path), "--target", "v5p", "--json"]
        process = median_time(lambda: subprocess.run(command, capture_output=True, check=True), options.runs)
        document = json.loads(subprocess.run(command, capture_output=True, check=True, text=True).stdout)
        assert document["modules"][0]["method"] == "hlo_liveness"
        print(f"{label:>5}: {len(text) / 1e6:5.1f} MB of HLO text, {layers} layers, "
              f"{sum(len(v) for v in hlo_estimate.hlo_text.parse(text).computations.values()):,} instructions: "
              f"estimate {seconds:.2f} s in-process, {process:.2f} s for `tpuprof memory --json`; "
              f"peak {estimate.peak_heap_bytes:,} B vs exact {exact.peak_heap_bytes:,} B "
              f"({estimate.peak_heap_bytes / exact.peak_heap_bytes:.3f}x)")


if __name__ == "__main__":
    main()
