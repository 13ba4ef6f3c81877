"""Run mutated inputs through a target in a worker process with a time and a memory limit, and sort the outcomes.

An input's outcome is one of:
- ok: the command finished (or `diff` exited 1 for a tripped --fail-if, which is what it is for);
- user_error: a `UserError` of one line, which the CLI prints as one sentence with exit code 2;
- crash: any other exception, a UserError that is not one line, or a warning (numpy's RuntimeWarning on overflow
  reaches the user's stderr);
- hang: the input ran longer than the time limit (SIGALRM in the worker; a regex stuck in C is killed by the parent);
- memory: the worker ran out of its address-space limit (MemoryError) or was killed for it.

Crashes are grouped by class (exception type and innermost tpuprof frame); the first input of each class is saved.
The worker is forked from the process that loaded the targets, so each input costs only its own run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import multiprocessing
import os
import resource
import shutil
import signal
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

GOOD = ("ok", "user_error")


class Hang(BaseException):
    """Raised by SIGALRM in the worker: BaseException so that the code under test cannot catch it."""


@dataclass
class Outcome:
    status: str
    key: str = ""
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Stats:
    target: str
    inputs: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    classes: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # key -> (count, saved input, detail)
    slowest: float = 0.0
    worker_peak_mb: float = 0.0

    @property
    def bad(self) -> int:
        return sum(n for status, n in self.counts.items() if status not in GOOD)

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return (f"{self.target}: {self.inputs} inputs in {self.seconds:.0f} s ({self.inputs / max(self.seconds, 1e-9):.0f}/s;"
                f" {counts}; slowest input {self.slowest:.2f} s; worker peak RSS {self.worker_peak_mb:.0f} MB)")


def _innermost(tb_exc: BaseException) -> str:
    frames = traceback.extract_tb(tb_exc.__traceback__)
    ours = [f for f in frames if "/tpuprof/" in f.filename] or frames
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{Path(frame.filename).name}:{frame.name}:{frame.lineno}"


def run_one(target, data: bytes, workdir: Path) -> Outcome:
    """Run one input in this process (the worker, or a debugger with --replay)."""
    started = time.perf_counter()
    outcome = _run(target, data, workdir)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _run(target, data: bytes, workdir: Path) -> Outcome:
    from tpuprof.errors import UserError

    for leftover in workdir.iterdir():
        if not leftover.name.startswith("intact"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    path = workdir / target.filename
    path.write_bytes(data)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(sink), \
                contextlib.redirect_stderr(sink):
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
            target.run(path, data)
        if caught:
            w = caught[0]
            return Outcome("crash", f"{w.category.__name__} at {Path(w.filename).name}:{w.lineno}", str(w.message))
        return Outcome("ok")
    except UserError as error:
        message = str(error)
        if "\n" in message or not message.strip() or len(message) > 1000:
            return Outcome("crash", f"UserError not one sentence at {_innermost(error)}", message[:2000])
        return Outcome("user_error", detail=message)
    except Hang as error:
        return Outcome("hang", f"hang at {_innermost(error)}", traceback.format_exc()[-3000:])
    except MemoryError as error:
        return Outcome("memory", f"MemoryError at {_innermost(error)}", traceback.format_exc()[-3000:])
    except SystemExit as error:
        if error.code in (0, None):
            return Outcome("ok")
        return Outcome("crash", f"SystemExit({error.code}) at {_innermost(error)}", traceback.format_exc()[-3000:])
    except BaseException as error:  # noqa: BLE001 - any other exception is what we are looking for
        return Outcome("crash", f"{type(error).__name__} at {_innermost(error)}", traceback.format_exc()[-3000:])


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _serve(conn, targets: dict, timeout: float, memory_mb: int, workdir: str) -> None:
    limit = _vm_bytes() + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def alarm(signum, frame):
        raise Hang()

    signal.signal(signal.SIGALRM, alarm)
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            name, data = conn.recv()
        except EOFError:
            return
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            outcome = run_one(targets[name], data, folder)
        except Hang:
            outcome = Outcome("hang", "hang outside the command", "", timeout)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        conn.send((outcome.status, outcome.key, outcome.detail, outcome.seconds, peak))


class Worker:
    """One forked worker process; restarted after it dies or hangs."""

    def __init__(self, targets: dict, timeout: float = 10.0, memory_mb: int = 1536, workdir: Path | None = None):
        self.targets, self.timeout, self.memory_mb = targets, timeout, memory_mb
        self.workdir = str(workdir or Path("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp") / f"tpuprof-fuzz-{os.getpid()}")
        self.process = None
        self.peak_mb = 0.0

    def start(self) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, daemon=True,
                                       args=(child, self.targets, self.timeout, self.memory_mb, self.workdir))
        self.process.start()
        child.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def run(self, name: str, data: bytes) -> Outcome:
        if self.process is None or not self.process.is_alive():
            self.start()
        try:
            self.conn.send((name, data))
            if self.conn.poll(self.timeout + 5):
                status, key, detail, seconds, peak = self.conn.recv()
                self.peak_mb = max(self.peak_mb, peak)
                return Outcome(status, key, detail, seconds)
            self.process.kill()
            self.process.join()
            self.process = None
            return Outcome("hang", "hang in native code (killed by the parent)", "", self.timeout + 5)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.process.join()
            code = self.process.exitcode
            self.process = None
            if code == -signal.SIGKILL:
                return Outcome("memory", "worker killed (SIGKILL: out of memory?)", "")
            return Outcome("crash", f"worker died with exit code {code}", "")


def campaign(target, worker: Worker, seed: int, seconds: float | None = None, inputs: int | None = None,
             crashes: Path | None = None, progress=None) -> Stats:
    """Mutate TARGET's samples for SECONDS or INPUTS (whichever ends first) with a seeded RNG."""
    import random

    rng = random.Random(f"{seed}:{target.name}")
    stats = Stats(target.name)
    started = time.monotonic()
    last_report = started
    while True:
        elapsed = time.monotonic() - started
        if (seconds is not None and elapsed >= seconds) or (inputs is not None and stats.inputs >= inputs):
            break
        data = target.mutate(rng)
        outcome = worker.run(target.name, data)
        stats.inputs += 1
        stats.counts[outcome.status] = stats.counts.get(outcome.status, 0) + 1
        if outcome.seconds > stats.slowest:
            stats.slowest = outcome.seconds
            if crashes is not None and outcome.seconds > 1.0:  # kept to look at: the next hang may be near it
                (crashes / target.name).mkdir(parents=True, exist_ok=True)
                (crashes / target.name / f"slowest{Path(target.filename).suffix}").write_bytes(data)
        if outcome.status not in GOOD:
            count, saved, detail = stats.classes.get(outcome.key, (0, "", outcome.detail))
            if not saved and crashes is not None:
                folder = crashes / target.name
                folder.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha1(data).hexdigest()[:12]
                saved_path = folder / f"{digest}{Path(target.filename).suffix or '.bin'}"
                saved_path.write_bytes(data)
                saved_path.with_suffix(saved_path.suffix + ".why").write_text(f"{outcome.key}\n\n{outcome.detail}\n")
                saved = str(saved_path)
            stats.classes[outcome.key] = (count + 1, saved, detail)
        if progress is not None and time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            stats.seconds = last_report - started
            stats.worker_peak_mb = worker.peak_mb
            progress(stats)
    stats.seconds = time.monotonic() - started
    stats.worker_peak_mb = worker.peak_mb
    return stats
