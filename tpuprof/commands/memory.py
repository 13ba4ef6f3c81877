"""`tpuprof memory`: dump files -> per-buffer/op analysis and peak -> fixes -> tables or JSON."""

from __future__ import annotations

import math
from pathlib import Path

from tpuprof import targets
from tpuprof.advice import memory as advice
from tpuprof.analyses import memory as analysis
from tpuprof.errors import UserError
from tpuprof.models.memory import ModuleMemory
from tpuprof.sources import hlo_dump, inputs


def module_memories(path: Path, module: str | None = None, target: str | None = None, top: int = 15,
            compile_: bool | None = None) -> list[ModuleMemory]:
    """The whole memory pipeline, for other commands (oom --dump, preflight, report) too.

    compile_=None (the default) recompiles with libtpu when it is installed, the TPU generation is known and the
    input holds module protos without a TPU buffer assignment (CPU/GPU dumps): exact figures instead of an
    estimate. True insists (a UserError if it cannot); False always estimates."""
    inputs.expect(path, inputs.MEMORY)  # a profile or a log given by mistake: name the command that reads it
    generation = targets.get(target) if target else None
    automatic = compile_ is None
    if automatic:
        compile_ = False
        if generation is not None and hlo_dump.needs_tpu_compile(Path(path), module):
            from tpuprof.sources import tpu_compile  # here: it imports shutil (and lzma, bz2) for nothing otherwise

            compile_ = tpu_compile.jax_available()
    if compile_:
        if generation is None:
            raise UserError("--compile needs --target (the TPU generation to compile for).")
        try:
            results = compile_with_libtpu(path, module, generation.name)
        except UserError as error:
            if not automatic:
                raise
            results = analysis.dump_memory(path, module, generation.name)
            for result in results:
                result.notes.insert(0, f"Not recompiled with libtpu ({error}); estimated instead.")
        else:
            if automatic:
                for result in results:
                    result.notes.insert(0, "This dump has no TPU buffer assignment and libtpu is installed: "
                                           f"recompiled for {generation.name} (--no-compile estimates instead).")
    else:
        results = analysis.dump_memory(path, module, generation.name if generation else None)
    named = {result.target for result in results if result.target}
    if generation is None and len(named) == 1:
        # One TPU for the dump: libtpu writes no target arguments beside some modules (a second compile of jit_init).
        generation = targets.get(named.pop())
    for result in results:
        if result.target or generation is not None:
            result.target = result.target or generation.name
            result.hbm_capacity_bytes = targets.get(result.target).compiler_hbm_bytes
        elif result.peak_heap_bytes is not None and result.peak_heap_bytes is not None:
            # Without a generation there is no HBM to judge by: no fit verdict, no batch or capacity advice.
            result.notes.append("The dump does not say which TPU it was compiled for (libtpu writes that in "
                                "*.target_arguments.txt or .pb beside each module): give --target GEN for whether "
                                "it fits and the advice that rests on the HBM.")
        describe_and_advise(result, top)
    return advice.answer_first(results)


def describe_and_advise(result: ModuleMemory, top: int) -> None:
    """Shapes and source lines are filled only for what is shown or advised on (large modules): the padding advice
    reads the padded buffers, and the rest of it reasons about what is live at the peak (attention scores, kept
    activations) by shape, and about the batch from the entry parameters (inputs lead with it). Then the advice."""
    analysis.describe(result, result.buffers[: max(top, 0) or len(result.buffers)])
    analysis.describe(result, [b for b in result.buffers if b.padding_bytes >= advice.MIN_PADDING_BYTES
                               or b.live_at_peak and (b.padding_bytes or b.size_bytes >= advice.MiB)
                               or b.allocation_type == "parameter"])
    result.suggestions = advice.suggest(result)


def compile_with_libtpu(path, module: str | None, target: str) -> list[ModuleMemory]:
    """--compile: recompile every HLO module proto under PATH with libtpu for TARGET, then analyse the real dumps,
    largest peak first. A module libtpu refuses is left out and named in a note of the first result.

    HLO text cannot be turned back into a module without XLA's parser (no Python package ships it), so
    this takes the `*.before_optimizations.hlo.pb` (or any HloModuleProto/HloProto) of a CPU/GPU/TF dump.
    Each compile is cached by the module's bytes, the target and libtpu's version (recompile_cache).
    """
    from tpuprof.sources import tpu_compile

    protos = _module_protos(Path(path), module)
    if not tpu_compile.jax_available():
        raise UserError(tpu_compile.INSTALL_HINT)
    results: list[ModuleMemory] = []
    dropped: list[str] = []
    for proto_path in protos:
        try:
            results += _recompiled(proto_path, target)
        except UserError as error:
            if len(protos) == 1:
                raise
            dropped.append(f"{proto_path.name} ({error})")
    if not results:
        raise UserError(f"libtpu compiled none of the {len(protos)} modules in {path}: " + "; ".join(dropped))
    results.sort(key=lambda r: -(r.peak_heap_bytes or 0))
    if dropped:
        results[0].notes.append(f"Left out ({len(dropped)} of {len(protos)} modules, libtpu refused them): "
                                + "; ".join(dropped) + ".")
    return results


