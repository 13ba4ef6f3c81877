"""`tpuprof ARGS` for a test: exit code, stdout and stderr, as a user's shell would see them.

Most command lines run in the test process (`cli.main(args)`): starting Python, importing tpuprof and its
libraries again for each of some 200 command lines was most of the suite's time, and proves nothing a test asks
about. The in-process run reproduces the process's view: file descriptors 1 and 2 are redirected to files (so
`library_output.hold` splits stderr exactly as in a terminal-less process, and what C++ libraries write on fd 2 is
held or shown as it would be), stdin is the given text (or empty), the environment holds COLUMNS=200 and the
test's variables, the working directory is the repository, and the exit code comes from `SystemExit` as Python
would turn it into one. The environment, working directory and sys.path are put back afterwards.

A separate process is kept where the process is what is tested or where state would outlive the command:
variables read when a module is imported or by a library that keeps instances (PYTHONPATH and its
sitecustomize, shell completion, Ray, gcsfs's emulator, the metadata server), `--ray`, gs:// paths,
`--verbose` (what TensorFlow and libtpu print as they load, once per process) and `capture` (TensorFlow's
profiler client and a live job). `run_cli_process` always starts one: the smoke
tests that check the two agree use it.
"""

from __future__ import annotations

import io
import locale
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass

from helpers.paths import ROOT

# The only variables a test may set for an in-process run: read by tpuprof when a command runs, not at import.
IN_PROCESS_VARIABLES = {"COLUMNS", "XDG_CACHE_HOME", "TPUPROF_DEBUG"}
# Commands that stay in their own process: the profiler client (TensorFlow's gRPC client, a job on loopback).
PROCESS_COMMANDS = {"capture"}


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def _environment(env: dict | None) -> dict:
    return {**os.environ, "COLUMNS": "200", **(env or {})}


def run_cli_process(*args: str, stdin: str | None = None, timeout: float = 300, env: dict | None = None) -> CliResult:
    """Run `tpuprof ARGS` as users do: a separate process (`python -m tpuprof`), exit code and both streams."""
    process = subprocess.run(
        [sys.executable, "-m", "tpuprof", *map(str, args)],
        input=stdin, stdin=subprocess.DEVNULL if stdin is None else None, capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env=_environment(env),
    )
    return CliResult(process.returncode, process.stdout, process.stderr)


def needs_process(args: tuple[str, ...], env: dict | None) -> str | None:
    """Why ARGS with ENV must run in a process of its own, or None."""
    changed = {k for k, v in (env or {}).items() if os.environ.get(k) != v} - IN_PROCESS_VARIABLES
    if changed:
        return f"variables {sorted(changed)}"
    command = next((a for a in args if not a.startswith("-")), None)
    if command in PROCESS_COMMANDS:
        return f"the {command} command"
    if "--verbose" in args or "-v" in args:
        return "--verbose (what libraries print as they load: only a fresh process loads them)"
    if "--ray" in args:
        return "Ray"
    if any(a.startswith("gs://") for a in args):
        return "gs:// paths"
    return None


def run_cli(*args: str, stdin: str | None = None, timeout: float = 300, env: dict | None = None) -> CliResult:
    """Run `tpuprof ARGS`: exit code and both streams, in this process where a process of its own proves
    nothing (see the module's docstring); TIMEOUT applies to a separate process only."""
    args = tuple(map(str, args))
    if needs_process(args, env):
        return run_cli_process(*args, stdin=stdin, timeout=timeout, env=env)
    return run_in_process(args, stdin, env)


def _text(data: bytes) -> str:
    """Bytes as subprocess.run(text=True) decodes them: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def run_in_process(args: tuple[str, ...], stdin: str | None, env: dict | None) -> CliResult:
    from tpuprof import cli

    saved_environ, saved_path, saved_cwd = dict(os.environ), sys.path[:], os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    ours: list = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            os.environ.update(_environment(env))
            os.chdir(ROOT)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            encoding = locale.getpreferredencoding(False)
            sys.stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO((stdin or "").encode(encoding))), encoding=encoding)
            ours = [open(1, "w", encoding=encoding, closefd=False),
                    open(2, "w", encoding=encoding, errors="backslashreplace", closefd=False, buffering=1)]
            sys.stdout, sys.stderr = ours
            returncode = _exit_code(cli.main, list(args))
        finally:
            for stream in ours:
                try:
                    stream.close()  # flushes; the descriptor stays open (closefd=False)
                except (OSError, ValueError):
                    pass
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            sys.path[:] = saved_path
            os.environ.clear()
            os.environ.update(saved_environ)
        out.seek(0)
        err.seek(0)
        return CliResult(returncode, _text(out.read()), _text(err.read()))


def _exit_code(main, args: list[str]) -> int:
    """MAIN(ARGS)'s exit code as the interpreter would make it: SystemExit's code (None: 0, a text: printed, 1),
    an escaped exception's traceback on stderr and 1."""
    try:
        main(args)
    except SystemExit as done:
        if done.code is None:
            return 0
        if isinstance(done.code, int):
            return done.code
        print(done.code, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - what reaches the interpreter in a process: TPUPROF_DEBUG=1 re-raises
        traceback.print_exc()
        return 1
    return 0
