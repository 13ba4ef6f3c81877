"""Will a program fit in one TPU device's HBM, and what is the largest per-device batch that does?

Every figure comes from the real XLA:TPU compiler (libtpu, compile-only). The compiler itself only
refuses programs whose *temporaries* exceed HBM; it does not check arguments + outputs - aliased +
temporaries + generated code against HBM, so that sum (`required_bytes`) is checked here.

Compiles are cached on disk by (SPEC file hash, factory, topology, batch, dtype, libtpu version, and --mesh),
so a repeated run, or a max-batch search that revisits a batch, costs nothing. The topology is the slice's
(v6e-256: v6e:16x16); an LLM step's digest holds its config, sequence length, remat, dtype and mesh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tpuprof import slices

CACHE_FORMAT = 2  # 2: dumps keep *.after_codegen.hlo.pb (the step-time estimate reads it)
# A compile stopped before code generation answers only "does not fit", and only when its layout needs more than
# the capacity plus this: code generation has dropped at most 7 MB of temporaries on the programs measured (and
# added up to 7.9 GiB): docs/preflight-families.md ("The first answer").
CODEGEN_MARGIN_BYTES = 256 << 20
STEP = 8  # batch sizes searched are multiples of 8 ...
PREFERRED = 128  # ... and multiples of 128 are recommended when they fit (Cloud TPU performance guide)
BATCH_LIMIT = 1 << 20  # a search stops here: larger batches make compiles slow and are not realistic


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpuprof" / "preflight"


@dataclass
class Measurement:
    """One compile (or cache hit) of the program at one batch size."""

    batch_size: int
    fits: bool
    required_bytes: int | None  # None when the compiler refused the program (RESOURCE_EXHAUSTED)
    stats: dict | None = None  # argument/output/alias/temp/generated_code bytes
    oom_message: str | None = None
    dump_dir: str | None = None
    cached: bool = False
    # "code": a whole compile; "buffer_assignment": stopped before code generation (Compiler(layout_only=True))
    # because the layout alone does not fit: required_bytes is then the layout's, a lower bound.
    stage: str = "code"

    @property
    def host_bytes(self) -> int:
        """Host memory the program holds per device, as the compiler states it (arguments + outputs - aliased +
        temporaries in host memory): activations a remat policy offloads, pinned host arguments. Not HBM, and
        not in `required_bytes`. 0 without figures (a refused compile, or one cached before they were kept)."""
        stats = self.stats or {}
        return (stats.get("host_argument_size_in_bytes", 0) + stats.get("host_output_size_in_bytes", 0)
                - stats.get("host_alias_size_in_bytes", 0) + stats.get("host_temp_size_in_bytes", 0))

    def host_fits(self, host_capacity: int | None) -> bool | None:
        """host_bytes within what one device may hold on the host (targets.Target.host_capacity_bytes: libtpu's
        budget, or the host's DRAM share where smaller); None where no host budget is known."""
        return None if host_capacity is None else self.host_bytes <= host_capacity

    def fits_within(self, host_capacity: int | None) -> bool:
        """Whether this batch can run: HBM fits (`fits`) and so does the host memory, where its budget is known."""
        return self.fits and self.host_fits(host_capacity) is not False

    @property
    def refused_space(self) -> str | None:
        """The memory space the compiler refused the program for ("hbm", "host", "vmem"), from its
        RESOURCE_EXHAUSTED message; None when it compiled, or the message names none."""
        if not self.oom_message:
            return None
        try:
            from tpuprof.analyses import oom
        except ImportError:
            return None
        report = oom.parse_message(self.oom_message)
        return report.memory_space if report is not None else None

    def bound(self, host_capacity: int | None) -> str:
        """Which memory a batch that cannot run exceeds: "hbm", "host", or the on-chip scratch ("vmem",
        "smem") the compiler refused it for (HBM when it names none or another space)."""
        if self.required_bytes is None:
            space = self.refused_space
            return space if space in ("host", "vmem", "smem") else "hbm"
        return "hbm" if not self.fits else "host"


@dataclass
class Curve:
    """required_bytes ~ fixed + per_example * batch, least squares over the measured compiles."""

    fixed_bytes: int
    per_example_bytes: float


@dataclass
class Search:
    max_batch_size: int | None  # largest multiple of STEP that fits; None if STEP does not
    recommended_batch_size: int | None  # largest multiple of PREFERRED that fits, else max_batch_size
    points: list[Measurement] = field(default_factory=list)
    limited: bool = False  # fits at BATCH_LIMIT: the search stopped there
    # What the next batch (or, when none fits, the smallest) exceeds: "hbm", "host" (offloaded activations
    # beyond what a device may hold on the host), "batch_limit" (the search stopped at the limit).
    bound: str | None = None


def fit_curve(points: list[Measurement]) -> Curve | None:
    measured = sorted({p.batch_size: p.required_bytes for p in points if p.required_bytes is not None}.items())
    if len(measured) < 2:
        return None
    n = len(measured)
    mean_b = sum(b for b, _ in measured) / n
    mean_r = sum(r for _, r in measured) / n
    var = sum((b - mean_b) ** 2 for b, _ in measured)
    slope = sum((b - mean_b) * (r - mean_r) for b, r in measured) / var
    return Curve(int(round(mean_r - slope * mean_b)), slope)


def search_max_batch(measure: Callable[[int], Measurement], capacity: int, limit: int = BATCH_LIMIT,
                     step: int = STEP, preferred: int = PREFERRED, host_capacity: int | None = None) -> Search:
    """Largest multiple of STEP whose program fits, assuming fitting is monotone in the batch. (An LLM step
    searches sequences per device: STEP and PREFERRED are 1 there.) A batch fits when its HBM does and, with
    HOST_CAPACITY (what one device may hold in host memory), so does the host memory it holds (`--remat offload`'s
    activations): whichever of the two runs out first bounds the answer.

    Memory is close to linear in the batch (fixed + per-example bytes) until the compiler starts to
    rematerialise near the HBM limit. Compiles at 8 and 256 give a linear model; one jump goes to its
    predicted maximum, strides that double from 8 walk up (or down) from there until the answer is
    bracketed, and bisection finishes. Where the line through the last two fitting compiles puts the boundary
    at a bracket's edge (it predicted the batch that failed, or the one that fitted), the batch next to that
    edge is tried first: memory is linear there more often than not. Candidates are rounded to a multiple of 128
    when one is close (down, when walking up from a jump that fitted), so the recommended multiple of 128 is
    usually a measured compile. 5 compiles when memory is exactly linear, 6 for the sample steps (mlp.py,
    narrow_mlp.py, keras_mlp.py:tokens on v5e), more when the compiler rematerialises near the limit. The
    predictions follow whichever line (HBM's, the host's) reaches its capacity first.
    """
    points: dict[int, Measurement] = {}

    def probe(batch: int) -> bool:
        points[batch] = measure(batch)
        return points[batch].fits_within(host_capacity)

    def beyond_the_host(batch: int) -> bool:
        """Offloaded activations are held per sequence: once two compiles hold host memory in exact proportion to
        their batch, a batch whose proportion exceeds the host's capacity cannot run, and is not compiled."""
        held = [(b, p.host_bytes) for b, p in points.items() if p.stats and p.host_bytes]
        if host_capacity is None or len(held) < 2:
            return False
        first_batch, first_bytes = held[0]
        if any(held_bytes * first_batch != first_bytes * b for b, held_bytes in held):
            return False
        return batch * first_bytes > host_capacity * first_batch

    if not probe(step):
        return Search(None, None, list(points.values()), bound=points[step].bound(host_capacity))
    low, high = step, None  # low fits, high (if known) does not
    mode, delta, turn, edge_tried = "start", step, 0, False
    while (high is None and low < limit) or (high is not None and high - low > step):
        predicted = _secant(points, capacity, host_capacity)
        capped = False
        if predicted is None and len(points) == 1:
            # 8 and 256: at tiny batches fixed overheads and on-chip scratch hide the per-example slope
            candidate = low * 32
            if host_capacity is not None and points[low].host_bytes:
                # Offloaded activations grow in proportion to the batch, with no such overheads: jump no
                # further than where that proportion reaches the host's capacity (a host-bound search then
                # ends in 2 compiles: the first batch and the predicted maximum; the one above it holds its
                # proportion, beyond the host, and is not compiled).
                candidate = min(candidate, low * host_capacity // points[low].host_bytes)
        elif predicted is None:  # memory fell as the batch grew (the compiler rematerialises): no line
            if high is None:
                candidate, delta, mode = low + delta, delta * 2, "up"
            else:
                candidate = (low + high) // 2
        elif mode == "start":  # jump to where the line through the last two compiles reaches HBM
            candidate = min(predicted, low * 256, high or limit)
            capped = candidate < predicted  # a far extrapolation is not trusted: jump again from there
        elif mode == "up":  # the jump fitted: step up by doubling strides (or further, to the line) until one fails
            if predicted <= low + step:  # the line puts the boundary here: the next batch should fail
                candidate = low + step
            else:
                candidate = max(predicted, low + delta)
                delta *= 2
        elif mode == "down":  # the jump failed: step down by doubling strides until something fits
            candidate = min(predicted if predicted < high else high, high - delta)
            delta *= 2
        elif predicted is not None and not edge_tried and _at_an_edge(predicted, low, high, step):
            # bracketed, and the line puts the boundary at an edge (it predicted the batch that failed, say): the
            # batch next to that edge, once, before narrowing by halves
            edge_tried = True
            candidate = high - step if predicted >= high else low + step
        else:  # bracketed: the secant (kept off the edges) and the midpoint in turn
            turn += 1
            width = high - low
            inside = predicted is not None and low < predicted < high
            candidate = (min(max(predicted, low + width // 16), high - width // 16)
                         if inside and turn % 2 else (low + high) // 2)
        candidate = _align(candidate, low, high, limit, step, preferred, below=mode == "up")
        fits = False if beyond_the_host(candidate) else probe(candidate)
        if fits:
            low = candidate
        else:
            high = candidate
        if mode == "start" and predicted is not None:
            mode = ("start" if fits else "bisect") if capped else ("up" if fits else "down")
        elif (mode == "up" and not fits) or (mode == "down" and fits):
            mode = "bisect"
    recommended = max((p.batch_size for p in points.values()
                       if p.fits_within(host_capacity) and p.batch_size % preferred == 0), default=None)
    if recommended is None or low // preferred * preferred > recommended:
        recommended = low // preferred * preferred if low >= preferred else low
    ordered = sorted(points.values(), key=lambda p: p.batch_size)
    bound = ("batch_limit" if high is None else "host" if high not in points
             else points[high].bound(host_capacity))
    return Search(low, recommended, ordered, limited=high is None, bound=bound)


def _at_an_edge(predicted: int, low: int, high: int, step: int) -> bool:
    """Whether the line's prediction is at (or just past) the fitting batch LOW or the failing batch HIGH: within
    an eighth of the bracket, not a far overshoot (memory that grows faster than linearly)."""
    near = max(step, (high - low) // 8)
    return high <= predicted <= high + near or low - near <= predicted <= low


def _secant(points: dict[int, Measurement], capacity: int, host_capacity: int | None = None) -> int | None:
    """Where the line through the two largest measured batches reaches the capacity: HBM's, and where the host
    memory grows with the batch, the host's line reaching HOST_CAPACITY too; the smaller (the binding resource).

    Local rather than a global fit: small batches carry fixed overheads that skew the slope.
    """
    predictions = [_line([(b, p.required_bytes) for b, p in points.items() if p.required_bytes is not None],
                         capacity)]
    if host_capacity is not None:
        predictions.append(_line([(b, p.host_bytes) for b, p in points.items() if p.stats], host_capacity))
    return min((p for p in predictions if p is not None), default=None)


def _line(measured: list[tuple[int, int]], capacity: int) -> int | None:
    """Where the line through the two largest batches' bytes reaches CAPACITY; None unless they grow."""
    measured = sorted(measured)
    if len(measured) < 2:
        return None
    (b1, r1), (b2, r2) = measured[-2:]
    if r2 <= r1:
        return None
    slope = (r2 - r1) / (b2 - b1)
    return int(b2 + (capacity - r2) / slope)


def _align(candidate: int, low: int, high: int | None, limit: int, step: int = STEP,
           preferred_step: int = PREFERRED, below: bool = False) -> int:
    """A multiple of STEP strictly between low and high; a nearby multiple of PREFERRED if there is one (BELOW: at
    or below the candidate, nearer the batches that fit, so that it is likely a compile that fits)."""
    top = (high - step) if high is not None else limit
    aligned = min(max(candidate // step * step, low + step), top)
    width = (high if high is not None else aligned) - low
    preferred = (aligned // preferred_step if below else round(aligned / preferred_step)) * preferred_step
    if low < preferred <= top and abs(preferred - aligned) <= max(step, width // 4):
        return preferred
    return aligned


class Compiler:
    """Compiles one SPEC for one target and dtype, through the on-disk cache."""

    def __init__(self, spec, slice_: slices.Slice, dtype: str | None, use_cache: bool = True,
                 on_compile: Callable[[int], None] | None = None, layout_only: bool = False,
                 on_layout: Callable[[int, int], None] | None = None, stop_at_layout: bool = False):
        from tpuprof.sources import tpu_compile

        self.spec = spec
        # Stop a compile once its memory layout alone does not fit (tpu_compile.compile_until_layout): a spec that
        # pickles.
        self.layout_only = layout_only or stop_at_layout
        # Every compile stops at its layout, one that may fit too (a fix's check: seconds, where code generation
        # takes minutes): its figures are a lower bound whatever they say.
        self.stop_at_layout = stop_at_layout
        # A spec that pickles compiles in a child process, to the end unless layout_only: libtpu aborting on a failed
        # check ends the child, not tpuprof, and the layout can be shown while code is generated.
        self.in_child = self.layout_only or getattr(spec, "compiles_in_a_child", False)
        self.target = slice_
        self.dtype = dtype
        self.use_cache = use_cache
        self.on_compile = on_compile
        self.on_layout = on_layout  # (batch, HBM bytes): a layout that may fit, its compile going on (layout_only)
        self.capacity = slice_.target.compiler_hbm_bytes
        self.host_capacity = slice_.target.host_capacity_bytes  # None: no host budget known (v2, v3)
        self.topology = slice_.compile_label  # with the chip config: v4 compiles are megacore
        self.compiles = 0
        self._libtpu = _libtpu_version()
        self._tpu_compile = tpu_compile
        self._memo: dict[int, Measurement] = {}

    def _key(self, batch: int) -> str:
        parts = [CACHE_FORMAT, self.spec.digest, self.spec.factory_name, self.topology, batch,
                 self.dtype or "default", self._libtpu]
        if getattr(self.spec, "mesh_text", None):  # --mesh: the factory's Mesh (the LLM step's digest has it)
            parts.append(self.spec.mesh_text)
        flags = " ".join(os.environ.get("LIBTPU_INIT_ARGS", "").split())
        if flags:  # libtpu compiles with the job's flags (tpu_compile._check_libtpu_flags): another program
            parts.append(flags)
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def measure(self, batch: int, dump: bool = False, need_dump: bool | None = None) -> Measurement:
        """The program's figures at `batch`. `dump`: a new compile keeps its dump; `need_dump` (default:
        `dump`): a cached result without a dump is not enough (the breakdown needs it)."""
        need_dump = dump if need_dump is None else need_dump
        memo = self._memo.get(batch)
        if memo is not None and self._enough(memo, need_dump):
            return memo
        entry = cache_root() / f"{self._key(batch)}.json"
        if self.use_cache and entry.is_file():
            try:
                cached = Measurement(**{**json.loads(entry.read_text()), "cached": True})
            except (ValueError, TypeError, OSError):
                cached = None
            if cached is not None and cached.dump_dir and not _hold(cached.dump_dir):
                cached.dump_dir = None  # the dump was deleted: the figures still hold
            if cached is not None and self._enough(cached, need_dump):
                self._memo[batch] = cached
                return cached
        keep = dump or need_dump or self.in_child  # a layout is read from its dump
        # A layout's dump has no code generation's files: a folder of its own, never taken for a whole compile's.
        folder = cache_root() / f"{self._key(batch)}{'-layout' if self.layout_only else ''}"
        result = self._compile(batch, folder if keep else None)
        self._memo[batch] = result
        _write_json_atomically(entry, {k: v for k, v in result.__dict__.items() if k != "cached"})
        return result

    def _enough(self, measurement: Measurement, need_dump: bool) -> bool:
        """A whole compile answers a layout-only question; a layout does not answer a whole compile's."""
        if measurement.stage != "code" and not self.layout_only:
            return False
        if measurement.stage != "code" and measurement.fits and not self.stop_at_layout:
            return False  # a layout that fits, stopped there: only the whole compile says whether the step fits
        return not need_dump or bool(measurement.dump_dir or measurement.oom_message)

    def drop_dumps(self, keep: set[int]) -> None:
        """Delete the cached dumps of the batches not reported (a search dumps every compile, so
        that the reported one needs no second compile); their figures stay cached."""
        for batch, measurement in list(self._memo.items()):
            if batch in keep or not measurement.dump_dir or not _delete_unless_held(measurement.dump_dir):
                continue
            measurement.dump_dir = None
            entry = cache_root() / f"{self._key(batch)}.json"
            _write_json_atomically(entry, {k: v for k, v in measurement.__dict__.items() if k != "cached"})

    def _compile(self, batch: int, folder: Path | None) -> Measurement:
        if self.on_compile:
            self.on_compile(batch)
        # The user's factory runs here, outside the SIGTERM handler below (a handler raising inside an import of a
        # C extension can crash the interpreter); a layout's child process builds the program itself.
        program = None if self.in_child else self.spec.program(batch, self.dtype, self.target)
        staging = None
        # SIGTERM from here on ends the compile as Ctrl-C does, so the staging folder is never left behind.
        with _terminate_as_exit():
            try:
                staging = self._staging(folder)
                self.compiles += 1
                if self.in_child:
                    on_layout = (lambda laid_out: self.on_layout(batch, laid_out)) if self.on_layout else None
                    stop_above = (0 if self.stop_at_layout else self.capacity + CODEGEN_MARGIN_BYTES) \
                        if self.layout_only else None
                    result = self._tpu_compile.compile_until_layout(self.spec, batch, self.dtype, self.target,
                                                                    staging, stop_above, on_layout=on_layout)
                else:
                    result = program.compile(self.target, staging)
            except BaseException as error:
                # Ctrl-C, SIGTERM (a scheduler's time limit) or a failed compile: the half-written dump goes.
                if staging is not None:
                    shutil.rmtree(staging.parent, ignore_errors=True)
                if isinstance(error, self._tpu_compile.CompileResourceExhausted):
                    return Measurement(batch, False, None, oom_message=error.message)
                if isinstance(error, self._tpu_compile.CompileFailed):
                    from tpuprof.errors import UserError

                    raise UserError(f"libtpu could not compile {self.spec.text} at batch {batch} for "
                                    f"{self.target.topology}: {str(error).strip().splitlines()[0]}") from None
                raise
        dump_dir = None
        if staging is not None:
            for _ in range(2):
                try:
                    staging.rename(folder)  # complete or absent
                except OSError:  # already there: the same program's dump (the key says so), another process's
                    pass
                if _hold(str(folder)):  # else another process deleted it just now: this one's takes its place
                    dump_dir = str(folder)
                    break
            shutil.rmtree(staging.parent, ignore_errors=True)
        required = result.required_bytes  # of a layout: a lower bound, above the capacity (compile_until_layout)
        return Measurement(batch, required <= self.capacity, required, result.memory_analysis(), dump_dir=dump_dir,
                           stage=result.stage)

    @staticmethod
    def _staging(folder: Path | None) -> Path | None:
        """A fresh folder beside FOLDER for the compile's dump until it is complete (None: no dump kept)."""
        if folder is None:
            return None
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_staging(folder.parent)
            # The process id in the name: a later run removes the folder if this process dies (SIGKILL).
            return Path(tempfile.mkdtemp(prefix=f".{folder.name}.{STAGING_MARK}{os.getpid()}.",
                                         dir=folder.parent)) / "dump"
        except OSError as error:
            from tpuprof.errors import UserError

            raise UserError(f"cannot write the compile cache in {folder.parent} ({error.strerror}): "
                            "point XDG_CACHE_HOME at a writable folder.") from None


# Processes share the cache: a max-batch search deletes the dumps of the batches it does not report, while another
# process may be reading one (the same program at the same batch: the step estimate and the memory breakdown read
# the dump lazily). A process holds a shared lock on each dump folder it uses for as long as it runs; a search
# deletes a dump only when it gets that lock exclusively, and otherwise leaves it for the reader.
_HELD: dict[str, int] = {}  # dump folder -> this process's open descriptor holding its shared lock


def _hold(folder: str) -> bool:
    """Hold FOLDER (a dump in the cache) while this process runs; False if it is gone."""
    import fcntl

    if folder in _HELD:
        return True
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    fcntl.flock(descriptor, fcntl.LOCK_SH)  # waits only while a search deletes it
    try:
        present = os.stat(folder).st_ino == os.fstat(descriptor).st_ino
    except OSError:
        present = False
    if not present:
        os.close(descriptor)
        return False
    _HELD[folder] = descriptor
    return True


def _delete_unless_held(folder: str) -> bool:
    """Delete FOLDER unless another process holds it; True if it is gone."""
    import fcntl

    own = _HELD.pop(folder, None)
    if own is not None:
        os.close(own)
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    os.close(descriptor)
    return True


STAGING_MARK = "staging-"  # .<key>.staging-<pid>.<random>: a compile's dump until it is complete
STALE_UNKNOWN_OWNER_S = 24 * 3600  # a staging folder without a process id (older tpuprof) is stale after a day


def remove_stale_staging(root: Path) -> None:
    """Remove the staging folders that processes no longer running left in the cache (killed with SIGKILL, or a
    crash of the machine); a staging folder of a running process is its compile in progress."""
    import time

    try:
        entries = [p for p in root.iterdir() if p.name.startswith(".") and p.is_dir()]
    except OSError:
        return
    for path in entries:
        _, _, owner = path.name.partition(f".{STAGING_MARK}")
        pid = owner.split(".", 1)[0]
        if pid.isdigit():
            if _running(int(pid)):
                continue
        else:
            try:
                if time.time() - path.stat().st_mtime < STALE_UNKNOWN_OWNER_S:
                    continue
            except OSError:
                continue
        shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True


@contextlib.contextmanager
def _terminate_as_exit():
    """SIGTERM (a job scheduler's time limit, `kill`) as SystemExit(143) in the main thread while a compile runs,
    so that its staging folder is removed as on Ctrl-C; the previous handler comes back afterwards. Python runs
    the handler once libtpu's compile returns control to the interpreter."""
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _libtpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return "unknown"


def _write_json_atomically(path: Path, data: dict) -> None:
    from tpuprof.renderers.output import write_atomically

    try:
        write_atomically(path, json.dumps(data, indent=1))
    except OSError:
        pass  # the cache is an optimisation: a read-only cache only costs a recompile next time


def parameter_bytes(spec, dtype, slice_: slices.Slice) -> int | None:
    """Bytes of the weights (and optimizer state) alone, for the message of a step that never fits."""
    if hasattr(spec, "state_bytes_per_device"):  # an LLM step: from the sharding, per device
        return spec.state_bytes_per_device
    program = spec.program(STEP, dtype, slice_.topology)
    other = spec.program(2 * STEP, dtype, slice_.topology) if program.kind == "jax" else None
    try:
        return program.parameter_bytes(other)
    except Exception:  # noqa: BLE001 - an estimate for the message only; the verdict stands without it
        return None


HOST_ADVICE = "offload fewer activations to host memory"


def too_large(parameters: int | None, chosen: Measurement, capacity: int, step: int = STEP,
              host_capacity: int | None = None, host_advice: str = HOST_ADVICE, what: str = "parameters") -> str:
    """The verdict when not even the smallest batch fits: the host's memory when that is what it exceeds (HBM
    advice would not help), else HBM's. WHAT: what PARAMETERS counts (an LLM step's: the weights and AdamW state)."""
    from tpuprof.units import fmt_bytes

    text = f"does not fit even at batch {step}"
    if chosen.bound(host_capacity) == "host":
        if chosen.required_bytes is not None:
            return (f"{text} in host memory: the step holds {fmt_bytes(chosen.host_bytes)} per device there "
                    f"(activations it offloads), more than the {fmt_bytes(host_capacity)} a device may hold; HBM "
                    f"fits ({fmt_bytes(chosen.required_bytes)} of {fmt_bytes(capacity)}): {host_advice}.")
        used = _refused_figures(chosen.oom_message)
        return f"{text} in host memory: the compiler ran out of it{used}; {host_advice}."
    if parameters:
        text += f": {what} alone are {fmt_bytes(parameters)}"
        if parameters > capacity:
            text += f", more than the {fmt_bytes(capacity)} of HBM"
    if chosen.required_bytes is not None:
        text += f" (the step needs {fmt_bytes(chosen.required_bytes)} of {fmt_bytes(capacity)})"
    return text + "."


def _refused_figures(message: str | None) -> str:
    """" (used X of Y)" from a RESOURCE_EXHAUSTED message that states them, else ""."""
    from tpuprof.units import fmt_bytes

    try:
        from tpuprof.analyses import oom
    except ImportError:
        return ""
    report = oom.parse_message(message or "")
    if report is None or not report.used_bytes or not report.capacity_bytes:
        return ""
    return f" (used {fmt_bytes(report.used_bytes)} of {fmt_bytes(report.capacity_bytes)})"


# --- what the step time estimate needs of the step -------------------------------------------------------

def gradient_bytes_per_device(devices: int, parameters: int | None, argument_bytes: int | None,
                              compiled_devices: int = 1) -> tuple[float | None, str]:
    """What each device all-reduces across slices: its share of the f32 gradients once reduced within the
    slice (reduce-scatter over ICI, all-reduce of the shard over DCN, all-gather over ICI). Without a parameter
    count, the compiled step's argument bytes per device (over COMPILED_DEVICES) stand in: an upper bound."""
    devices = devices or 1
    if parameters:
        return 4.0 * parameters / devices, f"{parameters:,} parameters x 4 bytes (f32) / {devices} devices per slice"
    if argument_bytes:
        return (argument_bytes * compiled_devices / devices,
                "the compiled step's argument bytes per device (parameters, optimizer state and batch: an "
                "upper bound on the gradients) / the slice's devices")
    return None, ""


def replica_gradient_bytes(parameters: int | None, state_bytes: int | None) -> tuple[float | None, str]:
    """The gradients a data-parallel replica all-reduces across the slice: f32 per parameter of a known model,
    else the step's batch-independent argument bytes (parameters and optimizer state: exact for a step without
    optimizer state, an upper bound otherwise)."""
    if parameters:
        return 4.0 * parameters, f"data-parallel all-reduce of {parameters:,} f32 gradients"
    if not state_bytes:
        return None, ""
    return float(state_bytes), ("data-parallel all-reduce of the step's batch-independent arguments (parameters and "
                                "optimizer state: an upper bound on the gradients)")


def model_flops_basis(model: dict | None, seq_len: int | None, batch_per_chip: int | None,
                      devices_per_chip: int = 1) -> str:
    """What model_flops_per_device counts for MODEL, in words and figures ("" where it counts nothing)."""
    model = model or {}
    active = model.get("active_parameters") or model.get("parameters")
    if not (active and seq_len and batch_per_chip):
        return ""
    tokens = batch_per_chip / (devices_per_chip or 1) * seq_len
    width = model.get("attention_width") or (model.get("heads") or 0) * (model.get("head_dim") or 0)
    windows, counts = model.get("attention_windows") or {}, {}
    for kind, count in (model.get("layer_kinds") or {}).items():
        counts[kind.split("+")[0]] = counts.get(kind.split("+")[0], 0) + count
    windowed = "".join(f"; {counts[kind]} of them {kind} over {span:,} keys" for kind, span in windows.items()
                       if counts.get(kind))
    widths = model.get("attention_widths") or {}
    if widths:
        windowed += "".join(f"; {kind} layers {value:,} wide" for kind, value in widths.items())
    attention = (f" + causal attention, 12 x tokens x {seq_len:,} keys x {width:,} (heads x head_dim) / 2 in each "
                 f"of {model.get('layers') or 0:,} layers{windowed}" if width
                 else " (attention's own matmuls left out: no head size known)")
    return (f"MaxText's calculate_tflops_training_per_device for {model.get('family') or 'this model'}: 6 x "
            f"{active:,} matmul parameters (those a token uses: no embedding lookup, norms or biases) x "
            f"{tokens:,g} tokens per device{attention}")


def model_flops_per_device(model: dict | None, seq_len: int | None, batch_per_chip: int | None,
                           devices_per_chip: int = 1) -> float | None:
    """MaxText's model FLOPs per device for an LLM of known size (MODEL: tpuprof.sources.llm.Spec.model_info());
    None for other programs."""
    from tpuprof.analyses import step_estimate

    model = model or {}
    parameters = model.get("parameters")
    if not (parameters and seq_len and batch_per_chip):
        return None
    tokens = batch_per_chip / (devices_per_chip or 1) * seq_len
    # An MoE model computes with its active parameters; attention needs heads x head_dim (0: left out).
    active = model.get("active_parameters") or parameters
    width = model.get("attention_width") or (model.get("heads") or 0) * (model.get("head_dim") or 0)
    # Sliding-window and chunked layers attend their window's (chunk's) keys, not the whole sequence.
    windows, kinds = model.get("attention_windows") or {}, model.get("layer_kinds") or {}
    widths = model.get("attention_widths")
    spans = ([(kind.split("+")[0], windows.get(kind.split("+")[0], 0)) for kind, count in kinds.items()
              for _ in range(count)] if (windows or widths) and kinds else None)
    return step_estimate.model_flops(active, tokens, model.get("layers") or 0, seq_len, width, spans=spans,
                                     widths=widths)
