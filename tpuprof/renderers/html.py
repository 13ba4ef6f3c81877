"""One self-contained HTML page from the report's inputs (see tpuprof.commands.report).

plotly.js is embedded once in the page (no CDN: it must open on an offline TPU VM). Every string that
comes from the user's program or files (op names, shapes, paths, messages) goes through `esc`, in
the HTML and in the plot labels alike: plotly draws label text as markup (it knows <b>, <a href>...)
and turns entities back into characters, so escaped labels display as typed and never act as tags.
"""

from __future__ import annotations

import datetime as _dt
import math
from itertools import count

from tpuprof.units import fmt_bytes, fmt_fixed
from tpuprof.presentation import fits_share, fits_word
from tpuprof.presentation.model import freed_words
from tpuprof.renderers.printers import esc, prose
from tpuprof.sources.inputs import KIND_LABELS, MEMORY, OOM, PREFLIGHT, SERVE, STEPS, Input

MIB = 1024 * 1024
CATEGORY_LABELS = {"compute": "compute", "input": "waiting for input", "host_transfer": "host transfers",
                   "collective": "collectives", "host_overhead": "host overhead", "compile": "compilation",
                   "other": "other"}
CATEGORY_COLOURS = {"compute": "#2e7d32", "input": "#c62828", "host_transfer": "#1565c0", "collective": "#00838f",
                    "host_overhead": "#ef6c00", "compile": "#6a1b9a", "other": "#9e9e9e"}
