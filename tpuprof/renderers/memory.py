"""Memory analysis as a JSON document (the contract other tools read) and as rich tables."""

from __future__ import annotations

from tpuprof.presentation import fits_word
from tpuprof.units import fmt_bytes
from tpuprof.models.memory import ModuleMemory


def to_json(results: list[ModuleMemory], top: int) -> dict:
    return {"modules": [_module_json(m, top) for m in results]}


def _module_json(m: ModuleMemory, top: int) -> dict:
    buffers = m.buffers if top <= 0 else m.buffers[:top]
    ops = m.ops if top <= 0 else m.ops[:top]
    return {
        "name": m.name,
        "source": m.source,
        "source_kind": m.source_kind,
        "target": m.target,
        "estimated": m.estimated,
        "method": m.method,
        "expected_error_percent": m.expected_error_percent,
        "peak_range_bytes": list(m.peak_range_bytes) if m.peak_range_bytes else None,
        "notes": m.notes,
        "peak_heap_bytes": m.peak_heap_bytes,
        "peak_unpadded_heap_bytes": m.peak_unpadded_heap_bytes,
        "argument_bytes": m.argument_bytes,
        "output_bytes": m.output_bytes,
        "temp_bytes": m.temp_bytes,
        "hbm_capacity_bytes": m.hbm_capacity_bytes,
        "padding_at_peak_bytes": m.padding_at_peak_bytes,
        "other_memory_spaces": {str(k): v for k, v in sorted(m.other_memory_spaces.items())},
        "buffer_count": len(m.buffers),
        "buffers": [
            {
                "instruction": b.instruction,
                "shape": b.shape,
                "size_bytes": b.size_bytes,
                "unpadded_bytes": b.unpadded_bytes,
                "padding_bytes": b.padding_bytes,
                "expansion": round(b.expansion, 3),
                "allocation_type": b.allocation_type,
                "op_name": b.op_name,
                "source_line": b.source_line,
                "live_at_peak": b.live_at_peak,
            }
            for b in buffers
        ],
        "ops_scope": m.ops_scope,
        "ops": [
            {
                "op_name": o.op_name,
                "size_bytes": o.size_bytes,
                "unpadded_bytes": o.unpadded_bytes,
                "padding_bytes": o.padding_bytes,
                "buffers": o.buffers,
                "worst_buffer": o.worst_buffer,
            }
            for o in ops
        ],
        "suggestions": [s.to_dict() for s in m.suggestions],
    }


def method_words(method: str | None, target: str | None, error_percent: float | None,
                 peak_range: tuple[int, int] | list[int] | None) -> str:
    """How a module's figures were obtained, in one sentence (terminal and HTML report)."""
    tpu = target or "the TPU"
    if method == "recompiled":
        return f"Exact: recompiled with libtpu for {tpu}; figures from its buffer assignment."
    if method == "recompiled_one_device":
        return (f"Not per device: the module is sharded, recompiled here on one {tpu} device, so these are the whole "
                "program's figures on one chip; `tpuprof preflight` compiles it over the slice for per-device ones.")
    if method == "hlo_liveness":
        within = f", expected within {error_percent:g}% of the compiler's peak" if error_percent is not None else ""
        return (f"Estimate{within}: liveness over the scheduled HLO text (no buffer assignment); "
                "the HloProto (--xla_dump_hlo_as_proto) gives exact figures.")
    if method == "unscheduled_bound":
        span = (f": the real peak lies between {fmt_bytes(peak_range[0])} and {fmt_bytes(peak_range[1])}"
                if peak_range else "")
        return (f"Estimate for {tpu} without a TPU schedule or layouts (libtpu's default tiles){span}; "
                "recompile the module proto with libtpu (--compile) for exact figures.")
    return "Exact: the compiler's TPU buffer assignment."


