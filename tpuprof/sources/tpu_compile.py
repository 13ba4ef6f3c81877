"""Compile programs for a TPU with libtpu on a machine that has no TPU (compile-only).

libtpu (from `jax[tpu]`) runs the real XLA:TPU compiler against a topology description. We compile
for ONE device of the smallest topology of a generation (`tpuprof.targets`), with the chip config users'
jobs run (v4: "megacore"), so every figure is per device as a job sees it: a chip on v4, v5e, v5p and v6e,
a TensorCore on v2, v3 and TPU7x, with the per-device batch the user would run.

Three front ends reach the same compiler:
- a JAX callable and example arguments: `jax.jit(f).lower(...).compile(compiler_options=...)`;
  `compiler_options` carries `xla_dump_to`, so each compile dumps into its own folder;
- a `tf.function` and `tf.TensorSpec`s: TensorFlow emits an HloModuleProto
  (`experimental_get_compiler_ir(stage="hlo_serialized")`), jaxlib turns it into StableHLO and the
  topology's compile-only client compiles it;
- a compiled Keras (TF backend) model: we build its train step as a `tf.function` (above).

JAX and TensorFlow are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from tpuprof import slices
from tpuprof.errors import UserError, tensorflow_missing
from tpuprof.models.shape import HOST_MEMORY_SPACE

# The dump files of the main module that tpuprof reads; the compiler writes many more per compile.
KEPT_SUFFIXES = (
    ".after_optimizations.hlo.pb",
    ".after_optimizations-buffer-assignment.txt",
    ".after_optimizations.txt",
    ".after_optimizations-memory-usage-report.txt",
    ".target_arguments.txt",  # which TPU the module was compiled for (read by the memory command)
    ".execution_options.txt",  # the device assignment: which chip each partition runs on (collectives)
    ".after_codegen.hlo.pb",  # the compiler's per-op estimated_cycles (preflight's step-time estimate)
)

INSTALL_HINT = (
    "compiling for a TPU needs libtpu: install it with `pip install 'jax[tpu]'` "
    "(or `pip install 'tpuprof[tpu]'`); no TPU is needed."
)


class CompileResourceExhausted(Exception):
    """The XLA:TPU compiler refused the program for lack of device memory (RESOURCE_EXHAUSTED).

    `message` is the compiler's full text, for the OOM triage to parse.
    """

    def __init__(self, message: str, target: str):
        super().__init__(message)
        self.message = message
        self.target = target


class CompileFailed(Exception):
    """The compiler (or the TF -> HLO conversion) failed for a reason other than memory."""


@dataclass
class CompileResult:
    """The compiler's own memory figures for one device, and where the dump went."""

    target: str  # generation, e.g. v5e
    topology: str  # e.g. v5e:2x2
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs that reuse an argument's buffer (donation), counted once
    temp_bytes: int
    generated_code_bytes: int
    dump_dir: str | None = None
    files: list[str] = field(default_factory=list)  # kept dump files of the main module
    # Host memory the program holds per device (memory space S(5)): activations a remat policy offloads, and
    # arguments or outputs placed in pinned host memory. Not HBM: not in required_bytes.
    host_argument_bytes: int = 0
    host_output_bytes: int = 0
    host_alias_bytes: int = 0
    host_temp_bytes: int = 0
    # "code": the whole compile (the figures are libtpu's own); "buffer_assignment": stopped once the compiler
    # had laid out the program's memory (compile_until_layout), so the program's code and the scratch that code
    # generation adds are not known: generated_code_bytes is 0 and temp_bytes the buffer assignment's.
    stage: str = "code"

    @property
    def required_bytes(self) -> int:
        """What the program needs in HBM at once; compile-only does not check this against HBM."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.generated_code_bytes)

    @property
    def hlo_proto(self) -> str | None:
        return next((f for f in self.files if f.endswith(".after_optimizations.hlo.pb")), None)

    def memory_analysis(self) -> dict[str, int]:
        """The compiler's numbers in the names `compiled.memory_analysis()` uses."""
        return {
            "argument_size_in_bytes": self.argument_bytes,
            "output_size_in_bytes": self.output_bytes,
            "alias_size_in_bytes": self.alias_bytes,
            "temp_size_in_bytes": self.temp_bytes,
            "generated_code_size_in_bytes": self.generated_code_bytes,
            "host_argument_size_in_bytes": self.host_argument_bytes,
            "host_output_size_in_bytes": self.host_output_bytes,
            "host_alias_size_in_bytes": self.host_alias_bytes,
            "host_temp_size_in_bytes": self.host_temp_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["required_bytes"] = self.required_bytes
        return data


def _quiet_libtpu() -> None:
    """Without these, libtpu prints warnings about the TPU host it is not running on."""
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Compile-only touches no TPU: other processes (tests, other tpuprof runs) may hold libtpu too.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if "TPU_LOG_DIR" not in os.environ:
        _private_libtpu_log_dir()


def _private_libtpu_log_dir() -> None:
    """libtpu writes log files for every process that loads it, to /tmp/tpu_logs (whatever TMPDIR says), and
    leaves them there; `TPU_LOG_DIR=disabled` only moves them to TMPDIR. A folder of this process's own, removed
    when it exits, keeps the temp directory as it was (its messages still reach stderr at the levels above)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="tpuprof-libtpu-logs-")
    os.environ["TPU_LOG_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def jax_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("jax") is not None and importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


def topology_devices(target: "slices.Slice | str") -> tuple:
    """The compile-only devices of the slice's topology (a bare generation: its smallest), in the chip config
    users' jobs run (`tpuprof.targets`: v4 is "megacore", one device per chip)."""
    chosen = slices.resolve(target)
    with _TOPOLOGY_LOCK:  # a sweep's threads (commands.preflight): libtpu registers its plugin once, unlocked
        return _topology_devices(chosen.topology, chosen.target.chip_config_name, chosen.chips_per_host_bounds)


@lru_cache(maxsize=None)
def _topology_devices(topology: str, chip_config_name: str | None, chips_per_host_bounds: tuple | None) -> tuple:
    """One device tuple per topology, however the slice was named (`v6e-8`, `v6e:2x4`): a mesh built from one
    name's devices must hold the devices another name's arguments are placed on."""
    if not jax_available():
        raise UserError(INSTALL_HINT)
    _quiet_libtpu()
    _check_libtpu_flags()
    from jax.experimental import topologies

    chip_config = {"chip_config_name": chip_config_name} if chip_config_name else {}
    if chips_per_host_bounds:  # a 1-chip slice (v6e-1): libtpu's default 2x2x1 host refuses it
        chip_config["chips_per_host_bounds"] = chips_per_host_bounds
    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology, **chip_config)
    except Exception as error:  # noqa: BLE001 - libtpu raises plain RuntimeErrors
        label = f"{topology} {chip_config_name}" if chip_config_name else topology
        raise UserError(f"libtpu cannot compile for topology {label!r}: {_first_line(error)}.") from None
    return tuple(description.devices)


