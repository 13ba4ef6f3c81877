"""One self-contained HTML page from the report's inputs (see tpuprof.commands.report).

plotly.js is embedded once in the page (no CDN: it must open on an offline TPU VM). Every string that
comes from the user's program or files (op names, shapes, paths, messages) goes through `esc`, in
the HTML and in the plot labels alike: plotly draws label text as markup (it knows <b>, <a href>...)
and turns entities back into characters, so escaped labels display as typed and never act as tags.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
from itertools import count

from tpuprof.units import fmt_bytes
from tpuprof.commands.report import KIND_LABELS, MAX_MODULES, MEMORY, OOM, PREFLIGHT, STEPS, Input

MIB = 1024 * 1024
CATEGORY_LABELS = {"compute": "compute", "input": "waiting for input", "host_transfer": "host transfers",
                   "collective": "collectives", "host_overhead": "host overhead", "compile": "compilation",
                   "other": "other"}
CATEGORY_COLOURS = {"compute": "#2e7d32", "input": "#c62828", "host_transfer": "#1565c0", "collective": "#00838f",
                    "host_overhead": "#ef6c00", "compile": "#6a1b9a", "other": "#9e9e9e"}
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
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;word-break:break-all}
a.path{word-break:normal;white-space:nowrap}
ol.suggestions li{margin:6px 0}
.saving{background:#ddf4ff;border-radius:4px;padding:1px 6px;font-size:.85em;white-space:nowrap}
.plot{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:10px 0}
.note{color:#57606a;font-style:italic}
"""


def esc(value) -> str:
    return _html.escape("" if value is None else str(value), quote=True)


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


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
        {MEMORY: _memory, STEPS: _steps, OOM: _oom, PREFLIGHT: _preflight}[item.kind](page, item, top)
    head_title = esc(title or "tpuprof report")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{head_title}</title>"
            f"<style>{CSS}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>"
            f"<body><main>\n" + "\n".join(page.parts) + "\n</main></body></html>\n")


# ---------------------------------------------------------------- header and suggestions

def _capacity_card(name: str, target: str | None, peak: int | None, capacity: int | None,
                   what: str = "peak") -> str:
    if peak is None:
        verdict = '<span class="warn">peak unknown</span>'
    elif not capacity:
        verdict = '<span class="warn">no target: capacity unknown</span>'
    elif peak > capacity:
        verdict = f'<span class="oom">does not fit: {peak / capacity:.1%} of HBM</span>'
    else:
        verdict = f'<span class="fit">fits: {peak / capacity:.1%} of HBM</span>'
    return (f'<div class="card"><span class="mono">{esc(_short(name, 40))}</span><b>{esc(fmt_bytes(peak))} {what}</b>'
            f'{esc(target or "target unknown")}, HBM {esc(fmt_bytes(capacity) if capacity else "n/a")}<br>{verdict}'
            "</div>")


def _header(page: _Page, inputs: list[Input], title: str | None) -> None:
    from tpuprof import __version__

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
                                            m.get("hbm_capacity_bytes")))
        elif item.kind == OOM:
            space = (d.get("memory_space") or "device memory").upper()
            if d.get("used_bytes") and d.get("capacity_bytes"):
                numbers = f"used {fmt_bytes(d['used_bytes'])} of {fmt_bytes(d['capacity_bytes'])}"
            elif d.get("requested_bytes"):
                free = f", {fmt_bytes(d['free_bytes'])} free" if d.get("free_bytes") is not None else ""
                numbers = f"{d.get('kind', '').replace('_', ' ')}: asked for {fmt_bytes(d['requested_bytes'])}{free}"
            else:
                numbers = d.get("kind", "").replace("_", " ")
            cards.append(f'<div class="card">OOM log <span class="mono">{esc(_short(item.path, 40))}</span>'
                         f'<b class="oom">out of {esc(space)}</b>{esc(numbers)}</div>')
        elif item.kind == PREFLIGHT:
            for t in d["targets"]:
                cards.append(_capacity_card(f"preflight {t.get('target')} batch {t.get('batch_size')}",
                                            t.get("target"), t.get("required_bytes"), t.get("hbm_capacity_bytes"),
                                            "required"))
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
        rows.append(f'<tr><td class="n">{number}</td><td><a href="#input-{number}" class="mono path">{esc(item.path)}'
                    f"</a></td><td>{esc(KIND_LABELS[item.kind])}{' (JSON)' if item.from_json else ''}</td>"
                    f"<td>{esc(made)}</td></tr>")
    page.add("<table><tr><th>#</th><th>input</th><th>kind</th><th>how it was made</th></tr>"
             + "".join(rows) + "</table>")


