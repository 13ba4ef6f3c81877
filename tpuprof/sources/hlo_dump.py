"""Find and read XLA dumps: HloProto (`*.hlo.pb`), buffer-assignment text, HLO text, and what libtpu writes
beside a module (`*.target_arguments.txt`: the TPU and torus it was compiled for; `*.execution_options.txt`: the
device assignment).

A dump folder from `--xla_dump_to` holds many files per module; for memory we pick, per module, the most
informative one: the after-optimizations HloProto (buffer assignment and heap trace), else the
buffer-assignment text, else the after-optimizations HLO text. The step estimate reads the module libtpu
compiled (read_compiled_module).
"""

from __future__ import annotations

import contextlib
import mmap
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpuprof import targets
from tpuprof.errors import UserError

PROTO_SUFFIXES = (".hlo.pb", ".hlo_proto.pb")
BUFFER_ASSIGNMENT_SUFFIX = "-buffer-assignment.txt"


@dataclass
class DumpFile:
    module: str  # module name as the dump names it, e.g. module_0003.jit_train_step
    path: Path
    kind: str  # hlo_proto | buffer_assignment | hlo_text

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def module_key(name: str) -> str:
    """`module_0001.jit_f.cl_123.after_optimizations.hlo.pb` -> `module_0001.jit_f.cl_123`."""
    for marker in (".cpu_after_optimizations", ".gpu_after_optimizations",  # XLA:CPU/GPU dumps
                   ".after_optimizations", ".before_optimizations", ".after_codegen", ".hlo_proto.pb",
                   ".hlo.pb", "-buffer-assignment.txt", ".txt"):
        index = name.find(marker)
        if index > 0:
            return name[:index]
    return name


def classify(path: Path) -> tuple[str, int] | None:
    """(kind, rank) of a dump file, lower rank preferred within a module; None if not a memory source."""
    name = path.name
    if name.endswith(PROTO_SUFFIXES):
        # Protos from before buffer assignment carry no heap trace: not a memory source.
        if "before_optimizations" in name or "before_buffer_assignment" in name:
            return None
        if name.endswith((".after_optimizations.hlo.pb", ".hlo_proto.pb")):
            return "hlo_proto", 0
        return "hlo_proto", 1 if "after_buffer_assignment" in name else 2
    if name.endswith(BUFFER_ASSIGNMENT_SUFFIX):
        if any(marker in name for marker in NON_TPU_MARKERS):
            return None  # XLA:CPU/GPU's buffer assignment is not TPU memory: the module's HLO text is estimated
        return "buffer_assignment", 3
    if name.endswith(("-memory-usage-report.txt", "-live-range.txt", "-buffer-assignment-values.txt")):
        return None
    if name.endswith((".after_optimizations.txt", ".cpu_after_optimizations.txt", ".gpu_after_optimizations.txt")):
        return "hlo_text", 4
    if name.endswith((".txt", ".hlo")) and "optimizations" not in name and "codegen" not in name:
        # Dump folders hold many other .txt files (flags, configs): only HLO modules count.
        with open(path, "rb") as handle:
            if handle.read(64).lstrip().startswith(b"HloModule"):
                return "hlo_text", 5
    return None


# XLA's CPU and GPU compilers name their dumps `<module>.cpu_after_optimizations.hlo.pb` / `gpu_...`: the
# buffer assignment inside is the host's or the GPU's, not a TPU's.
NON_TPU_MARKERS = ("cpu_after_optimizations", "gpu_after_optimizations", "cpu_after_buffer_assignment",
                   "gpu_after_buffer_assignment")


def non_tpu_platform(path: Path, module_proto=None) -> str | None:
    """'CPU'/'GPU'/'non-TPU' when the dump was not compiled for a TPU: its file name says so, or no array in
    its entry computation carries TPU tiles (`T(...)`); None for a TPU dump."""
    name = path.name
    for marker in NON_TPU_MARKERS:
        if marker in name:
            return marker[:3].upper()
    if module_proto is None:
        return None
    entry = next((c for c in module_proto.computations if c.id == module_proto.entry_computation_id), None)
    if entry is None:
        return None
    arrays = 0
    for instruction in entry.instructions:
        shape = instruction.shape
        for element in ([shape] if not shape.tuple_shapes else list(shape.tuple_shapes)):
            if element.dimensions:
                arrays += 1
                if element.layout.tiles:
                    return None
    return "non-TPU" if arrays else None


