"""What `tpuprof oom` shows, from its `tpuprof.oom/1` document (built by tpuprof/documents_oom.py): what failed,
the figures the message gives, the server's settings when a serving engine failed, every listed allocation with
its padding recomputed from the shape, the dump's buffers when one was joined, the batch estimate and the fixes.
The terminal, Markdown, the report page and the notebook print this section; the page adds its chart."""

from __future__ import annotations

from tpuprof.models.suggestion import FRAMEWORK_NAMES
from tpuprof.presentation.memory import wrappable_shape
from tpuprof.presentation.model import Caveats, Fact, Fixes, Note, Section, Table, Verdict, name, number, text
from tpuprof.units import fmt_bytes

KIND_TEXT = {
    "compile": "compile time: the program does not fit",
    "early_abort": "compile time: the compiler gave up early",
    "runtime_allocation": "run time: a device buffer could not be allocated",
    "reservation": "run time: the program's memory could not be reserved when loading it",
    "kv_budget": "start-up: the serving engine's memory budget does not hold what it must",
}
SERVING_CAUSES = {
    "program_load": "a compiled program did not fit the HBM the KV cache left",
    "runtime_buffer": "a buffer did not fit the HBM the KV cache left",
    "kv_budget": "the KV cache cannot hold one request of --max-model-len",
    "weights_over_cap": "the weights exceed limit x --gpu-memory-utilization",
    "compile_hbm": "a program does not fit a device's HBM",
    "smem": "the page table does not fit SMEM", "vmem": "a kernel's scratch does not fit VMEM",
}
# XLA lists its largest allocations (about 10-20); a log that repeats or concatenates messages can list thousands,
# which a table cannot usefully show (and rich takes seconds to lay out).
MAX_ALLOCATION_ROWS = 30
FIGURES = [("used", "used_bytes"), ("required (estimate)", "required_bytes"), ("capacity", "capacity_bytes"),
           ("exceeded by", "exceeded_bytes"), ("requested", "requested_bytes"), ("free", "free_bytes"),
           ("largest free region", "largest_free_bytes"), ("reservable", "reservable_bytes"),
           ("total usage", "total_bytes"), ("reserved", "reserved_bytes"), ("program", "program_bytes"),
           ("arguments", "arguments_bytes"), ("output", "output_bytes"),
           ("currently allocated", "currently_allocated_bytes"), ("TensorCore", "tensorcore_bytes"),
           ("SparseCore", "sparsecore_bytes"), ("global", "global_bytes"), ("scoped", "scoped_bytes")]


def section(document: dict, top: int = MAX_ALLOCATION_ROWS, source: str | None = None) -> Section:
    """SOURCE: the log's path, which the document does not hold (the terminal and the page name it)."""
    d = document
    out = Section("tpuprof oom: TPU out of memory")
    where = (f"{source}, line {d['line_number']}" if d.get("line_number") else source) if source else None
    out.blocks.append(Verdict(where or "the log", False, (d.get("headline") or "")[:300]))
    if (d.get("messages_found") or 0) > 1:
        out.blocks.append(Note(f"{d['messages_found']} out-of-memory messages in the log; this is the most detailed."))
    out.blocks += _facts(d)
    figures = _figures(d)
    if figures:
        out.blocks.append(Table((text("figure"), number("bytes"), text("how", drop=1)), figures,
                                "The figures the message gives"))
    out.blocks += [Note(n, "warning") for n in d.get("notes") or []]
    allocations = d.get("allocations") or []
    if allocations:
        shown = allocations[:max(top, 1)]
        out.blocks.append(Table((number("#"), number("size"), text("shape"), number("unpadded", drop=3),
                                 number("x", drop=4), text("recomputed", drop=2), name("op", drop=1),
                                 name("source", drop=5)),
                                tuple(_allocation(a) for a in shown),
                                "Largest allocations (log) with padding recomputed from the shape"))
        if len(allocations) > len(shown):
            out.blocks.append(Note(f"... and {len(allocations) - len(shown)} more listed allocations (--json has "
                                   "every one)"))
        out.blocks += [Note(f"allocation {a.get('index')}: {m}", "warning") for a in shown
                       for m in a.get("disagreements") or []]
    joined = d.get("dump")
    if joined:
        what = "listed allocations" if any("index" in r for r in joined["buffers"]) else "largest buffers"
        out.blocks.append(Note(f"Dump {joined['module']}: arguments {fmt_bytes(joined['argument_bytes'])}, "
                               f"temporaries {fmt_bytes(joined['temp_bytes'])}, output "
                               f"{fmt_bytes(joined['output_bytes'])}"))
        out.blocks.append(Table((number("#"), name("instruction"), text("shape"), number("size"),
                                 number("unpadded", drop=3), text("type", drop=2), name("op", drop=1)),
                                tuple((str(r.get("index", "")), r["instruction"], wrappable_shape(r["shape"]),
                                       fmt_bytes(r["size_bytes"]), fmt_bytes(r["unpadded_bytes"]),
                                       r.get("allocation_type") or "", r.get("op_name") or "")
                                      for r in joined["buffers"]), f"The dump's {what}"))
    estimate = d.get("batch_estimate") or {}
    said = _batch_words(d, estimate)
    if said:
        out.blocks.append(Note(said))
    if estimate.get("fitting_batch") is not None:
        # 0: not even one example fits (the estimate's arithmetic), which "batch that fits: 0" did not say.
        fitting = estimate["fitting_batch"] or "none, not even 1"
        out.blocks.append(Fact("batch that fits", f"{fitting} (now {estimate.get('current_batch')}; "
                                                  f"confidence {estimate.get('confidence')})"))
    if d.get("suggestions"):
        out.blocks.append(Fixes("Causes and fixes: first what can make it fit alone, then by memory freed",
                                tuple(d["suggestions"]), d.get("framework")))
    out.blocks.append(Caveats("batch estimate", tuple(estimate.get("caveats") or ())))
    return out


