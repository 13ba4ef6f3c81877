"""What `tpuprof serve` shows, from its `tpuprof.serve/1` document (tpuprof/documents_serve.py): one section with a
verdict per slice, the comparison table, per slice the figures with how each was obtained and the launch command,
and the ranking. The terminal, Markdown, the report page and the notebook all print this section."""

from __future__ import annotations

from tpuprof.presentation.model import Caveats, Command, Fact, Note, Section, Table, Verdict, name, number, text
from tpuprof.units import fmt_bytes, fmt_ms, fmt_parameters, tenths_down


def _usd(value) -> str:
    return "n/a" if value is None else f"${value:,.3f}"


def _per_engine(t: dict) -> str:
    """The estimate's requests are each replica's share of those in flight on the slice."""
    return f" per engine (of {t['replicas']})" if t.get("replicas", 1) > 1 else ""


def _cost(e: dict, t: dict) -> str:
    cost = e["cost_per_million_output_tokens"]
    if cost is not None:
        return f"{_usd(cost)} per 1M output tokens (estimated)"
    generation = str(t["slice"].get("topology", "")).split(":")[0] or "GEN"
    return f"no cost: tpuprof has no price for {generation} (give --price {generation}=USD per chip-hour)"


def _prefill(e: dict) -> str:
    band = e.get("prefill_ms")
    if not band:
        return ""
    return f" (prefill chunk {fmt_ms(band['point'])}, {fmt_ms(band['low'])} to {fmt_ms(band['high'])})"


def _utilization(t: dict) -> str:
    safe = t["safe_gpu_memory_utilization"]
    return f"{t['gpu_memory_utilization']:.2f}" + (f" (safe ≤ {safe:.2f})" if safe is not None else "")


COLUMNS = (name("slice"), number("TP"), text("fits"), number("weights/dev"), number("KV/token/dev", drop=3),
           number("KV tokens"), number("max conc.", drop=4), number("utilization", drop=5), number("TPOT"),
           number("TTFT", drop=2), number("out tok/s"), number("$/1M out", drop=1), number("programs", drop=2))


def _row(t: dict) -> tuple[str, ...]:
    e = t["estimate"] or {}
    return (t["slice"]["name"], f"{t['tensor_parallel_size']}" + (f" x{t['replicas']}" if t["replicas"] > 1 else ""),
            "yes" if t["fits"] else "no", fmt_bytes(t["weights_bytes_per_device"]),
            f"{t['kv_bytes_per_token_per_device']:,} B", f"{t['kv_cache_tokens']:,}", tenths_down(t['max_concurrency']),
            _utilization(t), fmt_ms(e.get("tpot_ms")), fmt_ms(e.get("ttft_ms")),
            "n/a" if not e else f"{e['output_tokens_per_s']:,.0f}", _usd(e.get("cost_per_million_output_tokens")),
            "n/a" if not t["programs"] else f"{t['programs']['count']:,}")


def section(document: dict) -> Section:
    model, workload, targets = document["model"], document["workload"], document["targets"]
    out = Section(f"tpuprof serve: {model['name']} ({fmt_parameters(model['parameters'])} parameters), "
                  f"{workload['input_len']} in / {workload['output_len']} out tokens per request")
    out.blocks += [Verdict(t["slice"]["name"], t["fits"], t["verdict"]) for t in targets]
    if document.get("not_compiled"):
        out.blocks.append(Note(document["not_compiled"]))
    out.blocks.append(Table(COLUMNS, tuple(_row(t) for t in targets)))
    out.sections += [_target(t, model.get("max_position_embeddings")) for t in targets]
    ranking = document["ranking"]
    if len(targets) > 1 and ranking["speed"]:
        out.sections.append(Section("ranking", [Note(f"fastest first: {', '.join(ranking['speed'])}; cheapest first: "
                                                     f"{', '.join(ranking['cost']) or 'n/a'}")]))
    return out


