"""Shared output helpers: one JSON document on stdout, and a rich console only when tables are asked for."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from pathlib import Path

from tpuprof.errors import UserError

# Errors of writing that the disk, not tpuprof, causes: the output is refused in one sentence.
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NOT_A_FILE = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device",
               stat.S_IFSOCK: "a socket"}


def print_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False))
    sys.stdout.write("\n")
    sys.stdout.flush()


def console():
    """The rich console of human output; its width follows the one rule in renderers/tables.py."""
    from tpuprof.renderers.tables import console as make_console

    return make_console()


def output_file(path, force: bool, example: str) -> Path:
    """The file `-o PATH` writes: PATH, or the file a symlink at PATH points to (the link stays a link). Refused in
    one sentence: a folder, anything that is not a regular file (a FIFO, a device such as /dev/full, a socket),
    and an existing file without FORCE. EXAMPLE is a file name to suggest, e.g. report.html."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real
    except OSError as error:
        raise UserError(f"cannot write {path}: {error.strerror}.") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path} is a folder: -o names the file to write, e.g. -o {path / example}.")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is {_NOT_A_FILE.get(stat.S_IFMT(mode), 'not a regular file')}, not a file: "
                        f"-o writes a file, e.g. -o {example}.")
    if not force:
        raise UserError(f"{path} exists: give another -o, or --force to replace it.")
    return real


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside PATH and rename: a crash never leaves half a file."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb"):
    """A file object to write PATH through: a temporary file beside it, renamed over PATH when the block ends
    without an error, removed otherwise (a crash or an interrupt never leaves half a file).

    The file's own errors (a folder that cannot be made or written, a read-only file system, a full disk) are
    one sentence (UserError); other errors of the block pass through unchanged.
    """
    import tempfile  # here: it imports shutil, lzma and bz2 (5 ms), which commands printing to stdout never need

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as error:
        raise _cannot_write(path, error) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any file the user writes
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and (error.errno in _FULL or error.filename in (tmp, str(path))):
            raise _cannot_write(path, error) from None
        raise


def _cannot_write(path: Path, error: OSError) -> UserError:
    return UserError(f"cannot write {path}: {error.strerror or error}.")
