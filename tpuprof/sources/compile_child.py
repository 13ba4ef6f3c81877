"""One compile in a process of its own, so that the parent can stop it once the compiler has laid out the
program's memory (tpu_compile.compile_until_layout): libtpu's code generation, which follows and takes most
of a large step's compile time, cannot be interrupted inside a process; and so that libtpu aborting on a failed
check ends this process, not tpuprof.

Each compile process is forked from a compile server (`python -m tpuprof.sources.compile_child`), started once per
tpuprof process, that has imported JAX, its Pallas kernels and the LLM step's modules (1-2 s of a small step's
6-7 s compile) and initialised no backend: each compile after the first then starts at once. The server reads
requests on stdin, each a length-prefixed pickle `(environ, request, log_path, returncode_path)`, forks, writes the
compile's process id as a line on stdout, and writes its return code (as subprocess gives it) to RETURNCODE_PATH
when it ends. The compile runs with the parent's ENVIRON (LIBTPU_INIT_ARGS and XLA_FLAGS are read when libtpu
starts, in the compile), its stderr in LOG_PATH. REQUEST is a pickled `(spec, batch, dtype, target, dump_dir,
outcome_path)`: it compiles `spec.program(batch, dtype, target)` into `dump_dir` and writes what happened to
`outcome_path` (JSON): `{"kind": "ok", "result": CompileResult.to_dict()}`, or the kind of failure and its message.
The server ends when its stdin closes (its parent ended); a compile process is killed when the server ends.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys

from tpuprof.sources.tpu_compile import REQUEST_LENGTH

# Imported once by the server, before any fork: what a compile of the LLM step imports (no backend starts).
PRELOADED = ("jax", "jax.numpy", "jax.experimental.topologies", "jax.experimental.shard_map", "jax.ad_checkpoint",
             "jax.experimental.pallas", "jax.experimental.pallas.tpu",
             "jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel",
             "tpuprof.sources.llm")  # tpu_compile: imported by this module


def _die_with_parent() -> None:
    """A parent killed outright (SIGKILL, or SIGTERM outside the main thread) must not leave this process running
    for minutes: Linux sends SIGKILL here when the thread that started this process ends."""
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent still kills it when it stops waiting
        return
    if os.getppid() != parent:  # the parent ended before the request above
        os._exit(1)


def compile_request(request: bytes) -> None:
    from tpuprof.errors import UserError
    from tpuprof.sources import tpu_compile

    spec, batch, dtype, target, dump_dir, outcome_path = pickle.loads(request)
    try:
        result = spec.program(batch, dtype, target).compile(target, dump_dir)
        outcome = {"kind": "ok", "result": result.to_dict()}
    except tpu_compile.CompileResourceExhausted as error:
        outcome = {"kind": "resource_exhausted", "message": error.message}
    except tpu_compile.CompileFailed as error:
        outcome = {"kind": "failed", "message": str(error)}
    except UserError as error:
        outcome = {"kind": "user_error", "message": str(error)}
    partial = f"{outcome_path}.partial"
    with open(partial, "w") as file:
        json.dump(outcome, file)
    os.replace(partial, outcome_path)


def _compile_in_fork(environ: dict, request: bytes, log_path: str) -> int:
    """The forked compile process: the server's streams and handlers are not its own."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with_parent()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(log, 2)
    os.environ.clear()
    os.environ.update(environ)
    compile_request(request)
    return 0


def _written(path: str, text: str) -> None:
    partial = f"{path}.partial"
    try:
        with open(partial, "w") as file:
            file.write(text)
        os.replace(partial, path)
    except OSError:  # the parent has stopped waiting and removed the folder
        pass


def serve() -> int:
    import importlib

    _die_with_parent()
    for name in PRELOADED:
        importlib.import_module(name)
    returncode_paths: dict[int, str] = {}

    def reap(signum, frame):  # each ended compile's return code, as subprocess gives it
        while returncode_paths:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            path = returncode_paths.pop(pid, None)
            if path is not None:
                _written(path, str(os.waitstatus_to_exitcode(status)))

    signal.signal(signal.SIGCHLD, reap)
    requests, replies = sys.stdin.buffer, sys.stdout
    while True:
        header = requests.read(REQUEST_LENGTH.size)
        if len(header) < REQUEST_LENGTH.size:
            return 0  # the parent ended
        environ, request, log_path, returncode_path = pickle.loads(requests.read(REQUEST_LENGTH.unpack(header)[0]))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # the child is recorded before it is reaped
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                code = _compile_in_fork(environ, request, log_path)
            except BaseException:  # noqa: BLE001 - said on the compile's stderr, read by the parent
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        returncode_paths[pid] = returncode_path
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        replies.write(f"{pid}\n")
        replies.flush()


if __name__ == "__main__":
    sys.exit(serve())
