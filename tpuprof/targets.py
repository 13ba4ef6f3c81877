"""TPU generations: what one device of each is (the device users' jobs see), the HBM the compiler offers it,
and the published per-chip figures. The one place in tpuprof that knows these facts, each with its source.

A *device* is what JAX, TensorFlow and PyTorch/XLA place programs on (`jax.devices()`, `/device:TPU:N` in a
capture). Depending on the generation it is a whole chip or one TensorCore of it:

- v2, v3: one TensorCore; a chip has two (two devices per chip).
- v4, v5p: one chip, whose two TensorCores run one program together ("megacore"). A v4 VM runs megacore
  (a real v4 OOM log reads "Used 63.80G of 30.75G hbm"); libtpu compiles for it with chip_config_name
  "megacore" (without it, a v4 device is one TensorCore with 15.25G). v5p devices are megacore by default.
- v5e, v6e: one chip with one TensorCore.
- TPU7x (Ironwood): one TensorCore; a chip has two, each with its own half of the chip's HBM (8 devices
  on 4 chips).

`compiler_hbm_bytes` is what libtpu 0.0.42.1 states as "available HBM (X)" for one device when a program is too
large (checked by tests/test_targets.py, which compiles for every generation); it is below the published size
because the runtime keeps part of HBM. The published figures are per chip; `..._per_device` divides them by the
devices per chip (the device's share of the chip). The docs write HBM sizes as "GB"; they are GiB (the v5e
compiler offers 15.75 GiB, more than 16e9 bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tpuprof.errors import UserError

GiB = 1 << 30

# Where the figures come from (the published ones were read on the date given).
SOURCES = {
    "libtpu": "libtpu 0.0.42.1 compile-only topologies (jax.experimental.topologies), checked by tests/test_targets.py: "
              "device attributes (device_kind, num_cores, coords, core_on_chip) and the compiler's "
              "'exceeds available HBM (X)'",
    "cloud-tpu-docs": "Cloud TPU docs, system architecture pages https://cloud.google.com/tpu/docs/system-architecture-tpu-vm "
                      "and /tpu/docs/v2, v3, v4, v5e, v5p, v6e (per-chip peak bf16 FLOP/s, HBM, HBM bandwidth)",
    "tpu7x-docs": "Cloud TPU docs, TPU7x (Ironwood) https://docs.cloud.google.com/tpu/docs/tpu7x (read 2026-11-24): per "
                  "chip 2 TensorCores, 2307 TFLOP/s bf16 (4614 fp8), 192 GiB HBM, 7380 GB/s; Google blog 'Ironwood: "
                  "the first Google TPU for the age of inference' (2025-04-09): 4614 TFLOP/s, 192 GB, 7.37 TB/s",
    "xprof": "openxla/xprof xprof/convert/xplane_to_utilization_viewer.cc: a TPU7x capture's device_type_string is "
             "'TPU v7x' (v6e: 'TPU v6 Lite')",
}


@dataclass(frozen=True)
class Target:
    name: str  # canonical generation name: v5e, tpu7x
    topology: str  # the smallest topology libtpu compiles for: v5e:2x2
    chip_config_name: str | None  # libtpu chip config for the device users run (v4: "megacore"); None: default
    device_kind: str  # what one device is: "chip" or "TensorCore"
    cores_per_device: int  # TensorCores running one device's program
    devices_per_chip: int
    compiler_hbm_bytes: int  # HBM available to one device's program, as the compiler states it (libtpu 0.0.42.1)
    published_hbm_bytes_per_chip: int
    peak_bf16_tflops: float  # per chip, published
    hbm_gbps: float  # HBM bandwidth per chip, published, GB/s
    jax_device_kind: str  # jax.Device.device_kind
    capture_device_types: tuple[str, ...]  # device_type_string of a profiler capture's /device:TPU:N planes
    codename: str  # tpu_topology_args.version in a dump's *.target_arguments.txt
    codename_variant: str = ""  # tpu_topology_args.variant ("lite" on v5e)
    aliases: tuple[str, ...] = ()  # other names people use; slice names (v6e-8) and topologies work too
    published_source: str = "cloud-tpu-docs"  # a key of SOURCES
    # A tuple's index table: 4 bytes per element rounded up to this many bytes (see TUPLE_TABLE_GRANULES).
    tuple_table_granule_bytes: int = 512
    # The link between the host and one chip, GB/s per direction, and what that figure is (None: not published,
    # offload copies go untimed): see HOST_LINK_TYPICAL.
    host_link_gbps: float | None = None
    host_link: str = ""
    # The host's memory (DRAM) per chip, where a remat policy offloads activations (None: not published). The
    # Cloud TPU docs give it per host (VM) with its chip count: see HOST_DRAM_SOURCES.
    host_dram_bytes_per_chip: int | None = None
    # What libtpu 0.0.42.1 lets one device's program hold in host memory when it compiles without a TPU ("Ran
    # out of memory in memory space host. Used X of 128.00G host"): the same on v4, v5e, v5p, v6e and TPU7x
    # (a 2,000-layer --remat offload step, sample_profiles/models/offload_llm.py); v2 and v3 not checked (None).
    compiler_host_bytes: int | None = 128 * GiB
    # For the step-time estimate (preflight): the TensorCore clock the compiler's estimated_cycles count,
    # and published peaks for 8-bit operands (None: the bf16 peak applies). See RATES below.
    clock_ghz: float | None = None
    peak_int8_tops: float | None = None  # per chip
    peak_fp8_tflops: float | None = None  # per chip
    # Interconnect, for the collectives of the step-time estimate: see ICI below (None: not published).
    ici_link_gbps: float | None = None  # GB/s per ICI link, per direction
    ici_ports: int | None = None  # ICI links per chip
    ici_wraparound: str = ""  # which slice axes close into rings: "cube" (v4/v5p/TPU7x) or "16" (v5e/v6e)
    dcn_gbps_per_chip: float | None = None  # data-centre network between slices, Gbit/s per chip
    ici_source: str = ""
    # Whether Mosaic, the Pallas TPU compiler, compiles the Pallas kernels tpuprof's steps run (splash attention,
    # ragged paged attention). Not on v2 and v3 (libtpu 0.0.42.1): "E2001: Unsupported matmul RHS type on target:
    # vector<128x128xbf16>" for splash, "Expected the 2nd minor dimension is aligned to the tile" for paged attention.
    pallas_kernels: bool = True

    @property
    def device(self) -> str:
        """What one device is, in words: 'one chip', 'one chip (2 TensorCores)' (megacore), 'one TensorCore (2 per
        chip)'."""
        if self.device_kind == "chip":
            return "one chip" if self.cores_per_device == 1 else f"one chip ({self.cores_per_device} TensorCores)"
        return f"one TensorCore ({self.devices_per_chip} per chip)"

    def device_info(self) -> dict:
        """The device as the --json documents describe it."""
        return {"kind": self.device_kind, "cores_per_device": self.cores_per_device,
                "devices_per_chip": self.devices_per_chip, "description": self.device}

    @property
    def published_hbm_bytes(self) -> int:
        """Published HBM of one device (its share of the chip's)."""
        return self.published_hbm_bytes_per_chip // self.devices_per_chip

    @property
    def host_dram_bytes(self) -> int | None:
        """Host memory per device (its share of the chip's), None where the docs give none."""
        if self.host_dram_bytes_per_chip is None:
            return None
        return self.host_dram_bytes_per_chip // self.devices_per_chip

    @property
    def host_capacity_bytes(self) -> int | None:
        """Host memory one device's program can hold: the compiler's budget, or the host's DRAM share where that
        is smaller (v5e: 64 GiB per chip; a compile that fits the budget can still not fit the host)."""
        known = [b for b in (self.compiler_host_bytes, self.host_dram_bytes) if b is not None]
        return min(known) if known else None

    @property
    def peak_bf16_tflops_per_device(self) -> float:
        return self.peak_bf16_tflops / self.devices_per_chip

    @property
    def hbm_gbps_per_device(self) -> float:
        return self.hbm_gbps / self.devices_per_chip

    @property
    def topology_prefix(self) -> str:
        """The generation's name in libtpu topology names: v5e in v5e:2x2, tpu7x in tpu7x:2x2x1."""
        return self.topology.split(":")[0]