_CHECKED_FLAGS = "TPUPROF_LIBTPU_INIT_ARGS_CHECKED"  # the LIBTPU_INIT_ARGS a parent process checked


def _check_libtpu_flags() -> None:
    """libtpu reads LIBTPU_INIT_ARGS when it loads, as on a TPU VM, and at a flag it does not know or a value it
    cannot read it ends the process (exit 1, its message on the stderr tpuprof holds): no word to the user. So
    where the variable is set, a child process loads libtpu first (about 2 s) and its refusal becomes one
    sentence; once per value, children of this process included."""
    flags = os.environ.get("LIBTPU_INIT_ARGS", "").strip()
    if not flags or os.environ.get(_CHECKED_FLAGS) == flags:
        return
    import subprocess
    import sys

    probe = ("from jax.experimental import topologies\n"
             "topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2')\n")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return  # not a refusal: the compile itself will say what is wrong
    refusals = [line[len("ERROR: "):] for line in done.stderr.splitlines() if line.startswith("ERROR: ")]
    if done.returncode != 0 and refusals:
        raise UserError(f"libtpu refuses LIBTPU_INIT_ARGS ({refusals[-1].strip()}): tpuprof compiles with the flags "
                        f"of that variable, as a TPU job does, so correct the flag or unset the variable.")
    os.environ[_CHECKED_FLAGS] = flags


def device(target: "slices.Slice | str"):
    """Device 0 of the topology: the one chip / TensorCore tpuprof compiles for."""
    return topology_devices(target)[0]


def topology_mesh(target: "slices.Slice | str", axis_name: str = "data", axes: str | None = None):
    """A mesh over all devices of the slice's topology, for factories that shard themselves: 1-D (`data`), or
    with MaxText's axes when `axes` (`fsdp=-1,tensor=4`, the --mesh option) is given."""
    from jax.sharding import Mesh
    import numpy as np

    devices = topology_devices(target)
    if axes:
        from tpuprof.sources import mesh

        return mesh.make_mesh(devices, mesh.parse_mesh(axes, len(devices)))
    return Mesh(np.array(devices), (axis_name,))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__


