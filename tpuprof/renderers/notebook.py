"""A result as a compact HTML block for notebooks (`_repr_html_`): the headline figures, the largest rows,
the suggestions. Drawn from the result's `--json` document alone, without plotly; `tpuprof.report()`
makes the full page with charts.
"""

from __future__ import annotations

from tpuprof.presentation.model import freed_words, saved_time_words
from tpuprof.renderers.printers import esc, prose
from tpuprof.units import fmt_bytes

ROWS = 8  # table rows shown in a notebook
STYLE = ("<style>.tpuprof table{border-collapse:collapse;margin:4px 0}.tpuprof th,.tpuprof td{border:1px solid #ccc;"
         "padding:2px 6px;text-align:left}.tpuprof td.n{text-align:right}.tpuprof .fit{color:#1a7f37}"
         ".tpuprof .oom{color:#cf222e}</style>")


def render(result) -> str:
    """RESULT (one of tpuprof.results, named here by class so that this module does not import them)."""
    draw = {"MemoryResult": _memory, "AnalyzeResult": _analyze, "OomResult": _oom, "PreflightResult": _preflight,
            "DiffResult": _diff, "CaptureResult": _capture, "ReportResult": _report,
            "ServeResult": _presented}[type(result).__name__]
    body = draw(result.to_dict())
    return f'{STYLE}<div class="tpuprof">{body}{_suggestions(result.suggestions)}</div>'


def _presented(document: dict) -> str:
    """A command moved onto the presentation model (tpuprof/presentation): its section, without plots."""
    from tpuprof.presentation import build
    from tpuprof.renderers.printers import html

    return html(build(document))


def _table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _suggestions(suggestions: list) -> str:
    if not suggestions:
        return ""
    items = []
    for s in suggestions:
        words = freed_words(s) or saved_time_words(s)
        saving = f" ({words})" if words else ""
        items.append(f"<li><b>{esc(s.kind)}</b>: {prose(s.message)}{esc(saving)}</li>")
    return "<p><b>What to change</b></p><ol>" + "".join(items) + "</ol>"


def _memory(document: dict) -> str:
    from tpuprof.presentation.memory import section
    from tpuprof.renderers.printers import html

    return html(section(document, ROWS, modules=4))


def _analyze(document: dict) -> str:
    from tpuprof.presentation.analyze import section
    from tpuprof.renderers.printers import html

    return html(section(document, ROWS))


def _oom(document: dict) -> str:
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.printers import html

    return html(section(document, ROWS))


def _preflight(document: dict) -> str:
    from tpuprof.presentation.preflight import section
    from tpuprof.renderers.printers import html

    return html(section(document, ROWS))


def _diff(document: dict) -> str:
    from tpuprof.presentation.diff import section
    from tpuprof.renderers.printers import html

    return html(section(document, ROWS))


def _capture(document: dict) -> str:
    parts = [f"<p><b>Captured run</b> <code>{esc(document['run_dir'])}</code> from "
             f"{esc(', '.join(document['addresses']))}</p>",
             _table(["host", "file size", "events"], [[h["host"], fmt_bytes(h["size_bytes"]), h["events"]]
                                                      for h in document["hosts"]], numeric={1, 2})]
    analysis = document.get("analysis")
    if isinstance(analysis, dict) and "steps" in analysis:
        parts.append(_analyze(analysis))
    elif isinstance(analysis, dict):
        parts.append(f"<p>Not analysed: {esc(analysis.get('error'))}</p>")
    return "".join(parts)


def _report(document: dict) -> str:
    inputs = ", ".join(f"{i['path']} ({i['kind']})" for i in document["inputs"])
    return (f'<p>Report written to <a href="{esc(document["output"])}">{esc(document["output"])}</a> '
            f"({fmt_bytes(document['bytes'])}) from {esc(inputs)}.</p>")