def _g(value: float) -> int:
    return int(round(value * GiB))


# The host link per chip, from the JAX scaling book (https://jax-ml.github.io/scaling-book/tpus/, read 2026-11-29):
# "PCIe bandwidth is typically around 1.6e10 bytes / second per TPU (3.2e10 for TPU v6e)"; its direction is not
# stated, read here as per direction. v6e's agrees with the Cloud TPU docs' "PCIe Gen5 interface" at 8 lanes
# (31.5 GB/s per direction), and the host-to-HBM copies of a real v6e capture ran at 27.6 GB/s (openxla/xprof's
# tpu_inference_2, tests/test_analyze_real_tpu.py). TPU7x: not given (None).
HOST_LINK_TYPICAL = "PCIe, about 16 GB/s per chip, the JAX scaling book's typical figure"
HOST_LINK_V6E = "PCIe Gen5, about 32 GB/s per chip, the JAX scaling book's figure for v6e"

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("v2", "v2:2x2", None, "TensorCore", 1, 2, _g(7.48), 16 * GiB, 46, 716,
               jax_device_kind="TPU v2", capture_device_types=("TPU v2",), codename="TPU_VERSION_JELLYFISH",
               aliases=("tpu v2",), compiler_host_bytes=None, pallas_kernels=False),
        Target("v3", "v3:2x2", None, "TensorCore", 1, 2, _g(15.48), 32 * GiB, 123, 900,
               jax_device_kind="TPU v3", capture_device_types=("TPU v3",), codename="TPU_VERSION_DRAGONFISH",
               aliases=("tpu v3",), compiler_host_bytes=None, pallas_kernels=False),
        Target("v4", "v4:2x2x1", "megacore", "chip", 2, 1, _g(30.75), 32 * GiB, 275, 1200,
               jax_device_kind="TPU v4", capture_device_types=("TPU v4",), codename="TPU_VERSION_PUFFERFISH",
               aliases=("tpu v4",), host_link_gbps=16.0, host_link=HOST_LINK_TYPICAL),
        Target("v5e", "v5e:2x2", None, "chip", 1, 1, _g(15.75), 16 * GiB, 197, 819,
               jax_device_kind="TPU v5 lite", capture_device_types=("TPU v5 Lite", "TPU v5e"),
               codename="TPU_VERSION_VIPERFISH", codename_variant="lite",
               aliases=("v5litepod", "v5lite", "tpu v5 lite", "tpu v5e"), host_dram_bytes_per_chip=512 * GiB // 8,
               host_link_gbps=16.0, host_link=HOST_LINK_TYPICAL),
        # The Cloud TPU docs give 95 GiB per chip; the compiler offers slightly more (95.74G): a rounded figure.
        Target("v5p", "v5p:2x2x1", None, "chip", 2, 1, _g(95.74), 95 * GiB, 459, 2765,
               jax_device_kind="TPU v5", capture_device_types=("TPU v5", "TPU v5p"), codename="TPU_VERSION_VIPERFISH",
               aliases=("v5", "tpu v5", "tpu v5p"), host_dram_bytes_per_chip=448 * 10**9 // 4,
               host_link_gbps=16.0, host_link=HOST_LINK_TYPICAL),
        Target("v6e", "v6e:2x2", None, "chip", 1, 1, _g(31.25), 32 * GiB, 918, 1638,
               jax_device_kind="TPU v6 lite", capture_device_types=("TPU v6 Lite", "TPU v6e"),
               codename="TPU_VERSION_GHOSTLITE", aliases=("v6", "trillium", "tpu v6 lite", "tpu v6e"),
               host_link_gbps=32.0, host_link=HOST_LINK_V6E,
               host_dram_bytes_per_chip=1536 * GiB // 8),
        Target("tpu7x", "tpu7x:2x2x1", None, "TensorCore", 1, 2, _g(94.75), 192 * GiB, 2307, 7380,
               jax_device_kind="TPU7x", capture_device_types=("TPU v7x", "TPU7x"), codename="TPU_VERSION_6acc60406",
               aliases=("v7x", "7x", "v7", "tpu7", "ironwood", "tpu v7x"), published_source="tpu7x-docs"),
    )
}
# Host DRAM per chip: the Cloud TPU docs' figure per host over the chips of that host (read 2026-11-27).
HOST_DRAM_SOURCES = {
    "v5e": "https://docs.cloud.google.com/tpu/docs/v5e: DRAM per host 512 GiB, 8 chips per host",
    "v5p": "https://docs.cloud.google.com/tpu/docs/v5p: VM properties, 4 chips, RAM 448 GB (half of it with NUMA "
           "binding)",
    "v6e": "https://docs.cloud.google.com/tpu/docs/v6e: DRAM per host 1536 GiB, 8 chips per host",
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
# int8: Cloud TPU pages (v5e 393, v5p 918, v6e 1836 TOPS per chip); fp8: TPU7x 4614 TFLOP/s per chip.
RATES = {
    "v2": {"clock_ghz": 0.70},
    "v3": {"clock_ghz": 0.94},
    "v4": {"clock_ghz": 1.05},
    "v5e": {"clock_ghz": 1.50, "peak_int8_tops": 393},
    "v5p": {"clock_ghz": 1.75, "peak_int8_tops": 918},
    "v6e": {"clock_ghz": 1.75, "peak_int8_tops": 1836},
    "tpu7x": {"clock_ghz": 2.2, "peak_fp8_tflops": 4614},
}
# How the compiler sizes a tuple's index table (the estimate of HLO text counts it): probe compiles of tuples of
# 3 to 40 elements on libtpu 0.0.42.1 gave 1024-byte steps on v2/v3, 512 on v4/v5e and 32 on v5p, v6e and TPU7x
# (tpu7x: 32, 64 and 160 B for 3, 9 and 40 elements).
TUPLE_TABLE_GRANULES = {"v2": 1024, "v3": 1024, "v4": 512, "v5e": 512, "v5p": 32, "v6e": 32, "tpu7x": 32}
# --- ICI and DCN (issue 21b: collectives in the step time) ------------------------------------------------
# Per-link bandwidth = the published bidirectional ICI bandwidth per chip / ICI ports / 2 directions:
# - v5e: 400 GB/s bidirectional, 4 ports, 2D torus -> 50 GB/s per link and direction; its Pod bisection
#   (1.6 TB/s over the 2 x 16 links a 16x16 torus cut crosses) gives the same 50 GB/s. DCN: 2 x 100 Gbps NICs
#   per 8-chip host = 25 Gbit/s per chip. https://cloud.google.com/tpu/docs/v5e
# - v6e: 800 GB/s, 4 ports, 2D torus -> 100 GB/s (Pod bisection 3.2 TB/s = 32 links x 100 GB/s); DCN 100 Gbit/s
#   per chip. https://cloud.google.com/tpu/docs/v6e, https://docs.cloud.google.com/tpu/docs/tpu7x (table)
# - v5p: 1200 GB/s, 3D torus (6 ports) -> 100 GB/s; DCN 50 Gbit/s per chip. "All 4x4x4 and larger slices (one
#   cube) have full 3D torus" connectivity. https://cloud.google.com/tpu/docs/v5p
# - TPU7x: 1200 GB/s, DCN 100 Gbit/s per chip (tpu7x page); 3D torus of 4x4x4 cubes like v5p: 6 ports assumed.
# - v4: Pod bisection 24 TB/s over the 2 x 256 links a 16x16x16 torus cut crosses -> 47 GB/s; 3D torus when
#   every dimension is a multiple of 4 (https://cloud.google.com/tpu/docs/v4). DCN per chip not published.
# - v2, v3: not modelled (no per-link figure published in the pages read).
# Wraparound: v4/v5p/TPU7x slices whose dimensions are all multiples of 4 (whole cubes) are tori on every
# axis, smaller ones meshes; v5e/v6e close an axis into a ring only at the Pod's full 16 (the published Pod
# bisection needs the wrap links; for smaller slices the docs say nothing: assumed open, a mesh).
ICI = {
    "v4": {"ici_link_gbps": 47.0, "ici_ports": 6, "ici_wraparound": "cube",
           "ici_source": "https://cloud.google.com/tpu/docs/v4 (bisection 24 TB/s per 4096-chip Pod)"},
    "v5e": {"ici_link_gbps": 50.0, "ici_ports": 4, "ici_wraparound": "16", "dcn_gbps_per_chip": 25.0,
            "ici_source": "https://cloud.google.com/tpu/docs/v5e (400 GB/s bidirectional per chip, 4 ports)"},
    "v5p": {"ici_link_gbps": 100.0, "ici_ports": 6, "ici_wraparound": "cube", "dcn_gbps_per_chip": 50.0,
            "ici_source": "https://cloud.google.com/tpu/docs/v5p (1200 GB/s bidirectional per chip, 3D torus)"},
    "v6e": {"ici_link_gbps": 100.0, "ici_ports": 4, "ici_wraparound": "16", "dcn_gbps_per_chip": 100.0,
            "ici_source": "https://cloud.google.com/tpu/docs/v6e (800 GB/s bidirectional per chip, 4 ports)"},
    "tpu7x": {"ici_link_gbps": 100.0, "ici_ports": 6, "ici_wraparound": "cube", "dcn_gbps_per_chip": 100.0,
              "ici_source": "https://docs.cloud.google.com/tpu/docs/tpu7x (1200 GB/s bidirectional per chip; "
                            "6 ports assumed, as v5p)"},
}
TARGETS = {name: replace(target, **RATES.get(name, {}), **ICI.get(name, {}),
                         tuple_table_granule_bytes=TUPLE_TABLE_GRANULES[name])
           for name, target in TARGETS.items()}
ALIASES = {alias.replace(" ", ""): t.name for t in TARGETS.values() for alias in t.aliases}


def _key(name: str) -> str:
    """`TPU v5 lite`, `v6e-8`, `v5litepod-16`, `tpu7x:2x2x1` -> the lookup key (`v5lite`, `v6e`, `v5litepod`, `tpu7x`)."""
    key = name.strip().lower().split(":")[0]
    key = re.sub(r"^\d+\s*x\s*(?=[a-z])", "", key)  # multi-slice names: 2xv5p-128
    key = re.sub(r"-\d+$", "", key)  # slice names: v6e-8, v5litepod-16, tpu7x-8
    key = key.replace(" ", "").replace("_", "")
    if key not in TARGETS and key not in ALIASES and key.startswith("tpu") and not key.startswith("tpu7"):
        key = key[3:].lstrip("-")  # tpu-v5e, tpuv4
    return key


def get(name: str) -> Target:
    """Look up a generation by name (`v5e`), alias (`trillium`, `v7x`, `ironwood`), slice name (`v6e-8`),
    device kind (`TPU v5 lite`) or topology (`v5e:2x2`)."""
    key = _key(name)
    key = ALIASES.get(key, key)
    if key not in TARGETS:
        raise UserError(f"unknown TPU target {name!r}: use one of {', '.join(TARGETS)} "
                        f"(or a name such as v7x, ironwood, trillium, v6e-8, or a topology such as v5e:2x2).")
    return TARGETS[key]


# `device_type_string` of a capture's /device:TPU:N plane -> generation.
_DEVICE_TYPES = {" ".join(kind.lower().split()): t.name for t in TARGETS.values()
                 for kind in (*t.capture_device_types, t.jax_device_kind)}


def from_device_type(text: str) -> str | None:
    """`TPU v6 Lite` (a profiler capture's device_type_string) -> `v6e`; None when unknown."""
    return _DEVICE_TYPES.get(" ".join(text.lower().split()))


# libtpu's chip codenames in a dump's `*.target_arguments.txt` (tpu_topology_args.version / variant).
_CODENAMES = {(t.codename, t.codename_variant): t.name for t in TARGETS.values()}
_CODENAMES[("TPU_VERSION_GHOSTLITE", "lite")] = "v6e"


def from_codename(version: str, variant: str = "") -> str | None:
    """`TPU_VERSION_GHOSTLITE` (a dump's target_arguments.txt: tpuprof.sources.hlo_dump reads it) -> `v6e`;
    None if unknown."""
    return _CODENAMES.get((version, variant))