def _target(t: dict, positions: int | None) -> Section:
    """One slice's facts; POSITIONS: the model's max_position_embeddings, which caps the longest length."""
    kv = t["kv"]
    window = kv.get("window")
    if kv.get("latent_dim"):
        spread = (f"{kv['bytes_per_token_on_its_device']:,} B on the device holding the token, "
                  f"{t['kv_bytes_per_token_per_device']:,} B averaged over the {kv['page_shards']} devices"
                  if kv["page_shards"] > 1 else f"{t['kv_bytes_per_token_per_device']:,} B per device")
        per_token = Fact("KV per token", f"{spread} ({kv['dtype']}, page {kv['page_size']} tokens: "
                                         f"{kv['page_size_rule']}; {kv['layout_rule']})")
    elif kv.get("layer_kinds"):
        kinds = "; ".join(f"{k['layers']} {k['attention']} layers: {k['kv_heads_per_device']} KV head(s) per device"
                          f"{', replicated' if k['replicated'] else ''}, head_dim {k['head_dim']} stored as "
                          f"{k['padded_head_dim']}, {k['cache_slots']} {kv['dtype']} slots, "
                          f"{k['page_bytes_per_layer']:,} B a page" for k in kv["layer_kinds"])
        per_token = Fact("KV per token", f"{t['kv_bytes_per_token_per_device']:,} B per device ({kinds}; page "
                                         f"{kv['page_size']} tokens: {kv['page_size_rule']}; {kv['layout_rule']})")
    else:
        kept = (f" in the {window['full_groups'] * window['group_size']} layers that keep every token"
                if window and window["kept"] and window["group_size"] else "")
        per_token = Fact("KV per token", f"{t['kv_bytes_per_token_per_device']:,} B per device{kept} "
                                         f"({kv['kv_heads_per_device']} KV head(s) per device"
                                         f"{', replicated' if kv['replicated'] else ''}, head_dim {kv['head_dim']} "
                                         f"stored as {kv['padded_head_dim']}, {kv['cache_slots']} {kv['dtype']} slots "
                                         f"for {2 * kv['kv_heads_per_device']} K/V heads, page {kv['page_size']} "
                                         f"tokens: {kv['page_size_rule']})")
    blocks = [
        Fact("weights", f"{fmt_bytes(t['weights_bytes_per_device'])} per device ({t['weights_how']})"),
        per_token,
        *([Fact(f"{window['kind']} layers", window["rule"])] if window else []),
        Fact("KV cache", f"at utilization {t['gpu_memory_utilization']:.2f} of "
                         f"{fmt_bytes(t['bytes_limit_per_device'])}: {t['kv_cache_pages']:,} pages, "
                         f"{t['kv_cache_tokens']:,} tokens, {t['max_concurrency']:.2f} requests of "
                         f"{t['max_model_len']} tokens; longest --max-model-len for the concurrency asked: "
                         f"{t['largest_max_model_len']:,}"
                         + (" (the model's positions)" if t["largest_max_model_len"] == positions else "")
                         + (f" ({t['kv_cache_how']})" if t.get("kv_cache_how") else "")),
    ]
    programs = t["programs"]
    if programs:
        largest = programs["largest"]
        where = (f"largest: the {largest['tokens']}-token {largest['kind']}, temporaries "
                 f"{fmt_bytes(programs['largest_temp_bytes'])} + code {fmt_bytes(programs['largest_code_bytes'])}"
                 if largest else "none compiled")
        safe = t["safe_gpu_memory_utilization"]
        blocks.append(Fact("programs", f"the engine compiles {programs['count']} at start-up "
                                       f"({programs['count_rule']}); tpuprof compiled {programs['compiled']} ({where}); "
                                       f"safe --gpu-memory-utilization {safe if safe is not None else 'n/a'} with a "
                                       f"{fmt_bytes(t['margin_bytes'])} margin"))
    e = t["estimate"]
    if e:
        step = e["decode_step_ms"]
        blocks.append(Fact("speed and cost",
                           f"at {e['concurrency']} requests{_per_engine(t)}: "
                           f"decode step {fmt_ms(step['point'])} ({fmt_ms(step['low'])} to "
                           f"{fmt_ms(step['high'])}, {e['bound']}-bound), TPOT {fmt_ms(e['tpot_ms'])} "
                           f"({fmt_ms(e['tpot_ms_low'])} to {fmt_ms(e['tpot_ms_high'])}), TTFT {fmt_ms(e['ttft_ms'])}{_prefill(e)}, "
                           f"{e['output_tokens_per_s']:,.0f} output tokens/s ({e['output_tokens_per_s_per_chip']:,.0f} "
                           f"per chip), {_cost(e, t)}"))
    lowered = (t.get("concurrency") or {}).get("note")
    if lowered and not t["fits"]:  # a plan that serves says it in its verdict
        blocks.append(Note(lowered + "."))
    blocks += [Note(p, "problem") for p in t["problems"][1:]]  # the first is the verdict's reason
    blocks.append(Command("launch", t["command"]))
    name_ = t["slice"]["name"]
    if programs:
        blocks.append(Caveats(f"{name_} programs", tuple(programs.get("caveats") or ())))
    if e:
        blocks.append(Caveats(f"{name_} estimate", tuple(e.get("caveats") or ())))
    return Section(f"{name_} ({t['engine']['name']} rules of {t['engine']['version']})", blocks)