def discover(path: Path, module: str | None = None) -> list[DumpFile]:
    """The files to analyse under PATH, one per module, largest module first."""
    if not path.exists():
        raise UserError(f"{path} does not exist.")
    if path.is_file():
        classified = classify(path)
        kind = classified[0] if classified else _sniff(path)
        return [DumpFile(module_key(path.name), path, kind)]
    candidates: dict[str, tuple[int, DumpFile]] = {}
    for file in sorted(path.iterdir()):
        classified = classify(file) if file.is_file() else None
        if classified is None:
            continue
        kind, rank = classified
        key = module_key(file.name)
        if key not in candidates or rank < candidates[key][0]:
            candidates[key] = (rank, DumpFile(key, file, kind))
    if not candidates:
        if not any(path.iterdir()):
            raise UserError(f"{path} is empty: point tpuprof at an XLA dump folder (--xla_dump_to).")
        raise UserError(
            f"{path} holds no XLA dumps (*.hlo.pb, *-buffer-assignment.txt or HLO text): dump them with "
            "XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_proto --xla_dump_hlo_as_text'."
        )
    files = sorted((f for _, f in candidates.values()), key=lambda f: f.size, reverse=True)
    if module:
        chosen = [f for f in files if f.module == module] or [f for f in files if module in f.module]
        if not chosen:
            names = ", ".join(f.module for f in files[:8])
            raise UserError(f"no module matching {module!r} in {path}; modules: {names}.")
        files = chosen
    return files


def needs_tpu_compile(path: Path, module: str | None = None) -> bool:
    """Whether PATH holds module protos without a TPU buffer assignment (CPU/GPU dumps, protos before
    optimization): what `--compile` turns into exact TPU figures."""
    try:
        files = discover(path, module)
    except UserError:
        return False
    if path.is_dir() and not files:
        return False
    for file in files:
        if file.kind != "hlo_proto":
            continue
        name = file.path.name
        if name.endswith(".after_optimizations.hlo.pb") and not any(m in name for m in NON_TPU_MARKERS):
            continue  # XLA:TPU's own dump name (the memory analysis still checks its layouts)
        proto = read_hlo_proto(file.path)
        if non_tpu_platform(file.path, proto.hlo_module) or not proto.buffer_assignment.logical_buffers:
            return True
    if path.is_dir() and any(path.glob("*before_optimizations.hlo.pb")):
        return not any(f.kind in ("hlo_proto", "buffer_assignment") for f in files)
    return False


