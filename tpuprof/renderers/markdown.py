"""`--format markdown`: a command's --json document as GitHub-flavoured Markdown, short enough for a pull request
comment or `$GITHUB_STEP_SUMMARY`: the verdict first, the top rows, the fixes with their code, the caveats.

Rendered from the very document `--json` prints (never from the pipeline's objects), so the two cannot drift:
every figure here is a field of the document, formatted. `render(document)` picks the layout from the document's
`schema` (tpuprof.<command>/<version>).
"""

from __future__ import annotations

from tpuprof import schemas
from tpuprof.renderers.diff import fmt_change, fmt_percent, fmt_value
from tpuprof.presentation import fits_word
from tpuprof.renderers.printers import (  # noqa: F401 (the building blocks, importable from here)
    MAX_FIXES, caveats, cell, code, fixes, more, table)
from tpuprof.units import fmt_bytes

TOP = 5  # rows of each table: enough to act on, short enough for a comment
MAX_MODULES = 3  # memory documents of a whole dump folder: the largest peaks


def render(document: dict, top: int = TOP) -> str:
    """The Markdown of any tpuprof --json document (memory, oom, analyze, preflight, diff)."""
    parsed = schemas.parse(document.get("schema"))
    command = parsed[0] if parsed else ""
    renderer = RENDERERS.get(command)
    if renderer is None:
        raise ValueError(f"no Markdown layout for a {document.get('schema')!r} document")
    lines = renderer(document, top)
    return "\n".join(_tidy(lines)).strip() + "\n"


# --- building blocks ---------------------------------------------------------------------------------------

def _tidy(lines: list[str]) -> list[str]:
    """No runs of blank lines."""
    out: list[str] = []
    for line in lines:
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    return out


# --- memory ------------------------------------------------------------------------------------------------

def memory_module(module: dict, top: int, heading: str = "###") -> list[str]:
    """One module as `tpuprof memory` presents it (tpuprof/presentation/memory.py)."""
    from tpuprof.presentation.memory import module_section
    from tpuprof.renderers.printers import markdown

    return markdown(module_section(module, top), level=len(heading))


def _memory(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.memory import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top, modules=MAX_MODULES))


# --- oom ---------------------------------------------------------------------------------------------------

