"""TPU slices as Cloud TPU names them: `v5p-128`, `v6e-256`, `v5litepod-64`, `tpu7x-64`, `2xv5p-128`.

A slice name is `<generation>-<N>`. What N counts depends on the generation:

- v2, v3, v4, v5p: TensorCores. Their chips have two, so v5p-128 is 64 chips (4x4x4). On v4 and v5p the two
  TensorCores of a chip run one program (megacore), so a v5p-128 job sees 64 devices; on v2 and v3 each
  TensorCore is a device (v3-32: 16 chips, 32 devices).
  https://cloud.google.com/tpu/docs/v5p ("v5p-32 specifies a v5p TPU slice with 32 TensorCores (16 chips)"),
  https://cloud.google.com/tpu/docs/types-topologies (v2 to v4: "v4-128 ... 128 TensorCores"),
  https://cloud.google.com/tpu/docs/v2, https://cloud.google.com/tpu/docs/v3 (v3 Pod: 1024 chips, 2D torus).
- v5e (v5litepod), v6e: chips, one TensorCore each (v6e-256 = 256 chips, 16x16).
  https://cloud.google.com/tpu/docs/v5e ("v$VERSION_NUMBER-$CHIP_COUNT"; shapes 1x1 ... 16x16),
  https://cloud.google.com/tpu/docs/v6e (256-chip Pod, 2D torus).
- TPU7x: TensorCores, each its own device (two per chip): tpu7x-128 = 64 chips (4x4x4), 128 devices.
  https://docs.cloud.google.com/tpu/docs/tpu7x; the sizes and shapes are those of the accelerator-type
  tables of MaxText (accelerator_to_spec_map.py) and apple/axlearn (axlearn/common/compiler_options.py),
  which list `tpu7x-128` as topology 4x4x4 with 128 devices.

The shapes below are the published ones (Cloud TPU docs' configuration tables; v4/v5p/TPU7x 3D shapes as in
the v5p table and MaxText's table, which share them by chip count). A multi-slice job (`2xv5p-128`) is
several such slices joined by the data-centre network: the compile is one slice's program.

A 1-chip slice (v5e-1, v6e-1, tpu7x-2) compiles on a 1x1 topology with one chip per host (libtpu's default
host of 2x2x1 chips refuses smaller topologies).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

from tpuprof import targets
from tpuprof.errors import UserError

# Chip count -> shape, for 2D generations (v2, v3, v5e, v6e) and 3D ones (v4, v5p, TPU7x).
SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16",
             512: "16x32", 1024: "32x32"}
SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 192: "4x4x12",
             256: "4x8x8", 384: "4x8x12", 512: "8x8x8", 768: "8x8x12", 1024: "8x8x16", 1536: "8x12x16",
             2048: "8x16x16", 3072: "12x16x16", 4096: "16x16x16", 4608: "12x16x24", 6144: "16x16x24"}


@dataclass(frozen=True)
class Naming:
    """How a generation's slice names count, and which chip counts exist."""

    unit: str  # "TensorCores" or "chips": what N in <generation>-N counts
    cores_per_chip: int  # TensorCores per chip (N / this = chips when the unit is TensorCores)
    chip_counts: tuple[int, ...]  # the published slice sizes, in chips
    prefix: str  # how Cloud TPU spells the name: v5litepod-16, v6e-16, tpu7x-128

    def count(self, chips: int) -> int:
        return chips * self.cores_per_chip if self.unit == "TensorCores" else chips


NAMING = {
    "v2": Naming("TensorCores", 2, (4, 16, 64, 128, 256), "v2"),
    "v3": Naming("TensorCores", 2, (4, 16, 32, 64, 128, 256, 512, 1024), "v3"),
    "v4": Naming("TensorCores", 2, (4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 4096), "v4"),
    "v5p": Naming("TensorCores", 2, tuple(SHAPES_3D), "v5p"),
    "v5e": Naming("chips", 1, (1, 4, 8, 16, 32, 64, 128, 256), "v5litepod"),
    "v6e": Naming("chips", 1, (1, 4, 8, 16, 32, 64, 128, 256), "v6e"),
    "tpu7x": Naming("TensorCores", 2, (1, *SHAPES_3D), "tpu7x"),
}
THREE_D = {"v4", "v5p", "tpu7x"}


