"""`preflight --model`'s step time against published MaxText runs on v6e (not part of the test suite).

    XDG_CACHE_HOME=... nice .venv/bin/python bench/bench_llm_step.py [--remat full|offload] [NAME ...]

For each published run, tpuprof's own LLM train step (tpuprof/sources/llm.py: scanned layers, Pallas splash
attention, AdamW, FSDP over the slice) is compiled by `tpuprof preflight --model` for the published slice at
the published sequence length and per-chip batch, and its step estimate (band and point, collectives on the
slice's torus) is set against the step time the recipe's log prints. When the published batch does not fit
this definition, the largest per-chip batch that does is compiled instead and the comparison is per token
(the point's step x published batch / our batch): said in the output.

What is as in the published runs (tpu-recipes training/trillium READMEs, MaxText@tpu-recipes-v0.1.4): splash
blocks of 2048 with the fused backward kernel and their scoped-VMEM limit (98,304 KiB), f32 weights and AdamW
state, FSDP over the slice, the XLA flag sets both recipes name (layout for all-reduce/reduce-scatter, data-
parallel overlap, all-gather continuation fusion, host-offload scheduling: llm.compiler_options), and with
`--remat offload` (the default here) the decoder-layer input and q/k/v projections offloaded to host memory,
the rest recomputed. What differs: the 8B recipe offloads the attention output projection too (tpuprof
recomputes it) and offloads all-reduces to the SparseCores (not set here); the 70B recipe keeps libtpu's
collective matmuls, which every `--model` compile turns off as the 8B recipe does; the layer is tpuprof's
compact definition, not MaxText's code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = Path(__file__).resolve().parent / "training_published.json"
BENCH_RUNS = ("llama3.1-8b v6e-8", "llama3.1-8b v6e-16", "llama3.1-70b v6e-256")  # this bench's three


@dataclass
class Run:
    name: str
    model: str
    slice: str
    seq: int
    batch: int  # published per-device batch
    seconds: float  # the published log's step time
    source: str
    batch_here: int | None = None  # a smaller batch when the published one does not fit this definition


def published_runs() -> list[Run]:
    """This bench's runs, as bench/training_published.json records them (with the recipe's settings and source)."""
    runs = {r["name"]: r for r in json.loads(PUBLISHED.read_text())["runs"]}
    return [Run(name, runs[name]["model"], runs[name]["slice"], runs[name]["seq"], runs[name]["batch_per_device"],
                runs[name]["published"]["step_s"], runs[name]["source"]) for name in BENCH_RUNS]


RUNS = published_runs()


def preflight(run: Run, batch: int, remat: str) -> dict:
    command = [sys.executable, "-m", "tpuprof", "preflight", "--model", run.model, "--tpu", run.slice,
               "--seq", str(run.seq), "--batch-per-chip", str(batch), "--remat", remat, "--json"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    if result.returncode not in (0, 1):  # 1: does not fit
        raise SystemExit(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)["targets"][0]


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remat", default="offload", choices=("full", "offload"),
                        help="offload: the published recipes' host offload of layer inputs and q/k/v (default)")
    parser.add_argument("names", nargs="*", help="runs (e.g. 'llama3.1-8b v6e-8') or models; all by default")
    options = parser.parse_args(arguments)
    chosen = [r for r in RUNS if not options.names or r.name in options.names or r.model in options.names]
    print(f"remat: {options.remat}")
    print(f"{'run':20} {'published':>9} {'batch':>5} {'low':>8} {'high':>8} {'point':>8} {'per token':>9} "
          f"{'point/pub':>9}  collectives (exposed)  MFU")
    for run in chosen:
        started = time.perf_counter()
        batch = run.batch_here or run.batch
        target = preflight(run, batch, options.remat)
        while not target["fits"] and batch > 1:
            batch -= 1
            target = preflight(run, batch, options.remat)
        seconds = time.perf_counter() - started
        e = target.get("estimate")
        if not e:
            print(f"{run.name:20} does not fit at batch 1 ({target.get('oom', {}).get('message', '')})")
            continue
        scale = run.batch / batch  # the point per token, at the published batch
        ratio = e["step_ms"] / 1e3 * scale / run.seconds
        print(f"{run.name:20} {run.seconds:8.3f}s {batch:5d} {e['step_ms_low'] / 1e3:7.3f}s {e['step_ms_high'] / 1e3:7.3f}s "
              f"{e['step_ms'] / 1e3:7.3f}s {e['step_ms'] / 1e3 * scale:8.3f}s {ratio:9.2f}  "
              f"{e['collective_ms'] / 1e3:.3f}s ({e['exposed_collective_ms'] / 1e3:.3f}s)  {e['mfu_percent']}%   "
              f"(published batch {run.batch}; {run.source}; {seconds:.0f} s; estimated kernels: "
              f"{', '.join(sorted({k['kernel'] for k in e.get('kernels_estimated') or []})) or 'none'})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
