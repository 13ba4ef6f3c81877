"""tpuprof serve's speed estimate against published TPU serving runs (bench/serving_published.json,
each row with its source, settings and workload as published): TPOT and output tokens/s, the band and the point,
and the ratio of the point to the published figure (goal: TPOT point within 25%).

    .venv/bin/python bench/bench_serve.py [--compile] [--markdown]

Without --compile the weights come from the shapes (no JAX; within 0.1% of the compiled figure for dense models).
Rows whose model tpuprof cannot build (no config) or which are marked not comparable are listed and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PUBLISHED = ROOT / "bench" / "serving_published.json"
CONFIGS = ROOT / "tests" / "fixtures" / "serving"  # config.json of models with no built-in name
# Published model ids tpuprof has no built-in config for -> a config.json under tests/fixtures/serving; the others
# are given to tpuprof.serve as published (it takes the hub ids of its built-in configs).
MODELS = {"Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": str(CONFIGS / "qwen3-coder-480b-a35b.config.json")}


def rows(compile_: bool) -> list[dict]:
    import tpuprof

    out = []
    for row in json.loads(PUBLISHED.read_text())["rows"]:
        settings, workload, published = row["settings"], row["workload"], row["published"]
        model = MODELS.get(settings["model"], settings["model"])
        if not row["comparable"]:
            out.append({"id": row["id"], "skipped": "not comparable"})
            continue
        try:
            result = tpuprof.serve(
                model, settings["tpu"], tensor_parallel_size=settings["tensor_parallel_size"],
                max_model_len=settings["max_model_len"], max_num_seqs=settings.get("max_num_seqs"),
                max_num_batched_tokens=settings.get("max_num_batched_tokens"),
                gpu_memory_utilization=settings.get("gpu_memory_utilization"),
                kv_cache_dtype=settings.get("kv_cache_dtype") or "auto",
                quantization=settings.get("quantization") or "bf16", block_size=settings.get("block_size"),
                enable_expert_parallel=bool(settings.get("enable_expert_parallel")),
                input_len=workload["input_len"], output_len=workload["output_len"],
                concurrency=workload.get("effective_concurrency") or workload["concurrency"], compile=compile_)
        except tpuprof.UserError as error:
            if "reads no model hub" not in str(error):
                raise
            out.append({"id": row["id"], "skipped": "no config for " + settings["model"]})
            continue
        estimate = result.to_dict()["targets"][0]["estimate"]
        item = {"id": row["id"], "source": row["source"], "estimate": estimate, "published": published}
        if published.get("tpot_ms_mean"):
            item["tpot_ratio"] = estimate["tpot_ms"] / published["tpot_ms_mean"]
        item["throughput_ratio"] = estimate["output_tokens_per_s"] / published["output_tokens_per_s"]
        out.append(item)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true", help="weights from compiled programs (slow)")
    args = parser.parse_args()
    print("| run | TPOT published (mean) | TPOT point [band] | ratio | output tok/s published | point [band] | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for item in rows(args.compile):
        if "skipped" in item:
            print(f"| {item['id']} | skipped: {item['skipped']} | | | | | |")
            continue
        e, p = item["estimate"], item["published"]
        tpot = f"{p['tpot_ms_mean']:.1f} ms" if p.get("tpot_ms_mean") else "not published"
        ratio = f"{item['tpot_ratio']:.2f}" if "tpot_ratio" in item else ""
        print(f"| {item['id']} | {tpot} | {e['tpot_ms']:.1f} [{e['tpot_ms_low']:.1f}, {e['tpot_ms_high']:.1f}] ms "
              f"| {ratio} | {p['output_tokens_per_s']:,.0f} | {e['output_tokens_per_s']:,.0f} "
              f"[{e['output_tokens_per_s'] * e['tpot_ms'] / e['tpot_ms_high']:,.0f}, "
              f"{e['output_tokens_per_s'] * e['tpot_ms'] / e['tpot_ms_low']:,.0f}] | "
              f"{item['throughput_ratio']:.2f} |")


if __name__ == "__main__":
    main()
