"""Suggestions on a terminal, the same way for every command: a title for each kind, the saving with how it
was obtained, the message, the call in the user's framework, the source line and the evidence."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as e

from tpuprof.units import fmt_bytes as fmt


def value(item, key: str):
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def render_suggestions(console: Console, suggestions: list, framework: str | None, heading: str) -> None:
    """Numbered fixes: a title (not an internal label), the saving with how it was obtained, the message, the
    call in the user's framework, the evidence and the source line."""
    from tpuprof.models.suggestion import KIND_TITLES
    from tpuprof.analyses.framework import FRAMEWORK_NAMES

    console.print(f"[bold]{e(heading)}[/bold]")
    for i, item in enumerate(suggestions, 1):
        kind = value(item, "kind") or ""
        title = KIND_TITLES.get(kind, kind.replace("_", " ").capitalize())
        saving = value(item, "saving_bytes")
        low_high = value(item, "saving_bytes_range")
        badge = ""
        if saving:
            badge = f"frees ≈{fmt(saving)}"
            if low_high and (low_high[0] != saving or low_high[1] != saving):
                badge += f" ({fmt(low_high[0])}-{fmt(low_high[1])})"
            badge += f", {value(item, 'confidence') or 'estimated'}"
            if value(item, "severity") == "blocking":
                badge += "; enough to fit"
            badge = f" [dim]({badge})[/dim]"
        console.print(f"{i}. [bold]{e(title)}[/bold]{badge}: {e(value(item, 'message') or '')}")
        code = value(item, "code")
        if code:
            who = FRAMEWORK_NAMES.get(value(item, "framework") or framework or "", "")
            console.print(f"   [cyan]{e(who + ': ' if who else '')}{e(code)}[/cyan]")
        if value(item, "source_line"):
            console.print(f"   [dim]at {e(value(item, 'source_line'))}[/dim]")
        if value(item, "evidence"):
            console.print(f"   [dim]evidence: {e(value(item, 'evidence'))}[/dim]")