def _is_resource_exhausted(error: BaseException) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def _dump_options(dump_dir: str | os.PathLike | None) -> dict[str, Any]:
    if dump_dir is None:
        return {}
    return {"xla_dump_to": str(dump_dir), "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}


def _collect_dump(dump_dir: str | os.PathLike | None, keep_all: bool) -> list[str]:
    """The main module's kept files; the rest of the dump (other stages, pass folders) is deleted.

    A compile dumps one module here (the folder is fresh), so "main module" is the one with an
    after_optimizations proto; if several are present we keep the largest, which is the step.
    """
    if dump_dir is None:
        return []
    folder = Path(dump_dir)
    protos = sorted(folder.glob("*.after_optimizations.hlo.pb"), key=lambda p: (-p.stat().st_size, p.name))
    if not protos:
        return sorted(str(p) for p in folder.iterdir() if p.is_file())
    prefix = protos[0].name[: -len(".after_optimizations.hlo.pb")]
    kept = []
    for path in sorted(folder.iterdir()):
        wanted = path.is_file() and path.name.startswith(prefix + ".") and path.name[len(prefix):] in KEPT_SUFFIXES
        if wanted:
            kept.append(str(path))
        elif not keep_all:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return kept


def _fresh_dir(dump_dir: str | os.PathLike | None) -> None:
    if dump_dir is None:
        return
    folder = Path(dump_dir)
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"dump folder {folder} is not empty")
    folder.mkdir(parents=True, exist_ok=True)


def _result(chosen: slices.Slice, stats, dump_dir, keep_all: bool) -> CompileResult:
    return CompileResult(
        target=chosen.generation,
        topology=chosen.topology,
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        generated_code_bytes=int(stats.generated_code_size_in_bytes),
        dump_dir=None if dump_dir is None else str(dump_dir),
        files=_collect_dump(dump_dir, keep_all),
        **{f"host_{kind}_bytes": int(getattr(stats, f"host_{kind}_size_in_bytes", 0) or 0)
           for kind in ("argument", "output", "alias", "temp")},
    )


def layout_figures(proto_path: str | os.PathLike) -> dict[str, int]:
    """Argument, output, alias and temporary bytes, in HBM and host memory, from the buffer assignment in a
    compile's `*.after_optimizations.hlo.pb`, counted as XLA's CompiledMemoryStats counts its allocations
    (PopulateBufferStatsFromAllocations): a parameter's allocation is an argument (and aliased when the module's
    input/output aliasing names it), a live-out one an output, any other that is not thread-local a temporary;
    memory space 0 is HBM, 5 the host's; the TPU's on-chip memories (1: VMEM, 2, 4, 6) are not counted, as
    libtpu's own figures do not count them. `compiled.memory_analysis()` of the finished compile gives the same argument,
    output, alias and host figures; its temporaries add the scratch code generation allocates."""
    from tpuprof.protos import hlo_pb2

    proto = hlo_pb2().HloProto.FromString(Path(proto_path).read_bytes())
    aliased = {(entry.parameter_number, tuple(entry.parameter_shape_index))
               for entry in proto.hlo_module.input_output_alias.entries}
    figures = {f"{prefix}{kind}_bytes": 0 for prefix in ("", "host_") for kind in ("argument", "output", "alias", "temp")}
    for allocation in proto.buffer_assignment.buffer_allocations:
        if allocation.color not in (0, HOST_MEMORY_SPACE):  # on-chip memories (VMEM, SMEM, semaphores)
            continue
        prefix = "host_" if allocation.color == HOST_MEMORY_SPACE else ""
        if allocation.is_entry_computation_parameter:
            figures[f"{prefix}argument_bytes"] += allocation.size
            if (allocation.parameter_number, tuple(allocation.parameter_shape_index)) in aliased:
                figures[f"{prefix}alias_bytes"] += allocation.size
        if allocation.maybe_live_out:
            figures[f"{prefix}output_bytes"] += allocation.size
        if not (allocation.is_entry_computation_parameter or allocation.maybe_live_out or allocation.is_thread_local):
            figures[f"{prefix}temp_bytes"] += allocation.size
    return figures


