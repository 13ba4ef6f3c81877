"""Start the training jobs of sample_profiles/jobs on free loopback ports, wait for READY, stop them.

The jobs build their bottleneck in (see each job's docstring); tests capture them with the real profiler
client. Used by the session-scoped `profiler_job` fixture in conftest.py, so each distinct job runs once
per test session.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.paths import SAMPLES

JOBS_DIR = SAMPLES / "jobs"


# The test run's folder shared by its xdist workers (conftest's run_folder sets it).
RUN_FOLDER_VARIABLE = "TPUPROF_TEST_RUN_FOLDER"


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick, released at once), and none this test run handed
    out before, in this process or another xdist worker: a job binds its port seconds after the pick, and an
    address a test keeps dead must not become another worker's job."""
    run_folder = os.environ.get(RUN_FOLDER_VARIABLE)
    if not run_folder:
        return _kernel_port()
    from filelock import FileLock

    given = Path(run_folder) / "ports-given.txt"
    with FileLock(f"{given}.lock"):
        taken = set(given.read_text().split()) if given.exists() else set()
        port = _kernel_port()
        while str(port) in taken:
            port = _kernel_port()
        with open(given, "a") as record:
            record.write(f"{port}\n")
    return port


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Job:
    script: str
    args: tuple
    port: int
    process: subprocess.Popen
    log_path: str
    started_s: float = field(default=0.0)  # seconds from launch to READY

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def start_job(script: str, *args: str, seconds: float = 900, timeout: float = 180, cwd: str | None = None) -> Job:
    """Launch sample_profiles/jobs/<script> on a free port, in the folder CWD (a job runs in its own folder, as on
    a TPU VM), and return once it printed READY."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"tpuprof-job-{port}-", suffix=".log", delete=False)
    command = [sys.executable, str(JOBS_DIR / script), "--port", str(port), "--seconds", str(seconds), *args]
    launched = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=cwd)
    log.close()
    job = Job(script, tuple(args), port, process, log.name)
    wait_ready(job, timeout)
    job.started_s = time.monotonic() - launched
    return job


def wait_ready(job: Job, timeout: float) -> None:
    selector = selectors.DefaultSelector()
    selector.register(job.process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=1.0):
                if job.process.poll() is not None:
                    break
                continue
            line = job.process.stdout.readline()
            if line.strip() == "READY":
                return
            if not line:  # EOF: the job died
                break
    finally:
        selector.close()
    tail = job.log_tail()
    job.stop()
    raise RuntimeError(f"{job.script} {' '.join(job.args)} did not print READY within {timeout:.0f}s:\n{tail}")
