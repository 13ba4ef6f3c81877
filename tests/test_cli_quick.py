"""The quick parse of plain command lines (tpuprof/cli_lazy.py) reads every command line exactly as typer does, or
leaves it to typer; and a plain command line runs without importing typer."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from conftest import ROOT
from tpuprof import cli
from tpuprof.cli_lazy import Commands

# Command lines typer accepts: every kind of parameter (flags, flag pairs, ints with a minimum, enums, paths,
# repeated options, variadic and optional arguments, callbacks), options before, between and after arguments.
ACCEPTED = [
    ["analyze", "x"],
    ["analyze", "a", "b", "--top", "5", "--format", "markdown"],
    ["analyze", "--json", "a", "--top=0", "b", "--csv", "steps", "--workers", "2", "--ray", "auto", "-v"],
    ["analyze", "x", "--top", "3", "--top", "4"],
    ["memory", "d", "--compile", "-m", "x", "--target", "v5e"],
    ["memory", "--no-compile", "d.txt", "--target", "trillium", "--csv", "ops", "--json"],
    ["memory", "d", "--module=train_step", "--top", "0", "--verbose"],
    ["memory", "d", "--compile", "--no-compile", "-m", "a", "-m", "b", "--json", "--json", "--top", " 7"],
    ["oom"],
    ["oom", "-"],
    ["oom", "log.txt", "--batch", "128", "--dump", "dumps/x", "--target", "v6e-8", "--format", "json"],
    ["diff", "a", "b", "--fail-if", "peak_heap_bytes>+5%", "--fail-if", "median_ms>+2", "--batches", "64,128"],
    ["diff", "a", "b"],
    ["preflight", "--model", "llama3.1-8b", "--tpu", "v5e,v6e", "--seq", "8192", "--max-batch", "--remat", "all"],
    ["preflight", "m.py:factory", "--tpu", "v5e:2x2", "--batch", "32", "--compare-bf16", "--no-cache",
     "--tokens-per-example", "2048", "--price", "v6e=2.70", "--mesh", "fsdp=-1,tensor=4", "--dtype", "fp8"],
    ["report", "a", "b.json", "-o", "page.html", "--title", "step 128", "--target", "v5p", "--top", "20"],
    ["trace", "logs", "-o", "t.pftrace", "--steps", "10:13", "--hosts", "w0,w1", "--force", "--json"],
    ["capture", "--tpu", "my-tpu", "--zone", "z", "--duration", "5s", "--analyze", "--host-tracer-level", "3"],
    ["capture", "--service-addr", "localhost:9012", "--logdir", "gs://b/logs", "--port", "9012", "--delay", "1s"],
    ["guide"],
    ["serve", "--model", "llama3.1-70b", "--tpu", "v6e-8,v5p-16", "--max-model-len", "8192", "--concurrency", "64",
     "--gpu-memory-utilization", "0.9", "--engine", "sglang-jax", "--kv-cache-dtype", "fp8", "--no-compile",
     "--enable-expert-parallel", "--quantization", "int8", "--block-size", "32", "--input-len", "100"],
]

# Command lines the quick parse must leave to typer: help, errors, anything click reads in its own way.
LEFT_TO_TYPER = [
    [], ["--version"], ["-h"], ["analyze", "-h"], ["analyze", "x", "--help"], ["memroy", "x"], ["memory"],
    ["analyze"], ["diff", "a"], ["diff", "a", "b", "c"], ["preflight", "x.py:f"],
    ["memory", "--top", "abc", "DIR"], ["memory", "--target", "v9", "DIR"], ["memory", "--csv", "steps", "DIR"],
    ["preflight", "x.py:f", "--tpu", "v5e,v9"], ["memory", "--frobnicate", "DIR"], ["analyze", "--workers", "0", "x"],
    ["analyze", "x", "--top"], ["analyze", "x", "--json=1"], ["analyze", "--", "x"], ["memory", "-vm", "x", "d"],
    ["report", "a", "--title", "-x"], ["memory", "", "--json"], ["memory", "d", "--top", "5.0"],
    ["memory", "d", "--format", "JSON"], ["memory", "d", "--compile=1"], ["analyze", "x", "-5"],
]


@pytest.fixture(scope="module")
def recording():
    """The CLI's own declarations, each command's function replaced by one that records what it is given."""
    seen: list[dict] = []
    commands = Commands(name=cli.commands.name, version=cli.commands.version, **cli.commands.settings)
    for command in cli.commands.commands.values():
        declared = command.callback.__wrapped__

        def record(**values):
            seen.append(values)

        functools.update_wrapper(record, declared)  # the declared parameters and annotations
        settings = {k: v for k, v in command.settings.items() if k != "short_help"}
        commands.command(**settings)(record)
    return commands, seen


def _typer_reads(recording, args):
    commands, seen = recording
    seen.clear()
    commands.typer_app()(args=args, prog_name="tpuprof", standalone_mode=False)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_the_quick_parse_reads_a_plain_command_line_as_typer_does(recording, args):
    parsed = recording[0].quick_parse(args)
    assert parsed is not None, "a plain command line went to typer"
    assert parsed[1] == _typer_reads(recording, args)


@pytest.mark.parametrize("args", LEFT_TO_TYPER, ids=" ".join)
def test_help_errors_and_unusual_command_lines_are_left_to_typer(recording, args):
    assert recording[0].quick_parse(args) is None


def test_every_declared_parameter_is_within_the_quick_parse():
    """A declaration the quick parse does not know (a new setting or type) would send its command to typer on every
    run, silently slower: each command must have its table."""
    for command in cli.commands.commands.values():
        command.quick_table()


def test_completion_is_left_to_typer(recording, monkeypatch):
    monkeypatch.setenv("_TPUPROF_COMPLETE", "complete_bash")
    assert recording[0].quick_parse(["analyze", "x"]) is None


def test_a_plain_command_line_does_not_import_typer():
    code = ("import sys; from tpuprof import cli\n"
            "cli.main(['analyze', sys.argv[1], '--json'])\n"
            "assert 'typer' not in sys.modules, 'typer imported'\n")
    capture = ROOT / "sample_profiles" / "captures" / "jax_compute"
    done = subprocess.run([sys.executable, "-c", code, str(capture)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"schema": "tpuprof.analyze/1"' in done.stdout
