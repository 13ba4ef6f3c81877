"""`--format markdown`: a command's --json document as GitHub-flavoured Markdown, short enough for a pull request
comment or `$GITHUB_STEP_SUMMARY`: the verdict first, the top rows, the fixes with their code, the caveats.

Rendered from the very document `--json` prints (never from the pipeline's objects), so the two cannot drift:
every figure here is a field of the document, formatted. `render(document)` picks the layout from the document's
`schema` (tpuprof.<command>/<version>).
"""

from __future__ import annotations

from tpuprof import schemas
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
        if t.get("fast"):  # stopped at the memory layout: its figures are a lower bound
            out += [f"{name}: {cell(t['fast']['method'])}.", ""]
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
    from tpuprof.presentation.diff import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


def _serve(document: dict, top: int) -> list[str]:
    """Its presentation (tpuprof/presentation/serve.py): the verdicts, the table, per slice the figures and the
    launch command, the ranking."""
    from tpuprof.presentation.serve import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document))


RENDERERS = {"memory": _memory, "oom": _oom, "analyze": _analyze, "preflight": _preflight, "diff": _diff,
             "serve": _serve}