_TOPOLOGY_LOCK = threading.Lock()


def _raise_compile_error(error: BaseException, chosen: slices.Slice):
    if _is_resource_exhausted(error):
        raise CompileResourceExhausted(str(error), chosen.generation) from None
    raise CompileFailed(str(error)) from error


# --- JAX -------------------------------------------------------------------------------------------

def place_args(args: Sequence[Any], target: slices.Slice | str) -> list:
    """Example arguments as ShapeDtypeStructs on device 0 of the target.

    Leaves that already carry a sharding on the topology (a factory given the mesh) keep it.
    """
    import jax
    from jax.sharding import SingleDeviceSharding

    single = SingleDeviceSharding(device(target))
    topology = set(topology_devices(target))

    def place(leaf):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and set(getattr(sharding, "device_set", ())) <= topology and sharding.device_set:
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(f"example argument {leaf!r} is not an array or jax.ShapeDtypeStruct")
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=single)

    return jax.tree_util.tree_map(place, list(args))


def compile_jax(fn, args: Sequence[Any], target: slices.Slice | str, dump_dir: str | os.PathLike | None = None,
                keep_all: bool = False, donate_argnums: Sequence[int] = (),
                options: dict[str, Any] | None = None) -> CompileResult:
    """Compile `fn(*args)` for one device of `target`; dump into `dump_dir` (a fresh folder) if given;
    `options`: compiler flags the program is run with (e.g. libtpu's xla_tpu_scoped_vmem_limit_kib)."""
    import jax

    chosen = slices.resolve(target)
    placed = place_args(args, chosen)
    _fresh_dir(dump_dir)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, donate_argnums=tuple(donate_argnums))
    lowered = jitted.lower(*placed)
    try:
        compiled = lowered.compile(compiler_options={**(options or {}), **_dump_options(dump_dir)})
    except Exception as error:  # noqa: BLE001 - jaxlib raises JaxRuntimeError with the status text
        _raise_compile_error(error, chosen)
    return _result(chosen, compiled.memory_analysis(), dump_dir, keep_all)


# --- stopped once the memory is laid out -------------------------------------------------------------

LAYOUT_SUFFIXES = (".after_optimizations.hlo.pb", ".after_optimizations-buffer-assignment.txt",
                   ".after_optimizations-memory-usage-report.txt")


def compile_until_layout(spec, batch: int, dtype: str | None, target: slices.Slice | str, dump_dir: str | os.PathLike,
                         stop_above: int | None, poll_s: float = 0.25,
                         on_layout: Callable[[int], None] | None = None) -> CompileResult:
    """Compile `spec.program(batch, dtype, target)` in a child process (tpuprof.sources.compile_child); once the
    compiler has dumped the optimized module with its buffer assignment, before code generation (most of a large
    step's compile time: Llama 3.1 70B on v6e-256 is laid out in seconds, then generates code for minutes), stop
    it if the layout alone already needs more than STOP_ABOVE bytes of HBM (layout_hbm_bytes; None: never): the
    figures are then the buffer assignment's (layout_figures), a lower bound, as code generation adds to them
    (7.9 GiB on a Llama 3.1 8B v6e-8 step). Otherwise, and when the compile ends first, the whole compile's
    result. SPEC must pickle (llm.Spec does). ON_LAYOUT(bytes): called with the layout's HBM when the compile goes
    on past it (what the user may see while code is generated, minutes on a large step)."""
    import json
    import pickle
    import signal
    import tempfile

    chosen = slices.resolve(target)
    # The compile loads libtpu with this process's LIBTPU_INIT_ARGS of the moment: a flag libtpu refuses is said here,
    # in one sentence, not as the compile process's end.
    _check_libtpu_flags()
    folder = Path(dump_dir)
    _fresh_dir(folder)
    with tempfile.TemporaryDirectory(prefix="tpuprof-compile-") as scratch:
        outcome_path = Path(scratch) / "outcome.json"
        log_path = Path(scratch) / "stderr.txt"
        request = pickle.dumps((spec, batch, dtype, chosen, str(folder), str(outcome_path)))
        child = _COMPILE_SERVER.start(request, log_path, Path(scratch) / "returncode")
        try:
            sizes, to_the_end = None, False
            while child.poll() is None:
                ready = None if to_the_end else _layout_files(folder)
                if ready is not None:
                    now = tuple(path.stat().st_size for path in ready)
                    if now == sizes:  # written and no longer growing: freeze the child, then check
                        child.send_signal(signal.SIGSTOP)
                        figures = _readable_layout(ready[0])
                        if figures is not None and stop_above is not None and \
                                layout_hbm_bytes(figures) > stop_above:
                            child.kill()
                            return _layout_result(chosen, figures, folder)
                        to_the_end = figures is not None  # it may fit: only the whole compile can say
                        child.send_signal(signal.SIGCONT)
                        if to_the_end and on_layout is not None:
                            on_layout(layout_hbm_bytes(figures))
                    sizes = now
                child.wait(poll_s)  # ends at once when the child does
        finally:
            child.kill()
        if not outcome_path.is_file():
            raise CompileFailed(_why_the_child_ended(child.returncode, log_path.read_text(errors="replace")))
        outcome = json.loads(outcome_path.read_text())
    if outcome["kind"] == "resource_exhausted":
        # libtpu dumps the buffer assignment, then refuses a program whose temporaries exceed HBM: when the refusal
        # came before the polling above saw the layout (a loaded machine), the answer is still the layout's.
        ready = _layout_files(folder)
        figures = _readable_layout(ready[0]) if ready else None
        if figures is not None and stop_above is not None and layout_hbm_bytes(figures) > stop_above:
            return _layout_result(chosen, figures, folder)
        raise CompileResourceExhausted(outcome["message"], chosen.generation)
    if outcome["kind"] == "failed":
        raise CompileFailed(outcome["message"])
    if outcome["kind"] == "user_error":
        raise UserError(outcome["message"])
    data = outcome["result"]
    data.pop("required_bytes", None)
    return CompileResult(**data)


