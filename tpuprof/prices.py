"""On-demand Cloud TPU prices per chip-hour, for preflight's cost per million examples.

Prices change and differ by region; every figure says where it comes from and whether it was checked.
`preflight --price v6e=2.70` overrides a figure (for a region, a discount, a commitment price).

PRICES_DATE / PRICES_SOURCE: the figures below are Google Cloud's published on-demand list prices per
chip-hour in us-central (Iowa) as tpuprof's authors knew them in 2025 (Cloud TPU pricing page,
https://cloud.google.com/tpu/pricing). The stored copies of that page that could be consulted when this
table was written (2026-11) show only its v2/v3/v4 introduction, not the per-chip-hour table, so each
figure is marked unverified: check the page for your region before relying on a cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuprof.errors import UserError

PRICES_DATE = "2025 (list prices as known then; not re-checked 2026-11)"
PRICES_SOURCE = "https://cloud.google.com/tpu/pricing (on-demand, us-central, per chip-hour)"


@dataclass(frozen=True)
class Price:
    usd_per_chip_hour: float
    source: str
    verified: bool  # read from the source at the date stated; False: from memory, check it


_UNVERIFIED = f"{PRICES_SOURCE}, as of {PRICES_DATE}; unverified"

PRICES: dict[str, Price] = {
    "v2": Price(1.125, _UNVERIFIED + " (v2-8 $4.50/h for 4 chips)", False),
    "v3": Price(2.00, _UNVERIFIED + " (v3-8 $8.00/h for 4 chips)", False),
    "v4": Price(3.22, _UNVERIFIED, False),
    "v5e": Price(1.20, _UNVERIFIED, False),
    "v5p": Price(4.20, _UNVERIFIED, False),
    "v6e": Price(2.70, _UNVERIFIED, False),
    # TPU7x (Ironwood): no public on-demand list price known to tpuprof; pass --price tpu7x=...
}


def parse_overrides(text: str | None) -> dict[str, Price]:
    """`v6e=2.70,v5e=1.10` -> prices given on the command line."""
    from tpuprof import targets

    overrides: dict[str, Price] = {}
    if not text:
        return overrides
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise UserError(f"--price {part.strip()!r} must be GENERATION=USD_PER_CHIP_HOUR, e.g. v6e=2.70.")
        try:
            usd = float(value)
        except ValueError:
            raise UserError(f"--price {part.strip()!r}: {value.strip()!r} is not a number of dollars.") from None
        if not usd > 0 or usd == float("inf"):
            raise UserError(f"--price {part.strip()!r}: a price per chip-hour must be a positive number.")
        overrides[targets.get(name).name] = Price(usd, "--price (given on the command line)", True)
    return overrides


def price_for(generation: str, overrides: dict[str, Price] | None = None) -> Price | None:
    if overrides and generation in overrides:
        return overrides[generation]
    return PRICES.get(generation)
