"""How long `tpuprof serve` takes to compile every program it compiles for a model, on this machine, from an empty
compile cache (the issue's question: Llama-3.1-70B on v6e-8 at 8k context with 64 requests at once).

    .venv/bin/python bench/bench_serve_compile.py [--model llama3.1-70b] [--tpu v6e-8] [--max-model-len 8192]
        [--concurrency 64] [--max-num-batched-tokens N]

Prints each program's compile time (wall and the process's CPU time; other processes share the cores), the total,
how many programs vLLM itself would compile at start-up, and the headroom figures that came out. Run it niced.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama3.1-70b")
    parser.add_argument("--tpu", default="v6e-8")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuprof-serve-bench-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache  # an empty compile cache: every program compiles
        import tpuprof

        marks = []

        def on_compile(program) -> None:
            marks.append((program, time.perf_counter(), time.process_time()))
            print(f"compiling {program.kind} tokens={program.tokens} requests={program.requests} "
                  f"layers={program.layers}", flush=True)

        wall, cpu = time.perf_counter(), time.process_time()
        result = tpuprof.serve(args.model, args.tpu, max_model_len=args.max_model_len, concurrency=args.concurrency,
                               max_num_batched_tokens=args.max_num_batched_tokens, on_compile=on_compile)
        end = (time.perf_counter(), time.process_time())
        wall, cpu = end[0] - wall, end[1] - cpu
    ends = [m[1:] for m in marks[1:]] + [end] if marks else []
    print(f"\n{'program':<40} {'wall s':>8} {'cpu s':>8}")
    for (program, w0, c0), (w1, c1) in zip(marks, ends):
        label = f"{program.kind} {program.tokens or program.requests} x{program.layers} layer(s)"
        print(f"{label:<40} {w1 - w0:8.1f} {c1 - c0:8.1f}")
    target = result.to_dict()["targets"][0]
    programs = target["programs"]
    print(f"\n{args.model} on {args.tpu}: {len(marks)} compiles in {wall:.0f} s wall, {cpu:.0f} s CPU of this process "
          f"(`nproc` {os.cpu_count()}); vLLM compiles {programs['count']} programs at start-up "
          f"({programs['count_rule']}).")
    print(f"weights/device {target['weights_bytes_per_device'] / 2**30:.2f} GiB, largest program temp "
          f"{programs['largest_temp_bytes'] / 2**20:.1f} MiB + code {programs['largest_code_bytes'] / 2**20:.1f} MiB, "
          f"safe --gpu-memory-utilization {target['safe_gpu_memory_utilization']}, KV tokens "
          f"{target['kv_cache_tokens']:,}, TPOT {target['estimate']['tpot_ms']:.1f} ms")


if __name__ == "__main__":
    main()