def _sniff(path: Path) -> str:
    """Guess the kind of a single file whose name does not say."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if b"\0" in head or not head:
        if not head:
            raise UserError(f"{path} is empty.")
        return "hlo_proto"
    text = head.decode("utf-8", "replace")
    if text.lstrip().startswith("BufferAssignment") or re.search(r"^allocation \d+: size", text, re.M):
        return "buffer_assignment"
    if "HloModule" in text or re.search(r"\bENTRY\b", text):
        return "hlo_text"
    raise UserError(f"{path} is not an XLA dump (HloProto, buffer-assignment text or HLO text).")


def read_hlo_proto(path: Path):
    """Parse an HloProto (or a bare HloModuleProto) file; a truncated or foreign file is a UserError."""
    from tpuprof import protos

    data = path.read_bytes()
    if not data:
        raise UserError(f"{path} is empty.")
    hlo_pb2 = protos.hlo_pb2()
    proto = _parse(hlo_pb2.HloProto, data)
    if proto is not None and proto.hlo_module.computations:
        return proto
    # An HloModuleProto on its own (`*.before_optimizations.hlo.pb`, TF's compiler IR) is another message.
    module = _parse(hlo_pb2.HloModuleProto, data)
    if module is None or not module.computations or not module.name:
        from tpuprof.sources.binary import copied_as_text

        why = copied_as_text(data)
        raise UserError(f"{path} is not a readable HloProto: {why}" if why else
                        f"{path} is not a readable HloProto (truncated or another kind of file).")
    proto = hlo_pb2.HloProto()
    proto.hlo_module.CopyFrom(module)
    return proto


def read_buffer_definers(path: Path):
    """What the memory analysis reads of the HloProto at PATH, or None when it is no HloProto with a buffer
    assignment (then read it whole): the buffer assignment, and the module without its fusion bodies, its
    instructions with the fields the analysis reads (protos.buffer_view_classes).

    The instructions of a fusion body define no logical buffer (its fusion instruction does, in the caller); in a
    48-layer transformer they are 3,598 of 4,317 computations, 6.7 of 8.4 MB, skipped unparsed. Whoever reads the
    result checks that it holds every instruction the buffers name (models.hlo_module.HloModule.find,
    whole_module=False)."""
    from google.protobuf.message import DecodeError

    from tpuprof import protos

    index_class, view_class = protos.buffer_view_classes()
    try:
        index = index_class()
        with _mapped(path) as data:
            index.ParseFromString(data)
        module = index.hlo_module
        if not module.computations or not index.buffer_assignment:
            return None  # no buffer assignment (a CPU/GPU or unoptimised proto): the estimate reads it whole
        kept = [c.SerializeToString() for c in module.computations if not c.is_fusion_computation]
        module.ClearField("computations")
        # The view's wire format, written in one join (each copy of megabytes is mostly page faults): HloProto
        # field 1, the module (its other fields, then the kept computations as field 3), and field 3, the buffer
        # assignment.
        module_fields = [module.SerializeToString()]
        for computation in kept:
            module_fields += (_field_head(3, len(computation)), computation)
        assignment = index.buffer_assignment
        wire = b"".join([_field_head(1, sum(map(len, module_fields))), *module_fields,
                         _field_head(3, len(assignment)), assignment])
        del index, module, kept, module_fields, assignment  # their memory is the view's to reuse
        view = view_class.FromString(wire)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return view if view.buffer_assignment.logical_buffers else None


@contextlib.contextmanager
def _mapped(path: Path):
    """The bytes of PATH mapped from the page cache, its pages mapped at once, rather than copied into fresh memory
    page by page: reading a 9 MB proto was 2,300 page faults, 6 ms here. protobuf copies what it keeps, so the
    mapping closes when the parse is done."""
    with open(path, "rb") as file:
        how = ({"flags": mmap.MAP_SHARED | mmap.MAP_POPULATE, "prot": mmap.PROT_READ}
               if hasattr(mmap, "MAP_POPULATE") else {"access": mmap.ACCESS_READ})  # MAP_POPULATE: Linux
        try:
            mapped = mmap.mmap(file.fileno(), 0, **how)
        except (OSError, ValueError):  # an empty file, or one that cannot be mapped (a pipe): read as it comes
            yield file.read()
            return
        with mapped, memoryview(mapped) as view:
            yield view


def _field_head(field_number: int, length: int) -> bytes:
    """The head of a length-delimited field in protobuf's wire format: tag and length, as varints."""
    head = bytearray()
    for value in (field_number << 3 | 2, length):
        while value > 0x7F:
            head.append(value & 0x7F | 0x80)
            value >>= 7
        head.append(value)
    return bytes(head)


def _parse(message_class, data: bytes):
    from google.protobuf.message import DecodeError

    message = message_class()
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return message


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not text: expected HLO or buffer-assignment text.") from None


def read_hlo_text_beside(buffer_assignment: Path) -> str | None:
    """The module's HLO text beside its `*-buffer-assignment.txt`, or None when the dump holds none."""
    candidate = buffer_assignment.with_name(buffer_assignment.name.split("-buffer-assignment")[0] + ".txt")
    if not candidate.is_file():
        return None
    return candidate.read_text(encoding="utf-8", errors="replace")