# The step-time category each kind of step suggestion removes: its ms per step bound what the fix can win.
STEP_SAVINGS = {"input_pipeline": "input", "steps_per_execution": "host_overhead", "compile": "compile",
                "host_transfer": "host_transfer", "collective": "collective"}


def _suggestions(page: _Page, inputs: list[Input]) -> None:
    memory, steps = [], []
    for number, item in enumerate(inputs, 1):
        d = item.document
        if item.kind == MEMORY:
            lists = [m.get("suggestions", []) for m in d.get("modules", [])[:MAX_MODULES]]
        elif item.kind == PREFLIGHT:
            lists = [(t.get("memory") or {}).get("suggestions", []) for t in d.get("targets", [])]
        else:
            lists = [d.get("suggestions", [])]
        for suggestions in lists:
            for s in suggestions:
                if not isinstance(s, dict) or not s.get("message"):
                    continue
                if item.kind == STEPS:
                    category = STEP_SAVINGS.get(s.get("kind"))
                    saving = (d.get("breakdown_ms_per_step") or {}).get(category) if category else \
                        s.get("saving_ms_per_step")
                    steps.append((number, s, saving if isinstance(saving, (int, float)) else None))
                else:
                    saving = s.get("saving_bytes")
                    memory.append((number, s, saving if isinstance(saving, (int, float)) else None))
    # Sized savings first, largest first; the ones the inputs cannot size keep their command's order.
    for found, heading, unit in ((memory, "Memory: what to change, by HBM saved", "bytes"),
                                 (steps, "Step time: what to change, by time per step it can win", "ms")):
        if not found:
            continue
        found.sort(key=lambda entry: -(entry[2] or 0))
        page.add(f"<h2>{heading}</h2><ol class=\"suggestions\">")
        for number, s, saving in found:
            badge = ""
            if saving and unit == "bytes":
                badge = f' <span class="saving">saves ~{esc(fmt_bytes(saving))}</span>'
            elif saving:
                badge = f' <span class="saving">up to {saving:.2f} ms per step</span>'
            evidence = f'<br><span class="meta">evidence: {esc(s["evidence"])}</span>' if s.get("evidence") else ""
            page.add(f'<li><b>[{esc(s.get("kind", ""))}]</b> {esc(s["message"])}{badge} '
                     f'<a href="#input-{number}" class="meta">(input {number})</a>{evidence}</li>')
        page.add("</ol>")


# ---------------------------------------------------------------- memory

def _memory(page: _Page, item: Input, top: int) -> None:
    modules = item.document["modules"]
    if len(modules) > MAX_MODULES:
        page.add(f'<p class="note">{len(modules)} modules; the {MAX_MODULES} largest are shown.</p>')
    for m in modules[:MAX_MODULES]:
        _memory_module(page, m, top)


