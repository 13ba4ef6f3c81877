"""Why `tpuprof serve` compiles every backbone whole: a backbone program compiled with every decoder layer against
the 1-layer program plus (layers - 1) x the growth from 1 to 2 layers (a cheaper scaling it does not use: the
compiler sometimes outlines identical layers into one body, so code and temporaries are not linear in layers).

    .venv/bin/python bench/bench_serve_layers.py [--model qwen2.5-0.5b] [--tpu v6e-1] [--tokens 16,256]

Prints, per token padding, the whole program's temporaries and code, the scaled figures and the error in percent.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from tpuprof.analyses import serve_memory, serve_programs
    from tpuprof.sources import llm_serve
    from tpuprof.sources.llm import load_config
    from tpuprof import slices

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--tpu", default="v6e-1")
    parser.add_argument("--tokens", default="16,256")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    config, _ = load_config(args.model)
    chosen = slices.parse(args.tpu)
    tp = chosen.devices
    kv = serve_memory.kv_layout(config, "vllm", tp, "auto", args.max_model_len, None, 8)
    for tokens in (int(t) for t in args.tokens.split(",")):
        backbones, _ = serve_programs.programs(config, kv, tp=tp, max_num_seqs=8, max_model_len=args.max_model_len,
                                                  max_num_batched_tokens=tokens, quantization="bf16",
                                                  expert_parallel=False, generation=chosen.generation)
        one = replace(backbones[-1], layers=1)
        figures = {}
        for layers in (1, 2, config.num_hidden_layers):
            start = time.perf_counter()
            figures[layers] = llm_serve.compile_program(config, replace(one, layers=layers), args.tpu)
            print(f"{tokens} tokens, {layers} layers: temp {figures[layers]['temp_bytes']:,} code "
                  f"{figures[layers]['code_bytes']:,} ({time.perf_counter() - start:.0f} s)", flush=True)
        whole = figures[config.num_hidden_layers]
        for key in ("temp_bytes", "code_bytes"):
            scaled = figures[1][key] + (config.num_hidden_layers - 1) * (figures[2][key] - figures[1][key])
            error = (scaled - whole[key]) / whole[key] * 100 if whole[key] else 0.0
            print(f"  {key}: whole {whole[key]:,}, scaled {scaled:,}, error {error:+.1f}%")
        reserve_whole = whole["temp_bytes"] + whole["code_bytes"]
        reserve_scaled = sum(figures[1][k] + (config.num_hidden_layers - 1) * (figures[2][k] - figures[1][k])
                             for k in ("temp_bytes", "code_bytes"))
        print(f"  temp + code: whole {reserve_whole:,}, scaled {reserve_scaled:,}, error "
              f"{(reserve_scaled - reserve_whole) / reserve_whole * 100:+.1f}%")


if __name__ == "__main__":
    main()
