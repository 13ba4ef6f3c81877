"""The tests' CLI runner (tests/helpers/cli.py): a command line run in the test process gives what a separate
`python -m tpuprof` process gives, to the byte: exit code, stdout and stderr (usage errors through typer's
standalone mode, help, our UserError, stdin, tables at the given width, JSON, Markdown, --fail-if's exit 1), and
the test process is left as it was."""

from __future__ import annotations

import os
import sys

import pytest

from helpers.cli import needs_process, run_cli, run_in_process, run_cli_process
from helpers.paths import ROOT

OOM_TEXT = (ROOT / "sample_profiles" / "oom" / "libtpu_transformer_v5e.txt").read_text()

COMMAND_LINES = {
    "version": (["--version"], None, None),
    "alone": ([], None, {"COLUMNS": "80"}),
    "usage error": (["memroy", "x"], None, None),
    "bad value": (["memory", "--top", "abc", "DIR"], None, None),
    "help": (["oom", "-h"], None, None),
    "user error": (["memory", "/nonexistent"], None, None),
    "memory tables": (["memory", "sample_profiles/dumps/conv18_f32_v5e"], None, {"COLUMNS": "100"}),
    "memory json": (["memory", "sample_profiles/dumps/transformer_bf16_v6e", "--json"], None, None),
    "oom stdin": (["oom", "--batch", "128"], OOM_TEXT, None),
    "oom nothing on stdin": (["oom"], "", None),
    "analyze markdown": (["analyze", "sample_profiles/captures/tf_slow_map", "--format", "markdown"], None, None),
    "diff trips": (["diff", "sample_profiles/dumps/diff_b64", "sample_profiles/dumps/diff_b128", "--fail-if",
                    "peak_heap_bytes>+5%"], None, None),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("name", COMMAND_LINES)
def test_in_process_equals_a_process_of_its_own(name):
    args, stdin, env = COMMAND_LINES[name]
    assert needs_process(tuple(args), env) is None
    mine = run_in_process(tuple(args), stdin, env)
    theirs = run_cli_process(*args, stdin=stdin, env=env)
    assert (mine.returncode, mine.stderr) == (theirs.returncode, theirs.stderr)
    assert mine.stdout == theirs.stdout


def test_the_test_process_is_left_as_it_was():
    before = (dict(os.environ), sys.path[:], os.getcwd(), sys.stdin, sys.stdout, sys.stderr)
    result = run_cli("memory", "sample_profiles/dumps/conv18_f32_v5e", "--json", env={"XDG_CACHE_HOME": "/nonexistent"})
    assert result.returncode == 0 and result.stdout.startswith("{")
    assert (dict(os.environ), sys.path[:], os.getcwd(), sys.stdin, sys.stdout, sys.stderr) == before


def test_what_needs_a_process_of_its_own():
    assert needs_process(("memory", "x"), {"COLUMNS": "80", "XDG_CACHE_HOME": "/c"}) is None
    assert needs_process(("memory", "x"), dict(os.environ)) is None  # the environment as it is
    assert needs_process(("memory", "x"), {"PYTHONPATH": "/tmp"})  # a sitecustomize runs at start-up
    assert needs_process(("memory", "x", "--verbose"), None)  # libraries print as they load
    assert needs_process(("capture", "--port", "1"), None)
    assert needs_process(("analyze", "gs://bucket/logs"), None)
    assert needs_process(("analyze", "x", "--ray", "auto"), None)