def _memory_module(page: _Page, m: dict, top: int) -> None:
    """One module: its summary, the curve, the padding wasters and padding by op."""
    page.add(f'<h3 class="mono">{esc(m["name"])}</h3>'
             f'<p class="meta">{esc(m.get("source_kind"))}: {esc(m.get("source"))}</p>')
    if m.get("estimated"):
        page.add(f'<p class="warn">Estimate: simulated default TPU tilings for {esc(m.get("target") or "TPU")}; '
                 "compile with libtpu (tpuprof memory --compile) for the real layouts.</p>")
    for note in m.get("notes", []):
        page.add(f'<p class="note">{esc(note)}</p>')
    rows = [("peak HBM (padded)", m.get("peak_heap_bytes")), ("peak HBM (unpadded)",
            m.get("peak_unpadded_heap_bytes")), ("padding live at the peak", m.get("padding_at_peak_bytes")),
            ("arguments", m.get("argument_bytes")), ("outputs", m.get("output_bytes")),
            ("temporaries", m.get("temp_bytes")), ("HBM capacity", m.get("hbm_capacity_bytes"))]
    page.add("<table>" + "".join(f'<tr><th>{k}</th><td class="n">{esc(fmt_bytes(v))}</td></tr>'
                                 for k, v in rows if v is not None) + "</table>")
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
    fig = go.Figure()
    fig.add_scatter(x=x, y=[v / MIB for v in timeline["padded_bytes"]], name="padded (allocated)",
                    mode="lines", line=dict(shape="hv", color="#1f6feb"))
    if timeline.get("unpadded_bytes"):
        fig.add_scatter(x=x, y=[v / MIB for v in timeline["unpadded_bytes"]], name="unpadded (the data)",
                        mode="lines", line=dict(shape="hv", color="#2da44e", dash="dot"))
    peak = m.get("peak_heap_bytes")
    if peak is not None:
        fig.add_vline(x=timeline["peak_position"], line=dict(color="#cf222e", dash="dash"),
                      annotation_text=esc(f"peak {fmt_bytes(peak)}"), annotation_position="top left")
    capacity = m.get("hbm_capacity_bytes")
    if capacity and peak and peak >= 0.25 * capacity:  # a far-away capacity line would flatten the curve
        fig.add_hline(y=capacity / MIB, line=dict(color="#9a6700"),
                      annotation_text=esc(f"HBM {fmt_bytes(capacity)}"), annotation_position="bottom right")
    fig.update_layout(title="Memory over program order (heap-simulator trace, as XProf's memory viewer)",
                      xaxis_title="program order (allocation events)", yaxis_title="MiB",
                      legend=dict(orientation="h", y=-0.2))
    page.figure(fig)


def _padding_wasters(page: _Page, m: dict, top: int) -> None:
    import plotly.graph_objects as go

    wasters = sorted((b for b in m.get("buffers", []) if b.get("padding_bytes", 0) > 0),
                     key=lambda b: -b["padding_bytes"])[: max(top, 1)]
    # Bytes-sized paddings next to megabyte ones are noise on the chart: keep those within 1/1000 of the worst.
    wasters = [b for b in wasters if b["padding_bytes"] * 1000 >= wasters[0]["padding_bytes"]] if wasters else []
    if not wasters:
        page.add('<p class="note">No buffer is padded: the layouts fit the TPU tiles exactly.</p>')
        return
    labels = [esc(f"{b['instruction']} {_short(b['shape'], 40)}") for b in wasters]
    hover = [esc(b.get("fix") or b.get("op_name") or "") for b in wasters]
    fig = go.Figure()
    fig.add_bar(y=labels, x=[b["unpadded_bytes"] / MIB for b in wasters], orientation="h", name="data (unpadded)",
                marker_color="#2da44e", hovertext=hover)
    fig.add_bar(y=labels, x=[b["padding_bytes"] / MIB for b in wasters], orientation="h", name="padding",
                marker_color="#cf222e", hovertext=hover)
    fig.update_layout(barmode="stack", title="Top padding wasters (buffers by bytes of padding)",
                      xaxis_title="MiB", yaxis=dict(autorange="reversed", automargin=True),
                      legend=dict(orientation="h", y=-0.2))
    page.figure(fig, height=max(300, 60 + 28 * len(wasters)))
    fixes = any(b.get("fix") for b in wasters)  # a saved --json has none: the fixes are in the suggestions
    rows = "".join(
        f'<tr><td class="mono">{esc(b["instruction"])}</td><td class="mono">{esc(b["shape"])}</td>'
        f'<td class="n">{esc(fmt_bytes(b["padding_bytes"]))}</td><td class="n">{b.get("expansion", 1):.1f}x</td>'
        f'<td>{"yes" if b.get("live_at_peak") else ""}</td><td class="mono">{esc(b.get("op_name"))}</td>'
        + (f'<td>{esc(b.get("fix") or "")}</td>' if fixes else "") + "</tr>" for b in wasters)
    page.add("<table><tr><th>buffer</th><th>shape</th><th>padding</th><th>expansion</th><th>live at peak</th>"
             f"<th>framework op</th>{'<th>fix</th>' if fixes else ''}</tr>{rows}</table>")


