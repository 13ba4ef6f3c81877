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
NEUTRAL = {"buffer_count"}
TITLES = {"steps": "Step time", "memory": "Memory", "preflight": "Preflight"}


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

    from tpuprof.renderers import tables
    from tpuprof.presentation.memory import wrappable_shape
    from tpuprof.renderers.output import console

    out = console()
    out.print(f"A: {escape(result['a']['path'])}\nB: {escape(result['b']['path'])}")
    if result["identical"]:
        out.print("[green]no change[/green]: every metric and buffer is the same in A and B.")
    for g in result["groups"]:
        rows = []
        # Zero in A and in B (host transfers of a CPU job): no row; --json and --fail-if still have them.
        zero = [m for m in g["metrics"] if m.a == 0 and m.b == 0 and result["kind"] == "steps"]
        for m in g["metrics"]:
            if m in zero:
                continue
            change, percent = m.change, m.percent
            colour = _colour(m.name, change)
            cells = [fmt_change(change, m.unit), fmt_percent(percent)]
            if colour:
                cells = [f"[{colour}]{c}[/{colour}]" for c in cells]
            rows.append((m.name, fmt_value(m.a, m.unit), fmt_value(m.b, m.unit), *cells))
        columns = [tables.name("metric (--fail-if name)"), tables.number("A"), tables.number("B"),
                   tables.number("change"), tables.number("%")]
        title = TITLES.get(result["kind"], result["kind"])
        if g["name"] != result["kind"]:  # one group per module or target: name it
            title += f": {g['name']}"
        notes = []
        if any(m.unit == "percent" for m in g["metrics"]):
            notes.append("shares change in percentage points (pts), not in %")
        if zero:
            notes.append(f"{len(zero)} metrics are 0 in A and B: " + ", ".join(m.name for m in zero))
        out.print(tables.table(columns, rows, out.width, title=escape(title), caption="; ".join(notes) or None))
        measured = g.get("steps_measured")
        if measured:
            out.print(f"Steps measured: {measured['a']} in A, {measured['b']} in B (that depends on how long each "
                      "capture ran: not compared).")
        verdict = g.get("verdict")
        if verdict and verdict["a"] != verdict["b"]:
            out.print(f"Verdict: {escape(str(verdict['a']))} -> [bold]{escape(str(verdict['b']))}[/bold].")
        if g.get("ops"):
            rows = []
            for r in g["ops"]:
                cells = [fmt_value(r[k], "ms").replace(" ms", "") if r[k] is not None else "-"
                         for k in ("a_ms_per_step", "b_ms_per_step")]
                change = (fmt_change(r["change_ms"], "ms") if r["change_ms"] is not None
                          else "[red]new[/red]" if r["a_ms_per_step"] is None else "[green]gone[/green]")
                where = r["where"] + (f" ({r['category']})" if r.get("category") else "")
                rows.append((escape(r.get("hlo_op") or r["name"]), where, *cells, change))
            columns = [tables.name("op", least=24), tables.text("where", drop=1), tables.number("A ms"),
                       tables.number("B ms"), tables.number("change")]
            out.print(tables.table(
                columns, rows, out.width, title="Top ops: self time per step (device ops per chip)",
                caption="from each report's top list: new/gone = in only one of them"))
        growth = g.get("per_example")
        if growth:
            measure = "peak HBM" if growth.get("measure", "peak_heap_bytes") == "peak_heap_bytes" else "required HBM"
            line = (f"Per example: {fmt_change(growth['per_example_bytes'], 'bytes')} of {measure} per example "
                    f"(batch {growth['batch_a']} -> {growth['batch_b']}, {escape(growth['evidence'])}); "
                    + ("not linear: a line through the two batches has a negative fixed part, so no batch is "
                       "extrapolated from it" if growth.get("not_linear")
                       else f"fixed part {fmt_bytes(growth['fixed_bytes'])}"))
            if "largest_batch_if_linear" in growth:
                line += (f"; at this rate batch {growth['largest_batch_if_linear']} is the largest that fits "
                         f"{fmt_bytes(growth['hbm_capacity_bytes'])} (linear estimate: confirm with preflight)")
            out.print(line + ".")
        buffers = g.get("buffers")
        if buffers and any(buffers[k] for k in ("appeared", "disappeared", "changed")):
            rows = []
            for r in buffers["changed"]:
                rows.append(("changed", escape(r["instruction"]), escape(_shape_change(r["a_shape"], r["b_shape"])),
                             fmt_bytes(r["a_bytes"]), fmt_bytes(r["b_bytes"]), fmt_change(r["change"], "bytes")))
            for r in buffers["appeared"]:
                rows.append(("[red]new[/red]", escape(r["instruction"]), escape(wrappable_shape(r["shape"])), "",
                             fmt_bytes(r["size_bytes"]), fmt_change(r["size_bytes"], "bytes")))
            for r in buffers["disappeared"]:
                rows.append(("[green]gone[/green]", escape(r["instruction"]), escape(wrappable_shape(r["shape"])),
                             fmt_bytes(r["size_bytes"]), "", fmt_change(-r["size_bytes"], "bytes")))
            columns = [tables.text(""), tables.name("instruction", least=20), tables.text("shape", drop=1),
                       tables.number("A"), tables.number("B"), tables.number("change")]
            out.print(tables.table(columns, rows, out.width, title="Buffers (matched by HLO instruction)"))
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
        # The figure the threshold compared: the one printed in the table (rounded alike).
        seen = fmt_percent(check["percent"]) if check["on"] == "percent" else \
            fmt_change(check["change"], unit) if check["on"] == "change" else fmt_value(check["b"], unit)
        group = "" if check["group"] == result["kind"] else f" ({escape(check['group'])})"
        out.print(f"{status} --fail-if {escape(check['expression'])}{group}: {check['metric']} {seen}.")
    if result["regression"]:
        out.print("[red bold]regression[/red bold]: a --fail-if threshold tripped (exit code 1).")


def _shape_change(a: str, b: str) -> str:
    """'f32[64,8]{1,0:T(8,128)}' and 'f32[128,8]{1,0:T(8,128)}' -> 'f32[64,8] -> f32[128,8] {1,0:T(8,128)}'."""
    from tpuprof.presentation.memory import wrappable_shape

    if a == b:
        return wrappable_shape(b)
    a_dims, _, a_layout = a.partition("]{")
    b_dims, _, b_layout = b.partition("]{")
    if a_layout and a_layout == b_layout:
        return f"{a_dims}] -> {b_dims}] {{{b_layout}"
    return f"{wrappable_shape(a)} -> {wrappable_shape(b)}"
