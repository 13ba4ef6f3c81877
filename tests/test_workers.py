"""How `make test` splits the suite over xdist workers (tests/conftest.py): tests that share a fixture wider than a
test run on one worker, so that it is built once; what is marked slow goes out first."""

from __future__ import annotations

import os

import pytest

from helpers.paths import ROOT
from helpers.workers import longest_first, worker_groups

SHARED = '''
import pytest

@pytest.fixture(scope="session")
def job():
    return "a training job"

@pytest.fixture(scope="session")
def compile_cache():
    return "the run's compile cache, shared by the workers"
'''

FIRST = '''
import pytest

@pytest.fixture(scope="module")
def compiled():
    return "a compile"

def test_one(compiled): pass
def test_two(compiled): pass
def test_alone(tmp_path, compile_cache): pass
def test_with_the_job(job): pass

@pytest.mark.slow
def test_slow(): pass
'''

SECOND = '''
def test_with_the_job_too(job): pass
def test_other(): pass
'''


def test_tests_that_share_a_wider_fixture_form_one_group(pytester):
    pytester.makeconftest(SHARED)
    pytester.makepyfile(test_first=FIRST, test_second=SECOND)
    items, _ = pytester.inline_genitems()
    groups = {item.nodeid.split("::")[1]: name for item in items if (name := worker_groups(items).get(item.nodeid))}
    # The module's compile and the session's job are two groups (the job's spans both files); a test with only
    # function-scoped fixtures, or the compile cache every worker shares, belongs to none.
    assert groups == {"test_one": "test_first", "test_two": "test_first",
                      "test_with_the_job": "test_first-2", "test_with_the_job_too": "test_first-2"}


def test_a_test_marked_slow_goes_first(pytester):
    pytester.makeconftest(SHARED)
    pytester.makepyfile(test_first=FIRST, test_second=SECOND)
    items, _ = pytester.inline_genitems()
    order = [item.nodeid.split("::")[1] for item in longest_first(items, worker_groups(items))]
    assert order[0] == "test_slow" and sorted(order) == sorted(item.nodeid.split("::")[1] for item in items)


SPREAD = '''
import pytest

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    with open(BUILDS, "a") as builds:
        builds.write("built\\n")
    return "a compile"

''' + "\n".join(f"def test_alone_{n}(): pass\ndef test_shared_{n}(compiled): pass" for n in range(8))


def test_a_module_fixture_is_built_once_over_two_workers(pytester, monkeypatch):
    """The whole path of `make test`: two xdist workers, --dist loadgroup, this plugin. Its tests sit between
    tests that share nothing, so that xdist alone hands them to both workers."""
    pytest.importorskip("xdist")
    builds = pytester.path / "builds.txt"
    pytester.makepyfile(test_spread=f"BUILDS = {str(builds)!r}\n" + SPREAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "helpers.workers")
    result.assert_outcomes(passed=16)
    assert builds.read_text().splitlines() == ["built"]


def test_no_fixture_of_pytest_joins_the_suites_tests(request, tmp_path):
    """Over this run's own tests: tmp_path is built from pytest's session-scoped tmp_path_factory, and `make test`'s
    .venv lies inside the clone. A test like this one, with only function-scoped fixtures of the suite, shares
    nothing and belongs to no group (when pytest's fixtures counted as the suite's, every test was in one group and
    one worker ran the whole suite)."""
    groups = worker_groups(request.session.items)
    assert request.node.nodeid not in groups