REQUEST_LENGTH = struct.Struct("<Q")  # the compile server's requests: a pickle after its length


class _CompileProcess:
    """A compile forked by the compile server: not this process's child, so its end is the return code the server
    writes (RETURNCODE_PATH)."""

    def __init__(self, pid: int, returncode_path: Path, server):
        self.pid = pid
        self.returncode_path = returncode_path
        self.server = server  # its subprocess.Popen
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._written_code()
        # Reaped and gone, its code not written: the server writes it next, unless the server itself ended (killed),
        # taking its compile with it. (Not waiting for the code here would let the server write it into a folder
        # being removed.)
        if self.returncode is None and not self._exists() and self.server.poll() is not None:
            self.returncode = self._written_code()
            if self.returncode is None:
                import signal

                self.returncode = -signal.SIGKILL
        return self.returncode

    def _written_code(self) -> int | None:
        try:
            return int(self.returncode_path.read_text())
        except (OSError, ValueError):
            return None

    def _exists(self) -> bool:  # an ended process the server has not reaped yet exists still
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def wait(self, timeout: float) -> None:
        """Until the process ends or TIMEOUT seconds pass, whichever is first."""
        import time

        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Ended, and reaped by the server (seconds at most: a frozen compile is killed too)."""
        import signal

        self.send_signal(signal.SIGKILL)
        self.wait(10)


class _CompileServer:
    """The compile server of this process (tpuprof.sources.compile_child): started at the first compile, again when
    it has ended or when the JAX settings JAX reads on import (JAX_* variables) have changed since."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process = None
        self._settings = None

    def start(self, request: bytes, log_path: Path, returncode_path: Path) -> _CompileProcess:
        import pickle
        import subprocess
        import sys

        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                            if p)}
        settings = (sys.executable, sorted((k, v) for k, v in env.items() if k.startswith("JAX_")))
        message = pickle.dumps((env, request, str(log_path), str(returncode_path)))
        with self._lock:
            if self._process is not None and (self._process.poll() is not None or self._settings != settings):
                self._stop()
            if self._process is None:
                self._process = subprocess.Popen([sys.executable, "-m", "tpuprof.sources.compile_child"],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL, env=env)
                self._settings = settings
            try:
                self._process.stdin.write(REQUEST_LENGTH.pack(len(message)) + message)
                self._process.stdin.flush()
                line = self._process.stdout.readline()
            except OSError:
                line = b""
            if not line.strip().isdigit():
                self._stop()
                raise CompileFailed("the compile server ended before the compile started (is jax[tpu] installed "
                                    "in this Python?)")
            server = self._process
        return _CompileProcess(int(line), returncode_path, server)

    def _stop(self) -> None:
        import subprocess

        process, self._process = self._process, None
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)  # its stdin closed: it ends, and its compiles with it
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_COMPILE_SERVER = _CompileServer()


