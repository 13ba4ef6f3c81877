"""A diff as a JSON document and as rich tables: signed changes and percentages."""

from __future__ import annotations

import math

from tpuprof.units import fmt_bytes


def to_json(result: dict) -> dict:
    groups = []
    for g in result["groups"]:
        out = {**g, "metrics": [m.to_json() for m in g["metrics"]]}
        groups.append(out)
    return {"kind": result["kind"], "a": result["a"], "b": result["b"], "identical": result["identical"],
            "summary": "no change" if result["identical"] else "changed", "groups": groups,
            "unpaired_groups": result["unpaired"], "thresholds": result["thresholds"],
            "regression": result["regression"]}


# Red means worse. For most metrics (sizes, times, input share) more is worse; for these, more is better,
# and for counts that only describe the run (steps captured, buffers) neither.
HIGHER_IS_BETTER = {"compute_percent", "max_batch_size"}
NEUTRAL = {"step_count", "buffer_count"}


def _colour(name: str, change) -> str:
    if not change or name in NEUTRAL:
        return ""
    worse = change < 0 if name in HIGHER_IS_BETTER else change > 0
    return "red" if worse else "green"


def fmt_value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "ms":
        return f"{value:.3f} ms"
    if unit == "percent":
        return f"{value:.1f}%"
    return f"{value:g}"


def fmt_change(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    sign = "+" if value > 0 else "-"
    if unit == "percent":
        return f"{sign}{abs(value):.1f} pts"
    return sign + fmt_value(abs(value), unit)


def fmt_percent(value) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "new" if value > 0 else "gone"
    return f"{value:+.1f}%"


def print_tables(result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from tpuprof.renderers.output import console

    out = console()
    out.print(f"A: {escape(result['a']['path'])}\nB: {escape(result['b']['path'])}")
    if result["identical"]:
        out.print("[green]no change[/green]: every metric and buffer is the same in A and B.")
    for g in result["groups"]:
        table = Table(title=f"{result['kind']}: {g['name']}", title_justify="left")
        for column, justify in (("metric", "left"), ("A", "right"), ("B", "right"), ("change", "right"),
                                ("%", "right")):
            table.add_column(column, justify=justify)
        for m in g["metrics"]:
            change, percent = m.change, m.percent
            colour = _colour(m.name, change)
            cells = [fmt_change(change, m.unit), fmt_percent(percent)]
            if colour:
                cells = [f"[{colour}]{c}[/{colour}]" for c in cells]
            table.add_row(m.name, fmt_value(m.a, m.unit), fmt_value(m.b, m.unit), *cells)
        out.print(table)
        verdict = g.get("verdict")
        if verdict and verdict["a"] != verdict["b"]:
            out.print(f"verdict: {escape(str(verdict['a']))} -> [bold]{escape(str(verdict['b']))}[/bold]")
        if g.get("ops"):
            table = Table(title="Top ops, self time per step (from each report's top list)", title_justify="left")
            for column, justify in (("op", "left"), ("where", "left"), ("A ms", "right"), ("B ms", "right"),
                                    ("change", "right")):
                table.add_column(column, justify=justify, overflow="fold")
            for r in g["ops"]:
                cells = [fmt_value(r[k], "ms").replace(" ms", "") if r[k] is not None else "-"
                         for k in ("a_ms_per_step", "b_ms_per_step")]
                table.add_row(escape(r["name"][:90]), r["where"], *cells,
                              fmt_change(r["change_ms"], "ms") if r["change_ms"] is not None else "")
            out.print(table)
        growth = g.get("per_example")
        if growth:
            measure = "peak HBM" if growth.get("measure", "peak_heap_bytes") == "peak_heap_bytes" else "required HBM"
            line = (f"Per example: {fmt_change(growth['per_example_bytes'], 'bytes')} of {measure} per example "
                    f"(batch {growth['batch_a']} -> {growth['batch_b']}, {escape(growth['evidence'])}); "
                    f"fixed part {fmt_bytes(growth['fixed_bytes'])}")
            if "largest_batch_if_linear" in growth:
                line += (f"; at this rate batch {growth['largest_batch_if_linear']} is the largest that fits "
                         f"{fmt_bytes(growth['hbm_capacity_bytes'])} (linear estimate: confirm with preflight)")
            out.print(line + ".")
        buffers = g.get("buffers")
        if buffers and any(buffers[k] for k in ("appeared", "disappeared", "changed")):
            table = Table(title="Buffers (matched by HLO instruction)", title_justify="left")
            for column, justify in (("", "left"), ("instruction", "left"), ("shape", "left"), ("A", "right"),
                                    ("B", "right"), ("change", "right")):
                table.add_column(column, justify=justify, overflow="fold")
            for r in buffers["changed"]:
                shape = r["b_shape"] if r["a_shape"] == r["b_shape"] else f"{r['a_shape']} -> {r['b_shape']}"
                table.add_row("changed", escape(r["instruction"]), escape(shape), fmt_bytes(r["a_bytes"]),
                              fmt_bytes(r["b_bytes"]), fmt_change(r["change"], "bytes"))
            for r in buffers["appeared"]:
                table.add_row("[red]new[/red]", escape(r["instruction"]), escape(r["shape"]), "",
                              fmt_bytes(r["size_bytes"]), fmt_change(r["size_bytes"], "bytes"))
            for r in buffers["disappeared"]:
                table.add_row("[green]gone[/green]", escape(r["instruction"]), escape(r["shape"]),
                              fmt_bytes(r["size_bytes"]), "", fmt_change(-r["size_bytes"], "bytes"))
            out.print(table)
            counts = (f"{buffers['changed_count']} changed, {buffers['appeared_count']} new, "
                      f"{buffers['disappeared_count']} gone")
            if buffers["partial"]:
                counts += " (a --json input lists only its top buffers: new/gone is among the listed ones)"
            out.print(f"[dim]{counts}[/dim]")
    if result["unpaired"]:
        out.print(f"[yellow]{result['unpaired']} module(s) or target(s) only in one input were not compared.[/yellow]")
    for check in result["thresholds"]:
        status = "[red]FAIL[/red]" if check["tripped"] else "[green]ok[/green]"
        unit = next((m.unit for g in result["groups"] for m in g["metrics"] if m.name == check["metric"]), "")
        seen = fmt_percent(check["percent"]) if check["on"] == "percent" else \
            fmt_change(check["change"], unit) if check["on"] == "change" else fmt_value(check["b"], unit)
        out.print(f"{status} --fail-if {escape(check['expression'])} [{escape(check['group'])}]: {seen}")
    if result["regression"]:
        out.print("[red bold]regression[/red bold]: a --fail-if threshold tripped (exit code 1).")