MAX_MODULES = 4  # per dump folder: the first modules in memory's order (a JAX dump holds dozens of tiny ones)
TREEMAP_OPS = 150  # ops in the padding treemap: beyond that the boxes are too small to read

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{margin:8px 0 4px;font-size:1.6em}h2{margin-top:32px;border-bottom:2px solid #d0d7de;padding-bottom:4px}
h3{margin:20px 0 6px}
.meta{color:#57606a;font-size:.9em}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;min-width:220px}
.card b{display:block;font-size:1.25em;margin-top:2px}
.fit{color:#1a7f37}.oom{color:#cf222e}.warn{color:#9a6700}
table{border-collapse:collapse;background:#fff;margin:8px 0;font-size:.9em;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
td.n{text-align:right;white-space:nowrap}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;overflow-wrap:anywhere}
td>.mono{display:inline-block;min-width:16ch}
a.path{word-break:normal;white-space:nowrap}
ol.suggestions li{margin:6px 0}
.saving{background:#ddf4ff;border-radius:4px;padding:1px 6px;font-size:.85em;white-space:nowrap}
.plot{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:10px 0}
.note{color:#57606a;font-style:italic}
details.caveats{color:#57606a;font-size:.9em;margin:6px 0}details.caveats ul{margin:4px 0}
"""


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


# ---------------------------------------------------------------- units and sizes on charts

BYTE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))
# A quantity under both is not worth a chart (a sentence says it): 1.45 KiB of padding in a 1 GiB peak.
NEGLIGIBLE_BYTES = 1 << 20
NEGLIGIBLE_SHARE = 0.01
# Bars under this share of the largest are left off a bar chart (the table beside it lists them).
VISIBLE_SHARE = 0.01
# Legends above the plot area, right-aligned: below it they collide with the x axis title.
_TOP_LEGEND = dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0)


def byte_unit(largest: float) -> tuple[str, int]:
    """The binary unit in which LARGEST reads 1 to 1023, so that axes never tick at 0.0001 MiB ('100μ')."""
    chosen = BYTE_UNITS[0]
    for unit in BYTE_UNITS:
        if largest >= unit[1]:
            chosen = unit
    return chosen


def negligible(part: float, whole: float | None) -> bool:
    return part < NEGLIGIBLE_BYTES and (not whole or part < NEGLIGIBLE_SHARE * whole)


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table of already-escaped cells; a column empty in every row is left out."""
    keep = [i for i in range(len(headers)) if any(row[i] not in ("", None) for row in rows)]
    head = "".join(f"<th>{headers[i]}</th>" for i in keep)
    body = "".join("<tr>" + "".join(f'<td class="n">{row[i]}</td>' if i in numeric else f"<td>{row[i]}</td>"
                                    for i in keep) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class _Page:
    """Collects HTML parts; numbers the plot divs so the page is the same for the same inputs."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._ids = count(1)
        self.plots = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def figure(self, fig, height: int = 420) -> None:
        import plotly.io as pio

        fig.update_layout(height=height, margin=dict(l=60, r=30, t=50, b=50), template="plotly_white")
        self.plots += 1
        self.add('<div class="plot">' + pio.to_html(
            fig, include_plotlyjs=False, full_html=False, div_id=f"plot-{next(self._ids)}",
            config={"displaylogo": False, "responsive": True}) + "</div>")

    def figure_html(self, fig, height: int = 420) -> str:
        """The figure's HTML for a printer that assembles a section (tpuprof/renderers/printers.py): drawn by
        `figure`, the one place that embeds a plot."""
        mark = len(self.parts)
        self.figure(fig, height)
        drawn = "".join(self.parts[mark:])
        del self.parts[mark:]
        return drawn


def render(inputs: list[Input], top: int = 15, title: str | None = None) -> str:
    from plotly.offline import get_plotlyjs

    page = _Page()
    _header(page, inputs, title)
    _suggestions(page, inputs)
    for number, item in enumerate(inputs, 1):
        page.add(f'<h2 id="input-{number}">{number}. {esc(KIND_LABELS[item.kind])}: '
                 f'<span class="mono">{esc(item.path)}</span></h2>')
        if item.from_json and item.kind in (MEMORY, STEPS):
            page.add('<p class="note">Read from a tpuprof --json document: curves that need the raw data '
                     '(memory over program order, per-step times) are not in it.</p>')
        {MEMORY: _memory, STEPS: _steps, OOM: _oom, PREFLIGHT: _preflight, SERVE: _serve}[item.kind](page, item, top)
    head_title = esc(title or "tpuprof report")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{head_title}</title>"
            f"<style>{CSS}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>"
            f"<body><main>\n" + "\n".join(page.parts) + "\n</main></body></html>\n")


# ---------------------------------------------------------------- header and suggestions

def _capacity_card(name: str, target: str | None, peak: int | None, capacity: int | None,
                   what: str = "peak", estimated: bool = False, peak_range=None) -> str:
    if estimated:
        what += " (estimate)"  # from HLO text or a non-TPU dump: say so where the number is read
    if peak is None:
        verdict = '<span class="warn">peak unknown</span>'
    elif not capacity:
        verdict = '<span class="warn">no target: capacity unknown</span>'
    else:
        verdict = f'<span class="{"fit" if peak <= capacity else "oom"}">{esc(fits_share(peak, capacity))}</span>'
    if isinstance(peak_range, list) and len(peak_range) == 2 and all(isinstance(v, int) for v in peak_range):
        verdict += f'<br><span class="meta">range {esc(fmt_bytes(peak_range[0]))} to {esc(fmt_bytes(peak_range[1]))}'
        if capacity and peak_range[1] > capacity >= (peak or 0):
            verdict += ": may not fit"
        verdict += "</span>"
    return (f'<div class="card"><span class="mono">{esc(_short(name, 40))}</span><b>{esc(fmt_bytes(peak))} {what}</b>'
            f'{esc(target or "target unknown")}, HBM {esc(fmt_bytes(capacity) if capacity else "n/a")}<br>{verdict}'
            "</div>")


def _oom_numbers(d: dict) -> str:
    """The OOM card's one line of figures: what was needed against what there was."""
    when = {"compile": "at compile time", "early_abort": "at compile time (early abort)",
            "runtime_allocation": "at run time", "reservation": "when loading the program"}.get(d.get("kind"), "")
    capacity, used = d.get("capacity_bytes"), d.get("used_bytes")
    if used and capacity:
        figures = f"{fmt_bytes(used)} needed, {fmt_bytes(capacity)} available ({used / capacity:.1f}x)"
    elif d.get("hlo_temp_bytes") and capacity:
        temp = d["hlo_temp_bytes"]
        figures = f"{fmt_bytes(temp)} of temporaries, {fmt_bytes(capacity)} available ({temp / capacity:.1f}x)"
    elif d.get("requested_bytes"):
        free = f", {fmt_bytes(d['free_bytes'])} free" if d.get("free_bytes") is not None else ""
        figures = f"{fmt_bytes(d['requested_bytes'])} requested{free}"
    elif d.get("exceeded_bytes"):
        figures = f"over by {fmt_bytes(d['exceeded_bytes'])}"
    else:
        figures = "the message gives no sizes"
    return f"{figures} {when}".strip()


def _header(page: _Page, inputs: list[Input], title: str | None) -> None:
    from tpuprof.version import __version__

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page.add(f"<h1>{esc(title or 'tpuprof report')}</h1>"
             f'<p class="meta">Generated {esc(now)} by tpuprof {esc(__version__)} from {len(inputs)} '
             f"input{'s' if len(inputs) != 1 else ''}.</p>")
    cards = []
    for item in inputs:
        d = item.document
        if item.kind == MEMORY:
            for m in d["modules"][:MAX_MODULES]:
                cards.append(_capacity_card(m["name"], m.get("target"), m.get("peak_heap_bytes"),
                                            m.get("hbm_capacity_bytes"), estimated=bool(m.get("estimated")),
                                            peak_range=m.get("peak_range_bytes")))
        elif item.kind == OOM:
            space = d.get("memory_space")
            space = "host memory" if space == "host" else (space or "device memory").upper()
            cards.append(f'<div class="card">OOM log <span class="mono">{esc(_short(item.path, 40))}</span>'
                         f'<b class="oom">out of {esc(space)}</b>{esc(_oom_numbers(d))}</div>')
        elif item.kind == PREFLIGHT:
            for t in d["targets"]:
                cards.append(_capacity_card(f"preflight {t.get('target')} batch {t.get('batch_size')}",
                                            t.get("target"), t.get("required_bytes"), t.get("hbm_capacity_bytes"),
                                            "required"))
        elif item.kind == SERVE:
            from tpuprof.presentation import build

            for verdict in build(d).verdicts():
                tone = "fit" if verdict.fits else "oom"
                cards.append(f'<div class="card">serve {esc(d["model"]["name"])}<b class="{tone}">'
                             f'{esc(verdict.subject)}</b>{esc(verdict.text)}</div>')
        elif item.kind == STEPS:
            s = d.get("steps", {})
            cards.append(f'<div class="card">profile <span class="mono">{esc(_short(item.path, 40))}</span>'
                         f'<b>{s.get("median_ms", 0):.2f} ms median step</b>{esc(d.get("verdict", ""))}, '
                         f'{d.get("input_bound_percent", 0):.1f}% waiting for input</div>')
    page.add('<div class="cards">' + "".join(cards) + "</div>")
    rows = []
    for number, item in enumerate(inputs, 1):
        made = item.meta.get("note") or ""
        if item.meta.get("batch_size"):
            made = f"batch {item.meta['batch_size']}, {item.meta.get('dtype') or ''} — {made}"
        rows.append([str(number), f'<a href="#input-{number}" class="mono path">{esc(item.path)}</a>',
                     f"{esc(KIND_LABELS[item.kind])}{' (JSON)' if item.from_json else ''}", esc(made)])
    page.add(_table(["#", "input", "kind", "how it was made"], rows, {0}))


# The step-time category each kind of step suggestion removes: its ms per step bound what the fix can win.
STEP_SAVINGS = {"input_pipeline": "input", "steps_per_execution": "host_overhead", "compile": "compile",
                "host_transfer": "host_transfer", "collective": "collective"}


def _batches_per_step(document: dict) -> int:
    """Batches one step of a profile runs (Keras steps_per_execution), 1 when it does not say."""
    value = (document.get("steps") or {}).get("batches_per_step")
    return int(value) if isinstance(value, (int, float)) and value >= 1 else 1


def _number(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _oom_shortfall(d: dict) -> int:
    """What an OOM lacks; at least 1 byte: it did not fit, whatever figures its message gives."""
    used = _number(d.get("used_bytes")) or _number(d.get("required_bytes")) or _number(d.get("hlo_temp_bytes"))
    capacity = _number(d.get("capacity_bytes"))
    requested, free = _number(d.get("requested_bytes")), _number(d.get("free_bytes"))
    figures = [_number(d.get("exceeded_bytes")), used - capacity if used and capacity else None,
               requested - free if requested is not None and free is not None else None]
    return max([f for f in figures if f] + [1])


def suggestion_groups(inputs: list[Input]) -> list[tuple[int, str, list[dict], int | None]]:
    """(input number, kind, its suggestion dicts, its shortfall) for every program of every input: the
    shortfall is > 0 when it does not fit, 0 when it fits, None when the input cannot tell."""
    groups = []
    for number, item in enumerate(inputs, 1):
        d = item.document
        if item.kind == MEMORY:
            for m in d.get("modules", [])[:MAX_MODULES]:
                peak, capacity = _number(m.get("peak_heap_bytes")), _number(m.get("hbm_capacity_bytes"))
                shortfall = max(peak - capacity, 0) if peak is not None and capacity else None
                groups.append((number, item.kind, m.get("suggestions", []), shortfall))
        elif item.kind == PREFLIGHT:
            for t in d.get("targets", []):
                required, capacity = _number(t.get("required_bytes")), _number(t.get("hbm_capacity_bytes"))
                if t.get("fits") is False:
                    shortfall = max((required or 0) - (capacity or 0), 1)
                elif t.get("fits") is True:
                    shortfall = 0
                else:
                    shortfall = None
                listed = [*(t.get("memory") or {}).get("suggestions", []), *(t.get("oom") or {}).get("suggestions", [])]
                groups.append((number, item.kind, listed, shortfall))
        elif item.kind == OOM:
            groups.append((number, item.kind, d.get("suggestions", []), _oom_shortfall(d)))
        else:
            groups.append((number, item.kind, d.get("suggestions", []), None))
    return [(n, k, [s for s in listed if isinstance(s, dict) and s.get("message")], f) for n, k, listed, f in groups]


def ranked_suggestions(inputs: list[Input], kinds=(MEMORY, PREFLIGHT, OOM)) -> list[tuple[int, dict]]:
    """(input number, suggestion dict) over INPUTS of KINDS, in one order: the fixes of what does not fit
    first (those that make it fit alone, largest first), then the rest by saving, then what fits."""
    from tpuprof.models.suggestion import Suggestion, rank_across

    def ranked(d: dict) -> Suggestion:  # what the order needs from a document's suggestion
        def figure(key):
            return _number(d.get(key)) if not isinstance(d.get(key), float) else d[key]

        def pair(key):
            value = d.get(key)
            ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
            return tuple(value) if ok else None

        severity = d.get("severity") if isinstance(d.get("severity"), str) else "improve"
        return Suggestion(str(d.get("kind", "")), "", severity=severity, saving_bytes=figure("saving_bytes") or None,
                          saving_bytes_range=pair("saving_bytes_range"),
                          saving_ms_per_step=figure("saving_ms_per_step"), saving_ms_range=pair("saving_ms_range"))

    groups = [g for g in suggestion_groups(inputs) if g[1] in kinds]
    made = [[(ranked(s), s) for s in listed] for _, _, listed, _ in groups]
    dicts = {id(obj): d for pairs in made for obj, d in pairs}
    order = rank_across([([obj for obj, _ in pairs], group[3]) for pairs, group in zip(made, groups)])
    return [(groups[index][0], dicts[id(obj)]) for index, obj in order]


def _suggestions(page: _Page, inputs: list[Input]) -> None:
    from tpuprof.models.suggestion import FRAMEWORK_NAMES
    from tpuprof.models.suggestion import KIND_TITLES

    memory = ranked_suggestions(inputs)
    steps = []
    for number, kind, listed, _ in suggestion_groups(inputs):
        if kind != STEPS:
            continue
        d = inputs[number - 1].document
        for s in listed:
            category = STEP_SAVINGS.get(s.get("kind"))
            saving = (d.get("breakdown_ms_per_step") or {}).get(category) if category else s.get("saving_ms_per_step")
            own = s.get("saving_ms_range") or [None, s.get("saving_ms_per_step")]
            if isinstance(own[-1], (int, float)) and isinstance(saving, (int, float)) and own[-1] < 0.99 * saving:
                # The fix wins less than its category's time: steps per call leave overhead / N of the overhead,
                # and no batch comes faster than the input pipeline (tf_tiny_spe1: 0.51 ms of its 0.88).
                saving = own[-1]
            steps.append((number, s, saving if isinstance(saving, (int, float)) else None))
    batches = {n: _batches_per_step(inputs[n - 1].document) for n, _, _ in steps}
    # The time a fix can win, largest first, per batch: a step of 64 batches (Keras steps_per_execution) is not
    # 64 times the work of another input's step of one.
    steps.sort(key=lambda entry: -(entry[2] or 0) / batches[entry[0]])
    fits = {n: f for n, _, _, f in suggestion_groups(inputs)}
    for found, heading, unit in (
            ([(n, s, s.get("saving_bytes")) for n, s in memory],
             "Memory: what to change, first what makes a program that does not fit fit", "bytes"),
            (steps, "Step time: what to change, by time per step it can win", "ms")):
        if not found:
            continue
        page.add(f"<h2>{heading}</h2><ol class=\"suggestions\">")
        for number, s, saving in found:
            badge = ""
            if unit == "bytes" and freed_words(s):
                badge = f' <span class="saving">{esc(freed_words(s))}</span>'
            elif saving and unit == "ms":
                per_batch = (f" ({fmt_fixed(saving / batches[number], 2)} ms per batch, {batches[number]} batches a "
                             "step)") if batches[number] > 1 else ""
                badge = f' <span class="saving">up to {fmt_fixed(saving, 2)} ms per step{per_batch}</span>'
            blocked = unit == "bytes" and (fits.get(number) or 0) > 0
            status = f' <span class="oom">{fits_word(False)}</span>' if blocked else ""
            title = KIND_TITLES.get(s.get("kind", ""), s.get("kind", ""))
            code = ""
            if s.get("code"):
                who = FRAMEWORK_NAMES.get(s.get("framework") or "", "")
                code = f'<br><code>{esc((who + ": ") if who else "")}{esc(s["code"])}</code>'
            where = f'<br><span class="meta">at {esc(s["source_line"])}</span>' if s.get("source_line") else ""
            evidence = f'<br><span class="meta">evidence: {prose(s["evidence"])}</span>' if s.get("evidence") else ""
            page.add(f'<li><b>[{esc(title)}]</b> {prose(s["message"])}{badge} '
                     f'<a href="#input-{number}" class="meta">(input {number})</a>{status}{code}{where}{evidence}</li>')
        page.add("</ol>")


# ---------------------------------------------------------------- memory

def _memory(page: _Page, item: Input, top: int) -> None:
    modules = item.document["modules"]
    if len(modules) > MAX_MODULES:
        page.add(f'<p class="note">{len(modules)} modules; the first {MAX_MODULES} are shown, the one the answer is '
                 'about first.</p>')
    for m in modules[:MAX_MODULES]:
        _memory_module(page, m, top)


def _memory_module(page: _Page, m: dict, top: int, title: str | None = None, summary=None) -> None:
    """One module: what `tpuprof memory` presents (tpuprof/presentation/memory.py) but its tables, which the page
    replaces by the padding wasters and padding by op, each with its chart and fixes; then the curve. TITLE: the
    section's own (another command's compile names its target); SUMMARY: the section another command built for
    the module (preflight's, under the compile's verdict)."""
    from tpuprof.presentation import Fixes, Table
    from tpuprof.presentation.memory import module_section
    from tpuprof.renderers.printers import html

    summary = summary or module_section(m, top, title)
    summary.blocks = [b for b in summary.blocks if not isinstance(b, (Table, Fixes))]
    page.add(html(summary, page.figure_html))
    _memory_timeline(page, m)
    _padding_wasters(page, m, top)
    _padding_by_op(page, m, top)


def _memory_timeline(page: _Page, m: dict) -> None:
    import plotly.graph_objects as go

    timeline = m.get("timeline")
    if not timeline:
        if "timeline" in m or m.get("peak_heap_bytes") is None:
            page.add('<p class="note">No heap-simulator trace in this input: no memory-over-time curve.</p>')
        return
    x = timeline["position"]
    if len(x) < 2:  # one allocation event: a curve of one point is an empty chart
        page.add(f'<p class="note">One allocation event in the heap-simulator trace: the heap holds '
                 f'{esc(fmt_bytes(timeline["padded_bytes"][0]))} throughout (no curve to draw).</p>')
        return
    fig = go.Figure()
    # MiB on every curve whatever the size: the unit of XProf's memory viewer, which the tests compare with.
    fig.add_scatter(x=x, y=[v / MIB for v in timeline["padded_bytes"]], name="padded (allocated)",
                    mode="lines", line=dict(shape="hv", color="#1f6feb"),
                    hovertemplate="event %{x}: %{y:.3f} MiB allocated<extra></extra>")
    if timeline.get("unpadded_bytes"):
        fig.add_scatter(x=x, y=[v / MIB for v in timeline["unpadded_bytes"]], name="unpadded (the data)",
                        mode="lines", line=dict(shape="hv", color="#2da44e", dash="dot"),
                        hovertemplate="event %{x}: %{y:.3f} MiB of data<extra></extra>")
    peak = m.get("peak_heap_bytes")
    if peak is not None:
        fig.add_vline(x=timeline["peak_position"], line=dict(color="#cf222e", dash="dash"),
                      annotation_text=esc(f"peak {fmt_bytes(peak)}"), annotation_position="top left")
    capacity = m.get("hbm_capacity_bytes")
    if capacity and peak and peak >= 0.25 * capacity:  # a far-away capacity line would flatten the curve
        fig.add_hline(y=capacity / MIB, line=dict(color="#9a6700"),
                      annotation_text=esc(f"HBM {fmt_bytes(capacity)}"), annotation_position="bottom right")
    fig.update_layout(title="Memory over program order (heap-simulator trace, as XProf's memory viewer)",
                      xaxis=dict(title="program order (allocation events)", tickformat="d",
                                 dtick=1 if len(x) <= 12 else None),
                      yaxis_title="heap size (MiB)", legend=_TOP_LEGEND)
    page.figure(fig)


def _padding_wasters(page: _Page, m: dict, top: int) -> None:
    import plotly.graph_objects as go

    padded = sorted((b for b in m.get("buffers", []) if b.get("padding_bytes", 0) > 0), key=lambda b: -b["padding_bytes"])
    if not padded:
        page.add('<p class="note">No buffer is padded: the layouts fit the TPU tiles exactly.</p>')
        return
    wasters = padded[: max(top, 1)]
    at_peak = m.get("padding_at_peak_bytes")
    total = at_peak if at_peak is not None else sum(b["padding_bytes"] for b in padded)
    if negligible(total, m.get("peak_heap_bytes")):
        wasters = wasters[:5]  # a long table of 508-byte scalars says no more than its first rows
        worst = wasters[0]
        page.add(f'<p class="note">Padding is negligible: {esc(fmt_bytes(total))} '
                 f'{"live at the peak" if at_peak is not None else "in all"}'
                 f'{_share(total, m.get("peak_heap_bytes"))}; the most padded buffer, '
                 f'<span class="mono">{esc(worst["instruction"])}</span>, has {esc(fmt_bytes(worst["padding_bytes"]))}.'
                 "</p>")
    else:
        shown = [b for b in wasters if b["padding_bytes"] >= VISIBLE_SHARE * wasters[0]["padding_bytes"]]
        unit, size = byte_unit(max(b["size_bytes"] for b in shown))
        labels = [esc(f"{b['instruction']} {_short(b['shape'], 40)}") for b in shown]
        hover = [esc(b.get("fix") or b.get("op_name") or "") for b in shown]
        fig = go.Figure()
        for name, key, colour in (("data (unpadded)", "unpadded_bytes", "#2da44e"), ("padding", "padding_bytes", "#cf222e")):
            fig.add_bar(y=labels, x=[b[key] / size for b in shown], orientation="h", name=name, marker_color=colour,
                        customdata=[[fmt_bytes(b[key]), h] for b, h in zip(shown, hover)],
                        hovertemplate=f"%{{y}}<br>{name}: %{{customdata[0]}}<br>%{{customdata[1]}}<extra></extra>")
        left = len(wasters) - len(shown)
        more = f"; {left} smaller in the table" if left else ""
        fig.update_layout(barmode="stack", title=f"Top padding wasters (buffers by bytes of padding{more})",
                          xaxis_title=f"size ({unit})", yaxis=dict(autorange="reversed", automargin=True),
                          legend=_TOP_LEGEND)
        page.figure(fig, height=max(260, 110 + 28 * len(shown)))
    rows = [[f'<span class="mono">{esc(b["instruction"])}</span>', f'<span class="mono">{esc(b["shape"])}</span>',
             esc(fmt_bytes(b["padding_bytes"])), f'{b.get("expansion", 1):.1f}x', "yes" if b.get("live_at_peak") else "",
             f'<span class="mono">{esc(b.get("op_name") or "")}</span>' if b.get("op_name") else "",
             esc(_fix_only(b.get("fix"), b))] for b in wasters]
    page.add(_table(["buffer", "shape", "padding", "expansion", "live at peak", "framework op", "fix"], rows, {2, 3}))


def _fix_only(fix: str | None, buffer: dict) -> str:
    """A buffer's fix without the 'instruction shape: ' it starts with (the table's own columns say those)."""
    if not fix:
        return ""
    prefix = f"{buffer['instruction']} {buffer['shape']}: "
    return fix[len(prefix):] if fix.startswith(prefix) else fix


def _share(part: float, whole: float | None) -> str:
    return f" ({part / whole:.2%} of the {fmt_bytes(whole)} peak)" if whole else ""


def _padding_by_op(page: _Page, m: dict, top: int) -> None:
    import plotly.graph_objects as go

    ops = sorted((o for o in m.get("ops", []) if o.get("padding_bytes", 0) > 0), key=lambda o: -o["padding_bytes"])
    if not ops:
        return
    total = sum(o["padding_bytes"] for o in ops)
    scope = "live at the peak" if m.get("ops_scope") == "peak" else "all buffers"
    worst = ops[0]
    if negligible(total, m.get("peak_heap_bytes")):
        pass  # _padding_wasters said it in a sentence; the table below lists the ops
    elif worst["padding_bytes"] >= 0.9 * total:
        # One op holds (nearly) all of it: a treemap would be one big box.
        page.add(f'<p>{worst["padding_bytes"] / total:.0%} of the padding ({esc(fmt_bytes(worst["padding_bytes"]))} of '
                 f'{esc(fmt_bytes(total))}, {scope}) is in one framework op: '
                 f'<span class="mono">{esc(worst["op_name"])}</span>.</p>')
    else:
        # A treemap over the op-name path (jit(step)/jvp()/conv...): each scope's box is its ops' padding.
        ids, labels, parents, paths = [], [], [], []
        index: dict[tuple[str, ...], str] = {}
        totals: dict[str, int] = {}
        fixes: dict[str, str] = {}
        for o in ops[:TREEMAP_OPS]:
            parts = tuple(p for p in (o["op_name"] or "(no framework op)").split("/") if p) or ("(no framework op)",)
            for depth in range(1, len(parts) + 1):
                key = parts[:depth]
                if key not in index:
                    index[key] = f"n{len(index)}"
                    ids.append(index[key])
                    labels.append(esc(_short(parts[depth - 1], 40)))
                    parents.append(index[key[:-1]] if depth > 1 else "")
                    paths.append(esc("/".join(key)))
                totals[index[key]] = totals.get(index[key], 0) + o["padding_bytes"]
            if o.get("fix"):
                fixes[index[parts]] = esc(f"fix: {o['fix']}")
        unit, size = byte_unit(max(totals.values()))
        sizes = [esc(fmt_bytes(totals[i])) for i in ids]
        fig = go.Figure(go.Treemap(
            ids=ids, labels=labels, parents=parents, values=[totals[i] / size for i in ids], branchvalues="total",
            customdata=[[sz, path, fixes.get(i, "")] for sz, path, i in zip(sizes, paths, ids)],
            texttemplate="%{label}<br>%{customdata[0]}",
            hovertemplate="%{customdata[1]}<br>%{customdata[0]} of padding<br>%{customdata[2]}<extra></extra>"))
        fig.update_layout(title=f"Padding by framework op ({scope}; box area: bytes of padding)")
        page.figure(fig, height=420)
    rows = [[f'<span class="mono">{esc(o["op_name"])}</span>', esc(fmt_bytes(o["padding_bytes"])),
             esc(fmt_bytes(o["size_bytes"])), esc(o.get("buffers", "")), esc(o.get("fix") or o.get("worst_buffer") or "")]
            for o in ops[: max(top, 1)]]
    page.add(_table(["framework op", "padding", "padded size", "buffers", "fix (its worst buffer)"], rows, {1, 2, 3}))


# ---------------------------------------------------------------- steps

def _steps(page: _Page, item: Input, top: int) -> None:
    """What `tpuprof analyze` presents (tpuprof/presentation/analyze.py), with the page's charts: the step time per
    step (or the mean step), the pod's heat map, the roofline and the tf.data stages."""
    from tpuprof.presentation import Note, Table
    from tpuprof.presentation.analyze import (BREAKDOWN_TITLE, DEVICE_OPS_TITLE, HOST_OPS_TITLE, POD_TITLE, ROOFLINE,
                                              STAGES_TITLE, section)
    from tpuprof.renderers.printers import html

    d = item.document
    shown = section(d, max(top, 1))

    def titled(start: str):
        return lambda b: isinstance(b, Table) and (b.title or "").startswith(start)

    stages = _stages_plot(d, top)
    _place(shown.blocks, _step_plots(d), before=titled(BREAKDOWN_TITLE))
    _place(shown.blocks, _pod_heat_map(d.get("hosts") or []), after=titled(POD_TITLE))
    _place(shown.blocks, _roofline(d), after=lambda b: isinstance(b, Note) and b.text.startswith(ROOFLINE + " ("))
    if stages:
        _place(shown.blocks, [stages], before=titled(STAGES_TITLE))
    else:
        _place(shown.blocks, [Note("No tf.data stages in this capture (a JAX process records only its own events; the "
                                   "breakdown above counts untraced gaps between steps as waiting for input).")],
               before=lambda b: titled(DEVICE_OPS_TITLE)(b) or titled(HOST_OPS_TITLE)(b))
    page.add(html(shown, page.figure_html))


def _place(blocks: list, added: list, before=None, after=None) -> None:
    """ADDED into BLOCKS before the first block BEFORE matches, or after the first AFTER matches (else at the end)."""
    if not added:
        return
    for i, block in enumerate(blocks):
        if before is not None and before(block):
            blocks[i:i] = added
            return
        if after is not None and after(block):
            blocks[i + 1:i + 1] = added
            return
    blocks.extend(added)


# Beyond this many steps one bar per step is a blur of hairlines: bins of consecutive steps, and the
# distribution of step times beside them.
MAX_STEP_BARS = 150
MIN_STEP_BARS = 3  # fewer steps are not worth a chart: the breakdown table says the same


def _step_plots(d: dict) -> list:
    """Each step's time by category (binned beyond MAX_STEP_BARS, with the distribution beside it); without the
    steps (a saved --json document) the mean step's."""
    from tpuprof.presentation import Plot

    hosts = [h for h in d.get("per_step", []) if h["steps"]]
    if hosts and len(hosts[0]["steps"]) >= MIN_STEP_BARS:
        width = -(-len(hosts[0]["steps"]) // MAX_STEP_BARS)  # steps per bar
        plots = [Plot(lambda: _step_chart(hosts, width))]
        if width > 1:
            plots.append(Plot(lambda: _step_distribution(hosts), 340))
        return plots
    if hosts or not d.get("breakdown_ms_per_step"):
        return []  # a bar or two: the table has the same numbers
    return [Plot(lambda: _mean_step_chart(d["breakdown_ms_per_step"]), 360)]


def _mean_step_chart(per_step: dict):
    import plotly.graph_objects as go

    fig = go.Figure()
    for category, label in CATEGORY_LABELS.items():
        fig.add_bar(x=["mean step"], y=[per_step.get(category, 0)], name=label,
                    marker_color=CATEGORY_COLOURS[category], hovertemplate=f"{label}: %{{y:.2f}} ms<extra></extra>")
    fig.update_layout(barmode="stack", title="Mean step time by category", yaxis_title="time per step (ms)",
                      legend=_TOP_LEGEND)
    return fig


def _step_chart(hosts: list[dict], width: int):
    import plotly.graph_objects as go

    host = hosts[0]
    steps = host["steps"]
    more = f" (host {host['host']}; {len(hosts) - 1} more hosts in the table above)" if len(hosts) > 1 else ""
    bins = [steps[i:i + width] for i in range(0, len(steps), width)]
    x = [b[0]["number"] for b in bins]
    spans = [f"step {b[0]['number']}" if len(b) == 1 else f"steps {b[0]['number']}-{b[-1]['number']}" for b in bins]
    fig = go.Figure()
    for category, label in CATEGORY_LABELS.items():
        y = [sum(st.get(f"{category}_ms", 0) for st in b) / len(b) for b in bins]
        fig.add_bar(x=x, y=y, name=label, marker_color=CATEGORY_COLOURS[category], customdata=spans,
                    hovertemplate=f"%{{customdata}}<br>{label}: %{{y:.2f}} ms" +
                    (" (mean)" if width > 1 else "") + "<extra></extra>")
    binned = f"; {len(steps)} steps, each bar the mean of {width}" if width > 1 else ""
    fig.update_layout(barmode="stack", title=esc(f"Step time per step, by category{more}{binned}"),
                      xaxis_title="step number", yaxis_title="time per step (ms)", legend=_TOP_LEGEND,
                      bargap=0.1 if len(bins) > 20 else 0.4)
    return fig


def _step_distribution(hosts: list[dict]):
    import numpy as np
    import plotly.graph_objects as go

    durations = np.array([st["duration_ms"] for h in hosts for st in h["steps"]])
    fig = go.Figure()
    fig.add_histogram(x=durations, nbinsx=80, marker_color="#57606a", name="steps",
                      hovertemplate="%{x} ms: %{y} steps<extra></extra>")
    for q, dash in ((50, "solid"), (90, "dash"), (99, "dot")):
        value = float(np.percentile(durations, q))
        fig.add_vline(x=value, line=dict(color="#cf222e", dash=dash),
                      annotation_text=f"p{q} {value:.2f} ms", annotation_position="top right")
    fig.update_layout(title=f"Step time distribution ({len(durations)} steps, every host)",
                      xaxis_title="step time (ms)", yaxis_title="steps", showlegend=False)
    return fig


def _stages_plot(d: dict, top: int):
    """The tf.data stages by own time, split into Python and the rest (the document sums them over epochs)."""
    from tpuprof.presentation import Plot

    stages = (d.get("input_pipeline") or {}).get("stages", [])[: max(top, 1)]
    if not stages:
        return None

    def figure():
        import plotly.graph_objects as go

        labels = [esc(_short(st["stage"], 70)) for st in stages]
        fig = go.Figure()
        fig.add_bar(y=labels, x=[max(st["self_ms"] - st.get("py_function_ms", 0), 0) for st in stages],
                    orientation="h", name="own time, not Python", marker_color="#1f6feb",
                    customdata=[[st.get("count")] for st in stages],
                    hovertemplate="%{y}<br>%{x:.1f} ms own time outside Python, %{customdata[0]} calls<extra></extra>")
        fig.add_bar(y=labels, x=[st.get("py_function_ms", 0) for st in stages], orientation="h",
                    name="Python (py_function)", marker_color="#cf222e",
                    hovertemplate="%{y}<br>%{x:.1f} ms in Python<extra></extra>")
        fig.update_layout(barmode="stack", title="Input pipeline: tf.data stages by own time (summed over repeat "
                          "epochs, as the terminal)", xaxis_title="own time in the capture (ms)",
                          yaxis=dict(autorange="reversed", automargin=True), legend=_TOP_LEGEND)
        return fig

    return Plot(figure, max(260, 110 + 30 * len(stages)))


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


MAX_HEAT_MAP_STEPS = 400  # beyond, columns are the mean of consecutive steps


def _pod_heat_map(hosts: list[dict]) -> list:
    """Several hosts: a host x step heat map of step times (same step number = same step)."""
    from tpuprof.presentation import Plot

    hosts = [h for h in hosts if h.get("step_list")]
    numbers = sorted({st["number"] for h in hosts for st in h["step_list"]})
    if len(hosts) < 2 or not numbers:
        return []

    def figure():
        import plotly.graph_objects as go

        width = -(-len(numbers) // MAX_HEAT_MAP_STEPS)
        column = {n: i // width for i, n in enumerate(numbers)}
        columns = -(-len(numbers) // width)
        z = []
        for h in hosts:
            sums, counts = [0.0] * columns, [0] * columns
            for st in h["step_list"]:
                sums[column[st["number"]]] += st["duration_ms"]
                counts[column[st["number"]]] += 1
            z.append([total / count if count else None for total, count in zip(sums, counts)])
        x = [numbers[i * width] for i in range(columns)]
        fig = go.Figure(go.Heatmap(z=z, x=x, y=[h["host"] for h in hosts], colorscale="YlOrRd",
                                   colorbar=dict(title="step time (ms)"), hoverongaps=False,
                                   hovertemplate="%{y}, step %{x}: %{z:.2f} ms<extra></extra>"))
        binned = f"; each column the mean of {width} steps" if width > 1 else ""
        fig.update_layout(title=esc(f"Step time per host and step (same step number = same step{binned})"),
                          xaxis_title="step number", yaxis=dict(title="host", autorange="reversed", automargin=True))
        return fig

    return [Plot(figure, min(1200, 160 + 14 * len(hosts)))]


def _roofline(d: dict) -> list:
    """Device ops as points against the chip's roofs (log-log), and the transfers against their links; the ops
    the chart cannot place, said in a sentence."""
    from tpuprof.presentation import Note, Plot

    roof = d.get("roofline") or {}
    points = d.get("roofline_points") or [o for o in d.get("top_ops", []) if o.get("where") == "device"]
    peak, hbm = roof.get("peak_flops_per_s"), roof.get("peak_hbm_bytes_per_s")
    placed = [o for o in points if o.get("flops_per_s") and o.get("intensity")]
    transfers = [o for o in points if o.get("bytes_per_s") and not o.get("flops_per_s")]
    unplaced = [o for o in points if o.get("flops_per_s") and not o.get("intensity")]
    if not peak or not hbm or not (placed or transfers or unplaced):
        return []
    out: list = [Note("Op rates are FLOPs (bytes) over self time, as XProf measures them.")]
    out += [Note(f'{o.get("hlo_op")}: {o["flops_per_s"] / 1e12:.2f} TFLOP/s ({o.get("bound")} '
                 f'{_num(o.get("percent_of_roof"), 0)}% of peak), not placed on the chart: the capture gives no bytes '
                 f'for it. FLOPs: {o.get("flops_source") or "from the capture"}.') for o in unplaced]
    if placed:
        intensities = [o["intensity"] for o in placed] + [roof.get("ridge_flops_per_byte") or peak / hbm]
        low, high = min(intensities) / 4, max(intensities) * 4
        if not 0 < low < high < math.inf:  # a log axis needs a positive, finite range (a hand-edited document)
            placed = []
    if placed:
        out.append(Plot(lambda: _roof_chart(placed, peak, hbm, low, high)))
    if transfers:
        out.append(Plot(lambda: _transfers_chart(transfers, hbm, roof.get("host_link_bytes_per_s")),
                        max(300, 100 + 30 * len(transfers))))
    return out


def _roof_chart(placed: list[dict], peak: float, hbm: float, low: float, high: float):
    import plotly.graph_objects as go

    xs = [low * (high / low) ** (i / 60) for i in range(61)]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[min(peak, x * hbm) for x in xs], mode="lines", name="roof: min(peak, intensity x HBM)",
                    line=dict(color="#57606a"),
                    hovertemplate="roof at %{x:.3g} FLOP/byte: %{y:.3g} FLOP/s<extra></extra>")
    by_category: dict[str, list] = {}
    for o in placed:
        by_category.setdefault(o.get("category") or "compute", []).append(o)
    for category, ops in by_category.items():
        fig.add_scatter(
            x=[o["intensity"] for o in ops], y=[o["flops_per_s"] for o in ops], mode="markers",
            name=CATEGORY_LABELS.get(category, category),
            marker=dict(color=CATEGORY_COLOURS.get(category, "#333"), size=[
                8 + min(24, 4 * (o.get("self_ms_per_step") or 0) ** 0.5) for o in ops]),
            text=[esc(f'{o.get("hlo_op")} ({o.get("name")}): {(o.get("self_ms_per_step") or 0):.3f} ms per step, '
                      f'{o.get("bound")} {_num(o.get("percent_of_roof"), 0)}% of roof') for o in ops],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s<extra></extra>")
    fig.update_layout(title="Device ops against the roof (marker size: time per step)",
                      xaxis=dict(type="log", title="operational intensity (FLOP/byte of HBM)"),
                      yaxis=dict(type="log", title="achieved FLOP/s"), legend=dict(orientation="h", y=-0.25))
    return fig


def _transfers_chart(transfers: list[dict], hbm: float, link: float | None):
    import plotly.graph_objects as go

    labels = [esc(f'{o.get("hlo_op")} ({o.get("category")})') for o in transfers]
    fig = go.Figure()
    fig.add_bar(y=labels, x=[o["bytes_per_s"] / 1e9 for o in transfers], orientation="h", name="achieved",
                hovertemplate="%{y}: %{x:.3g} GB/s<extra></extra>",
                marker_color=[CATEGORY_COLOURS.get(o.get("category"), "#333") for o in transfers])
    # On a log axis plotly places shapes and annotations at log10 of the value (the axis range too), while
    # traces take values: the reference lines go at log10(GB/s), and the range holds bars and lines.
    references = [hbm / 1e9] + ([link / 1e9] if link else [])
    fig.add_vline(x=math.log10(hbm / 1e9), line_dash="dot", annotation_text=f"HBM {hbm / 1e9:g} GB/s")
    if link:
        fig.add_vline(x=math.log10(link / 1e9), line_dash="dash",
                      annotation_text=esc(f"host link {link / 1e9:g} GB/s"))
    shown = [v for v in [o["bytes_per_s"] / 1e9 for o in transfers] + references if 0 < v < math.inf]
    fig.update_layout(title="Ops that move bytes without FLOPs (copies, collectives): achieved bandwidth",
                      xaxis=dict(type="log", title="GB/s (log)",
                                 range=[math.log10(min(shown) / 2), math.log10(max(shown) * 2)]),
                      yaxis=dict(autorange="reversed", automargin=True), showlegend=False)
    return fig


# ---------------------------------------------------------------- OOM and preflight

def _oom(page: _Page, item: Input, top: int) -> None:
    """What `tpuprof oom` presents (tpuprof/presentation/oom.py), with the chart of the listed allocations."""
    from tpuprof.presentation import Plot, Table
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.printers import html

    shown = section(item.document, max(top, 1), source=item.path)
    allocations = [a for a in item.document.get("allocations", []) if a.get("size_bytes")][: max(top, 1)]
    if allocations:
        at = next(i for i, b in enumerate(shown.blocks) if isinstance(b, Table))
        shown.blocks.insert(at, Plot(lambda: _allocations_figure(allocations), max(260, 110 + 28 * len(allocations))))
    page.add(html(shown, page.figure_html))


def _allocations_figure(allocations: list[dict]):
    import plotly.graph_objects as go

    labels = [esc(f"#{a.get('index', i + 1)} {_short(a.get('shape') or a.get('op_name') or '', 50)}")
              for i, a in enumerate(allocations)]
    data = [a.get("unpadded_bytes") or a.get("recomputed_unpadded_bytes") or a["size_bytes"] for a in allocations]
    unit, size = byte_unit(max(a["size_bytes"] for a in allocations))
    fig = go.Figure()
    for name, values, colour in (("data (unpadded)", data, "#2da44e"),
                                 ("padding", [a["size_bytes"] - u for a, u in zip(allocations, data)], "#cf222e")):
        fig.add_bar(y=labels, x=[v / size for v in values], orientation="h", name=name, marker_color=colour,
                    customdata=[[fmt_bytes(v), esc(a.get("op_name") or "")] for v, a in zip(values, allocations)],
                    hovertemplate=f"%{{y}}<br>{name}: %{{customdata[0]}}<br>%{{customdata[1]}}<extra></extra>")
    fig.update_layout(barmode="stack", title="Largest program allocations in the log", xaxis_title=f"size ({unit})",
                      yaxis=dict(autorange="reversed", automargin=True), legend=_TOP_LEGEND)
    return fig


def _preflight(page: _Page, item: Input, top: int) -> None:
    """What `tpuprof preflight` presents (tpuprof/presentation/preflight.py), with the chart of memory against the
    batch under the figures; each compile's memory as the page shows a memory module (its padding charts)."""
    from tpuprof.presentation import Plot, Table
    from tpuprof.presentation.preflight import MEMORY_TITLE, section
    from tpuprof.renderers.printers import html

    targets = [t for t in item.document.get("targets") or [] if isinstance(t, dict)]
    shown = section(item.document, max(top, 1))
    memory = [s for s in shown.sections if s.title.endswith(MEMORY_TITLE)]
    shown.sections = [s for s in shown.sections if s not in memory]
    curves = [t for t in targets if len([p for p in t.get("curve") or [] if p.get("required_bytes") is not None]) > 1]
    if curves:  # one point is no curve
        at = next((i + 1 for i, b in enumerate(shown.blocks) if isinstance(b, Table)), len(shown.blocks))
        shown.blocks.insert(at, Plot(lambda: _curve_figure(curves)))
    page.add(html(shown, page.figure_html))
    for sub, t in zip(memory, [t for t in targets if isinstance(t.get("memory"), dict)]):
        module = sub.sections[0]
        module.title = f"{sub.title}: {module.title}"
        _memory_module(page, t["memory"], top, summary=module)


def _curve_figure(targets: list[dict]):
    import plotly.graph_objects as go

    unit, size = byte_unit(max([p["required_bytes"] or 0 for t in targets for p in t["curve"]]
                               + [t.get("hbm_capacity_bytes") or 0 for t in targets]))
    fig = go.Figure()
    for t in targets:
        points = sorted((p for p in t["curve"] if p["required_bytes"] is not None), key=lambda p: p["batch_size"])
        fig.add_scatter(x=[p["batch_size"] for p in points], y=[p["required_bytes"] / size for p in points],
                        mode="lines+markers", name=esc(f"{t.get('target')} required"),
                        customdata=[fmt_bytes(p["required_bytes"]) for p in points],
                        hovertemplate="batch %{x}: %{customdata} required<extra></extra>")
        if t.get("hbm_capacity_bytes"):
            fig.add_hline(y=t["hbm_capacity_bytes"] / size, line=dict(dash="dot"),
                          annotation_text=esc(f"{t.get('target')} HBM {fmt_bytes(t['hbm_capacity_bytes'])}"))
    fig.update_layout(title="Memory vs batch size (measured compiles)", xaxis_title="per-chip batch (examples)",
                      yaxis_title=f"HBM required ({unit})", legend=_TOP_LEGEND)
    return fig


def _serve(page: _Page, item: Input, top: int) -> None:
    """The serve plan's presentation (tpuprof/presentation/serve.py), as the terminal and Markdown show it."""
    from tpuprof.presentation import build
    from tpuprof.renderers.printers import html

    page.add(html(build(item.document), page.figure_html))