def _why_the_child_ended(code: int, log: str) -> str:
    """The compile child's end in one line: libtpu's fatal log line where it aborted (glog's
    `F1129 12:00:00.0 pid file:line] Check failed: ...`), else the last line it printed."""
    import re

    fatal = [line.split("] ", 1)[1] for line in log.splitlines() if re.match(r"F\d{4} [\d:.]+ +\d+ \S+\] ", line)]
    if fatal:
        message = fatal[-1] if len(fatal[-1]) <= 300 else fatal[-1][:297] + "..."
        return f"libtpu stopped (signal {-code if code < 0 else code}): {message}"
    tail = log.strip().splitlines()[-1:] or ["no message"]
    return f"the compile process ended with code {code}: {tail[0]}"


def layout_hbm_bytes(figures: dict[str, int]) -> int:
    """Arguments + outputs - aliased + temporaries in HBM, as laid out before code generation."""
    return figures["argument_bytes"] + figures["output_bytes"] - figures["alias_bytes"] + figures["temp_bytes"]


def _layout_files(folder: Path) -> tuple[Path, ...] | None:
    """The main module's optimized proto and buffer-assignment reports, once all are in the dump folder."""
    protos = sorted(folder.glob("*.after_optimizations.hlo.pb"), key=lambda p: -p.stat().st_size)
    if not protos:
        return None
    prefix = protos[0].name[: -len(LAYOUT_SUFFIXES[0])]
    files = tuple(folder / f"{prefix}{suffix}" for suffix in LAYOUT_SUFFIXES)
    return files if all(path.is_file() for path in files) else None


def _readable_layout(proto_path: Path) -> dict[str, int] | None:
    try:
        figures = layout_figures(proto_path)
    except Exception:  # noqa: BLE001 - a proto still being written does not parse
        return None
    return figures if figures["argument_bytes"] or figures["temp_bytes"] or figures["output_bytes"] else None


def _layout_result(chosen: slices.Slice, figures: dict[str, int], folder: Path) -> CompileResult:
    return CompileResult(target=chosen.generation, topology=chosen.topology,
                         generated_code_bytes=0, dump_dir=str(folder), files=_collect_dump(folder, False),
                         stage="buffer_assignment", **figures)


# --- TensorFlow ------------------------------------------------------------------------------------

def _legalizable(hlo_module_bytes: bytes) -> bytes:
    """TF's HLO `copy` (a layout change on CPU) does not legalize to StableHLO; layouts are dropped in
    the conversion anyway, so the copy is an identity and a same-shape `reshape` stands in for it."""
    from tpuprof.protos import hlo_pb2

    module = hlo_pb2().HloModuleProto.FromString(hlo_module_bytes)
    changed = False
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode == "copy":
                instruction.opcode = "reshape"
                changed = True
    return module.SerializeToString() if changed else hlo_module_bytes


def tf_hlo_module(tf_function, specs: Sequence[Any]) -> bytes:
    """The serialized HloModuleProto TensorFlow builds for `tf_function(*specs)` (XLA, CPU platform)."""
    import tensorflow as tf

    function = tf_function
    if not getattr(function, "_jit_compile", False):
        function = tf.function(tf_function.python_function if hasattr(tf_function, "python_function")
                               else tf_function, jit_compile=True)
    try:
        return function.experimental_get_compiler_ir(*specs)(stage="hlo_serialized", platform_name="CPU")
    except Exception as error:  # noqa: BLE001 - TF raises many types for unsupported ops
        raise CompileFailed(f"TensorFlow could not lower the function to XLA HLO: {_first_line(error)}") from error


def compile_hlo_module(hlo_module_bytes: bytes, target: slices.Slice | str, dump_dir: str | os.PathLike | None = None,
                       keep_all: bool = False) -> CompileResult:
    """Compile a serialized HloModuleProto (e.g. from TensorFlow) for one device of `target`."""
    from jax._src import compiler
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    chosen = slices.resolve(target)
    dev = device(chosen)
    try:
        stablehlo = _jax.mlir.hlo_to_stablehlo(_legalizable(hlo_module_bytes))
    except Exception as error:  # noqa: BLE001
        raise CompileFailed(f"the HLO module could not be converted to StableHLO: {_first_line(error)}") from error
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    options.env_option_overrides = list(_dump_options(dump_dir).items())
    _fresh_dir(dump_dir)
    context = jax_mlir.make_ir_context()
    with context:
        module = ir.Module.parse(stablehlo)
        try:
            executable = dev.client.compile(module, _jax.DeviceList((dev,)), options)
        except Exception as error:  # noqa: BLE001
            _raise_compile_error(error, chosen)
    return _result(chosen, executable.get_compiled_memory_stats(), dump_dir, keep_all)