def _padding_by_op(page: _Page, m: dict, top: int) -> None:
    import plotly.graph_objects as go

    ops = sorted((o for o in m.get("ops", []) if o.get("padding_bytes", 0) > 0), key=lambda o: -o["padding_bytes"])
    if not ops:
        return
    # A treemap over the op-name path (jit(step)/jvp()/conv...): each scope's box is its ops' padding.
    ids, labels, parents, values, hover = [], [], [], [], []
    index: dict[tuple[str, ...], str] = {}
    totals: dict[str, int] = {}
    for o in ops[:TREEMAP_OPS]:
        parts = tuple(p for p in (o["op_name"] or "(no framework op)").split("/") if p) or ("(no framework op)",)
        for depth in range(1, len(parts) + 1):
            key = parts[:depth]
            if key not in index:
                index[key] = f"n{len(index)}"
                ids.append(index[key])
                labels.append(esc(_short(parts[depth - 1], 40)))
                parents.append(index[key[:-1]] if depth > 1 else "")
                hover.append(esc("/".join(key)))
                values.append(0)
            totals[index[key]] = totals.get(index[key], 0) + o["padding_bytes"]
        if o.get("fix"):
            hover[ids.index(index[parts])] = esc(f"{'/'.join(parts)} — fix: {o['fix']}")
    values = [totals[i] / MIB for i in ids]
    fig = go.Figure(go.Treemap(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                               hovertext=hover, hoverinfo="label+value+text", textinfo="label+value"))
    scope = "live at the peak" if m.get("ops_scope") == "peak" else "all buffers"
    fig.update_layout(title=f"Padding by framework op (MiB, {scope})")
    page.figure(fig, height=480)
    rows = "".join(
        f'<tr><td class="mono">{esc(o["op_name"])}</td><td class="n">{esc(fmt_bytes(o["padding_bytes"]))}</td>'
        f'<td class="n">{esc(fmt_bytes(o["size_bytes"]))}</td><td class="n">{esc(o.get("buffers", ""))}</td>'
        f'<td>{esc(o.get("fix") or o.get("worst_buffer") or "")}</td></tr>' for o in ops[: max(top, 1)])
    page.add("<table><tr><th>framework op</th><th>padding</th><th>padded size</th><th>buffers</th>"
             f"<th>fix (its worst buffer)</th></tr>{rows}</table>")


# ---------------------------------------------------------------- steps

