"""`tpuprof serve` as rich tables and as Markdown, both printed from the `tpuprof.serve/1` document (built by
tpuprof/documents_serve.py): every figure here is a field of it, formatted."""

from __future__ import annotations

from tpuprof.units import fmt_bytes


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:,.1f} ms"


def _usd(value) -> str:
    return "n/a" if value is None else f"${value:,.3f}"


def _utilization(t: dict) -> str:
    safe = t["safe_gpu_memory_utilization"]
    return f"{t['gpu_memory_utilization']:.2f}" + (f" (safe ≤ {safe:.2f})" if safe is not None else "")


def rows(document: dict) -> list[list[str]]:
    """One row per slice: the figures a reader compares."""
    out = []
    for t in document["targets"]:
        e = t["estimate"] or {}
        out.append([
            t["slice"]["name"], f"{t['tensor_parallel_size']}" + (f" x{t['replicas']}" if t["replicas"] > 1 else ""),
            "yes" if t["fits"] else "no", fmt_bytes(t["weights_bytes_per_device"]),
            f"{t['kv_bytes_per_token_per_device']:,} B", f"{t['kv_cache_tokens']:,}", f"{t['max_concurrency']:.1f}",
            _utilization(t), _ms(e.get("tpot_ms")), _ms(e.get("ttft_ms")),
            "n/a" if not e else f"{e['output_tokens_per_s']:,.0f}",
            _usd(e.get("cost_per_million_output_tokens")),
        ])
    return out


HEADERS = ["slice", "TP", "fits", "weights/dev", "KV/token/dev", "KV tokens", "max conc.", "utilization", "TPOT",
           "TTFT", "out tok/s", "$/1M out"]


def print_table(document: dict) -> None:
    from rich.markup import escape
    from rich.text import Text

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    model = document["model"]
    workload = document["workload"]
    out.print(tables.wrap(Text(f"serve {model['name']} ({model['parameters'] / 1e9:.1f}B parameters), "
                               f"{workload['input_len']} in / {workload['output_len']} out tokens per request"),
                          out.width))
    columns = [tables.name("slice"), tables.number("TP"), tables.text("fits"), tables.number("weights/dev"),
               tables.number("KV/token/dev", drop=3), tables.number("KV tokens"), tables.number("max conc.", drop=4),
               tables.number("utilization", drop=5), tables.number("TPOT"), tables.number("TTFT", drop=2),
               tables.number("out tok/s"), tables.number("$/1M out", drop=1)]
    out.print(tables.table(columns, [[escape(c) for c in row] for row in rows(document)], out.width))
    for t in document["targets"]:
        out.print(tables.wrap(Text(f"{t['slice']['name']} ({t['engine']['name']} rules of {t['engine']['version']}): "
                                   f"{t['verdict']}"), out.width))
        for line in details(t):
            out.print(tables.wrap(Text("- " + line), out.width))
        for problem in t["problems"][1:]:
            out.print(tables.wrap(Text("- " + problem, style="red"), out.width))
        out.print(tables.wrap(Text("- launch: " + t["command"]), out.width))
    ranking = document["ranking"]
    if len(document["targets"]) > 1 and ranking["speed"]:
        out.print(tables.wrap(Text(f"fastest first: {', '.join(ranking['speed'])}; cheapest first: "
                                   f"{', '.join(ranking['cost']) or 'n/a'}"), out.width))


def details(t: dict) -> list[str]:
    kv = t["kv"]
    lines = [
        f"weights {fmt_bytes(t['weights_bytes_per_device'])} per device ({t['weights_how']}); KV "
        f"{t['kv_bytes_per_token_per_device']:,} B per token per device ({kv['kv_heads_per_device']} KV head(s) per "
        f"device{', replicated' if kv['replicated'] else ''}, head_dim {kv['head_dim']} stored as "
        f"{kv['padded_head_dim']}, {kv['cache_slots']} {kv['dtype']} slots for {2 * kv['kv_heads_per_device']} K/V "
        f"heads, page {kv['page_size']} tokens: {kv['page_size_rule']})",
        f"KV cache at utilization {t['gpu_memory_utilization']:.2f} of {fmt_bytes(t['bytes_limit_per_device'])}: "
        f"{t['kv_cache_pages']:,} pages, {t['kv_cache_tokens']:,} tokens, {t['max_concurrency']:.2f} requests of "
        f"{t['max_model_len']} tokens; longest --max-model-len for the concurrency asked: {t['largest_max_model_len']:,}",
    ]
    programs = t["programs"]
    if programs:
        largest = programs["largest"]
        where = (f"largest: the {largest['tokens']}-token {largest['kind']}, temporaries "
                 f"{fmt_bytes(programs['largest_temp_bytes'])} + code {fmt_bytes(programs['largest_code_bytes'])}"
                 if largest else "none compiled")
        lines.append(f"programs: the engine compiles {programs['count']} at start-up ({programs['count_rule']}); "
                     f"tpuprof compiled {programs['compiled']} ({where}); safe --gpu-memory-utilization "
                     f"{t['safe_gpu_memory_utilization'] if t['safe_gpu_memory_utilization'] is not None else 'n/a'} "
                     f"with a {fmt_bytes(t['margin_bytes'])} margin")
    e = t["estimate"]
    if e:
        lines.append(f"at {e['concurrency']} requests: decode step {_ms(e['decode_step_ms']['point'])} "
                     f"({_ms(e['decode_step_ms']['low'])} to {_ms(e['decode_step_ms']['high'])}, {e['bound']}-bound), "
                     f"TPOT {_ms(e['tpot_ms'])} ({_ms(e['tpot_ms_low'])} to {_ms(e['tpot_ms_high'])}), TTFT "
                     f"{_ms(e['ttft_ms'])}, {e['output_tokens_per_s']:,.0f} output tokens/s "
                     f"({e['output_tokens_per_s_per_chip']:,.0f} per chip), {_usd(e['cost_per_million_output_tokens'])} "
                     "per 1M output tokens (estimated)")
    return lines
