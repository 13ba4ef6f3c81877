"""One compile in a process of its own, so that the parent can stop it once the compiler has laid out the
program's memory (tpu_compile.compile_until_layout): libtpu's code generation, which follows and takes most
of a large step's compile time, cannot be interrupted inside a process; and so that libtpu aborting on a failed
check ends this process, not tpuprof.

The parent writes a pickled `(spec, batch, dtype, target, dump_dir, outcome_path)` on stdin; the child
compiles `spec.program(batch, dtype, target)` into `dump_dir` and writes what happened to `outcome_path` (JSON):
`{"kind": "ok", "result": CompileResult.to_dict()}`, or the kind of failure and its message.
"""

from __future__ import annotations

import json
import os
import pickle
import sys


def _die_with_parent() -> None:
    """A parent killed outright (SIGKILL, or SIGTERM outside the main thread) must not leave this compile running
    for minutes: Linux sends SIGKILL here when the thread that started this process ends."""
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent still kills it when it stops waiting
        return
    if os.getppid() != parent:  # the parent ended before the request above
        os._exit(1)


def main() -> int:
    from tpuprof.errors import UserError
    from tpuprof.sources import tpu_compile

    _die_with_parent()
    spec, batch, dtype, target, dump_dir, outcome_path = pickle.load(sys.stdin.buffer)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