def _steps(page: _Page, item: Input, top: int) -> None:
    import plotly.graph_objects as go

    d = item.document
    s = d.get("steps", {})
    page.add(f'<p><b>{esc(d.get("verdict"))}</b>. {esc(d.get("verdict_reason"))}</p>')
    if s.get("count"):
        page.add(f'<p>{esc(s["count"])} steps: mean {s["mean_ms"]:.2f} ms, median {s["median_ms"]:.2f} ms, '
                 f'p90 {s["p90_ms"]:.2f} ms.</p>')
    for h in d.get("hosts", []):
        notes = "; ".join(h.get("notes") or [])
        page.add(f'<p class="meta">{esc(h["host"])} ({esc(h.get("platform"))}): {esc(h.get("steps", 0))} steps, '
                 f'{esc(h.get("step_source") or "no steps found")}{esc(". " + notes if notes else "")}</p>')

    hosts = [h for h in d.get("per_step", []) if h["steps"]]
    if hosts:
        host = hosts[0]
        fig = go.Figure()
        numbers = [st["number"] for st in host["steps"]]
        for category, label in CATEGORY_LABELS.items():
            fig.add_bar(x=numbers, y=[st.get(f"{category}_ms", 0) for st in host["steps"]], name=label,
                        marker_color=CATEGORY_COLOURS[category])
        more = f" (host {host['host']}; {len(hosts) - 1} more hosts in the table above)" if len(hosts) > 1 else ""
        fig.update_layout(barmode="stack", title=esc(f"Step time per step, by category{more}"),
                          xaxis_title="step", yaxis_title="ms", legend=dict(orientation="h", y=-0.2))
        page.figure(fig)
    elif d.get("breakdown_ms_per_step"):
        fig = go.Figure()
        for category, label in CATEGORY_LABELS.items():
            fig.add_bar(x=["mean step"], y=[d["breakdown_ms_per_step"].get(category, 0)], name=label,
                        marker_color=CATEGORY_COLOURS[category])
        fig.update_layout(barmode="stack", title="Mean step time by category", yaxis_title="ms")
        page.figure(fig, height=360)
    _breakdown(page, d)
    _chips(page, d)
    _roofline(page, d)

    stages = d.get("input_pipeline", {}).get("stages", [])
    if stages:
        labels = [esc(_short(st["stage"], 70)) for st in stages]
        fig = go.Figure()
        fig.add_bar(y=labels, x=[max(st["self_ms"] - st.get("py_function_ms", 0), 0) for st in stages],
                    orientation="h", name="own time", marker_color="#1f6feb")
        fig.add_bar(y=labels, x=[st.get("py_function_ms", 0) for st in stages], orientation="h",
                    name="of which Python (py_function)", marker_color="#cf222e")
        fig.update_layout(barmode="stack", title="Input pipeline: tf.data stages by own time", xaxis_title="ms",
                          yaxis=dict(autorange="reversed", automargin=True), legend=dict(orientation="h", y=-0.2))
        page.figure(fig, height=max(300, 80 + 30 * len(stages)))
        bottleneck = d["input_pipeline"].get("bottleneck")
        if bottleneck:
            page.add(f'<p>Slowest stage: <span class="mono">{esc(bottleneck["stage"])}</span> '
                     f'({bottleneck["self_ms"]:.1f} ms own time, {bottleneck["py_function_ms"]:.1f} ms in Python).</p>')
    else:
        page.add('<p class="note">No tf.data stages in this capture (a JAX process records only its own '
                 "events; the breakdown above counts untraced gaps between steps as waiting for input).</p>")
    ops = d.get("top_ops", [])[: max(top, 1)]
    device = [o for o in ops if o.get("where") == "device"]
    host = [o for o in ops if o.get("where") != "device"]
    if device:
        def rate(value, unit):
            return "" if value is None else f"{value / unit:.2f}"

        rows = "".join(
            f'<tr><td class="mono">{esc(o["name"])}</td><td class="mono">{esc(o.get("hlo_op"))}</td>'
            f'<td>{esc(o.get("category"))}</td><td class="n">{esc(_num(o.get("self_ms_per_step"), 3))}</td>'
            f'<td class="n">{rate(o.get("flops_per_s"), 1e12)}</td><td class="n">{rate(o.get("bytes_per_s"), 1e9)}</td>'
            f'<td class="n">{esc(_num(o.get("intensity"), 3))}</td><td>{esc(o.get("bound") or "")}'
            f'{esc(" " + format(o["percent_of_roof"], ".0f") + "%" if o.get("percent_of_roof") is not None else "")}'
            "</td></tr>" for o in device)
        page.add("<h3>Device ops by time per step (per chip: averaged over chips)</h3><table><tr><th>op</th>"
                 "<th>HLO op</th><th>category</th><th>ms per step</th><th>TFLOP/s</th><th>GB/s</th><th>FLOP/byte</th>"
                 f"<th>bound, % of roof</th></tr>{rows}</table>")
    if host:
        rows = "".join(f'<tr><td class="mono">{esc(o["name"])}</td><td>{esc(o["kind"])}</td><td>{esc(o["where"])}</td>'
                       f'<td class="n">{esc(o["count"])}</td><td class="n">{o["self_ms"]:.2f}</td></tr>' for o in host)
        page.add("<h3>Host ops by self time</h3><table><tr><th>op</th><th>type</th><th>where</th><th>count</th>"
                 f"<th>self ms</th></tr>{rows}</table>")


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _breakdown(page: _Page, d: dict) -> None:
    """The mean step split into the categories, as a table (the chart above shows them per step)."""
    shares, per_step = d.get("breakdown_percent") or {}, d.get("breakdown_ms_per_step") or {}
    if not shares:
        return
    rows = "".join(f'<tr><td><span style="color:{CATEGORY_COLOURS[c]}">&#9632;</span> {esc(label)}</td>'
                   f'<td class="n">{shares.get(c, 0):.1f}</td><td class="n">{per_step.get(c, 0):.2f}</td></tr>'
                   for c, label in CATEGORY_LABELS.items() if c in shares)
    page.add("<h3>Where the step time goes</h3><table><tr><th>category</th><th>% of step</th>"
             f"<th>ms per step</th></tr>{rows}</table>")


