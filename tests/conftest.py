"""Shared fixtures: the committed samples, the CLI runner, one compile cache per session, training jobs.

The helpers live in tests/helpers/ (a package); tests import them as `helpers.<module>`.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from helpers.cli import CliResult, run_cli, run_cli_process  # noqa: F401 - imported from here by the tests
from helpers.paths import DUMPS, ROOT, SAMPLES  # noqa: F401 - imported from here by the tests

# Tests written before tests/helpers/ existed import these modules by their former top-level names.
FORMER_NAMES = {"browser": "helpers.browser", "golden": "helpers.golden", "jobs_helper": "helpers.jobs",
                "perfetto_reader": "helpers.perfetto_reader", "real_data": "helpers.real_data",
                "sample_documents": "helpers.sample_documents", "synthetic_xspace": "helpers.synthetic_xspace",
                "xprof_oracle": "helpers.xprof_oracle"}
for _former, _module in FORMER_NAMES.items():
    sys.modules.setdefault(_former, importlib.import_module(_module))


# Session fixtures that compile with libtpu (besides compile_cache) or start a job, by name (tests/test_*.py).
COMPILING_FIXTURES = {"compile_cache", "family_runs", "gemma3_1b_v5e", "llama8b_v6e4", "compiled", "sharded",
                      "sparsecore_all_reduce", "oom_job"}
JOB_FIXTURES = {"profiler_job", "oom_job", "ray_cluster"}


def pytest_collection_modifyitems(items):
    """Tests that use a compiling fixture (the session's compile cache, a family's or a serving model's compiles)
    compile with libtpu, those that use a training job start one: marked so (pyproject.toml registers the
    markers) without each test saying it again."""
    for item in items:
        fixtures = set(item.fixturenames)
        if fixtures & COMPILING_FIXTURES or "[preflight/" in item.nodeid:  # or a preflight sample's document
            item.add_marker(pytest.mark.compile)
        if fixtures & JOB_FIXTURES:
            item.add_marker(pytest.mark.jobs)


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture(scope="session")
def compile_cache(cache_home):
    """The session's preflight compile cache (its XDG_CACHE_HOME): a program compiled by one test is a cache hit
    for every other. Tests about the cache itself (what it holds, what a first run compiles) use their own."""
    return cache_home


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory):
    """What runs without naming a cache (tpuprof.serve() and tpuprof.preflight() in this process, CLI processes)
    caches its compiles in the session's compile cache, never in the user's ~/.cache: a fresh clone compiles what
    its tests need once, and no run is faster or slower for what an earlier run left in the home folder. (Not named
    compile_cache, which marks the tests that use it as compiling.)"""
    folder = tmp_path_factory.mktemp("compile-cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def sample_dump(name: str):
    folder = DUMPS / name
    if not folder.is_dir():
        pytest.fail(f"sample dump {name} is missing: run `make samples`")
    return folder


def hlo_pb(name: str):
    return next(sample_dump(name).glob("*.after_optimizations.hlo.pb"))


@pytest.fixture(scope="session")
def profiler_job(tmp_path_factory):
    """Start a training job of sample_profiles/jobs once per session: profiler_job("jax_job.py", "--slow-loader-ms", "20").

    Returns a helpers.jobs.Job (its `.address` is localhost:PORT) that is READY and training; the same
    script and arguments give the same running job to every test; all are stopped at session end. Every job
    runs in its own folder (`job.cwd`), never the one tpuprof runs in, as on a TPU VM.
    """
    from helpers.jobs import start_job

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
