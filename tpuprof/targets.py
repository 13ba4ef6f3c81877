"""TPU generations: the HBM the XLA:TPU compiler offers one device, and published per-chip figures.

`compiler_hbm_bytes` is what libtpu 0.0.42.1 states as "available HBM (X)" for one compile-only
device of the topology (a TensorCore on v2-v4 and v5p, a chip on v5e and v6e); it is below the
published size because the runtime reserves part of HBM. Sources: Cloud TPU docs and real compiles
(see shared reference tpu-facts.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpuprof.errors import UserError

GiB = 1 << 30


@dataclass(frozen=True)
class Target:
    name: str  # v5e
    topology: str  # v5e:2x2, the smallest topology libtpu compiles for
    device: str  # what one compile-only device is
    compiler_hbm_bytes: int  # HBM available to one device's program, as the compiler states it
    published_hbm_bytes: int  # per device, from the Cloud TPU docs
    peak_bf16_tflops: float  # per chip
    hbm_gbps: float  # per chip
    # Second-minor tile for 32/16/8-bit types in the default TPU layouts (minor dim tiles to 128).
    second_minor_tile: tuple[int, int, int] = (8, 16, 32)
    # The link between the host and one chip, GB/s per direction, and what that figure is (None: not published).
    host_link_gbps: float | None = None
    host_link: str = ""
    # For the step-time estimate (preflight): the TensorCore clock the compiler's estimated_cycles count,
    # and published peaks for 8-bit operands (None: the bf16 peak applies). See RATES below.
    clock_ghz: float | None = None
    peak_int8_tops: float | None = None  # per chip
    peak_fp8_tflops: float | None = None  # per chip


def _g(value: float) -> int:
    return int(round(value * GiB))


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("v2", "v2:2x2", "one TensorCore", _g(7.48), 8 * GiB, 46, 716),
        Target("v3", "v3:2x2", "one TensorCore", _g(15.48), 16 * GiB, 123, 900),
        Target("v4", "v4:2x2x1", "one TensorCore", _g(15.25), 16 * GiB, 275, 1200),
        Target("v5e", "v5e:2x2", "one chip", _g(15.75), 16 * 10**9, 197, 819),
        Target("v5p", "v5p:2x2x1", "one TensorCore", _g(95.74), 95 * 10**9, 459, 2765),
        # Cloud TPU docs: "each v6e chip ... connects to the host through a PCIe Gen5 interface"; the lane count
        # is not published: 32 GT/s x 16 lanes x 128/130 / 8 = 63 GB/s per direction if it is x16.
        Target("v6e", "v6e:2x2", "one chip", _g(31.25), 32 * 10**9, 918, 1638, host_link_gbps=63.0,
               host_link="PCIe Gen5, 63 GB/s per direction if x16 (lanes not published)"),
    )
}
# TensorCore clocks: published peak bf16 FLOP/s / (2 x multiply-adds per cycle of the chip's MXUs), MXU counts
# from the Cloud TPU system-architecture pages (v2 1 MXU 128x128 per core, 2 cores; v3 2 per core, 2 cores;
# v4 and v5p 4 per core, 2 cores; v5e 4, 1 core). v2 0.70, v3 0.94 and v4 1.05 GHz agree with the clocks
# Google's TPU papers state (700, 940, 1050 MHz). v6e: its page says two 256x256 MXUs, but libtpu's own cost
# model schedules an 8192^3 bf16 matmul at 184,616 multiply-adds per cycle, more than two such MXUs can do
# (131,072): the 918 TFLOP/s are 4 x 256x256 at 1.75 GHz. TPU7x: no published MXU count; libtpu schedules
# 211,071 per cycle on one device, consistent with 4 x 256x256 per device at 2.2 GHz (the per-device half of
# 2,307 TFLOP/s bf16), an estimate. Measured on libtpu 0.0.42.1: an 8192^3 bf16 matmul compiled for one device,
# its cycles read by tpuprof/analyses/step_estimate.py (v2 16,110, v3 31,748, v4 58,878 per TensorCore, v5e
# 57,522, v5p 118,174 multiply-adds per cycle: 88-98% of the MXUs' peak at the clocks above; the
# bigmatmul_* samples of tests/fixtures/step_estimate check it stays below 100%).
# int8: Cloud TPU pages (v5e 393, v5p 918, v6e 1836 TOPS per chip).
RATES = {
    "v2": {"clock_ghz": 0.70},
    "v3": {"clock_ghz": 0.94},
    "v4": {"clock_ghz": 1.05},
    "v5e": {"clock_ghz": 1.50, "peak_int8_tops": 393},
    "v5p": {"clock_ghz": 1.75, "peak_int8_tops": 918},
    "v6e": {"clock_ghz": 1.75, "peak_int8_tops": 1836},
    "tpu7x": {"clock_ghz": 2.2, "peak_fp8_tflops": 4614},
}
TARGETS = {name: replace(target, **RATES.get(name, {})) for name, target in TARGETS.items()}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e", "v5": "v5p"}


def get(name: str) -> Target:
    """Look up a generation by name (`v5e`) or topology (`v5e:2x2`)."""
    key = name.strip().lower().split(":")[0].split("-")[0]
    key = ALIASES.get(key, key)
    if key not in TARGETS:
        raise UserError(f"unknown TPU target {name!r}: use one of {', '.join(TARGETS)}.")
    return TARGETS[key]


# `device_type_string` of a capture's /device:TPU:N plane -> generation.
_DEVICE_TYPES = {"tpu v2": "v2", "tpu v3": "v3", "tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e",
                 "tpu v5": "v5p", "tpu v5p": "v5p", "tpu v6 lite": "v6e", "tpu v6e": "v6e"}


def from_device_type(text: str) -> str | None:
    """`TPU v6 Lite` (a profiler capture's device_type_string) -> `v6e`; None when unknown."""
    key = " ".join(text.lower().split())
    name = _DEVICE_TYPES.get(key)
    return name if name in TARGETS else None


# libtpu's chip codenames in a dump's `*.target_arguments.txt` (tpu_topology_args.version / variant).
_CODENAMES = {
    ("TPU_VERSION_JELLYFISH", ""): "v2",
    ("TPU_VERSION_DRAGONFISH", ""): "v3",
    ("TPU_VERSION_PUFFERFISH", ""): "v4",
    ("TPU_VERSION_VIPERFISH", "lite"): "v5e",
    ("TPU_VERSION_VIPERFISH", ""): "v5p",
    ("TPU_VERSION_GHOSTLITE", ""): "v6e",
    ("TPU_VERSION_GHOSTLITE", "lite"): "v6e",
}


def from_target_arguments(text: str) -> str | None:
    """The generation a dump was compiled for, from its target_arguments.txt; None if unknown."""
    import re

    version = re.search(r"version:\s*(TPU_VERSION_\w+)", text)
    variant = re.search(r'variant:\s*"(\w*)"', text)
    if not version:
        return None
    return _CODENAMES.get((version.group(1), variant.group(1) if variant else ""))
