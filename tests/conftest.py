"""Shared fixtures: the committed samples, the CLI runner, one compile cache per session, training jobs.

The helpers live in tests/helpers/ (a package); tests import them as `helpers.<module>`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys

import pytest

from helpers.cli import CliResult, run_cli, run_cli_process  # noqa: F401 - imported from here by the tests
from helpers.jobs import RUN_FOLDER_VARIABLE
from helpers.paths import DUMPS, ROOT, SAMPLES  # noqa: F401 - imported from here by the tests

# helpers.workers: how `make test` splits the suite over xdist workers; pytester: tests/test_workers.py runs
# small suites of its own.
pytest_plugins = ["helpers.workers", "pytester"]

# The xdist worker this process is (gw0, gw1, ...), empty in a run without workers.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")

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


@pytest.hookimpl(tryfirst=True)  # before helpers.workers groups and orders them
def pytest_collection_modifyitems(config, items):
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
def cache_home(run_folder):
    """What runs without naming a cache (tpuprof.serve() and tpuprof.preflight() in this process, CLI processes)
    caches its compiles in the session's compile cache, never in the user's ~/.cache: a fresh clone compiles what
    its tests need once, and no run is faster or slower for what an earlier run left in the home folder. With
    xdist the workers share it, so that what one compiles the other finds. (Not named compile_cache, which marks
    the tests that use it as compiling.)"""
    folder = run_folder / "compile-cache"
    folder.mkdir(exist_ok=True)
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory):
    """The test run's temporary folder, one for all its xdist workers (each worker's own basetemp is a folder in
    it); helpers that coordinate the workers find it in $TPUPROF_TEST_RUN_FOLDER (helpers.jobs.free_port,
    helpers.sample_documents)."""
    folder = tmp_path_factory.getbasetemp()
    if WORKER:
        folder = folder.parent
    saved = os.environ.get(RUN_FOLDER_VARIABLE)
    os.environ[RUN_FOLDER_VARIABLE] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop(RUN_FOLDER_VARIABLE, None)
    else:
        os.environ[RUN_FOLDER_VARIABLE] = saved


@pytest.fixture(scope="session", autouse=True)
def one_compile_per_program(run_folder):
    """Under xdist, a program is compiled by one worker at a time: the other waits for it and then finds it in the
    shared cache. Without the lock both would compile it, and the second would replace the dump folder of the
    first while its test reads it (preflight renames a complete dump into place; the cache's JSON entries are
    written atomically). One worker alone needs no lock."""
    if not WORKER:
        yield
        return
    from filelock import FileLock

    from tpuprof.analyses import preflight

    locks = run_folder / "compile-locks"
    locks.mkdir(exist_ok=True)
    measure = preflight.Compiler.measure

    def measure_alone(self, batch, *args, **kwargs):
        # The key names the program; the cache folder is part of the lock's name, as tests with a cache of their
        # own compile the same program into another folder.
        where = f"{preflight.cache_root()}/{self._key(batch)}"
        with FileLock(locks / f"{hashlib.sha256(where.encode()).hexdigest()[:32]}.lock"):
            return measure(self, batch, *args, **kwargs)

    preflight.Compiler.measure = measure_alone
    yield
    preflight.Compiler.measure = measure


def sample_dump(name: str):
    folder = DUMPS / name
    if not folder.is_dir():
        pytest.fail(f"sample dump {name} is missing: run `make samples`")
    return folder


def hlo_pb(name: str):
    return next(sample_dump(name).glob("*.after_optimizations.hlo.pb"))


# The training jobs profiler_job started, by script and arguments; and the last test of the run that uses one.
RUNNING_JOBS: dict = {}
LAST_JOB_USER: list = []


def pytest_collection_finish(session):
    users = [item for item in session.items if "profiler_job" in item.fixturenames]
    LAST_JOB_USER[:] = users[-1:]


def pytest_runtest_teardown(item, nextitem):
    """A job trains until it is stopped (each takes a sixth of a core): stopped once the last test that uses one
    is done, not at the end of the run. The tests that use a job run on one worker, in order (helpers.workers)."""
    if LAST_JOB_USER and item is LAST_JOB_USER[0]:
        stop_jobs()


def stop_jobs():
    for job in RUNNING_JOBS.values():
        job.stop()
    RUNNING_JOBS.clear()


@pytest.fixture(scope="session")
def profiler_job(tmp_path_factory):
    """Start a training job of sample_profiles/jobs once per session: profiler_job("jax_job.py", "--slow-loader-ms", "20").

    Returns a helpers.jobs.Job (its `.address` is localhost:PORT) that is READY and training; the same
    script and arguments give the same running job to every test; all are stopped after the last test that
    uses one. Every job runs in its own folder (`job.cwd`), never the one tpuprof runs in, as on a TPU VM.
    """
    from helpers.jobs import start_job

    def get(script: str, *args: str):
        key = (script, *args)
        job = RUNNING_JOBS.get(key)
        if job is None or job.process.poll() is not None:
            folder = tmp_path_factory.mktemp("job")
            job = RUNNING_JOBS[key] = start_job(script, *args, cwd=str(folder))
            job.cwd = folder
        return job

    yield get
    stop_jobs()