def compile_tf(tf_function, specs: Sequence[Any], target: slices.Slice | str, dump_dir: str | os.PathLike | None = None,
               keep_all: bool = False) -> CompileResult:
    """Compile a `tf.function` for its TensorSpecs: TF -> HLO -> StableHLO -> libtpu."""
    return compile_hlo_module(tf_hlo_module(tf_function, specs), target, dump_dir, keep_all)


# --- Keras (TensorFlow backend) --------------------------------------------------------------------

def keras_train_step(model, x_spec, y_spec):
    """The model's train step (forward, loss, gradients, optimizer update) as an XLA `tf.function`.

    The model must be compiled (optimizer and loss). Variables (weights and optimizer slots) become
    parameters of the HLO module, so they count in the argument bytes as they would on the TPU.
    """
    import tensorflow as tf

    if getattr(model, "optimizer", None) is None:
        raise TypeError("the Keras model is not compiled: call model.compile(optimizer=..., loss=...) first")
    if not model.built:
        model.build(x_spec.shape)
    model.optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step, [x_spec, y_spec]


def compile_keras(model, x_spec, y_spec, target: slices.Slice | str, dump_dir: str | os.PathLike | None = None,
                  keep_all: bool = False) -> CompileResult:
    step, specs = keras_train_step(model, x_spec, y_spec)
    return compile_tf(step, specs, target, dump_dir, keep_all)


# --- SPEC: path/to/file.py:factory ----------------------------------------------------------------

@dataclass
class Program:
    """What a factory returned for one batch size, ready to compile."""

    kind: str  # jax | tf | keras
    value: tuple
    spec: str
    compiler_options: dict[str, Any] | None = None  # jax only: flags the program's own run sets

    def compile(self, target: slices.Slice | str, dump_dir: str | os.PathLike | None = None) -> CompileResult:
        try:
            if self.kind == "jax":
                return compile_jax(self.value[0], self.value[1], target, dump_dir, options=self.compiler_options)
            if self.kind == "tf":
                return compile_tf(self.value[0], self.value[1], target, dump_dir)
            return compile_keras(*self.value, target=target, dump_dir=dump_dir)
        except (CompileResourceExhausted, CompileFailed, UserError):
            raise
        except Exception as error:  # noqa: BLE001 - the user's step failed to trace: wrong argument
            # kinds, shape errors in the model, an uncompiled Keras model...
            raise UserError(f"{self.spec}: tracing the step failed: {type(error).__name__}: "
                            f"{_first_line(error)}.") from None

    def parameter_bytes(self, other: "Program | None" = None) -> int | None:
        """Bytes of the weights (and optimizer state) alone, unpadded.

        JAX: the example arguments whose shape is the same at another batch size (`other`).
        TF/Keras: the variables the step reads and updates.
        """
        if self.kind == "jax":
            import jax
            import numpy as np

            if other is None:
                return None
            leaves = jax.tree_util.tree_leaves(self.value[1])
            others = jax.tree_util.tree_leaves(other.value[1])
            if len(leaves) != len(others):
                return None
            return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a, b in zip(leaves, others)
                       if tuple(a.shape) == tuple(b.shape))
        if self.kind == "keras":
            import tensorflow as tf

            model = self.value[0]
            variables = list(model.variables) + list(getattr(model.optimizer, "variables", []))
        else:
            import tensorflow as tf

            function, specs = self.value
            variables = function.get_concrete_function(*specs).variables
        return sum(int(tf.TensorShape(v.shape).num_elements() or 0) * tf.as_dtype(v.dtype).size for v in variables)


