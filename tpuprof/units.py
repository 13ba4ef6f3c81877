"""Numbers in and out: byte sizes for people (fmt_bytes), and the one reader of the integers and sizes that
text sources hold (HLO and buffer-assignment text, layouts, OOM messages).

Text from a log or a dump may hold anything: 5,000-digit integers (Python's `int()` refuses past 4,300
digits), sizes beyond what a float holds, NaN, lower-case units. XLA counts sizes, dimensions and element
counts in int64, so that is the range a real number can have; anything else is a UserError that quotes
the number, never an OverflowError or a ValueError from deep inside.
"""

from __future__ import annotations

import math
import re

from tpuprof.errors import UserError

INT64_MAX = 2**63 - 1
SIZE_UNITS = "BKMGTPE"  # powers of 1024, as XLA prints sizes (HumanReadableNumBytes): 1.5G, 32.00MiB
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_MAX_DIGITS = 40  # longer numbers are out of every range below: refuse them before converting


def fmt_bytes(value: int | float | None) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: EiB always returns")


def fmt_fixed(value: float, digits: int) -> str:
    """VALUE to DIGITS decimals, halves rounded up: documents keep 3 decimals of a millisecond, and 30.415 read as
    a float prints 30.41 by f"{:.2f}" where the figure it rounds printed 30.42. Every place that shows such a
    figure to fewer decimals rounds it here."""
    from decimal import ROUND_HALF_UP, Decimal

    if not math.isfinite(value):  # Decimal cannot quantize an infinity: as f"{:.2f}" prints it
        return f"{value:.{digits}f}"
    return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def fmt_ms(value: float | None, *band: float) -> str:
    """A duration in ms or s, 3 significant digits, never in exponent notation ("1.14e+03 ms"); a BAND (low,
    high) follows in the same unit: "1.14 s (0.959-1.75 s)"."""
    if value is None:
        return "n/a"
    unit, size = ("s", 1000.0) if abs(value) >= 1000 else ("ms", 1.0)

    def number(v: float) -> str:
        v /= size
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"

    if band:
        return f"{number(value)} {unit} ({'-'.join(number(v) for v in band)} {unit})"
    return f"{number(value)} {unit}"


def fmt_share(share: float) -> str:
    """A share as a percentage: under 1% with a tenth, under 0.1% said so (a whole percent would read "0%", none)."""
    if share >= 0.01:
        return f"{share:.0%}"
    return f"{share:.1%}" if share >= 0.001 else "less than 0.1%"


def fmt_count(value: float) -> str:
    """A rate or count for people: thousands separated, 3 significant digits below 100, no exponent."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def fmt_parameters(count: int) -> str:
    """A parameter count for people: 8.03B, 45.2M, 1,024 (a tiny model is not "0.00B")."""
    if count >= 10**9:
        return f"{count / 1e9:.2f}B"
    if count >= 10**6:
        return f"{count / 1e6:.1f}M"
    return f"{count:,}"


def fmt_usd(value: float) -> str:
    """Dollars: whole above $100, cents above $1, 3 significant digits below (a cost per 1M tokens is cents)."""
    if value >= 100:
        return f"${value:,.0f}"
    return f"${value:.2f}" if value >= 1 else f"${value:.3g}"


def quote(text: str, width: int = 80) -> str:
    """TEXT for an error message: repr, cut to WIDTH characters (an input line can be megabytes long)."""
    return repr(text if len(text) <= width else text[:width] + "...")


def read_int(text: str, what: str, low: int = 0, high: int = INT64_MAX) -> int:
    """A decimal integer ('1234', '-1', '6,532,939,776') in [LOW, HIGH], or a UserError naming WHAT."""
    cleaned = text.strip().replace(",", "")
    if not _INTEGER.fullmatch(cleaned):
        raise UserError(f"cannot read {what}: {quote(text)} is not an integer.")
    if len(cleaned) > _MAX_DIGITS or not low <= int(cleaned) <= high:
        raise UserError(f"{what} is {quote(text)}: out of range ({low} to {high}).")
    return int(cleaned)


def read_float(text: str, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite decimal number in [LOW, HIGH] ('41.3', '1e3'), or a UserError naming WHAT (no NaN, no inf)."""
    cleaned = text.strip()
    if not _DECIMAL.fullmatch(cleaned):
        raise UserError(f"cannot read {what}: {quote(text)} is not a number.")
    value = float(cleaned) if len(cleaned) <= 4 * _MAX_DIGITS else math.inf
    if not math.isfinite(value) or not low <= value <= high:
        raise UserError(f"{what} is {quote(text)}: out of range.")
    return value


def read_size(number: str, unit: str = "", what: str = "size") -> int:
    """Bytes of a printed size: NUMBER ('1.5', '-2', '6532939776') times UNIT in powers of 1024 (B, K, M, G, T,
    P, E in any case, with or without 'B'/'iB'), rounded to a byte and within int64."""
    letter = (unit.strip()[:1] or "B").upper()
    if letter not in SIZE_UNITS:
        raise UserError(f"cannot read the {what} {quote(number + unit)}: unknown unit {quote(unit)}.")
    value = read_float(number, f"the {what}") * 1024 ** SIZE_UNITS.index(letter)
    if not abs(value) <= INT64_MAX:
        raise UserError(f"the {what} is {quote(number + unit)}: out of range (more than 8 EiB).")
    return int(round(value))


def unit_bytes(unit: str) -> int:
    """Bytes in one UNIT (B, K, M, G... any case, 'iB' or 'B' or nothing after it)."""
    letter = (unit.strip()[:1] or "B").upper()
    if letter not in SIZE_UNITS:
        raise UserError(f"unknown size unit {quote(unit)}.")
    return 1024 ** SIZE_UNITS.index(letter)


def tenths_down(value: float) -> str:
    """VALUE to a tenth, rounded down (requests a KV cache holds: 6.25 is 6.2, never more than it holds)."""
    import math

    return f"{math.floor(round(value * 10, 6)) / 10:.1f}"
