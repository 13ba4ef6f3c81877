"""What `tpuprof diff` shows, from its `tpuprof.diff/1` document (built by tpuprof/documents_diff.py): the --fail-if
checks, the two inputs, and per module or target the metrics with their signed changes, the verdict, the top ops
and the buffers that changed, appeared or went. The terminal, Markdown and the notebook print this section."""

from __future__ import annotations

from tpuprof.models.memory import PER_DEVICE_COMPILER_METHODS
from tpuprof.presentation.memory import wrappable_shape
from tpuprof.presentation.model import Caveats, Fact, Note, Section, Table, Verdict, name, number, text
from tpuprof.units import fmt_bytes, fmt_fixed

# Red means worse. For most metrics (sizes, times, input share) more is worse; for these, more is better,
# and for counts that only describe the run (steps captured, buffers) neither.
HIGHER_IS_BETTER = {"compute_percent", "max_batch_size"}
NEUTRAL = {"buffer_count"}
TITLES = {"steps": "Step time", "memory": "Memory", "preflight": "Preflight"}


def _fixed(value: float, digits: int) -> str:
    """VALUE to DIGITS decimals, halves rounded up (a document's 2.925 ms reads 2.93, as the figure it rounds)."""
    return fmt_fixed(value, digits)


def tone(metric: str, change) -> str:
    """"bad" when the change makes the program worse, "good" when better, "" for no change or neither."""
    if not change or metric in NEUTRAL:
        return ""
    worse = change < 0 if metric in HIGHER_IS_BETTER else change > 0
    return "bad" if worse else "good"


def fmt_value(value, unit: str | None) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "ms":
        return f"{_fixed(value, 3)} ms"
    if unit == "percent":
        return f"{_fixed(value, 1)}%"
    return f"{value:g}"


def fmt_change(value, unit: str | None) -> str:
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    sign = "+" if value > 0 else "-"
    if unit == "percent":
        return f"{sign}{_fixed(abs(value), 1)} pts"
    return sign + fmt_value(abs(value), unit)


def fmt_percent(value) -> str:
    if value is None:
        return ""
    return ("+" if value >= 0 else "-") + f"{_fixed(abs(value), 1)}%"


def metric_percent(m: dict) -> str:
    """The relative change; 'new' or 'gone' where A or B is 0 (the document holds no infinite percentage)."""
    if m.get("percent") is None and m.get("a") == 0 and m.get("b") and m.get("unit") != "percent":
        return "new" if m["b"] > 0 else "gone"
    return fmt_percent(m.get("percent"))


def section(document: dict, top: int = 10) -> Section:
    """The whole comparison, with TOP rows of each changed-buffer and op table (0: every row)."""
    d = document
    kind = d.get("kind") or ""
    out = Section("tpuprof diff")
    checks = d.get("thresholds") or []
    tripped = [c for c in checks if c.get("tripped")]
    if checks:
        out.blocks.append(Verdict("--fail-if", not tripped,
                                  f"regression: {len(tripped)} of {len(checks)} thresholds tripped (exit code 1)"
                                  if tripped else f"no regression: {len(checks)} threshold(s) checked"))
    a, b = d.get("a") or {}, d.get("b") or {}
    out.blocks += [Fact("A", str(a.get("path"))), Fact("B", str(b.get("path")))]
    if d.get("identical"):
        out.blocks.append(Verdict("no change", True, "every metric and buffer is the same in A and B."))
    units = {m["name"]: m.get("unit") for g in d.get("groups") or [] for m in g.get("metrics") or []}
    for c in tripped + [c for c in checks if not c.get("tripped")]:
        status = "FAIL" if c.get("tripped") else "ok" if c.get("evaluated") else "not evaluated"
        group = "" if c.get("group") == kind else f" ({c.get('group')})"
        out.blocks.append(Note(f"{status} --fail-if {c['expression']}{group}: {c.get('metric')} "
                               f"{_compared(c, units.get(c.get('metric')))}.", "problem" if c.get("tripped") else "note"))
    out.sections += [_group(g, kind, top) for g in d.get("groups") or []]
    if d.get("unpaired_groups"):
        out.blocks.append(Note(f"{d['unpaired_groups']} module(s) or target(s) only in one input were not compared.",
                               "warning"))
    return out


