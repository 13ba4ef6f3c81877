"""One width rule for every command's tables, at 80, 100, 120 columns and wider.

The console is as wide as the terminal; in a pipe or a CI log, `COLUMNS` if set, else 120 (see `console`).
A table is laid out for that width before rich draws it, by the kind of each column:

- `number`: sizes, times, counts, ratios. Never wrapped, never cut: a figure is always whole on one line.
- `name`: op, instruction and framework-op names. Cut in the middle with "…" to fit: the start says where
  in the model, the end says what the op is (`jit(train_step)/…/dot_general`).
- `text`: shapes and prose. Wrapped inside the column at spaces, never between a figure and its unit;
  a word longer than the column (a shape's layout) is folded.

When even the narrowest layout is too wide, columns are left out in the order of their `drop` rank (1 first;
0 never) and the table's caption names them, so that a narrow terminal loses detail, not legibility.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Width when stdout is not a terminal and COLUMNS is unset: wide enough for every table without leaving
# 80-column logs unreadable.
PIPE_WIDTH = 120
ELLIPSIS = "…"
_NAME_MIN = 14  # the narrowest a name is cut to by default: a few characters of scope, "…", the op
_TEXT_MIN = 10
_WORD_MAX = 24  # text columns keep their longest word whole up to this many cells (a shape's dimensions)


@dataclass(frozen=True)
class Column:
    header: str
    kind: str = "text"  # number | name | text
    justify: str = "left"
    drop: int = 0  # 0: always shown; otherwise left out when too narrow, rank 1 first
    least: int = 0  # the narrowest a name or text column is squeezed to (0: the default of its kind)


def number(header: str, drop: int = 0, justify: str = "right") -> Column:
    """Also for short labelled figures ("HBM 80%"), left-justified: whole on one line like any figure."""
    return Column(header, "number", justify, drop)


def name(header: str, drop: int = 0, least: int = _NAME_MIN) -> Column:
    return Column(header, "name", "left", drop, least)


def text(header: str, drop: int = 0, justify: str = "left") -> Column:
    return Column(header, "text", justify, drop)


class _PipeConsole(Console):
    def on_broken_pipe(self) -> None:
        """`tpuprof ... | head` closed the pipe once the reader had what it wanted: success, exit 0 (rich's
        default exits 1, which fails a `set -o pipefail` script)."""
        os.dup2(os.open(os.devnull, os.O_WRONLY), self.file.fileno())
        raise SystemExit(0)


def console(stderr: bool = False) -> Console:
    """The console every command prints to: terminal width, else COLUMNS, else PIPE_WIDTH."""
    out = _PipeConsole(highlight=False, soft_wrap=False, stderr=stderr)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        out.width = PIPE_WIDTH
    return out


def middle_ellipsis(value: Text, width: int) -> Text:
    """VALUE cut to WIDTH cells by dropping its middle: 'jit(train…jvp())/dot_general'. The end keeps two
    thirds: it names the op, the start only the scope."""
    if value.cell_len <= width:
        return value
    if width <= 1:
        return Text(ELLIPSIS)
    head = (width - 1) // 3
    tail = width - 1 - head
    return Text.assemble(value[:head], ELLIPSIS, value[len(value) - tail:])


# A figure and its unit ("15.74 GiB", "3.2 ms", "+1.3 pts") are one word for wrapping; so is any run of
# non-blank characters.
# A figure with its unit is one word, with the punctuation that follows it ("31.25 GiB:", "19.6 ms,"): wrapping
# never parts them, and never puts a space before the punctuation.
_WORD = re.compile(r"[-+≈~]?\d[\d.,]*\s(?:[KMGT]i?B|B|ms|s|pts|%|x)(?=\W|$)\S*|\S+")


def wrap(value: Text, width: int) -> Text:
    """VALUE wrapped at WIDTH cells at spaces, never between a figure and its unit; a word longer than the
    line (a shape's layout) is folded."""
    if value.cell_len <= width or "\n" in value.plain:
        return value
    lines: list[Text] = []
    line: Text | None = None
    for match in _WORD.finditer(value.plain):
        word = value[match.start():match.end()]
        if word.cell_len > width:  # fold what cannot wrap, in one pass (re-slicing the rest is quadratic)
            if line is not None:
                lines.append(line)
                line = None
            pieces = [word[i:i + width] for i in range(0, len(word), width)]
            lines.extend(pieces[:-1])
            word = pieces[-1]
        if line is not None and line.cell_len + 1 + word.cell_len <= width:
            line = Text.assemble(line, " ", word)
        else:
            if line is not None:
                lines.append(line)
            line = word
    if line is not None:
        lines.append(line)
    return Text("\n").join(lines)


def _overhead(count: int) -> int:
    """Cells the table style adds to its column widths: ' ' + separator + ' ' between columns, no edges."""
    return 3 * (count - 1)


def _header_min(header: str) -> int:
    return max((len(word) for word in header.split()), default=0)


def _widths(columns: Sequence[Column], cells: list[list[Text]], available: int) -> tuple[list[int], list[int]]:
    """Width per column, and the indexes of the columns kept, for AVAILABLE cells of content."""
    natural = [max([len(c.header)] + [row[i].cell_len for row in cells]) for i, c in enumerate(columns)]
    minimum = []
    for i, column in enumerate(columns):
        longest_cell = max([0] + [row[i].cell_len for row in cells])
        if column.kind == "number":
            minimum.append(max(longest_cell, _header_min(column.header)))
        elif column.kind == "name":
            minimum.append(min(natural[i], max(column.least or _NAME_MIN, _header_min(column.header))))
        else:
            longest_word = max([0] + [len(word) for row in cells for word in _WORD.findall(row[i].plain)])
            floor = max(column.least or _TEXT_MIN, _header_min(column.header), min(longest_word, _WORD_MAX))
            minimum.append(min(natural[i], floor))
    kept = list(range(len(columns)))
    ranked = sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: columns[i].drop)
    while ranked and sum(minimum[i] for i in kept) + _overhead(len(kept)) > available:
        kept.remove(ranked.pop(0))
    room = available - _overhead(len(kept))
    if sum(natural[i] for i in kept) <= room:
        return natural, kept
    widths = list(minimum)
    # The cells to spare go to number headers first (whole on one line), then names (each cell shows more
    # of a name), then text (which wraps anyway).
    for kind in ("number", "name", "text"):
        spare = room - sum(widths[i] for i in kept)
        wants = {i: natural[i] - widths[i] for i in kept if columns[i].kind == kind and natural[i] > widths[i]}
        total = sum(wants.values())
        if spare <= 0 or not total:
            continue
        for i, want in wants.items():
            widths[i] += min(want, spare * want // total)
        spare = room - sum(widths[i] for i in kept)
        for i in wants:  # what rounding left over
            extra = min(spare, natural[i] - widths[i])
            widths[i] += extra
            spare -= extra
    return widths, kept


def table(columns: Sequence[Column], rows: Iterable[Sequence[str | Text]], width: int,
          title: str | None = None, caption: str | None = None) -> Table:
    """A rich Table of ROWS (rich markup strings or Text) laid out for WIDTH cells by the rule above."""
    cells = [[cell if isinstance(cell, Text) else Text.from_markup(str(cell)) for cell in row] for row in rows]
    widths, kept = _widths(columns, cells, width)
    dropped = [columns[i].header for i in range(len(columns)) if i not in kept]
    if dropped:
        note = f"left out at {width} columns: {', '.join(dropped)} (wider terminal, COLUMNS=N, or --json)"
        caption = f"{caption}; {note}" if caption else note
    out = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for i in kept:
        column = columns[i]
        # A number column is as wide as its widest figure, so figures never wrap; its header may (at spaces).
        out.add_column(column.header, justify=column.justify, width=widths[i], no_wrap=column.kind == "name",
                       overflow="fold" if column.kind == "text" else "ellipsis")
    fit = {"name": middle_ellipsis, "text": wrap, "number": lambda cell, width: cell}
    for row in cells:
        out.add_row(*(fit[columns[i].kind](row[i], widths[i]) for i in kept))
    return out
