"""The presentation model's types: what a command shows a person, built once from its --json document.

A command's document (tpuprof/documents_*.py) holds the figures; a builder in this package turns it into a
`Section` of a few kinds of blocks, and the printers (tpuprof/renderers/printers.py) draw that one section as the
terminal's rich output, Markdown, a section of the `report` page and a notebook cell. A figure a reader sees is
therefore worded here once. Plots are HTML-only attachments: the other printers leave them out.

Block kinds:
- `Verdict`: whether something fits (or serves), with the sentence that says why: `fits_word` words it.
- `Fact`: one labelled figure (or short line of figures), saying how it was obtained.
- `Table`: rows of already-formatted cells; each column says its kind (number / name / text) and its rank to be
  left out on a narrow terminal (tpuprof/renderers/tables.py's width rule); a row may have a tone (a change for
  the worse or the better: red or green where the format has colour).
- `Note`: a sentence: a plain note, a warning (an estimate says so) or a problem (red).
- `Fixes`: a command's suggestions (their dicts), numbered with their savings; the report page ranks every input's
  fixes at its top instead, so its printer leaves them out of the section.
- `Caveats`: what an estimate leaves out, under the figures it qualifies (folded where the format can fold).
- `Command`: a command line to paste.
- `Plot`: a plotly figure, made only when the HTML page draws it.
- `Section`: a title, its blocks and sub-sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

FIT, NO_FIT, UNKNOWN = "fits", "does not fit", "unknown"


def fits_word(fits: bool | None) -> str:
    """The one wording of a fit verdict: "fits", "does not fit", or "unknown" when nothing tells."""
    return UNKNOWN if fits is None else FIT if fits else NO_FIT


def _field(item, key: str):
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def freed_words(item) -> str | None:
    """The one wording of the memory a fix frees, for every printer: "frees 32.00 MiB to 64.00 MiB, estimated" when
    the saving is a range (bf16's: a quarter to a half of the float32 at the peak), "frees ≈64.00 MiB, estimated"
    for a point estimate, "frees 64.00 MiB, measured" for a compiled or exact figure; "; enough to fit" when the fix
    alone makes the program fit. ITEM: a suggestion's dict or a Suggestion. None when it frees no bytes."""
    from tpuprof.units import fmt_bytes

    saving = _field(item, "saving_bytes")
    if not isinstance(saving, (int, float)) or isinstance(saving, bool) or saving <= 0:
        return None
    confidence = _field(item, "confidence") or "estimated"
    span = _field(item, "saving_bytes_range")
    if isinstance(span, (list, tuple)) and len(span) == 2 and span[0] != span[1]:
        words = f"frees {fmt_bytes(span[0])} to {fmt_bytes(span[1])}"
    else:
        words = f"frees {'≈' if confidence == 'estimated' else ''}{fmt_bytes(saving)}"
    words += f", {confidence}"
    if _field(item, "severity") == "blocking":
        words += "; enough to fit"
    return words


def saved_time_words(item) -> str | None:
    """The one wording of the step time a fix wins: "saves up to 25.04 ms/step, estimated" when its range starts at 0
    (a fix removes at most the time it addresses: an upper bound), "saves ≈X ms/step" otherwise. None without one."""
    saving = _field(item, "saving_ms_per_step")
    if not isinstance(saving, (int, float)) or isinstance(saving, bool) or saving <= 0:
        return None
    span = _field(item, "saving_ms_range")
    bound = isinstance(span, (list, tuple)) and len(span) == 2 and span[0] == 0
    return f"{'saves up to ' if bound else 'saves ≈'}{saving:g} ms/step, {_field(item, 'confidence') or 'estimated'}"


def fits_share(used: int | None, capacity: int | None, of: str = "HBM") -> str | None:
    """"fits: 82.3% of HBM" / "does not fit: 112.0% of HBM"; None when either figure is missing."""
    if used is None or not capacity:
        return None
    return f"{fits_word(used <= capacity)}: {used / capacity:.1%} of {of}"


@dataclass(frozen=True)
class Verdict:
    subject: str
    fits: bool | None
    text: str  # the reason, e.g. the document's own verdict sentence


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Column:
    header: str
    kind: Literal["number", "name", "text"] = "text"
    drop: int = 0  # 0: always shown; else left out on a narrow terminal, rank 1 first
    least: int = 0  # the narrowest a name or text column is squeezed to (0: the width rule's default)


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str | None = None
    tones: tuple[str, ...] = ()  # per row: "bad", "good" or "" (none); empty: no row has one


@dataclass(frozen=True)
class Note:
    text: str
    kind: Literal["note", "warning", "problem"] = "note"


@dataclass(frozen=True)
class Fixes:
    title: str
    items: tuple[dict, ...]
    framework: str | None = None  # the user's framework: its call is shown first


@dataclass(frozen=True)
class Caveats:
    what: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class Command:
    label: str
    text: str


@dataclass(frozen=True)
class Plot:
    """An HTML-only attachment: `figure()` returns a plotly Figure, made only by the HTML printer."""

    figure: Callable[[], Any]
    height: int = 420


Block = Union[Verdict, Fact, Table, Note, Fixes, Caveats, Command, Plot]


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
    sections: list["Section"] = field(default_factory=list)

    def verdicts(self) -> list[Verdict]:
        """Every verdict of this section and its sub-sections, in order (the report's header cards)."""
        return [b for b in self.blocks if isinstance(b, Verdict)] + [v for s in self.sections for v in s.verdicts()]


def number(header: str, drop: int = 0) -> Column:
    return Column(header, "number", drop)


def name(header: str, drop: int = 0, least: int = 0) -> Column:
    return Column(header, "name", drop, least)


def text(header: str, drop: int = 0) -> Column:
    return Column(header, "text", drop)