def _compared(check: dict, unit: str | None) -> str:
    """The figure the threshold compared, as the metrics table prints it (rounded alike)."""
    if check.get("on") == "percent":
        return fmt_percent(check.get("percent")) or "n/a"
    if check.get("on") == "change":
        return fmt_change(check.get("change"), unit)
    return fmt_value(check.get("b"), unit)


def _group(g: dict, kind: str, top: int) -> Section:
    title = TITLES.get(kind, kind)
    if g.get("name") != kind:  # one group per module or target: name it
        title += f": {g.get('name')}"
    out = Section(title)
    metrics = g.get("metrics") or []
    # Zero in A and in B (host transfers of a CPU job): no row; --json and --fail-if still have them.
    zero = [m for m in metrics if m.get("a") == 0 and m.get("b") == 0 and kind == "steps"]
    shown = [m for m in metrics if m not in zero]
    out.blocks.append(Table(
        (name("metric (--fail-if name)"), number("A"), number("B"), number("change"), number("%")),
        tuple((m["name"], fmt_value(m.get("a"), m.get("unit")), fmt_value(m.get("b"), m.get("unit")),
               fmt_change(m.get("change"), m.get("unit")), metric_percent(m)) for m in shown),
        None, tuple(tone(m["name"], m.get("change")) for m in shown)))
    if any(m.get("unit") == "percent" for m in metrics):
        out.blocks.append(Note("Shares change in percentage points (pts), not in %."))
    if zero:
        out.blocks.append(Note(f"{len(zero)} metrics are 0 in A and B: " + ", ".join(m["name"] for m in zero)))
    measured = g.get("steps_measured")
    if measured:
        out.blocks.append(Note(f"Steps measured: {measured.get('a')} in A, {measured.get('b')} in B (that depends on "
                               "how long each capture ran: not compared)."))
    sources = g.get("step_sources")
    if isinstance(sources, dict) and sources.get("a") and sources.get("b") and sources["a"] != sources["b"]:
        out.blocks.append(Note(f"A's steps are {'; '.join(sources['a'])}, B's are {'; '.join(sources['b'])}: "
                               "steps of different programs, chips or markers, so the step figures may not compare "
                               "alike.", "warning"))
    batches = g.get("batches_per_step")
    if isinstance(batches, dict) and batches.get("a") != batches.get("b"):
        out.blocks.append(Note(_different_steps(batches), "warning"))
    methods = g.get("methods")
    if isinstance(methods, dict) and methods.get("a") != methods.get("b") and methods.get("a") and methods.get("b"):
        estimated = [side.upper() for side in ("a", "b") if methods[side] not in PER_DEVICE_COMPILER_METHODS]
        if estimated:
            whose = ("A's and B's figures are estimates" if len(estimated) == 2
                     else f"{estimated[0]}'s figures are an estimate")
            out.blocks.append(Note(
                f"{whose}, obtained otherwise ({methods['a']} in A, {methods['b']} in B): a change may be the "
                "method's, not the program's (an estimate adds up every temporary and counts buffers otherwise); "
                "compare two inputs of one kind (HloProto or HLO text) for the program's own.", "warning"))
    verdict = g.get("verdict")
    if isinstance(verdict, dict) and verdict.get("a") != verdict.get("b"):
        out.blocks.append(Note(f"Verdict: {verdict.get('a')} -> {verdict.get('b')}."))
    out.blocks += _ops(g.get("ops") or [], top)
    growth = g.get("per_example")
    if growth:
        out.blocks.append(Note(_per_example(growth)))
    out.blocks += _buffers(g.get("buffers") or {})
    out.blocks.append(Caveats("", tuple(g.get("caveats") or ())))
    return out


def _different_steps(batches: dict) -> str:
    a, b = batches.get("a"), batches.get("b")
    return (f"A step runs {a} batch{'' if a == 1 else 'es'} in A and {b} in B (the input iterator's calls per step "
            "call, in each capture): step times and the per-step figures (ms per step, the ops) count "
            "different work; compare median_ms_per_batch and mean_ms_per_batch.")


