"""Shared test helpers: paths to the committed samples and a runner for the real CLI process."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_profiles"
DUMPS = SAMPLES / "dumps"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, stdin: str | None = None, timeout: float = 300, env: dict | None = None) -> CliResult:
    """Run `tpuprof ARGS` as users do: a separate process, exit code and both streams."""
    merged = {**os.environ, "COLUMNS": "200", **(env or {})}
    process = subprocess.run(
        [sys.executable, "-m", "tpuprof", *map(str, args)],
        input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=merged,
    )
    return CliResult(process.returncode, process.stdout, process.stderr)


@pytest.fixture(scope="session")
def cli():
    return run_cli


def sample_dump(name: str) -> Path:
    folder = DUMPS / name
    if not folder.is_dir():
        pytest.fail(f"sample dump {name} is missing: run `make samples`")
    return folder


def hlo_pb(name: str) -> Path:
    return next(sample_dump(name).glob("*.after_optimizations.hlo.pb"))


@pytest.fixture(scope="session")
def profiler_job(tmp_path_factory):
    """Start a training job of sample_profiles/jobs once per session: profiler_job("jax_job.py", "--slow-loader-ms", "20").

    Returns a jobs_helper.Job (its `.address` is localhost:PORT) that is READY and training; the same
    script and arguments give the same running job to every test; all are stopped at session end. Every job
    runs in its own folder (`job.cwd`), never the one tpuprof runs in, as on a TPU VM.
    """
    from jobs_helper import start_job

    running = {}

    def get(script: str, *args: str):
        key = (script, *args)
        job = running.get(key)
        if job is None or job.process.poll() is not None:
            folder = tmp_path_factory.mktemp("job")
            job = running[key] = start_job(script, *args, cwd=str(folder))
            job.cwd = folder
        return job

    yield get
    for job in running.values():
        job.stop()