def _chips(page: _Page, d: dict) -> None:
    devices = d.get("devices") or []
    if len(devices) < 2:
        return
    rows = "".join(f'<tr><td class="mono">{esc(x["host"])}/{esc(x["id"])}</td><td>{esc(x["kind"])}</td>'
                   f'<td class="n">{esc(x["steps"])}</td><td class="n">{x["median_ms"]:.2f}</td>'
                   f'<td class="n">{x["work_median_ms"]:.2f}</td>'
                   + "".join(f'<td class="n">{x["breakdown_percent"].get(c, 0):.1f}</td>'
                             for c in ("compute", "host_transfer", "collective", "host_overhead")) + "</tr>"
                   for x in devices)
    slow = "".join(f'<p class="warn">Slowest chip: {esc(c["chip"])} of {esc(c["host"])}, {c["work_median_ms"]:.2f} ms '
                   f'of its own work per step vs {c["fastest_work_median_ms"]:.2f} ms</p>' for c in d.get("slow_chips", []))
    page.add("<h3>Chips (aligned steps)</h3><table><tr><th>chip</th><th>kind</th><th>steps</th><th>median step ms</th>"
             "<th>own work ms</th><th>compute %</th><th>host transfers %</th><th>collectives %</th>"
             f"<th>host overhead %</th></tr>{rows}</table>{slow}")


