"""The `tpuprof.serve/1` document, built in this one place from the typed answer (tpuprof.models.serve.ServeAnswer):
`ServeResult.to_dict()` calls `document`; the table and the Markdown (tpuprof/renderers/serve.py) print it. The
ranking of the slices by cost and by speed is decided here too. (tpuprof/documents.py reads documents back.)
"""

from __future__ import annotations

from tpuprof.models.serve import Band, ProgramRecord, ServeAnswer, ServeEstimate, ServeTarget


def document(answer: ServeAnswer) -> dict:
    options, config = answer.options, answer.options.model
    from tpuprof.analyses.serve_estimate import active_parameters
    from tpuprof.sources.llm_serve import IMPLEMENTATION

    targets = [target(t) for t in answer.targets]
    return {
        "model": {"name": config.name, "source": options.model_source, "parameters": config.parameter_count(),
                  "active_parameters": active_parameters(config), "layers": config.num_hidden_layers,
                  "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                  "head_dim": config.head_dim, "max_position_embeddings": config.max_position_embeddings or None,
                  "implementation": IMPLEMENTATION},
        "workload": {"input_len": options.input_len, "output_len": options.output_len,
                     "concurrency": options.concurrency, "kv_cache_dtype": options.kv_cache_dtype,
                     "quantization": options.quantization},
        "compiled": options.compile,
        "not_compiled": options.not_compiled,
        "targets": targets,
        "ranking": ranking(targets),
    }


def ranking(targets: list[dict]) -> dict:
    """Slice names that serve as asked, cheapest per 1M output tokens first, and fastest (output tokens/s) first."""
    serving = [t for t in targets if t["fits"] and t["estimate"]]
    priced = [t for t in serving if t["estimate"]["cost_per_million_output_tokens"] is not None]
    return {"cost": [t["slice"]["name"] for t in sorted(priced, key=lambda t: t["estimate"]["cost_per_million_output_tokens"])],
            "speed": [t["slice"]["name"] for t in sorted(serving, key=lambda t: -t["estimate"]["output_tokens_per_s"])]}


def _window(w, cap) -> dict | None:
    if w is None:
        return None
    return {"layers": w.layers, "window": w.window, "kind": w.kind, "kept": w.kept, "rule": w.rule,
            "group_size": w.group_size or None, "full_groups": w.full_groups if w.group_size else None,
            "window_groups": w.window_groups if w.group_size else None, "swa_pool_tokens": cap.window_tokens or None}


def target(t: ServeTarget) -> dict:
    kv, cap = t.kv, t.capacity
    programs = t.programs
    return {
        "slice": t.slice.to_json(),
        "engine": {"name": t.engine.name, "version": t.engine.version, "source": t.engine.source},
        "tensor_parallel_size": t.tensor_parallel_size,
        "replicas": t.replicas,
        "max_model_len": t.max_model_len,
        "max_num_seqs": t.max_num_seqs,
        "max_num_batched_tokens": t.max_num_batched_tokens,
        "bytes_limit_per_device": cap.bytes_limit,
        "gpu_memory_utilization": cap.gpu_memory_utilization,
        "gpu_memory_utilization_given": t.utilization_given,
        "weights_bytes_per_device": cap.weights_bytes_per_device,
        "weights_how": t.weights_how,
        "kv_bytes_per_token_per_device": kv.kv_bytes_per_token_per_device,
        "kv": {"head_dim": kv.head_dim, "padded_head_dim": kv.padded_head_dim, "kv_heads": kv.kv_heads,
               "kv_heads_per_device": kv.kv_heads_per_device, "replicated": kv.replicated, "packing": kv.packing,
               "cache_slots": kv.cache_slots, "dtype": kv.dtype, "page_size": kv.page_size,
               "page_size_rule": kv.page_size_rule, "page_bytes_per_layer": kv.page_bytes_per_layer,
               "compiled_page_bytes_per_layer": programs.kv_page_bytes_per_layer if programs else None,
               "latent_dim": kv.latent_dim or None, "page_shards": kv.page_shards,
               "bytes_per_token_on_its_device": kv.kv_bytes_per_token_on_its_device,
               "layout_rule": kv.layout_rule or None, "window": _window(kv.window, cap),
               "layer_kinds": [{"attention": k.attention, "layers": k.layers, "head_dim": k.head_dim,
                                "padded_head_dim": k.padded_head_dim, "kv_heads": k.kv_heads,
                                "kv_heads_per_device": k.kv_heads_per_device, "replicated": k.replicated,
                                "cache_slots": k.cache_slots, "page_bytes_per_layer": k.page_bytes_per_layer}
                               for k in kv.kinds] or None},
        "kv_budget_bytes_per_device": cap.kv_budget_bytes_per_device,
        "kv_cache_pages": cap.pages,
        "kv_cache_tokens": cap.tokens,
        "max_concurrency": round(cap.max_concurrency, 2),
        "largest_max_model_len": cap.largest_max_model_len,
        "kv_cache_how": cap.how or None,
        "concurrency": {"asked": t.concurrency_asked, "planned": t.concurrency_planned, "held": t.requests_held,
                        "note": t.concurrency_note},
        "fits": t.fits,
        "verdict": t.verdict,
        "problems": list(t.problems),
        "safe_gpu_memory_utilization": t.safe_gpu_memory_utilization,
        "margin_bytes": t.margin_bytes,
        "headroom_bytes": t.headroom_bytes,
        "smem": {"page_table_bytes": t.smem_page_table_bytes, "limit_bytes": t.smem_limit_bytes},
        "programs": _programs(programs),
        "estimate": _estimate(t.estimate, t.kv),
        "command": t.command,
    }


