"""Byte sizes for people: powers of 1024 with IEC names (the OOM triage echoes XLA's own "19.46G" style instead)."""

from __future__ import annotations


def fmt_bytes(value: int | float | None) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: EiB always returns")