def _roofline(page: _Page, d: dict) -> None:
    """Device ops as points against the chip's roofs (log-log), and the transfers against their links."""
    import plotly.graph_objects as go

    roof = d.get("roofline") or {}
    points = d.get("roofline_points") or [o for o in d.get("top_ops", []) if o.get("where") == "device"]
    peak, hbm = roof.get("peak_flops_per_s"), roof.get("peak_hbm_bytes_per_s")
    placed = [o for o in points if o.get("flops_per_s") and o.get("intensity")]
    transfers = [o for o in points if o.get("bytes_per_s") and not o.get("flops_per_s")]
    unplaced = [o for o in points if o.get("flops_per_s") and not o.get("intensity")]
    if not peak or not hbm or not (placed or transfers or unplaced):
        return
    page.add(f'<h3>Roofline ({esc(roof.get("device_kind"))}, per chip)</h3><p class="meta">Peaks: '
             f'{peak / 1e12:g} TFLOP/s, HBM {hbm / 1e9:g} GB/s ({esc(roof.get("peak_source"))}). Program: '
             f'{_num((roof.get("flops_per_s") or 0) / 1e12, 3)} TFLOP/s, '
             f'{_num((roof.get("hbm_bytes_per_s") or 0) / 1e9, 1)} GB/s of HBM, MFU '
             f'{_num(roof.get("mfu_percent"), 3)}%. Op rates are FLOPs (bytes) over self time, as XProf measures them.'
             '</p>')
    for o in unplaced:
        page.add(f'<p class="note">{esc(o.get("hlo_op"))}: {o["flops_per_s"] / 1e12:.2f} TFLOP/s '
                 f'({esc(o.get("bound"))} {_num(o.get("percent_of_roof"), 0)}% of peak), not placed on the chart: the '
                 f'capture gives no bytes for it. FLOPs: {esc(o.get("flops_source") or "from the capture")}.</p>')
    if placed:
        intensities = [o["intensity"] for o in placed] + [roof.get("ridge_flops_per_byte") or peak / hbm]
        low, high = min(intensities) / 4, max(intensities) * 4
        xs = [low * (high / low) ** (i / 60) for i in range(61)]
        fig = go.Figure()
        fig.add_scatter(x=xs, y=[min(peak, x * hbm) for x in xs], mode="lines", name="roof: min(peak, intensity x HBM)",
                        line=dict(color="#57606a"))
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
        page.figure(fig)
    if transfers:
        link = roof.get("host_link_bytes_per_s")
        labels = [esc(f'{o.get("hlo_op")} ({o.get("category")})') for o in transfers]
        fig = go.Figure()
        fig.add_bar(y=labels, x=[o["bytes_per_s"] / 1e9 for o in transfers], orientation="h", name="achieved",
                    marker_color=[CATEGORY_COLOURS.get(o.get("category"), "#333") for o in transfers])
        fig.add_vline(x=hbm / 1e9, line_dash="dot", annotation_text=f"HBM {hbm / 1e9:g} GB/s")
        if link:
            fig.add_vline(x=link / 1e9, line_dash="dash", annotation_text=esc(f"host link {link / 1e9:g} GB/s"))
        fig.update_layout(title="Ops that move bytes without FLOPs (copies, collectives): achieved bandwidth",
                          xaxis=dict(type="log", title="GB/s (log)"), yaxis=dict(autorange="reversed", automargin=True),
                          showlegend=False)
        page.figure(fig, height=max(300, 100 + 30 * len(transfers)))


# ---------------------------------------------------------------- OOM and preflight

def _oom(page: _Page, item: Input, top: int) -> None:
    import plotly.graph_objects as go

    d = item.document
    page.add(f'<p class="oom mono">{esc(d.get("headline"))}</p>')
    if d.get("line_number"):
        page.add(f'<p class="meta">line {esc(d["line_number"])} of the log; {esc(d.get("messages_found", 1))} '
                 "out-of-memory message(s) found, the most detailed is shown.</p>")
    keys = [("used", "used_bytes"), ("capacity", "capacity_bytes"), ("exceeded by", "exceeded_bytes"),
            ("requested", "requested_bytes"), ("free", "free_bytes"), ("HLO temporaries", "hlo_temp_bytes"),
            ("unpadded", "unpadded_bytes"), ("padded", "padded_bytes"), ("arguments", "arguments_bytes"),
            ("program", "program_bytes"), ("reserved", "reserved_bytes")]
    rows = "".join(f'<tr><th>{label}</th><td class="n">{esc(fmt_bytes(d[key]))}</td></tr>'
                   for label, key in keys if d.get(key) is not None)
    if rows:
        page.add(f"<table>{rows}</table>")
    estimate = d.get("batch_estimate") or {}
    if estimate.get("reason"):
        page.add(f'<p>Batch: {esc(estimate["reason"])}</p>')
    allocations = [a for a in d.get("allocations", []) if a.get("size_bytes")][: max(top, 1)]
    if allocations:
        labels = [esc(f"#{a.get('index', i + 1)} {_short(a.get('shape') or a.get('op_name') or '', 50)}")
                  for i, a in enumerate(allocations)]
        unpadded = [(a.get("unpadded_bytes") or a.get("recomputed_unpadded_bytes") or a["size_bytes"]) / MIB
                    for a in allocations]
        fig = go.Figure()
        fig.add_bar(y=labels, x=unpadded, orientation="h", name="data (unpadded)", marker_color="#2da44e",
                    hovertext=[esc(a.get("op_name") or "") for a in allocations])
        fig.add_bar(y=labels, x=[a["size_bytes"] / MIB - u for a, u in zip(allocations, unpadded)], orientation="h",
                    name="padding", marker_color="#cf222e")
        fig.update_layout(barmode="stack", title="Largest program allocations in the log", xaxis_title="MiB",
                          yaxis=dict(autorange="reversed", automargin=True), legend=dict(orientation="h", y=-0.2))
        page.figure(fig, height=max(300, 60 + 28 * len(allocations)))
        rows = "".join(
            f'<tr><td class="mono">{esc(a.get("shape"))}</td><td class="n">{esc(fmt_bytes(a["size_bytes"]))}</td>'
            f'<td class="mono">{esc(a.get("op_name"))}</td><td class="mono">{esc(a.get("source"))}</td></tr>'
            for a in allocations)
        page.add("<table><tr><th>shape</th><th>size</th><th>operator</th><th>source</th></tr>" + rows + "</table>")
    for note in d.get("notes", []):
        page.add(f'<p class="note">{esc(note)}</p>')