@dataclass(frozen=True)
class Slice:
    """A TPU slice (or a generation's smallest topology) and the devices a job on it sees."""

    name: str  # as Cloud TPU names it (v5p-128), or the topology given (v6e:16x16), or the generation (v6e)
    generation: str  # tpuprof.targets name: v5p
    topology: str  # libtpu topology: v5p:4x4x4
    chips: int
    devices: int
    num_slices: int = 1  # a multi-slice job (2xv5p-128): slices joined by the data-centre network
    explicit: bool = True  # False: a bare generation name (compiled as before, for one device)

    @property
    def target(self) -> targets.Target:
        return targets.TARGETS[self.generation]

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int] | None:
        """libtpu's default host is 2x2x1 chips; a 1-chip topology needs a 1x1x1 host."""
        return (1, 1, 1) if self.chips == 1 else None

    @property
    def compile_label(self) -> str:
        """The topology and chip config a compile for this slice uses, as one text (cache keys, messages):
        `v4:2x2x1 megacore`, `v5e:2x2`."""
        chip_config = self.target.chip_config_name
        return f"{self.topology} {chip_config}" if chip_config else self.topology

    @property
    def total_chips(self) -> int:
        return self.chips * self.num_slices

    @property
    def total_devices(self) -> int:
        return self.devices * self.num_slices

    def to_json(self) -> dict:
        data = {"name": self.name, "topology": self.topology, "chips": self.chips, "devices": self.devices}
        if self.num_slices > 1:
            data["num_slices"] = self.num_slices
        return data


def _shape(generation: str, chips: int) -> str:
    return (SHAPES_3D if generation in THREE_D else SHAPES_2D)[chips]


def _from_shape(generation: str, shape: str, name: str, explicit: bool = True) -> Slice:
    target = targets.TARGETS[generation]
    try:
        dims = [int(d) for d in shape.lower().split("x")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims) or len(dims) not in (2, 3):
        raise UserError(f"topology {name!r} is not a chip layout such as {target.topology}.")
    chips = prod(dims)
    return Slice(name, generation, f"{target.topology_prefix}:{shape.lower()}", chips,
                 chips * target.devices_per_chip, explicit=explicit)


def parse(text: str) -> Slice:
    """`v5p-128`, `v5litepod-64`, `tpu7x-64`, `2xv5p-128` (two slices), `v6e:16x16` (a topology) or `v6e` (the
    generation's smallest topology, compiled for one device as before) -> the Slice."""
    name = text.strip()
    num_slices = 1
    multi = re.match(r"^(\d+)\s*x\s*(?=[a-zA-Z])(.+)$", name)
    if multi:
        num_slices, name = int(multi.group(1)), multi.group(2).strip()
        if num_slices < 1:
            raise UserError(f"{text!r}: the number of slices must be at least 1.")
    generation = targets.get(name).name  # unknown generations are a UserError
    base, sep, shape = name.partition(":")
    if sep and shape.strip():
        result = _from_shape(generation, shape.strip(), f"{targets.TARGETS[generation].topology_prefix}:{shape.strip()}")
    else:
        size = re.search(r"-(\d+)$", base.strip())
        if size is None:
            target = targets.TARGETS[generation]
            result = _from_shape(generation, target.topology.split(":")[1], generation, explicit=False)
            if num_slices > 1:
                raise UserError(f"{text!r}: a multi-slice job names its slices' size, e.g. 2x{NAMING[generation].prefix}-"
                                f"{NAMING[generation].count(NAMING[generation].chip_counts[1])}.")
        else:
            result = _from_name(generation, int(size.group(1)), text)
    if num_slices > 1:
        from dataclasses import replace

        result = replace(result, num_slices=num_slices)
    return result


def _from_name(generation: str, count: int, text: str) -> Slice:
    naming = NAMING[generation]
    target = targets.TARGETS[generation]
    chips = count // naming.cores_per_chip if naming.unit == "TensorCores" else count
    sizes = ", ".join(f"{naming.prefix}-{naming.count(c)}" for c in naming.chip_counts[:9])
    if naming.unit == "TensorCores" and count % naming.cores_per_chip or chips not in naming.chip_counts:
        raise UserError(f"{text.strip()!r} is not a {generation} slice Cloud TPU offers ({generation} names count "
                        f"{naming.unit}): use one of {sizes}, ... or a topology such as {target.topology}.")
    shape = "1x1x1" if generation == "tpu7x" and chips == 1 else _shape(generation, chips)
    canonical = f"{naming.prefix}-{count}"
    return Slice(canonical, generation, f"{target.topology_prefix}:{shape}", chips, chips * target.devices_per_chip)


def resolve(target: "Slice | str") -> Slice:
    """The Slice itself, or the one a text names (`v5e`, `v6e-8`, `v5e:2x2`): the compile layer takes either, so
    the options' typed slices pass through unparsed and the Python API and tests may still write a name."""
    return target if isinstance(target, Slice) else parse(target)


def table() -> list[Slice]:
    """Every published slice of every generation (the test checks each against libtpu)."""
    return [_from_name(generation, naming.count(chips), f"{naming.prefix}-{naming.count(chips)}")
            for generation, naming in NAMING.items() for chips in naming.chip_counts]
