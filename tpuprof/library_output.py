"""What libraries print (TensorFlow, absl, libtpu, CUDA, gRPC, XProf) stays off the user's terminal
unless --verbose; tpuprof's own messages always reach it.

C++ libraries write straight to file descriptor 2 (absl/glog lines such as "failed call to cuInit",
"Could not find cuda drivers", the AVX notice), and some do so while being imported, before any logging
setting of theirs can be changed. So `hold` splits stderr in two before a command runs: Python's
`sys.stderr`, where tpuprof, click and rich write, becomes a duplicate of the terminal's descriptor, and
descriptor 2 itself, which the libraries use, goes to a temporary file. Python warnings and Python
`logging` records from libraries go to that file too. `release` drops the file, or replays it on stderr
when the command failed with an internal error (where the libraries' words may explain it).

With --verbose descriptor 2 stays the terminal: every library line is shown as it comes. The Python API holds
them the same way around a call (`held`; `verbose=True` shows them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

# Read by TensorFlow, libtpu (TSL logging), gRPC and glog when they load: fewer lines to hold.
QUIET_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3", "GRPC_VERBOSITY": "ERROR", "GLOG_minloglevel": "3"}

_state: dict | None = None  # what `hold` changed, for `release` to put back


def _held_file():
    """An anonymous file for the libraries' output: in memory where Linux offers it (no disk, and no import of
    tempfile with shutil and random: 4 ms of every command's start), else an unnamed temporary file."""
    if hasattr(os, "memfd_create"):
        try:
            return open(os.memfd_create("tpuprof-libraries"), "w+", encoding="utf-8", errors="replace")
        except OSError:  # a seccomp profile or an old kernel without memfd
            pass
    import tempfile

    return tempfile.TemporaryFile(mode="w+", prefix="tpuprof-libraries-", encoding="utf-8", errors="replace")


def hold(verbose: bool, python_stderr: bool = True) -> None:
    """Split stderr before a command runs. Nothing happens when `sys.stderr` is not this process's fd 2
    (a caller that captures output itself, such as pytest's capsys), or when already held.
    PYTHON_STDERR=False (the Python API, `held`): `sys.stderr` is left as it is, whatever it is (a notebook's
    stream), and only what goes to fd 2, Python warnings and logging is held."""
    global _state
    if _state is not None:
        return
    if python_stderr:
        try:
            if sys.stderr.fileno() != 2:
                return
        except (AttributeError, OSError, ValueError):
            return
    import faulthandler

    sys.stderr.flush()
    _state = {"stderr": sys.stderr, "fd2": os.dup(2), "held": None, "showwarning": warnings.showwarning,
              "handlers": logging.root.handlers[:], "last_resort": logging.lastResort, "faulthandler": False,
              "environment": {}}
    terminal = None
    if python_stderr:
        terminal = open(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                        errors="backslashreplace")
        # Even with --verbose `sys.stderr` is split off fd 2, so that code which redirects fd 2 for a while
        # (the capture client's log) keeps our progress display on the terminal.
        sys.stderr = terminal
    if verbose:
        return
    for name, value in QUIET_ENVIRONMENT.items():
        if name not in os.environ:
            _state["environment"][name] = value
            os.environ[name] = value
    held = _state["held"] = _held_file()
    os.dup2(held.fileno(), 2)

    def to_held_file(message, category, filename, lineno, file=None, line=None):
        held.write(warnings.formatwarning(message, category, filename, lineno, line))
        held.flush()

    warnings.showwarning = to_held_file
    # Python logging of libraries (absl, tensorflow, jax): to the held file, not the terminal.
    handler = logging.StreamHandler(held)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    logging.root.handlers = [handler]
    logging.lastResort = handler
    # A library that aborts the process (a failed CHECK in C++) takes the held file with it: show at least
    # where it died, on the terminal.
    if terminal is not None and not faulthandler.is_enabled():
        faulthandler.enable(file=terminal)
        _state["faulthandler"] = True


def release(replay: bool) -> None:
    """After the command: drop what the libraries printed, or with REPLAY write it to the terminal first;
    then stderr is as it was."""
    global _state
    if _state is None:
        return
    state, _state = _state, None
    sys.stdout.flush()
    held = state["held"]
    if held is not None:
        held.flush()
        if replay:
            held.seek(0)
            text = held.read()
            if text.strip():
                sys.stderr.write("tpuprof: what the libraries printed before the error:\n" + text)
        if state["faulthandler"]:
            import faulthandler

            faulthandler.disable()
        warnings.showwarning = state["showwarning"]
        logging.root.handlers = state["handlers"]
        logging.lastResort = state["last_resort"]
    sys.stderr.flush()
    if sys.stderr is not state["stderr"]:
        terminal, sys.stderr = sys.stderr, state["stderr"]
        terminal.close()
    os.dup2(state["fd2"], 2)
    os.close(state["fd2"])
    if held is not None:
        held.close()


@contextlib.contextmanager
def held(verbose: bool = False):
    """The Python API's hold around one call (tpuprof.preflight(), tpuprof.memory()): what the libraries print
    stays out of the notebook or the script's stderr unless VERBOSE, and is written to `sys.stderr` before an
    error that is not the user's (it may explain it). The environment variables that quiet the libraries are
    set only for the call. Inside a command (already held) nothing changes."""
    if verbose or _state is not None:
        yield
        return
    try:  # a script: `sys.stderr` is fd 2 and is split off it, so that the caller's own messages still show
        script = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a notebook's stream: left as it is
        script = False
    hold(False, python_stderr=script)
    environment = dict(_state["environment"]) if _state is not None else {}
    failed = False
    try:
        yield
    except BaseException as error:
        from tpuprof.errors import UserError

        failed = not isinstance(error, (UserError, KeyboardInterrupt))
        raise
    finally:
        release(replay=failed)
        for name in environment:
            os.environ.pop(name, None)
