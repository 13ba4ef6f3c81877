"""The step report as a JSON document (the `--json` contract) and as rich tables."""

from __future__ import annotations

from tpuprof.analyses import input_pipeline
from tpuprof.analyses.summary import Report
from tpuprof.models.profile import CATEGORIES


def _ms(ps: int | float) -> float:
    return round(ps / 1e9, 3)


def to_json(report: Report, top: int) -> dict:
    stage = report.bottleneck_stage
    return {
        "hosts": [
            {
                "host": h.host,
                "file": h.path,
                "platform": h.platform,
                "step_source": h.step_source,
                "steps": len(h.steps),
                "median_ms": round(h.median_step_ms(), 3),
                "breakdown_percent": {c: round(100.0 * h.total(c) / h.step_ps, 1) if h.step_ps else 0.0
                                      for c in CATEGORIES},
                "notes": h.notes,
                "step_list": [
                    {"number": st.number, "duration_ms": _ms(st.duration_ps), "batches": st.batches,
                     **{f"{c}_ms": _ms(getattr(st, f"{c}_ps")) for c in CATEGORIES}}
                    for st in h.steps
                ],
            }
            for h in report.hosts
        ],
        "steps": {"count": report.step_count, "mean_ms": round(report.mean_ms, 3),
                  "median_ms": round(report.median_ms, 3), "p90_ms": round(report.p90_ms, 3),
                  "batches_per_step": report.batches_per_step},
        "breakdown_percent": report.breakdown_percent,
        "breakdown_ms_per_step": {k: round(v, 3) for k, v in report.breakdown_ms_per_step.items()},
        "input_bound_percent": report.input_bound_percent,
        "verdict": report.verdict,
        "verdict_reason": report.verdict_reason,
        "input_pipeline": {
            "bottleneck": None if stage is None else {
                "stage": stage.name, "kind": stage.kind, "count": stage.count, "self_ms": _ms(stage.self_ps),
                "py_function_ms": _ms(stage.py_function_ps)},
            "stages": [{"stage": s.name, "kind": s.kind, "count": s.count, "total_ms": _ms(s.total_ps),
                        "self_ms": _ms(s.self_ps), "py_function_ms": _ms(s.py_function_ps)}
                       for s in report.stages[: top if top > 0 else None]],
        },
        "precision": _precision(report),
        "stragglers": [{"host": h, "median_ms": round(v, 3), "hosts_median_ms": round(m, 3)}
                       for h, v, m in report.stragglers],
        "suggestions": report.suggestions,
        "top_ops": [{"name": o.name, "kind": o.kind, "where": o.where, "count": o.count, "self_ms": _ms(o.self_ps)}
                    for o in report.top_ops],
    }


def _precision(report: Report) -> dict:
    """Device time in matmuls/convolutions and the part with 32-bit results (TPU planes only)."""
    matmul = sum(h.matmul_ps for h in report.hosts)
    wide = sum(h.matmul_f32_ps for h in report.hosts)
    compute = sum(h.total("compute") for h in report.hosts)
    return {"matmul_ms": _ms(matmul), "matmul_f32_ms": _ms(wide),
            "f32_matmul_percent_of_compute": round(100.0 * wide / compute, 1) if compute and matmul else None}


def print_tables(report: Report, top: int) -> None:
    from rich.markup import escape

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    for h in report.hosts:
        source = f"steps from {escape(h.step_source)}" if h.step_source else "no steps found"
        out.print(f"[bold]{escape(h.host)}[/bold] ({h.platform}): {len(h.steps)} steps, {source}")
        for note in h.notes:
            out.print(f"  [dim]{escape(note)}[/dim]")
    if report.step_count:
        out.print(f"Steps: {report.step_count}, mean {report.mean_ms:.2f} ms, median {report.median_ms:.2f} ms, "
                  f"p90 {report.p90_ms:.2f} ms" + (f", {report.batches_per_step:g} batches per step call"
                                                   if report.batches_per_step > 1 else ""))
        labels = {"compute": "compute", "input": "waiting for input",
                  "host_overhead": "host overhead (launch, return, between steps)", "compile": "compilation",
                  "other": "other"}
        rows = [(labels[category], f"{report.breakdown_percent[category]:.1f}",
                 f"{report.breakdown_ms_per_step[category]:.2f}") for category in CATEGORIES]
        columns = [tables.text("category"), tables.number("% of step"), tables.number("ms per step")]
        out.print(tables.table(columns, rows, out.width, title="Where the step time goes"))
    colour = "red" if "input" in report.verdict else "yellow" if report.verdict != "compute-bound" else "green"
    out.print(f"Verdict: [bold {colour}]{report.verdict}[/bold {colour}]. {escape(report.verdict_reason)}")

    if report.stages:
        columns = [tables.name("stage", least=24), tables.number("calls"), tables.number("own ms"),
                   tables.number("in Python ms", drop=1)]
        rows = [(escape(s.name), str(s.count), f"{s.self_ps / 1e9:.1f}", f"{s.py_function_ps / 1e9:.1f}")
                for s in input_pipeline.merged(report.stages)[: top if top > 0 else None]]
        out.print(tables.table(columns, rows, out.width, title="tf.data stages by own time (summed over repeat epochs)"))
    if report.top_ops:
        columns = [tables.name("op", least=24), tables.text("type", drop=2), tables.text("where", drop=3),
                   tables.number("count", drop=1), tables.number("self ms")]
        rows = [(escape(o.name), escape(o.kind), o.where, str(o.count), f"{o.self_ps / 1e9:.2f}")
                for o in report.top_ops]
        out.print(tables.table(columns, rows, out.width, title="Top ops by self time"))
    for h, value, middle in report.stragglers:
        out.print(f"[yellow]Straggler:[/yellow] {escape(h)} median step {value:.2f} ms vs {middle:.2f} ms")
    if not report.suggestions and report.verdict == "compute-bound":
        out.print("No change to the input pipeline or the training loop is called for: the step is the program's "
                  "own work; the top ops above are where it goes.")
    if report.suggestions:
        out.print("[bold]Suggestions[/bold]")
        for i, s in enumerate(report.suggestions, 1):
            out.print(f"{i}. {escape('[' + s['kind'] + ']')} {escape(s['message'])}")
            out.print(f"   [dim]evidence: {escape(s['evidence'])}[/dim]")
