"""Suggestions on a terminal, the same way for every command: a title for each kind, the saving with how it
was obtained, the message, the call in the user's framework, the source line and the evidence."""

from __future__ import annotations

import re
import textwrap

from rich.console import Console
from rich.markup import escape as e
from rich.text import Text

from tpuprof.presentation.model import freed_words


# A figure and its unit stay on one line.
_FIGURE = re.compile(r"(\d) (?=(?:[KMGTPE]i?B|B|ms|s|%)(?:\W|$))")


def value(item, key: str):
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def render_suggestions(console: Console, suggestions: list, framework: str | None, heading: str) -> None:
    """Numbered fixes: a title (not an internal label), the saving with how it was obtained, the message, the
    call in the user's framework, the evidence and the source line."""
    from tpuprof.models.suggestion import KIND_TITLES
    from tpuprof.models.suggestion import FRAMEWORK_NAMES

    def say(plain: str, style: str = "", bold: int = 0) -> None:
        # Wrapped at spaces, never between a figure and its unit ("6.00 MiB"), continuation lines indented.
        protected = _FIGURE.sub("\\1\u00a0", plain)
        lines = textwrap.wrap(protected, width=max(console.width, 20), subsequent_indent="   ",
                              break_on_hyphens=False) or [""]
        for number, line in enumerate(lines):
            text = Text(line.replace("\u00a0", " "), style=style)
            if number == 0 and bold:
                text.stylize("bold", 0, bold)
            console.print(text)

    console.print(f"[bold]{e(heading)}[/bold]")
    for i, item in enumerate(suggestions, 1):
        kind = value(item, "kind") or ""
        title = KIND_TITLES.get(kind, kind.replace("_", " ").capitalize())
        freed = freed_words(item)
        badge = f" ({freed})" if freed else ""
        say(f"{i}. {title}{badge}: {value(item, 'message') or ''}", bold=len(f"{i}. {title}"))
        code = value(item, "code")
        if code:
            who = FRAMEWORK_NAMES.get(value(item, "framework") or framework or "", "")
            say(f"   {who + ': ' if who else ''}{code}", style="cyan")
        if value(item, "source_line"):
            say(f"   at {value(item, 'source_line')}", style="dim")
        if value(item, "evidence"):
            say(f"   evidence: {value(item, 'evidence')}", style="dim")