def print_tables(results: list[ModuleMemory], top: int) -> None:
    from rich.markup import escape
    from rich.table import Table

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    for m in results:
        title = f"[bold]{escape(m.name)}[/bold]  ({m.source_kind}: {escape(m.source)})"
        out.print(title)
        wording = method_words(m.method, m.target, m.expected_error_percent, m.peak_range_bytes)
        out.print(f"[yellow]{escape(wording)}[/yellow]" if m.estimated else f"[dim]{escape(wording)}[/dim]")
        for note in m.notes:
            out.print(f"[dim]{escape(note)}[/dim]")
        summary = Table(show_header=False, box=None, pad_edge=False)
        summary.add_column(style="bold")
        summary.add_column(justify="right")
        summary.add_column()
        if m.peak_heap_bytes is not None:
            capacity = ""
            if m.hbm_capacity_bytes:
                share = m.peak_heap_bytes / m.hbm_capacity_bytes
                verdict = f"[{'red' if share > 1 else 'green'}]{fits_word(share <= 1)}[/]"
                from tpuprof import targets

                generation = targets.get(m.target)
                capacity = (f"{share:.1%} of the {fmt_bytes(m.hbm_capacity_bytes)} of HBM the compiler offers "
                            f"{generation.device} of {m.target}: {verdict}")
            label = "peak HBM (padded, estimate)" if m.estimated else "peak HBM (padded)"
            if m.estimated and m.peak_range_bytes:
                capacity = (f"range {fmt_bytes(m.peak_range_bytes[0])} to {fmt_bytes(m.peak_range_bytes[1])}; "
                            + capacity)
            summary.add_row(label, fmt_bytes(m.peak_heap_bytes), capacity)
            summary.add_row("peak HBM (unpadded)", fmt_bytes(m.peak_unpadded_heap_bytes),
                            "as XProf counts it: the temporaries unpadded, the arguments/outputs as allocated")
            summary.add_row("padding live at the peak", fmt_bytes(m.padding_at_peak_bytes), "")
        summary.add_row("arguments", fmt_bytes(m.argument_bytes), "")
        summary.add_row("outputs", fmt_bytes(m.output_bytes), "")
        summary.add_row("temporaries", fmt_bytes(m.temp_bytes), "HBM temporaries of the buffer assignment")
        for space, size in sorted(m.other_memory_spaces.items()):
            summary.add_row(f"memory space S({space})", fmt_bytes(size), "not HBM (VMEM/SMEM...)")
        out.print(summary)

        shown = m.buffers[:top] if top > 0 else m.buffers
        columns = [tables.name("instruction", least=20), tables.text("shape"), tables.number("padded"),
                   tables.number("unpadded", drop=3), tables.number("padding"), tables.number("x", drop=4),
                   tables.text("kind", drop=2), tables.text("peak", drop=5, justify="center"),
                   tables.name("framework op", drop=1), tables.name("source", drop=6)]
        rows = [(escape(b.instruction), escape(wrappable_shape(b.shape)), fmt_bytes(b.size_bytes), fmt_bytes(b.unpadded_bytes),
                 fmt_bytes(b.padding_bytes), f"{b.expansion:.1f}", b.allocation_type, "*" if b.live_at_peak else "",
                 escape(b.op_name), escape(b.source_line.rsplit("/", 1)[-1])) for b in shown]
        out.print(tables.table(columns, rows, out.width, title=f"Largest HBM buffers ({len(shown)} of {len(m.buffers)})"))

        ops = m.ops[:top] if top > 0 else m.ops
        scope = "live at the peak" if m.ops_scope == "peak" else "all buffers"
        columns = [tables.name("framework op", least=24), tables.number("padded"), tables.number("unpadded", drop=2),
                   tables.number("padding"), tables.number("buffers", drop=3), tables.name("worst buffer", drop=1)]
        rows = [(escape(o.op_name), fmt_bytes(o.size_bytes), fmt_bytes(o.unpadded_bytes), fmt_bytes(o.padding_bytes),
                 str(o.buffers), escape(o.worst_buffer)) for o in ops]
        out.print(tables.table(columns, rows, out.width, title=f"By framework op ({scope})"))

        if m.suggestions:
            from tpuprof.renderers.suggestions import render_suggestions

            render_suggestions(out, m.suggestions, None, "What to change: first what makes it fit, then by HBM saved")
        out.print()



def wrappable_shape(shape: str) -> str:
    """'bf16[8,512]{1,0:T(8,128)(2,1)}' -> 'bf16[8,512] {1,0:T(8,128)(2,1)}': a narrow column wraps the
    layout onto its own line instead of cutting the dimensions."""
    if shape.startswith("(") or "]{" not in shape:
        return shape
    return shape.replace("]{", "] {", 1)