def _facts(d: dict) -> list[Fact]:
    facts = [Fact("kind", KIND_TEXT.get(d.get("kind"), d.get("kind") or "unknown"))]
    if d.get("error_code"):
        facts.append(Fact("error code", f"{d['error_code']} {d.get('error_name') or ''} "
                                        f"(openxla.org/xla/errors/error_{d['error_code'][1:]})"))
    if d.get("program_name"):
        facts.append(Fact("program", d["program_name"]))
    if d.get("memory_space"):
        facts.append(Fact("memory space", d["memory_space"]))
    if d.get("framework") or d.get("training") is not None:
        job = {True: "training", False: "inference"}.get(d.get("training"), "")
        framework = FRAMEWORK_NAMES.get(d.get("framework") or "", "unknown")
        facts.append(Fact("framework", f"{framework}, {job}" if job else framework))
    if d.get("kernel"):
        facts.append(Fact("kernel", d["kernel"]))
    if d.get("serving"):
        facts += _serving(d["serving"])
    return facts


def _figures(d: dict) -> tuple[tuple[str, str, str], ...]:
    rows = [("scoped limit" if key == "capacity_bytes" and d.get("scoped_limit") else label, fmt_bytes(d[key]), "")
            for label, key in FIGURES if d.get(key) is not None]
    if d.get("program_unknown"):
        rows.append(("program", "unknown", "the message gives no size"))
    if d.get("arguments_unknown"):
        rows.append(("arguments", "unknown", "the message gives no size"))
    if d.get("hlo_temp_bytes") is not None:
        how = ""
        if d.get("unpadded_bytes") is not None:
            how = (f"unpadded {fmt_bytes(d['unpadded_bytes'])}, padded {fmt_bytes(d.get('padded_bytes'))}, "
                   f"{d.get('utilization')}% utilization")
        elif d.get("utilization") is not None:
            how = f"{d['utilization']}% utilization"
        rows.append(("HLO temp", fmt_bytes(d["hlo_temp_bytes"]), how))
    return tuple(rows)


def _serving(serving: dict) -> list[Fact]:
    """The server the log shows: what failed in serving terms, its settings and the engine's memory figures."""
    settings = serving.get("settings") or {}
    engine = serving["engine"] + (f" {settings['engine_version']}" if settings.get("engine_version") else "")
    facts = [Fact("server", f"{engine}: {SERVING_CAUSES.get(serving['cause'], serving['cause'])}")]
    shown = [("model", "model"), ("TPU", "tpu"), ("TP", "tensor_parallel_size"), ("max-model-len", "max_model_len"),
             ("max-num-seqs", "max_num_seqs"), ("max-num-batched-tokens", "max_num_batched_tokens"),
             ("gpu-memory-utilization", "gpu_memory_utilization"), ("kv-cache-dtype", "kv_cache_dtype"),
             ("block-size", "block_size")]
    said = ", ".join(f"{label} {settings[key]}" for label, key in shown if settings.get(key) is not None)
    if said:
        facts.append(Fact("settings", said))
    if settings.get("kv_cache_tokens") is not None:
        kv = f"{settings['kv_cache_tokens']:,} tokens"
        if settings.get("max_concurrency") is not None and settings.get("concurrency_tokens"):
            kv += f" ({settings['max_concurrency']:g}x requests of {settings['concurrency_tokens']:,})"
        facts.append(Fact("KV cache", kv))
    if serving.get("estimated_max_model_len") is not None:
        facts.append(Fact("longest request", f"{serving['estimated_max_model_len']:,} tokens (vLLM's estimate)"))
    return facts


def _allocation(a: dict) -> tuple[str, ...]:
    size = a.get("size_bytes")
    unpadded = a["unpadded_bytes"] if a.get("unpadded_bytes") is not None else a.get("recomputed_unpadded_bytes")
    expansion = a.get("expansion") or (size / unpadded if size and unpadded else None)
    check = "-"
    if a.get("recomputed_padded_bytes") is not None:
        check = fmt_bytes(a["recomputed_padded_bytes"]) + (" ≠" if a.get("disagreements") else " ✓")
        if a.get("assumed_tiling"):
            check += f" ({a['assumed_tiling']}?)"
    return (str(a.get("index") or ""), fmt_bytes(size), wrappable_shape(a.get("shape") or ""), fmt_bytes(unpadded),
            f"{expansion:.1f}" if expansion else "", check,
            a.get("op_name") or a.get("op_type") or a.get("xla_label") or "", a.get("source") or "")


def _batch_words(d: dict, estimate: dict) -> str | None:
    """What the batch estimate says, unless a server (no batch to shrink) or a batch_size fix says it itself."""
    if d.get("serving") or any(s.get("kind") == "batch_size" for s in d.get("suggestions") or []):
        return None
    scale, reason = estimate.get("scale"), estimate.get("reason")
    if scale is not None and scale >= 1:
        return f"batch estimate: the program fits the capacity at the current batch ({reason})."
    if scale is not None and scale <= 0:
        return f"batch estimate: no batch fits; confidence {estimate.get('confidence')}: {reason}."
    if scale is None and reason:
        return f"batch estimate: none ({reason})."
    return None
