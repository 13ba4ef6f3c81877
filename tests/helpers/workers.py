"""How `make test` splits the suite over xdist workers (a pytest plugin: tests/conftest.py loads it).

Tests that share a session-, module- or class-scoped fixture (a family's compiles, a search, a training job, a Ray
cluster) form one group and run on one worker, so that the fixture is built once; every other test goes to
whichever worker is free. Groups and tests marked slow, then compile, then jobs go out first, so that the many
short tests at the end even out the workers.

The workers compute the groups as they collect (they alone know each test's fixtures) and write them to a folder
the controller names in $TPUPROF_TEST_WORKER_GROUPS; the controller's scheduler (xdist's scope scheduler) reads
them there. xdist's own `xdist_group` marks travel inside node ids, which pytest 9.2 no longer lets a plugin change
(pytest-xdist issue #1386: every test is then scheduled alone), so they are not used.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

GROUPS_VARIABLE = "TPUPROF_TEST_WORKER_GROUPS"
# Session fixtures every worker may hold one of: cheap, or shared by the workers through the run folder (conftest).
SHARED_BY_WORKERS = {"cli", "compile_cache", "cache_home", "run_folder", "one_compile_per_program"}


def _distributing(config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "loadgroup"


def pytest_configure(config):
    if _distributing(config) and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller, before the workers
        os.environ[GROUPS_VARIABLE] = tempfile.mkdtemp(prefix="tpuprof-worker-groups-")


def pytest_unconfigure(config):
    if _distributing(config) and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(os.environ.pop(GROUPS_VARIABLE, ""), ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after conftest's markers, which the order reads
def pytest_collection_modifyitems(config, items):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    folder = os.environ.get(GROUPS_VARIABLE)
    if not (worker and folder):
        return
    groups = worker_groups(items)
    items[:] = longest_first(items, groups)
    written = Path(folder) / f".{worker}.json"
    written.write_text(json.dumps(groups))
    written.replace(Path(folder) / f"{worker}.json")  # complete or absent


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist does not know it
def pytest_xdist_make_scheduler(config, log):
    if not _distributing(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FixtureGroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduler, a scope being a group of worker_groups or a test alone. It asks for a test's
        scope once every worker has collected, so the groups they wrote are there."""

        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                written = sorted(Path(os.environ[GROUPS_VARIABLE]).glob("gw*.json"))
                self.groups = json.loads(written[0].read_text()) if written else {}
            return self.groups.get(nodeid, nodeid)

    return FixtureGroupScheduling(config, log)


def _ours(definition, root: Path) -> bool:
    """Whether a fixture is the suite's (a test file's or conftest's), not pytest's or a plugin's (tmp_path_factory).
    `make test`'s .venv lies inside the clone: a file under the root is ours only outside the installed packages,
    else tmp_path_factory's session scope joins every test into one group and one worker runs the whole suite."""
    path = Path(inspect.getfile(definition.func)).resolve()
    installed = Path(sys.prefix).resolve()
    return root in path.parents and installed not in path.parents and "site-packages" not in path.parts


def longest_first(items, groups: dict[str, str]) -> list:
    """ITEMS with the groups and tests that take longest first, as their markers tell (slow, then compile, then
    jobs), so that the many short tests at the end even out the two workers; otherwise in collection order. xdist
    hands out groups in the order their first test comes (with --no-loadscope-reorder: by default it puts the
    groups with most tests first, and a slow test alone at the end leaves the other worker idle)."""
    rank = {"slow": 0, "compile": 1, "jobs": 2}
    first: dict[str, int] = {}
    for item in items:
        scope = groups.get(item.nodeid, item.nodeid)
        marks = [rank[mark.name] for mark in item.iter_markers() if mark.name in rank]
        first[scope] = min([first.get(scope, len(rank)), *marks])
    return sorted(items, key=lambda item: first[groups.get(item.nodeid, item.nodeid)])


def worker_groups(items) -> dict[str, str]:
    """The xdist group of each test that shares a session-, module- or class-scoped fixture with another (a
    compile of a family, a search, a training job, a Ray cluster): tests joined by such fixtures, directly or
    through each other, form one group, named after its first file. The other tests go to whichever worker is
    free. Fixtures of pytest and its plugins, and SHARED_BY_WORKERS, join nothing."""
    parent: dict = {}

    def root(node):
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    for item in items:
        for name in item.fixturenames:
            definitions = item._fixtureinfo.name2fixturedefs.get(name)
            if not definitions or name in SHARED_BY_WORKERS:
                continue
            definition = definitions[-1]
            if definition.scope == "function" or not _ours(definition, item.config.rootpath):
                continue
            instance = {"module": item.module.__name__, "class": getattr(item.cls, "__qualname__", "")}
            fixture = ("fixture", name, definition.baseid, instance.get(definition.scope, ""))
            parent[root(("test", item.nodeid))] = root(fixture)
    members: dict = {}
    for item in items:
        if ("test", item.nodeid) in parent:
            members.setdefault(root(("test", item.nodeid)), []).append(item)
    groups: dict[str, str] = {}
    for tests in members.values():
        if len(tests) > 1:
            name = base = tests[0].nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
            while name in groups.values():  # two groups that start in one file
                name = f"{base}-{int(name.rpartition('-')[2]) + 1 if name != base else 2}"
            groups.update((test.nodeid, name) for test in tests)
    return groups