@dataclass
class Spec:
    """A user's `path/to/file.py:factory`, loaded; `program(batch)` calls the factory."""

    text: str
    path: Path
    factory_name: str
    factory: Any
    digest: str  # sha256 of the file: part of the compile cache key
    accepts_dtype: bool
    accepts_mesh: bool
    kind: str | None = None  # what the factory returned last: jax | tf | keras
    mesh_text: str | None = None  # --mesh: the axes of the Mesh a factory with a `mesh` parameter receives
    batch_from: str | None = None  # a function's example arguments: which dimension is taken as the batch

    def program(self, batch_size: int, dtype: str | None = None, target: slices.Slice | str | None = None) -> Program:
        kwargs: dict[str, Any] = {}
        keras_policy = None
        if dtype == "bfloat16" and self.accepts_dtype:
            import jax.numpy as jnp

            kwargs["dtype"] = jnp.bfloat16
        elif dtype == "bfloat16":
            if self.kind not in (None, "keras"):
                raise self._no_dtype()
            keras_policy = "mixed_bfloat16"  # Keras factories: the policy applies to models built next
        if self.accepts_mesh and target is not None:
            kwargs["mesh"] = topology_mesh(target, axes=self.mesh_text)
        previous = _set_keras_policy(keras_policy) if keras_policy else None
        try:
            value = self.factory(batch_size, **kwargs)
        except UserError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's code: any exception is a bad SPEC
            raise _needs_tensorflow(error, self.text) or UserError(
                f"{self.text} raised {type(error).__name__} for batch size {batch_size}: "
                f"{_first_line(error)}.") from None
        finally:
            if previous is not None:
                _set_keras_policy(previous)
        kind = _classify(value)
        if kind is None:
            raise UserError(
                f"{self.text} returned {_describe(value)}; a factory returns (jax function, example arguments), "
                "(tf.function, [tf.TensorSpec...]) or (compiled Keras model, x TensorSpec, y TensorSpec).")
        if keras_policy and kind != "keras":
            raise self._no_dtype()
        self.kind = kind
        return Program(kind, tuple(value), self.text)

    def _no_dtype(self) -> UserError:
        return UserError(f"{self.factory_name} in {self.path} has no `dtype` parameter, so --compare-bf16 "
                         "cannot ask it for a bfloat16 version.")


def load_spec(text: str) -> Spec:
    """Import the file of `path/to/file.py:factory` (its folder on sys.path) and find the factory."""
    import hashlib
    import importlib.util
    import inspect
    import sys

    path_text, sep, name = text.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise UserError(f"SPEC {text!r} must be path/to/file.py:factory.")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise UserError(f"{path} does not exist." if not path.exists() else f"{path} is not a file.")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the model file may import its neighbours
    module_name = f"tpuprof_spec_{path.stem}_{digest[:12]}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError("not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - syntax errors, missing imports... in the user's file
        sys.modules.pop(module_name, None)
        raise _needs_tensorflow(error, str(path)) or UserError(
            f"importing {path} failed: {type(error).__name__}: {_first_line(error)}.") from None
    factory = getattr(module, name, None)
    if factory is None:
        raise UserError(f"{path} has no {name!r}.")
    if not callable(factory):
        raise UserError(f"{name!r} in {path} is not a function.")
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    return Spec(text, path, name, factory, digest, "dtype" in parameters, "mesh" in parameters)


def _needs_tensorflow(error: Exception, where: str) -> UserError | None:
    """The sentence for a model file or factory that imports TensorFlow or Keras where neither is installed."""
    if isinstance(error, ModuleNotFoundError) and error.name in ("tensorflow", "keras"):
        return tensorflow_missing(f"{where} imports {error.name}, so its preflight")
    return None


def _set_keras_policy(policy: str) -> str | None:
    try:
        import keras
    except ImportError:  # no Keras here, so the factory builds no Keras model: Spec.program says it takes no dtype
        return None

    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    return previous


def _module_of(value) -> str:
    return type(value).__module__ or ""


def is_keras_model(value) -> bool:
    return any((c.__module__ or "").split(".")[0] in ("keras", "tf_keras") for c in type(value).__mro__) \
        and hasattr(value, "trainable_variables")


def _is_tf_function(value) -> bool:
    return hasattr(value, "experimental_get_compiler_ir")


def _is_tensor_spec(value) -> bool:
    return type(value).__name__ == "TensorSpec" and _module_of(value).startswith("tensorflow")


def _classify(value) -> str | None:
    if not isinstance(value, (tuple, list)):
        return None
    if len(value) == 3 and is_keras_model(value[0]) and _is_tensor_spec(value[1]) and _is_tensor_spec(value[2]):
        return "keras"
    if len(value) == 2 and callable(value[0]) and isinstance(value[1], (tuple, list)):
        if _is_tf_function(value[0]):
            return "tf" if all(_is_tensor_spec(s) for s in value[1]) else None
        return "jax"
    return None


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value[:4])})"
    return f"a {type(value).__name__}"
