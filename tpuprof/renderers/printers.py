"""The printers of the presentation model (tpuprof/presentation): one section drawn as the terminal's rich output,
as Markdown, as a section of the self-contained `report` page, and as a notebook cell. They format nothing
themselves: every figure and sentence comes worded from the section."""

from __future__ import annotations

import html as _html
import re
from typing import Any, Callable

from tpuprof.presentation.model import Caveats, Command, Fact, Note, Plot, Section, Table, Verdict


def esc(value) -> str:
    return _html.escape("" if value is None else str(value), quote=True)


def prose(value) -> str:
    """A message for people: escaped, and its `code` spans (the advice quotes settings that way) as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(value))


# ---------------------------------------------------------------- terminal

def terminal(section: Section, out=None) -> None:
    """SECTION on the console, every line and table within its width (tpuprof/renderers/tables.py)."""
    from rich.markup import escape
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
                columns = [tables.Column(c.header, c.kind, "right" if c.kind == "number" else "left", c.drop)
                           for c in block.columns]
                out.print(tables.table(columns, [[escape(cell) for cell in row] for row in block.rows], out.width,
                                       title=block.title))
            elif isinstance(block, Fact):
                line(f"- {block.label}: {block.value}")
            elif isinstance(block, Note):
                line(("- " if not top else "") + block.text, "red" if block.kind == "problem" else "")
            elif isinstance(block, Command):
                line(f"- {block.label}: {block.text}")
            # Caveats and plots: the page and the Markdown fold them under the figures; a terminal keeps to figures.
        for sub in s.sections:
            draw(sub, False)

    draw(section, True)


# ---------------------------------------------------------------- Markdown

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
            lines += table([c.header for c in block.columns], [list(r) for r in block.rows],
                           right={i for i, c in enumerate(block.columns) if c.kind == "number"})
        elif isinstance(block, Fact):
            lines.append(f"- **{block.label}**: {block.value}")
        elif isinstance(block, Note):
            lines += [f"- ❌ {block.text}" if block.kind == "problem" else block.text, ""]
        elif isinstance(block, Command):
            lines += ["", "```sh", block.text, "```", ""]
        elif isinstance(block, Caveats):
            lines += caveats(list(block.items), block.what)
    lines.append("")
    for sub in section.sections:
        lines += markdown(sub, level + 1)
    return lines


# ---------------------------------------------------------------- HTML

def html(section: Section, figure: Callable[[Any, int], str] | None = None, level: int = 3) -> str:
    """SECTION as HTML for the report page (its CSS classes) or a notebook cell. FIGURE(fig, height) embeds a plot;
    without it (the notebook) plots are left out."""
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
            head = "".join(f"<th>{esc(c.header)}</th>" for c in block.columns)
            body = "".join("<tr>" + "".join(f'<td class="n">{esc(v)}</td>' if c.kind == "number" else f"<td>{esc(v)}</td>"
                                            for c, v in zip(block.columns, row)) + "</tr>" for row in block.rows)
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif isinstance(block, Note):
            parts.append(f'<p class="{"oom" if block.kind == "problem" else "note"}">{prose(block.text)}</p>')
        elif isinstance(block, Command):
            parts.append(f'<p>{esc(block.label)}:</p><pre class="mono">{esc(block.text)}</pre>')
        elif isinstance(block, Caveats) and block.items:
            parts.append(f'<details class="caveats"><summary>Caveats ({esc(block.what)})</summary><ul>'
                         + "".join(f"<li>{prose(c)}</li>" for c in block.items) + "</ul></details>")
        elif isinstance(block, Plot) and figure is not None:
            parts.append(figure(block.figure(), block.height))
    flush()
    parts += [html(sub, figure, min(level + 1, 6)) for sub in section.sections]
    return "\n".join(parts)
