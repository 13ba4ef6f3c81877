"""Human output of `tpuprof oom`: what failed, the numbers, every listed buffer checked, the fixes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as e
from rich.table import Table

from tpuprof.analyses.oom import format_bytes as fmt
from tpuprof.models.oom import BatchEstimate, OomReport
from tpuprof.renderers import tables
from tpuprof.renderers.memory import wrappable_shape

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
# which a terminal table cannot usefully show (and rich takes seconds to lay out).
MAX_ALLOCATION_ROWS = 30


def render(report: OomReport, estimate: BatchEstimate, suggestions: list[dict], source: str,
           dump_rows: dict | None = None, console: Console | None = None) -> None:
    console = console or tables.console()
    where = f"{source}, line {report.line_number}" if report.line_number else source
    console.print(f"[bold]TPU out of memory[/bold] ({e(where)})")
    console.print(f"  {e(report.headline[:300])}")
    if report.messages_found > 1:
        console.print(f"  {report.messages_found} out-of-memory messages in the log; this is the most detailed.")
    console.print()

    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("kind", KIND_TEXT.get(report.kind, report.kind))
    if report.error_code:
        summary.add_row("error code", f"{report.error_code} {e(report.error_name or '')} "
                        f"(openxla.org/xla/errors/error_{report.error_code[1:]})")
    if report.program_name:
        summary.add_row("program", e(report.program_name))
    if report.memory_space:
        summary.add_row("memory space", report.memory_space)
    if report.framework or report.training is not None:
        from tpuprof.models.suggestion import FRAMEWORK_NAMES

        job = {True: "training", False: "inference"}.get(report.training, "")
        name = FRAMEWORK_NAMES.get(report.framework or "", "unknown")
        summary.add_row("framework", f"{name}, {job}" if job else name)
    if report.kernel:
        summary.add_row("kernel", e(report.kernel))
    if report.serving is not None:
        _serving_rows(summary, report.serving)
    rows = [
        ("used", report.used_bytes), ("required (estimate)", report.required_bytes), ("scoped limit" if report.scoped_limit else "capacity", report.capacity_bytes), ("exceeded by", report.exceeded_bytes),
        ("requested", report.requested_bytes), ("free", report.free_bytes),
        ("largest free region", report.largest_free_bytes), ("reservable", report.reservable_bytes),
        ("total usage", report.total_bytes), ("reserved", report.reserved_bytes),
        ("program", report.program_bytes), ("arguments", report.arguments_bytes),
        ("output", report.output_bytes), ("currently allocated", report.currently_allocated_bytes),
        ("TensorCore", report.tensorcore_bytes), ("SparseCore", report.sparsecore_bytes),
        ("global", report.global_bytes), ("scoped", report.scoped_bytes),
    ]
    for label, value in rows:
        if value is not None:
            summary.add_row(label, fmt(value))
    if report.program_unknown:
        summary.add_row("program", "unknown size")
    if report.arguments_unknown:
        summary.add_row("arguments", "unknown size")
    if report.hlo_temp_bytes is not None:
        temp = fmt(report.hlo_temp_bytes)
        if report.unpadded_bytes is not None:
            temp += (f"  (unpadded {fmt(report.unpadded_bytes)}, padded {fmt(report.padded_bytes)}, "
                     f"{report.utilization}% utilization)")
        elif report.utilization is not None:
            temp += f"  ({report.utilization}% utilization)"
        summary.add_row("HLO temp", temp)
    console.print(summary)
    for note in report.notes:
        console.print(f"[yellow]! {e(note)}[/yellow]")

    if report.allocations:
        console.print()
        rows = []
        shown = report.allocations[:MAX_ALLOCATION_ROWS]
        for entry in shown:
            size = entry.size_bytes
            unpadded = entry.unpadded_bytes if entry.unpadded_bytes is not None else entry.recomputed_unpadded_bytes
            expansion = entry.expansion or (size / unpadded if size and unpadded else None)
            check = "-"
            if entry.recomputed_padded_bytes is not None:
                check = fmt(entry.recomputed_padded_bytes) + (" [red]≠[/red]" if entry.disagreements else " ✓")
                if entry.assumed_tiling:
                    check += f" ({entry.assumed_tiling}?)"
            op = entry.op_name or entry.op_type or (entry.xla_label or "")
            rows.append((str(entry.index or ""), fmt(size), e(wrappable_shape(entry.shape or "")), fmt(unpadded),
                         f"{expansion:.1f}" if expansion else "", check, e(op)))
        columns = [tables.number("#"), tables.number("size"), tables.text("shape"), tables.number("unpadded", drop=3),
                   tables.number("x", drop=4), tables.text("recomputed", drop=2), tables.name("op", drop=1)]
        table = tables.table(columns, rows, console.width,
                             title="Largest allocations (log) with padding recomputed from the shape")
        console.print(table)
        if len(report.allocations) > len(shown):
            console.print(f"... and {len(report.allocations) - len(shown)} more listed allocations (--json has every one)")
        for entry in shown:
            for message in entry.disagreements:
                console.print(f"[yellow]! allocation {entry.index}: {e(message)}[/yellow]")

    if dump_rows:
        console.print()
        joined = "listed allocations" if any("index" in r for r in dump_rows["buffers"]) else "largest buffers"
        console.print(f"Dump {e(dump_rows['module'])}: arguments {fmt(dump_rows['argument_bytes'])}, "
                      f"temporaries {fmt(dump_rows['temp_bytes'])}, output {fmt(dump_rows['output_bytes'])}")
        columns = [tables.number("#"), tables.name("instruction"), tables.text("shape"), tables.number("size"),
                   tables.number("unpadded", drop=3), tables.text("type", drop=2), tables.name("op", drop=1)]
        rows = [(str(row.get("index", "")), e(row["instruction"]), e(wrappable_shape(row["shape"])),
                 fmt(row["size_bytes"]), fmt(row["unpadded_bytes"]), e(row["allocation_type"]),
                 e(row.get("op_name") or "")) for row in dump_rows["buffers"]]
        table = tables.table(columns, rows, console.width, title=f"The dump's {joined}")
        console.print(table)

    console.print()
    from tpuprof.renderers.suggestions import value as _get

    # A server has no batch to shrink (its options are the fixes), and a batch_size fix says it itself.
    if report.serving is None and not any(_get(item, "kind") == "batch_size" for item in suggestions):
        if estimate.scale is not None and estimate.scale >= 1:
            console.print(f"batch estimate: the program fits the capacity at the current batch ({e(estimate.reason)}).")
        elif estimate.scale is not None and estimate.scale <= 0:
            console.print(f"batch estimate: no batch fits; confidence {estimate.confidence}: {e(estimate.reason)}.")
        elif estimate.scale is None:
            console.print(f"batch estimate: none ({e(estimate.reason)}).")
        console.print()
    from tpuprof.renderers.suggestions import render_suggestions

    render_suggestions(console, suggestions, report.framework,
                       "Causes and fixes: first what can make it fit alone, then by memory freed")




def _serving_rows(summary: Table, serving) -> None:
    """The server the log shows: what failed in serving terms, its settings and the engine's memory figures."""
    settings = serving.settings
    engine = serving.engine + (f" {settings.engine_version}" if settings.engine_version else "")
    summary.add_row("server", e(f"{engine}: {SERVING_CAUSES.get(serving.cause, serving.cause)}"))
    shown = [("model", settings.model), ("TPU", settings.tpu), ("TP", settings.tensor_parallel_size),
             ("max-model-len", settings.max_model_len), ("max-num-seqs", settings.max_num_seqs),
             ("max-num-batched-tokens", settings.max_num_batched_tokens),
             ("gpu-memory-utilization", settings.gpu_memory_utilization), ("kv-cache-dtype", settings.kv_cache_dtype),
             ("block-size", settings.block_size)]
    text = ", ".join(f"{name} {value}" for name, value in shown if value is not None)
    if text:
        summary.add_row("settings", e(text))
    if settings.kv_cache_tokens is not None:
        kv = f"{settings.kv_cache_tokens:,} tokens"
        if settings.max_concurrency is not None and settings.concurrency_tokens:
            kv += f" ({settings.max_concurrency:g}x requests of {settings.concurrency_tokens:,})"
        summary.add_row("KV cache", kv)
    if serving.estimated_max_model_len is not None:
        summary.add_row("longest request", f"{serving.estimated_max_model_len:,} tokens (vLLM's estimate)")