def _oom(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


# --- analyze -----------------------------------------------------------------------------------------------

def _analyze(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.analyze import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


# --- preflight ---------------------------------------------------------------------------------------------

def _preflight(document: dict, top: int) -> list[str]:
    from tpuprof.documents_preflight import target_label  # a heavy module: only preflight's Markdown needs it

    targets = document.get("targets") or []
    out = ["## tpuprof preflight", ""]
    rows = []
    for t in targets:
        e = t.get("estimate") or {}
        verdict = "✅ fits" if t.get("fits") else "❌ does not fit"
        if t.get("fits") and t.get("host_fits") is False:
            verdict = "✅ fits HBM, ❌ not host memory"
        largest = t.get("max_batch_size", "")
        if t.get("max_batch_bound") not in (None, "hbm") and largest is not None:
            largest = f"{largest} ({t['max_batch_bound'].replace('_', ' ')})"  # bound by the host or the search limit
        rows.append([target_label(t), t.get("batch_size"), verdict,
                     fmt_bytes(t.get("required_bytes")), fmt_bytes(t.get("hbm_capacity_bytes")),
                     largest, e.get("step_ms", ""), e.get("examples_per_s", ""),
                     e.get("cost_per_million_examples", "")])
    out += table(["target", "batch", "verdict", "required", "HBM", "max batch", "step ms (est.)", "examples/s",
                  "$ per 1M examples"], rows, right={1, 3, 4, 5, 6, 7, 8})
    for t in targets:
        name = target_label(t)
        if t.get("verdict"):
            out += [f"{name}: {cell(t['verdict'])}", ""]
        if t.get("unsharded"):
            from tpuprof.renderers.preflight import unsharded_words

            out += [f"{name}: weights and AdamW state: {cell(unsharded_words(t['unsharded'], t.get('mesh') or {}))}.",
                    ""]
        if t.get("host_bytes"):  # offloaded activations: the host's memory, not HBM
            host = (f"of {fmt_bytes(t['host_capacity_bytes'])} a device may hold, "
                    f"{fits_word(True) if t.get('host_fits') else '❌ more than a device may hold'}"
                    if t.get("host_capacity_bytes") else "no host budget known for this generation")
            out += [f"{name}: host memory (offloaded, not HBM) {fmt_bytes(t['host_bytes'])} ({host}).", ""]
        if t.get("max_batch_bound") and t.get("max_batch_size") is not None:  # else the verdict says why
            from tpuprof.renderers.preflight import bound_words

            out += [f"{name}: the largest batch is bound by {bound_words(t)}.", ""]
        e = t.get("estimate") or {}
        if e.get("step_ms") is not None:
            out += [f"**{name} step estimate** {e['step_ms']} ms (band {e.get('step_ms_low')}–{e.get('step_ms_high')} ms, "
                    f"{e.get('flop_utilization_percent')}% FLOP utilisation).", ""]
        memory = t.get("memory")
        if isinstance(memory, dict):
            out += memory_module(memory, top, heading="###")
        oom = t.get("oom") or {}
        if oom.get("suggestions"):
            out += [f"**{name}: out of memory** — {cell((oom.get('report') or {}).get('headline') or oom.get('message'))}",
                    ""] + fixes(oom["suggestions"]) + caveats((oom.get("batch_estimate") or {}).get("caveats"),
                                                              "batch estimate")
        out += caveats(e.get("caveats"), f"{name} step estimate") + caveats(t.get("caveats"), f"{name} largest batch")
    return out


# --- diff --------------------------------------------------------------------------------------------------

def _diff(document: dict, top: int) -> list[str]:
    checks = document.get("thresholds") or []
    tripped = [c for c in checks if c.get("tripped")]
    out = ["## tpuprof diff", ""]
    if checks:
        out.append(f"**❌ Regression: {len(tripped)} of {len(checks)} thresholds tripped**" if tripped
                   else f"**✅ No regression: {len(checks)} threshold(s) checked**")
        out.append("")
        ordered = tripped + [c for c in checks if not c.get("tripped")]
        out += table(["threshold", "group", "A", "B", "change", "", ],
                     [[code(c["expression"]), cell(c.get("group")), _threshold_value(c, "a"), _threshold_value(c, "b"),
                       _threshold_change(c), "❌ tripped" if c.get("tripped") else
                       ("✅ ok" if c.get("evaluated") else "not evaluated")] for c in ordered], right={2, 3, 4})
    a, b = document.get("a") or {}, document.get("b") or {}
    out += [f"A: {code(a.get('path'))} → B: {code(b.get('path'))} ({document.get('kind')}): "
            f"**{document.get('summary')}**.", ""]
    for group in document.get("groups") or []:
        name = group.get("name")
        if group.get("a_name") and group.get("b_name") and group["a_name"] != group["b_name"]:
            name = f"{group['a_name']} → {group['b_name']}"
        out += [f"### {code(name)}", ""]
        out += table(["metric", "A", "B", "change", "%"],
                     [[m["name"], fmt_value(m.get("a"), m.get("unit")), fmt_value(m.get("b"), m.get("unit")),
                       fmt_change(m.get("change"), m.get("unit")), fmt_percent(m.get("percent"))]
                      for m in group.get("metrics") or [] if m.get("change")], right={1, 2, 3, 4})
        verdict = group.get("verdict")
        if isinstance(verdict, dict) and verdict.get("a") != verdict.get("b"):
            out += [f"Verdict: {cell(verdict.get('a'))} → **{cell(verdict.get('b'))}**.", ""]
        per_example = group.get("per_example") or {}
        if per_example.get("not_linear"):
            out += [f"Per example: about {fmt_bytes(per_example['per_example_bytes'])}; not linear (a line through "
                    "the two batches has a negative fixed part), so no batch is extrapolated.", ""]
        elif per_example.get("per_example_bytes") is not None:
            out += [f"Per example: {fmt_bytes(per_example['per_example_bytes'])}, fixed "
                    f"{fmt_bytes(per_example.get('fixed_bytes'))}; largest batch if linear: "
                    f"{per_example.get('largest_batch_if_linear')}.", ""]
        changed = (group.get("buffers") or {}).get("changed") or []
        if changed:
            out += ["**Buffers that changed most**", ""]
            out += table(["buffer", "A", "B", "change", "op"],
                         [[code(c["instruction"]), fmt_bytes(c.get("a_bytes")), fmt_bytes(c.get("b_bytes")),
                           fmt_change(c.get("change"), "bytes"), cell(c.get("op_name"))] for c in changed[:top]],
                         right={1, 2, 3})
        ops = group.get("ops") or []
        if ops:
            out += table(["op", "where", "A ms/step", "B ms/step", "change ms"],
                         [[code(o.get("name")), o.get("where"), _ms(o.get("a_ms_per_step")),
                           _ms(o.get("b_ms_per_step")), _ms(o.get("change_ms"), signed=True)] for o in ops[:top]],
                         right={2, 3, 4})
        out += caveats(group.get("caveats"))
    return out


def _ms(value, signed: bool = False) -> str:
    return "" if value is None else f"{value:+.3f}" if signed else f"{value:.3f}"


def _unit(metric: str | None) -> str:
    """A threshold names its metric, not its unit: the metrics' names end in it."""
    for suffix, unit in (("_bytes", "bytes"), ("_ms", "ms"), ("_percent", "percent")):
        if (metric or "").endswith(suffix):
            return unit
    return ""


def _threshold_value(check: dict, side: str) -> str:
    return fmt_value(check.get(side), _unit(check.get("metric")))


def _threshold_change(check: dict) -> str:
    if check.get("on") == "percent":
        return fmt_percent(check.get("percent")) or "n/a"
    return fmt_change(check.get("change"), _unit(check.get("metric")))


def _serve(document: dict, top: int) -> list[str]:
    """Its presentation (tpuprof/presentation/serve.py): the verdicts, the table, per slice the figures and the
    launch command, the ranking."""
    from tpuprof.presentation.serve import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document))


RENDERERS = {"memory": _memory, "oom": _oom, "analyze": _analyze, "preflight": _preflight, "diff": _diff,
             "serve": _serve}