def detect_target(file: DumpFile) -> str | None:
    """The TPU generation of a dump, from the `<module>.target_arguments.txt` libtpu writes beside it."""
    arguments = read_target_arguments(file.path)
    return arguments.generation if arguments is not None else None


# --- what libtpu writes beside a module ------------------------------------------------------------------

@dataclass
class TargetArguments:
    """A dump's `<module>.target_arguments.txt` (libtpu's tpu_topology_args): the TPU and torus compiled for."""

    generation: str | None  # tpuprof.targets name, None for a chip tpuprof does not know
    chip_config: str | None  # "megacore", "default"; None when the file does not say
    chips_per_host_bounds: tuple[int, int, int] | None
    host_bounds: tuple[int, int, int] | None
    wrap: tuple[bool, bool, bool]  # the axes the file declares wrapped (rings)


def parse_target_arguments(text: str) -> TargetArguments:
    """The fields tpuprof reads. A v4 dump compiled per TensorCore (chip_config_name "default", which v4 VMs do
    not run) is still v4; its capacity is then half the chip's that tpuprof assumes."""
    version = re.search(r"version:\s*(TPU_VERSION_\w+)", text)
    variant = re.search(r'variant:\s*"(\w*)"', text)
    chip_config = re.search(r'chip_config_name:\s*"(\w*)"', text)
    declared = re.search(r"wrap\s*\{([^}]*)\}", text)
    return TargetArguments(
        generation=targets.from_codename(version.group(1), variant.group(1) if variant else "") if version else None,
        chip_config=chip_config.group(1) if chip_config else None,
        chips_per_host_bounds=_bounds(text, "chips_per_host_bounds"),
        host_bounds=_bounds(text, "host_bounds"),
        wrap=tuple(bool(declared and re.search(rf"\b{axis}:\s*true", declared.group(1))) for axis in "xyz"),
    )


def _bounds(text: str, name: str) -> tuple[int, int, int] | None:
    match = re.search(r"(?<![a-z_])" + name + r"\s*\{([^}]*)\}", text)
    if not match:
        return None
    values = {axis: int(v) for axis, v in re.findall(r"([xyz]):\s*(\d+)", match.group(1))}
    return values.get("x", 1), values.get("y", 1), values.get("z", 1)


def _beside(module_file: Path, suffix: str) -> Path | None:
    """The file libtpu wrote beside MODULE_FILE for the same module, e.g. `<module>.target_arguments.txt`."""
    key = module_key(module_file.name)
    exact = module_file.with_name(key + suffix)
    if exact.is_file():
        return exact
    return next(iter(sorted(module_file.parent.glob(key + "*" + suffix))), None)


# libtpu's TpuTopologyArgs in a `*.target_arguments.pb` (what it writes with --xla_dump_hlo_as_proto alone), by
# field number: read from its own dumps of one compile per generation, whose `.txt` twin names each field.
_TOPOLOGY_ARGS = 6  # TargetArguments.tpu_topology_args
_VERSION, _VARIANT, _CHIP_CONFIG, _CHIPS_PER_HOST, _HOSTS = 1, 2, 4, 5, 6
_VERSIONS = {1: "TPU_VERSION_JELLYFISH", 2: "TPU_VERSION_DRAGONFISH", 3: "TPU_VERSION_PUFFERFISH",
             4: "TPU_VERSION_VIPERFISH", 5: "TPU_VERSION_GHOSTLITE", 6: "TPU_VERSION_6acc60406"}


def parse_target_arguments_proto(data: bytes) -> TargetArguments | None:
    """The fields tpuprof reads, from the binary form; None when DATA is not a target-arguments message."""
    topology = _fields(data).get(_TOPOLOGY_ARGS)
    if not isinstance(topology, bytes):
        return None
    fields = _fields(topology)
    version, variant, chip_config = fields.get(_VERSION), fields.get(_VARIANT), fields.get(_CHIP_CONFIG)
    variant_text = variant.decode(errors="replace") if isinstance(variant, bytes) else ""
    return TargetArguments(
        generation=targets.from_codename(_VERSIONS.get(version, ""), variant_text) if isinstance(version, int)
        else None,
        chip_config=chip_config.decode(errors="replace") if isinstance(chip_config, bytes) else None,
        chips_per_host_bounds=_proto_bounds(fields.get(_CHIPS_PER_HOST)),
        host_bounds=_proto_bounds(fields.get(_HOSTS)),
        # Its wrap is empty in every dump seen (v4:4x4x4 to v6e:16x16, either form): which field is which axis
        # is not known, so none is read.
        wrap=(False, False, False),
    )