def _preflight(page: _Page, item: Input, top: int) -> None:
    import plotly.graph_objects as go

    targets = item.document["targets"]
    rows = []
    for t in targets:
        fits = t.get("fits")
        verdict = '<span class="fit">fits</span>' if fits else '<span class="oom">does not fit</span>' \
            if fits is not None else ""
        if t.get("verdict"):
            verdict += f' <span class="meta">{esc(t["verdict"])}</span>'
        rows.append(f'<tr><td>{esc(t.get("target"))} <span class="meta">{esc(t.get("topology"))}</span></td>'
                    f'<td class="n">{esc(t.get("batch_size"))}</td><td>{verdict}</td>'
                    f'<td class="n">{esc(fmt_bytes(t.get("required_bytes")))}</td>'
                    f'<td class="n">{esc(fmt_bytes(t.get("hbm_capacity_bytes")))}</td>'
                    f'<td class="n">{esc(t.get("max_batch_size", ""))}</td>'
                    f'<td class="n">{esc((t.get("bf16") or {}).get("max_batch_size", ""))}</td></tr>')
    page.add("<table><tr><th>target</th><th>batch</th><th>verdict</th><th>required</th><th>HBM</th>"
             "<th>max batch</th><th>max batch bf16</th></tr>" + "".join(rows) + "</table>")
    curves = [t for t in targets if len(t.get("curve") or []) > 1]  # one point is no curve
    if curves:
        fig = go.Figure()
        for t in curves:
            points = sorted(t["curve"], key=lambda p: p["batch_size"])
            fig.add_scatter(x=[p["batch_size"] for p in points], y=[p["required_bytes"] / MIB for p in points],
                            mode="lines+markers", name=esc(f"{t.get('target')} required"))
            if t.get("hbm_capacity_bytes"):
                fig.add_hline(y=t["hbm_capacity_bytes"] / MIB, line=dict(dash="dot"),
                              annotation_text=esc(f"{t.get('target')} HBM"))
        fig.update_layout(title="Memory vs batch size (measured compiles)", xaxis_title="per-chip batch",
                          yaxis_title="MiB")
        page.figure(fig)
    for t in targets:
        if t.get("oom", {}).get("headline"):
            page.add(f'<p class="oom mono">{esc(t.get("target"))}: {esc(t["oom"]["headline"])}</p>')
        if t.get("memory"):  # the memory command's analysis of the compiled module
            _memory_module(page, {**t["memory"], "name": f"{t.get('target')}: {t['memory'].get('name')}"}, top)