def _module_protos(path: Path, module: str | None) -> list[Path]:
    """The HLO module protos to recompile: one per module of a dump folder (before optimizations preferred), or
    the file given (a CPU/GPU proto after optimizations is swapped for its module before them)."""
    if path.is_dir():
        modules: dict[str, Path] = {}
        for proto in sorted(path.glob("*.hlo.pb")):
            key = hlo_dump.module_key(proto.name)
            if key not in modules or proto.name.endswith("before_optimizations.hlo.pb"):
                modules[key] = proto
        protos = [p for key, p in modules.items() if not module or module == key or module in p.name]
        if not protos:
            raise UserError(f"--compile needs an HLO module proto in {path}: dump with "
                            "XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_proto' (HLO text cannot be recompiled).")
        return protos
    if path.name.endswith(hlo_dump.PROTO_SUFFIXES) and any(m in path.name for m in hlo_dump.NON_TPU_MARKERS):
        # A CPU/GPU HloProto after optimization: its module as it was before is the one to give libtpu.
        marker = next(m for m in hlo_dump.NON_TPU_MARKERS if m in path.name)
        before = path.with_name(path.name.split("." + marker)[0] + ".before_optimizations.hlo.pb")
        return [before if before.exists() else path]
    if not path.name.endswith(hlo_dump.PROTO_SUFFIXES):
        raise UserError("--compile takes an HLO module proto (*.hlo.pb from --xla_dump_hlo_as_proto): "
                        "HLO text cannot be recompiled.")
    return [path]


RECOMPILE_CACHE_FORMAT = 1
_TILED = 3  # OpSharding.OTHER: an array split over a tile assignment of devices


def sharded_devices(module) -> int:
    """Over how many devices an HloModuleProto's entry computation splits its arrays (1: not sharded), from its
    instructions' OpSharding tile assignments."""
    entry = next((c for c in module.computations if c.id == module.entry_computation_id), None)
    most = 1
    for instruction in entry.instructions if entry is not None else ():
        if not instruction.HasField("sharding"):
            continue
        for sharding in [instruction.sharding, *instruction.sharding.tuple_shardings]:
            if sharding.type == _TILED:
                most = max(most, math.prod(sharding.tile_assignment_dimensions))
    return most


def recompile_cache(module_bytes: bytes, target: str) -> Path:
    """Where the recompile of one module for one target is kept: under preflight's compile cache, keyed by the
    module's bytes, the target and the versions of libtpu and jaxlib (another compiler gives other figures)."""
    import hashlib
    from importlib import metadata

    from tpuprof.analyses import preflight

    versions = []
    for package in ("libtpu", "jaxlib"):
        try:
            versions.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            versions.append("")
    digest = hashlib.sha256(module_bytes)
    digest.update(repr((RECOMPILE_CACHE_FORMAT, target, versions)).encode())
    return preflight.cache_root() / "recompiled" / digest.hexdigest()[:32]


def _recompiled(path: Path, target: str) -> list[ModuleMemory]:
    """One module proto recompiled for TARGET (or found in the cache) and analysed."""
    import shutil
    import tempfile

    from tpuprof.models.memory import METHOD_RECOMPILED, METHOD_RECOMPILED_ONE_DEVICE
    from tpuprof.sources import tpu_compile

    module = hlo_dump.read_hlo_proto(path).hlo_module
    devices = sharded_devices(module)
    module_bytes = module.SerializeToString()
    folder = recompile_cache(module_bytes, target)
    cached = folder.is_dir()
    if not cached:
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Compiled into a staging folder renamed when complete: a failed or interrupted compile leaves no entry.
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            tpu_compile.compile_hlo_module(module_bytes, target, staging / "dump")
            (staging / "dump").rename(folder)
        except tpu_compile.CompileResourceExhausted as error:
            raise UserError(f"libtpu ran out of memory compiling {path.name} for {target}; run "
                            f"`tpuprof oom` on its message: {error.message.splitlines()[0]}") from None
        except tpu_compile.CompileFailed as error:
            raise UserError(f"libtpu could not compile {path.name} for {target}: {error}") from None
        except OSError:
            if not folder.is_dir():  # another run renamed its own copy first: use that one
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    results = analysis.dump_memory(folder, None, target)
    for result in results:
        result.method = METHOD_RECOMPILED_ONE_DEVICE if devices > 1 else METHOD_RECOMPILED
        if devices > 1:
            result.notes.append(f"The module is sharded over {devices} devices; recompiled on one device its figures "
                                "are the whole program's, not one device's share.")
        result.source = str(path)  # the dump in the cache is tpuprof's: name the module the user gave
        result.notes.append(f"Compiled from {path} with libtpu for {target}"
                            + (" (cached compile)." if cached else "."))
    return results


def result(path: Path, module: str | None = None, target: str | None = None, top: int = 15,
           compile_: bool | None = None):
    """The memory pipeline's modules as the typed result that `tpuprof.memory()` returns and the CLI renders."""
    from tpuprof.results import MemoryResult

    return MemoryResult(str(path), module_memories(path, module, target, top, compile_), top)


def run(path: Path, module: str | None, target: str | None, compile_: bool | None, top: int, as_json: bool,
        csv: str | None = None, format_: str | None = None) -> None:
    from tpuprof.renderers import memory as render
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_, csv)
    if csv is not None:
        from tpuprof.renderers import csv as render_csv

        render_csv.check_memory(csv)
        render_csv.print_memory(module_memories(path, module, target, 0, compile_), csv)
        return
    memory = result(path, module, target, top, compile_)
    if not print_document(memory, format_):
        render.print_document(memory.to_dict(), top)