def _fields(data: bytes) -> dict[int, int | bytes]:
    """A message's fields by number (the last of a repeated one), read without its schema."""
    from google.protobuf import empty_pb2
    from google.protobuf.unknown_fields import UnknownFieldSet

    message = empty_pb2.Empty()
    message.ParseFromString(data)
    return {field.field_number: field.data for field in UnknownFieldSet(message) if field.wire_type in (0, 2)}


def _proto_bounds(data) -> tuple[int, int, int] | None:
    if not isinstance(data, bytes):
        return None
    values = _fields(data)
    return tuple(values.get(axis, 1) if isinstance(values.get(axis, 1), int) else 1 for axis in (1, 2, 3))


def read_target_arguments(module_file: Path) -> TargetArguments | None:
    """The target arguments of the module in MODULE_FILE (its `.txt`, else its `.pb`), or None when the dump holds
    neither or they cannot be read."""
    from google.protobuf.message import DecodeError

    try:
        found = _beside(module_file, ".target_arguments.txt")
        if found is not None:
            return parse_target_arguments(found.read_text(errors="replace"))
        found = _beside(module_file, ".target_arguments.pb")
        return parse_target_arguments_proto(found.read_bytes()) if found is not None else None
    except (OSError, DecodeError):
        return None


def read_device_assignment(module_file: Path) -> list[int]:
    """Partition (logical id) -> device id, from the module's `*.execution_options.txt`; [] without one."""
    found = module_file.with_name(module_key(module_file.name) + ".execution_options.txt")
    if not found.is_file():
        return []
    return [int(v) for v in re.findall(r"replica_device_ids:\s*(\d+)", found.read_text(errors="replace"))]


# --- the module libtpu compiled, for the step estimate ---------------------------------------------------

COMPILED_STAGES = ("after_codegen", "after_optimizations")


@dataclass
class CompiledModule:
    """The module libtpu compiled (`*.after_codegen.hlo.pb`, which carries the compiler's cycles, else
    `*.after_optimizations.hlo.pb`) and what the dump says beside it."""

    path: Path
    stage: str  # after_codegen | after_optimizations
    proto: object  # its HloModuleProto
    target_arguments: TargetArguments | None = None
    device_assignment: list[int] = field(default_factory=list)

    @property
    def target(self) -> str | None:
        return self.target_arguments.generation if self.target_arguments else None


def find_compiled_module(dump_dir: Path) -> Path:
    """The module proto of a compile's dump: after_codegen (carries the compiler's cycles) if kept."""
    for stage in COMPILED_STAGES:
        found = sorted(dump_dir.glob(f"*.{stage}.hlo.pb"), key=lambda p: (-p.stat().st_size, p.name))
        if found:
            return found[0]
    raise UserError(f"{dump_dir} holds no *.after_codegen.hlo.pb or *.after_optimizations.hlo.pb to estimate from.")


def read_compiled_module(path: str | Path) -> CompiledModule:
    """A compile's dump folder, or one of its module protos."""
    path = Path(path)
    proto_path = find_compiled_module(path) if path.is_dir() else path
    try:
        module = read_hlo_proto(proto_path).hlo_module
    except OSError as error:
        raise UserError(f"{proto_path} is not a readable HLO proto ({type(error).__name__}).") from None
    stage = "after_codegen" if ".after_codegen." in proto_path.name else "after_optimizations"
    return CompiledModule(proto_path, stage, module, read_target_arguments(proto_path),
                          read_device_assignment(proto_path))
