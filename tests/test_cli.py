"""First contact: what a new user types before anything works. Usage errors, help, version and shell
completion, each run as a separate `tpuprof` process (exit code, both streams)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, run_cli_process
from tpuprof import __version__, targets

COMMANDS = ("memory", "oom", "analyze", "capture", "report", "diff", "preflight", "serve", "trace", "guide")

# (arguments, what stderr must say): every usage error of issue #10 and a few more. A command, option or argument
# that is unknown or missing gets click's usage line; a bad value gets one sentence naming the option.
USAGE_ERRORS = [
    (["memroy", "x"], "No such command 'memroy'. Did you mean 'memory'?"),
    (["memory"], "Missing argument 'PATH'."),
    (["diff", "a"], "Missing argument 'B'."),
    (["preflight", "x.py:f"], "Missing option '--tpu'."),
    (["serve", "--tpu", "v6e-8"], "Missing option '--model'."),
    (["memory", "--frobnicate", "DIR"], "No such option: --frobnicate"),
    (["report"], "Missing argument 'INPUT...'."),
]
BAD_VALUES = [
    (["memory", "--top", "abc", "DIR"], "Invalid value for '--top': 'abc' is not a valid int range."),
    (["memory", "--target", "v9", "DIR"], "Invalid value for '--tpu' / '--target': unknown TPU target 'v9'"),
    (["memory", "--csv", "steps", "DIR"], "Invalid value for '--csv': 'steps' is not one of 'buffers', 'ops'."),
    (["analyze", "--csv", "buffers", "DIR"], "'buffers' is not one of 'steps', 'ops', 'stages'."),
    (["preflight", "x.py:f", "--tpu", "v5e,v9"], "unknown TPU target 'v9'"),
    (["serve", "--model", "llama3.1-8b", "--tpu", "v9z-8"], "Invalid value for '--tpu': unknown TPU target 'v9z-8'"),
    (["serve", "--model", "llama3.1-8b", "--tpu", "v6e-8", "--engine", "foo"],
     "Invalid value for '--engine': 'foo' is not one of 'vllm', 'sglang-jax', 'jetstream'."),
    (["serve", "--model", "llama3.1-8b", "--tpu", "v6e-8", "--concurrency", "abc"],
     "Invalid value for '--concurrency': 'abc' is not a valid int"),
    (["oom", "--tpu", "v9", "log.txt"], "unknown TPU target 'v9'"),
]


@pytest.mark.parametrize("args,message", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_error_is_the_usage_line_and_one_sentence(args, message):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("Usage: tpuprof") and len(lines) <= 4, result.stderr


@pytest.mark.parametrize("args,message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_a_bad_value_is_one_sentence(args, message):
    """The house rule for bad input, for every command alike: one sentence on stderr naming the option and the
    value, exit 2; no usage line (the option is known, its value is what is wrong)."""
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tpuprof: "), result.stderr
    assert message in result.stderr and "Usage:" not in result.stderr and result.stdout == ""


def test_with_json_a_bad_value_is_the_same_sentence_in_the_document():
    result = run_cli("serve", "--model", "llama3.1-8b", "--tpu", "v9z-8", "--json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "usage" and result.stderr == f"tpuprof: {error['message']}\n"


@pytest.mark.subprocess
def test_the_installed_console_script():
    """`tpuprof` as pip installs it (the console script beside this Python; in a fresh clone's .venv it runs
    the checkout): a usage error, the help and the version, as in the tests above."""
    script = Path(sys.executable).parent / "tpuprof"
    if not script.exists():
        pytest.skip(f"no tpuprof console script beside {sys.executable}: pip install -e . to test it")

    def run(*args):
        return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "COLUMNS": "100"})

    typo = run("memroy", "x")
    assert typo.returncode == 2 and "Did you mean 'memory'?" in typo.stderr and "Traceback" not in typo.stderr
    assert typo.stderr.startswith("Usage: tpuprof ")
    alone = run()
    assert alone.returncode == 0 and "Commands:" in alone.stdout and alone.stderr == ""
    assert run("--version").stdout.startswith("tpuprof ")


@pytest.mark.parametrize("args", [[], ["-h"], ["--help"]], ids=["alone", "-h", "--help"])
def test_help_lists_every_command_with_its_whole_description(args):
    result = run_cli(*args, env={"COLUMNS": "80"})
    assert result.returncode == 0 and result.stderr == ""
    listing = result.stdout.split("Commands:")[1]
    for command in COMMANDS:
        assert f"\n  {command} " in listing
    # Descriptions are whole (wrapped at 80 columns, never cut with "...").
    assert "..." not in listing
    assert "the peak, and the fixes." in " ".join(listing.split())
    assert max(map(len, result.stdout.splitlines())) <= 80


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_ends_with_real_examples(command):
    result = run_cli(command, "-h")
    assert result.returncode == 0 and result.stderr == ""
    examples = result.stdout.split("Examples:\n")[1].splitlines()
    assert len(examples) >= 2 and all(line.strip().startswith(("tpuprof ", "kubectl ")) for line in examples)
    assert all(f"tpuprof {command} " in line for line in examples if line.strip().startswith("tpuprof"))


def test_closed_sets_are_listed_by_help():
    generations = " ".join(targets.TARGETS)
    for command in ("memory", "oom", "report", "diff", "preflight"):
        assert generations in " ".join(run_cli(command, "-h").stdout.split()), command
    assert "--csv <buffers|ops>" in run_cli("memory", "-h").stdout
    assert "--csv <steps|ops|stages>" in run_cli("analyze", "-h").stdout


def test_generation_aliases_and_topologies_are_accepted():
    """Aliases pass the option check: the command runs (and here fails on the missing path, not the name)."""
    for name in ("trillium", "v5litepod", "v5e:2x2"):
        result = run_cli("memory", "/nonexistent", "--target", name)
        assert result.returncode == 2 and "Invalid value" not in result.stderr
        assert result.stderr.startswith("tpuprof: /nonexistent"), result.stderr


def test_version():
    result = run_cli("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"tpuprof {__version__}\n", "")


@pytest.mark.subprocess
def test_internal_error_is_one_line_without_traceback(tmp_path):
    """A bug (here: a sitecustomize that breaks the memory command's module) is one line and exit 1."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys, types\n"
        "broken = types.ModuleType('tpuprof.commands.memory')\n"
        "def run(*args, **kwargs):\n"
        "    raise ZeroDivisionError('simulated bug')\n"
        "broken.run = run\n"
        "sys.modules['tpuprof.commands.memory'] = broken\n")
    result = run_cli("memory", "x", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == ("tpuprof: internal error: ZeroDivisionError: simulated bug "
                             "(set TPUPROF_DEBUG=1 for the traceback).\n")
    debug = run_cli("memory", "x", env={"PYTHONPATH": str(tmp_path), "TPUPROF_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# Shell completion. The scripts call `tpuprof` by name: a `tpuprof` on PATH that runs this checkout.
@pytest.fixture()
def shell_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "tpuprof"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tpuprof "$@"\n')
    wrapper.chmod(0o755)
    # HOME in tmp: --install-completion writes there, never to the developer's own shell files.
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
            "HOME": str(tmp_path / "home")}


def _bash(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_offers_commands_generations_and_tables(shell_env):
    """The real thing: bash sources `tpuprof --show-completion` (the shell is detected) and calls the
    completion function as its completion engine does (the command name as $1)."""
    def complete(*words: str) -> list[str]:
        quoted = " ".join(f"'{w}'" for w in words)
        script = ('source <(tpuprof --show-completion) && '
                  f'COMP_WORDS=(tpuprof {quoted}) && COMP_CWORD={len(words)} && '
                  '_tpuprof_completion tpuprof && printf "%s\\n" "${COMPREPLY[@]}"')
        result = _bash(script, shell_env)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        return result.stdout.split()

    assert set(COMMANDS) <= set(complete(""))
    assert complete("mem") == ["memory"]
    assert complete("memory", "--target", "") == list(targets.TARGETS)
    assert complete("memory", "--target", "v5") == [n for n in targets.TARGETS if n.startswith("v5")]
    assert complete("preflight", "m.py:f", "--tpu", "v5e,v6") == [
        f"v5e,{n}" for n in targets.TARGETS if n.startswith("v6")]
    assert complete("analyze", "--csv", "") == ["steps", "ops", "stages"]
    assert "--install-completion" in complete("--")


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_install_completion_writes_the_script_for_the_detected_shell(shell_env):
    # Not the script's last command, so bash does not exec it: tpuprof's parent is the bash the user typed in,
    # whatever started the test run (a run under nohup or a service has no shell among the ancestors).
    result = _bash("tpuprof --install-completion; status=$?; exit $status", shell_env)
    assert result.returncode == 0, result.stderr
    home = shell_env["HOME"]
    script = open(f"{home}/.bash_completions/tpuprof.sh").read()
    assert "_TPUPROF_COMPLETE=complete_bash" in script
    assert f"source '{home}/.bash_completions/tpuprof.sh'" in open(f"{home}/.bashrc").read()


@pytest.mark.subprocess
def test_zsh_and_fish_completion(shell_env):
    """zsh and fish are not installed here: their scripts, and the answers the scripts ask `tpuprof` for
    (the same environment variables the scripts set)."""
    def run(**variables: str) -> str:
        result = subprocess.run(["tpuprof"], capture_output=True, text=True, timeout=60,
                                env={**shell_env, **variables})
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        return result.stdout

    zsh = run(_TPUPROF_COMPLETE="source_zsh")
    assert zsh.lstrip().startswith("#compdef tpuprof") and "_TPUPROF_COMPLETE=complete_zsh tpuprof" in zsh
    answer = run(_TPUPROF_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS="tpuprof ")
    assert all(f'"{command}":"' in answer for command in COMMANDS)  # each with its description
    answer = run(_TPUPROF_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS="tpuprof oom --target v")
    assert re.findall(r'"([^"]+)"', answer) == [n for n in targets.TARGETS if n.startswith("v")]  # not tpu7x

    fish = run(_TPUPROF_COMPLETE="source_fish")
    assert "complete --command tpuprof" in fish and "_TPUPROF_COMPLETE=complete_fish" in fish
    answer = run(_TPUPROF_COMPLETE="complete_fish", _TYPER_COMPLETE_FISH_ACTION="get-args",
                 _TYPER_COMPLETE_ARGS="tpuprof report --target ")
    assert [line.split("\t")[0] for line in answer.splitlines()] == list(targets.TARGETS)
    answer = run(_TPUPROF_COMPLETE="complete_fish", _TYPER_COMPLETE_FISH_ACTION="get-args",
                 _TYPER_COMPLETE_ARGS="tpuprof memory --csv ")
    assert [line.split("\t")[0] for line in answer.splitlines()] == ["buffers", "ops"]


# Library output (tpuprof/library_output.py): held back unless --verbose, replayed before an internal error.
def _command_that_prints_on_fd2(tmp_path, then: str):
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys, types\n"
        "fake = types.ModuleType('tpuprof.commands.memory')\n"
        "def run(*args, **kwargs):\n"
        "    from tpuprof.errors import UserError  # not at start-up: tpuprof must come from this checkout\n"
        "    os.write(2, b'E0000 00:00:1.0 12 cuda_platform.cc:52] failed call to cuInit\\n')\n"
        "    import warnings; warnings.warn('a library warning')\n"
        "    print('tpuprof: a line of ours', file=sys.stderr)\n"
        f"    {then}\n"
        "fake.run = run\n"
        "sys.modules['tpuprof.commands.memory'] = fake\n")
    return {"PYTHONPATH": str(tmp_path)}


@pytest.mark.subprocess
def test_library_lines_are_held_back(tmp_path):
    env = _command_that_prints_on_fd2(tmp_path, "raise UserError('bad input.')")
    result = run_cli("memory", "x", env=env)
    assert result.returncode == 2
    assert result.stderr == "tpuprof: a line of ours\ntpuprof: bad input.\n"
    verbose = run_cli("memory", "x", "--verbose", env=env)
    assert "failed call to cuInit" in verbose.stderr and "a library warning" in verbose.stderr


@pytest.mark.subprocess
def test_library_lines_are_replayed_before_an_internal_error(tmp_path):
    env = _command_that_prints_on_fd2(tmp_path, "raise ZeroDivisionError('simulated bug')")
    result = run_cli("memory", "x", env=env)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "tpuprof: a line of ours"
    assert lines[1] == "tpuprof: what the libraries printed before the error:"
    assert "failed call to cuInit" in lines[2] and "a library warning" in result.stderr
    assert lines[-1].startswith("tpuprof: internal error: ZeroDivisionError: simulated bug")


def _library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("tpuprof:")]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.compile
def test_keras_preflight_prints_no_library_line(compile_cache):
    """TensorFlow, absl and CUDA print about ten lines while Keras loads and compiles; none reach stderr. A
    process of its own: they print as the libraries load."""
    args = ["preflight", f"{ROOT / 'sample_profiles' / 'models' / 'keras_mlp.py'}:factory", "--tpu", "v3",
            "--batch", "32"]
    env = {"XDG_CACHE_HOME": str(compile_cache)}
    result = run_cli_process(*args, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and "fits" in result.stdout
    # The same run with --verbose shows them: the check above is not vacuous here.
    verbose = run_cli_process(*args, "--verbose", "--no-cache", env=env, timeout=600)
    assert verbose.returncode == 0 and _library_lines(verbose.stderr), verbose.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_capture_of_a_tpu_name_without_credentials_prints_one_sentence():
    """TensorClusterResolver loads TensorFlow (CUDA and absl lines) before it fails for want of credentials."""
    from test_capture import free_port

    dead = f"127.0.0.1:{free_port()}"
    env = {"GCE_METADATA_HOST": dead, "GCE_METADATA_IP": dead, "GOOGLE_APPLICATION_CREDENTIALS": "",
           "TPU_NAME": "", "HOME": "/nonexistent"}
    args = ["capture", "--tpu", "my-tpu", "--zone", "us-central2-b", "--project", "my-project"]
    result = run_cli(*args, env=env, timeout=120)
    assert result.returncode == 2
    assert _library_lines(result.stderr) == [] and len(result.stderr.splitlines()) == 1, result.stderr
    assert "credentials" in result.stderr
    verbose = run_cli(*args, "--verbose", env=env, timeout=120)
    assert verbose.returncode == 2 and _library_lines(verbose.stderr), verbose.stderr


@pytest.mark.parametrize("args", [("memory", "sample_profiles/dumps/transformer_bf16_v6e", "--top", "0"),
                                  ("memory", "sample_profiles/dumps/transformer_bf16_v6e", "--json"),
                                  ("memory", "sample_profiles/dumps/transformer_bf16_v6e", "--csv", "buffers")])
@pytest.mark.subprocess
def test_a_reader_that_closes_the_pipe_is_success(args):
    """`tpuprof ... | head`: the pipe is closed before anything is written, so every write fails; that is
    exit 0 with nothing on stderr (a `set -o pipefail` script must not fail on it)."""
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    assert stderr == ""


def test_with_json_a_command_line_typer_reads_still_gives_the_input_error(tmp_path):
    """`--` sends the command line to typer (the quick parse leaves it), where an error of the command itself must stay
    the one sentence it is, not an internal error of the error handling."""
    missing = tmp_path / "missing"
    result = run_cli("memory", "--json", "--", str(missing))
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stdout)["error"] == {"kind": "input", "message": f"{missing} does not exist."}