def _programs(programs) -> dict | None:
    if programs is None:
        return None
    from tpuprof.analyses.serve_programs import MARGIN_FRACTION

    largest = programs.largest
    return {
        "caveats": [f"The safe utilization leaves below the KV cache the largest temporaries, the code of every "
                    f"program compiled (loaded programs keep theirs resident) and a margin of {MARGIN_FRACTION:.0%} of "
                    "the limit for the engine's helper programs tpuprof does not compile and for fragmentation; "
                    "whether the runtime's reservation equals temporaries + code exactly is not verified on a TPU.",
                    "Programs as tpuprof builds them with JAX's ragged paged attention kernel; the engine's own "
                    "differ in detail (its kernel, fused KV update, sampler)."],
        "count": programs.engine_count,
        "count_rule": programs.engine_count_rule,
        "compiled": len(programs.records),
        "token_paddings": list(programs.token_paddings),
        "request_paddings": list(programs.request_paddings),
        "largest_temp_bytes": largest.temp_bytes if largest else None,
        "largest_code_bytes": largest.code_bytes if largest else None,
        "largest_reserve_bytes": largest.reserve_bytes if largest else None,
        # Loaded programs keep their code resident: the safe utilization counts all of it.
        "all_code_bytes": programs.all_code_bytes,
        "largest": {"kind": largest.kind, "tokens": largest.tokens, "requests": largest.requests} if largest else None,
        "failures": len(programs.failures),
        "compile_seconds": round(sum(r.seconds for r in programs.records), 1),
        "list": [_record(r) for r in programs.records],
    }


def _record(r: ProgramRecord) -> dict:
    return {"kind": r.kind, "tokens": r.tokens, "requests": r.requests, "temp_bytes": r.temp_bytes,
            "code_bytes": r.code_bytes, "how": r.how, "failure_space": r.failure_space, "failure": r.failure,
            "fix": r.fix, "cached": r.cached}


def _band(band: Band, digits: int = 3) -> dict:
    return {"point": round(band.point, digits), "low": round(band.low, digits), "high": round(band.high, digits)}


def _estimate(e: ServeEstimate | None, kv) -> dict | None:
    if e is None:
        return None
    window = kv.window
    # How the window layers are read is modelled where the engine keeps only the window; where it caches them in
    # full the decode step reads them over the whole context, as an engine whose kernel skips the pages outside the
    # window would not.
    windows = "" if not window or window.kept else (
        f", a kernel skipping the pages outside the {window.kind} layers' {window.window}-token window (the engine "
        "caches them in full; the step reads them over the whole context)")
    return {
        "caveats": ["Estimated: a roofline of the decode step and prefill chunks at stated efficiencies (docs/serve.md); "
                    "bench/bench_serve.py compares it with published TPU serving runs.",
                    "Not modelled: speculative decoding, prefix caching, queueing, sampling, host overhead between "
                    f"steps{windows}."],
        "concurrency": e.concurrency,
        "context_tokens": round(e.context_tokens, 1),
        "tpot_ms": round(e.tpot_ms.point, 3), "tpot_ms_low": round(e.tpot_ms.low, 3),
        "tpot_ms_high": round(e.tpot_ms.high, 3),
        "ttft_ms": round(e.ttft_ms, 3),
        "decode_step_ms": _band(e.decode_step_ms),
        "prefill_ms": _band(e.prefill_ms),
        "output_tokens_per_s": round(e.output_tokens_per_s, 1),
        "output_tokens_per_s_per_chip": round(e.output_tokens_per_s_per_chip, 1),
        "cost_per_million_output_tokens": (None if e.cost_per_million_output_tokens is None
                                           else round(e.cost_per_million_output_tokens, 4)),
        "price_usd_per_chip_hour": e.price_usd_per_chip_hour,
        "price_source": e.price_source,
        "bound": e.bound,
        "decode_breakdown_ms": dict(e.decode_breakdown_ms),
        "how": e.how,
    }