def _ops(ops: list[dict], top: int) -> list:
    if not ops:
        return []
    shown = ops[:top] if top > 0 else ops
    rows, tones = [], []
    for r in shown:
        a, b = (r.get(k) for k in ("a_ms_per_step", "b_ms_per_step"))
        change = (fmt_change(r["change_ms"], "ms") if r.get("change_ms") is not None
                  else "new" if a is None else "gone")
        where = (r.get("where") or "") + (f" ({r['category']})" if r.get("category") else "")
        rows.append((r.get("hlo_op") or r.get("name") or "", where, "-" if a is None else _fixed(a, 3),
                     "-" if b is None else _fixed(b, 3), change))
        tones.append("bad" if a is None else "good" if b is None else tone("op", r.get("change_ms")))
    return [Table((name("op", least=24), text("where", drop=1), number("A ms"), number("B ms"), number("change")),
                  tuple(rows), "Top ops: self time per step (device ops per chip)", tuple(tones)),
            Note("From each report's top list: new/gone = in only one of them.")]


def _per_example(growth: dict) -> str:
    measure = "peak HBM" if growth.get("measure", "peak_heap_bytes") == "peak_heap_bytes" else "required HBM"
    line = (f"Per example: {fmt_change(growth.get('per_example_bytes'), 'bytes')} of {measure} per example "
            f"(batch {growth.get('batch_a')} -> {growth.get('batch_b')}, {growth.get('evidence')}); "
            + ("not linear: a line through the two batches has a negative fixed part, so no batch is extrapolated "
               "from it" if growth.get("not_linear") else f"fixed part {fmt_bytes(growth.get('fixed_bytes'))}"))
    if "largest_batch_if_linear" in growth:
        line += (f"; at this rate batch {growth['largest_batch_if_linear']} is the largest that fits "
                 f"{fmt_bytes(growth.get('hbm_capacity_bytes'))} (linear estimate: confirm with preflight)")
    return line + "."


def _buffers(buffers: dict) -> list:
    """The changed, new and gone buffers the comparison kept (its top of each)."""
    if not any(buffers.get(k) for k in ("appeared", "disappeared", "changed")):
        return []
    rows, tones = [], []
    for r in buffers.get("changed") or []:
        rows.append(("changed", r["instruction"], shape_change(r.get("a_shape") or "", r.get("b_shape") or ""),
                     fmt_bytes(r.get("a_bytes")), fmt_bytes(r.get("b_bytes")), fmt_change(r.get("change"), "bytes"),
                     r.get("op_name") or ""))
        tones.append(tone("bytes", r.get("change")))
    for r in buffers.get("appeared") or []:
        rows.append(("new", r["instruction"], wrappable_shape(r.get("shape") or ""), "", fmt_bytes(r["size_bytes"]),
                     fmt_change(r["size_bytes"], "bytes"), r.get("op_name") or ""))
        tones.append("bad")
    for r in buffers.get("disappeared") or []:
        rows.append(("gone", r["instruction"], wrappable_shape(r.get("shape") or ""), fmt_bytes(r["size_bytes"]), "",
                     fmt_change(-r["size_bytes"], "bytes"), r.get("op_name") or ""))
        tones.append("good")
    columns = (text(""), name("instruction", least=20), text("shape", drop=1), number("A"), number("B"),
               number("change"), name("op", drop=2))
    counts = (f"{buffers.get('changed_count')} changed, {buffers.get('appeared_count')} new, "
              f"{buffers.get('disappeared_count')} gone")
    if buffers.get("partial"):
        counts += " (a --json input lists only its top buffers: new/gone is among the listed ones)"
    return [Table(columns, tuple(rows), "Buffers (matched by HLO instruction)", tuple(tones)), Note(counts + ".")]


def shape_change(a: str, b: str) -> str:
    """'f32[64,8]{1,0:T(8,128)}' and 'f32[128,8]{1,0:T(8,128)}' -> 'f32[64,8] -> f32[128,8] {1,0:T(8,128)}'."""
    if a == b:
        return wrappable_shape(b)
    a_dims, _, a_layout = a.partition("]{")
    b_dims, _, b_layout = b.partition("]{")
    if a_layout and a_layout == b_layout:
        return f"{a_dims}] -> {b_dims}] {{{b_layout}"
    return f"{wrappable_shape(a)} -> {wrappable_shape(b)}"
