"""The printers of the presentation model (tpuprof/presentation): one section drawn as the terminal's rich output,
as Markdown, as a section of the self-contained `report` page, and as a notebook cell. They format nothing
themselves: every figure and sentence comes worded from the section."""

from __future__ import annotations

import html as _html
import re
from typing import Any, Callable

from tpuprof.presentation.model import (Caveats, Command, Fact, Fixes, Note, Plot, Section, Table, Verdict,
                                        freed_words, saved_time_words)


def esc(value) -> str:
    return _html.escape("" if value is None else str(value), quote=True)


def prose(value) -> str:
    """A message for people: escaped, and its `code` spans (the advice quotes settings that way) as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(value))


# ---------------------------------------------------------------- terminal

NOTE_STYLES = {"note": "", "warning": "yellow", "problem": "red"}
TONE_STYLES = {"bad": "red", "good": "green", "": ""}


def terminal(section: Section, out=None) -> None:
    """SECTION on the console, every line and table within its width (tpuprof/renderers/tables.py)."""
    from rich.text import Text

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = out or console()

    def line(text: str, style: str = "") -> None:
        out.print(tables.wrap(Text(text, style=style), out.width))

    def draw(s: Section, top: bool) -> None:
        line(s.title, "" if top else "bold")
        for block in s.blocks:
            if isinstance(block, Verdict):
                line(f"{block.subject}: {block.text}", "" if block.fits is None else "green" if block.fits else "red")
            elif isinstance(block, Table):
                columns = [tables.Column(c.header, c.kind, "right" if c.kind == "number" else "left", c.drop, c.least)
                           for c in block.columns]
                if block.title:  # a line of its own: as a rich title it wraps to the width of a narrow table
                    line(block.title, "italic")
                tones = block.tones or ("",) * len(block.rows)
                out.print(tables.table(columns, [[Text(cell, style=TONE_STYLES[tone]) for cell in row]
                                                 for row, tone in zip(block.rows, tones)], out.width))
            elif isinstance(block, Fact):
                line(f"- {block.label}: {block.value}")
            elif isinstance(block, Note):
                line(("- " if not top else "") + block.text, NOTE_STYLES[block.kind])
            elif isinstance(block, Fixes):
                from tpuprof.renderers.suggestions import render_suggestions

                render_suggestions(out, list(block.items), block.framework, block.title)
            elif isinstance(block, Command):
                line(f"- {block.label}: {block.text}")
            # Caveats and plots: the page and the Markdown fold them under the figures; a terminal keeps to figures.
        for sub in s.sections:
            draw(sub, False)

    draw(section, True)


# ---------------------------------------------------------------- Markdown

MAX_FIXES = 5  # fixes in Markdown: enough to act on, short enough for a pull-request comment


def code(value) -> str:
    """Inline code that survives any backticks inside (a longer fence around it); a table's cell() escapes its
    pipes."""
    text = "" if value is None else str(value).replace("\n", " ").strip()
    if not text:
        return ""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def more(shown: int, total: int | None, what: str) -> list[str]:
    return [f"_{total - shown} of {total} {what} not shown: `--json` has every one._", ""] if total and total > shown else []


def fixes(suggestions: list, limit: int = MAX_FIXES) -> list[str]:
    """Numbered fixes: title, saving, message, the code to write, then the fact the fix rests on."""
    from tpuprof.models.suggestion import KIND_TITLES

    if not suggestions:
        return []
    out = ["**Fixes**", ""]
    for number, item in enumerate(suggestions[:limit], 1):
        kind = item.get("kind") or ""
        title = KIND_TITLES.get(kind, kind.replace("_", " ").capitalize())
        saving = ""
        words = freed_words(item) or saved_time_words(item)
        if words:
            saving = f" ({words})"
        out.append(f"{number}. **{cell(title)}**{saving}: {cell(item.get('message'))}")
        if item.get("code"):
            out.append(f"   {code(item['code'])}")
        if item.get("source_line"):
            out.append(f"   at {code(item['source_line'])}")
        if item.get("evidence"):
            out.append(f"   evidence: {cell(item['evidence'])}")
    out.append("")
    return out + more(limit, len(suggestions), "fixes")


def cell(value) -> str:
    """Text for a table cell: pipes escaped, one line, backticks kept balanced."""
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ").strip()


def table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> list[str]:
    """A GitHub table; columns in RIGHT are numbers (right-aligned)."""
    if not rows:
        return []
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out + [""]


def caveats(items: list | None, what: str = "") -> list[str]:
    if not items:
        return []
    return [f"<details><summary>Caveats{' (' + what + ')' if what else ''}</summary>", ""] \
        + [f"- {cell(c)}" for c in items] + ["", "</details>", ""]



def markdown(section: Section, level: int = 2) -> list[str]:
    """SECTION as GitHub-flavoured Markdown lines (tpuprof/renderers/markdown.py joins and tidies them)."""
    lines = ["#" * level + " " + section.title, ""]
    verdicts = [b for b in section.blocks if isinstance(b, Verdict)]
    for block in section.blocks:
        if isinstance(block, Verdict):
            mark = "" if block.fits is None else "✅ " if block.fits else "❌ "
            lines.append(f"- {mark}**{block.subject}**: {block.text}")
            if block is verdicts[-1]:
                lines.append("")
        elif isinstance(block, Table):
            lines.append("")
            if block.title:
                lines += [f"**{block.title}**", ""]
            lines += table([c.header for c in block.columns],
                           [[code(v) if c.kind == "name" else v for c, v in zip(block.columns, r)] for r in block.rows],
                           right={i for i, c in enumerate(block.columns) if c.kind == "number"})
        elif isinstance(block, Fact):
            lines.append(f"- **{block.label}**: {block.value}")
        elif isinstance(block, Note):
            # a paragraph after a list item needs a blank line first, or it continues the item
            lines += [f"- ❌ {block.text}", ""] if block.kind == "problem" else ["", block.text, ""]
        elif isinstance(block, Fixes):
            lines += ["", *fixes(list(block.items))]
        elif isinstance(block, Command):
            lines += ["", "```sh", block.text, "```", ""]
        elif isinstance(block, Caveats) and block.items:
            lines += ["", *caveats(list(block.items), block.what)]
    lines.append("")
    for sub in section.sections:
        lines += markdown(sub, level + 1)
    return lines


# ---------------------------------------------------------------- HTML

HTML_NOTE_CLASSES = {"note": "note", "warning": "warn", "problem": "oom"}
HTML_TONE_CLASSES = {"bad": "oom", "good": "fit"}


def _html_table(block: Table) -> str:
    """Numbers right-aligned, names (ops, instructions) in monospace; a column empty in every row is left out."""
    keep = [i for i in range(len(block.columns)) if any(row[i] for row in block.rows)]
    cell = {"number": lambda v: f'<td class="n">{esc(v)}</td>',
            "name": lambda v: f'<td><span class="mono">{esc(v)}</span></td>' if v else "<td></td>",
            "text": lambda v: f"<td>{esc(v)}</td>"}
    head = "".join(f"<th>{esc(block.columns[i].header)}</th>" for i in keep)
    tones = block.tones or ("",) * len(block.rows)
    body = "".join((f'<tr class="{HTML_TONE_CLASSES[tone]}">' if tone else "<tr>")
                   + "".join(cell[block.columns[i].kind](row[i]) for i in keep) + "</tr>"
                   for row, tone in zip(block.rows, tones))
    return f"<table><tr>{head}</tr>{body}</table>"


def html(section: Section, figure: Callable[[Any, int], str] | None = None, level: int = 3) -> str:
    """SECTION as HTML for the report page (its CSS classes) or a notebook cell. FIGURE(fig, height) embeds a plot;
    without it (the notebook) plots are left out. Fixes are left out too: the page ranks every input's at its top,
    the notebook lists the result's below."""
    parts = [f"<h{level}>{esc(section.title)}</h{level}>"]
    facts: list[str] = []

    def flush() -> None:
        if facts:
            parts.append("<table>" + "".join(facts) + "</table>")
            facts.clear()

    for block in section.blocks:
        if not isinstance(block, Fact):
            flush()
        if isinstance(block, Verdict):
            tone = "warn" if block.fits is None else "fit" if block.fits else "oom"
            parts.append(f'<p><b>{esc(block.subject)}</b>: <span class="{tone}">{prose(block.text)}</span></p>')
        elif isinstance(block, Fact):
            facts.append(f"<tr><th>{esc(block.label)}</th><td>{prose(block.value)}</td></tr>")
        elif isinstance(block, Table):
            if block.title:
                parts.append(f"<p><b>{esc(block.title)}</b></p>")
            parts.append(_html_table(block))
        elif isinstance(block, Note):
            parts.append(f'<p class="{HTML_NOTE_CLASSES[block.kind]}">{prose(block.text)}</p>')
        elif isinstance(block, Command):
            parts.append(f'<p>{esc(block.label)}:</p><pre class="mono">{esc(block.text)}</pre>')
        elif isinstance(block, Caveats) and block.items:
            what = f" ({esc(block.what)})" if block.what else ""
            parts.append(f'<details class="caveats"><summary>Caveats{what}</summary><ul>'
                         + "".join(f"<li>{prose(c)}</li>" for c in block.items) + "</ul></details>")
        elif isinstance(block, Plot) and figure is not None:
            parts.append(figure(block.figure(), block.height))
    flush()
    parts += [html(sub, figure, min(level + 1, 6)) for sub in section.sections]
    return "\n".join(parts)
