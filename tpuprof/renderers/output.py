"""Shared output helpers: one JSON document on stdout, and a rich console only when tables are asked for."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def print_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False))
    sys.stdout.write("\n")
    sys.stdout.flush()


def console():
    """The rich console of human output; its width follows the one rule in renderers/tables.py."""
    from tpuprof.renderers.tables import console as make_console

    return make_console()


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside PATH and rename: a crash never leaves half a file."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb"):
    """A file object to write PATH through: a temporary file beside it, renamed over PATH when the block ends
    without an error, removed otherwise (a crash or an interrupt never leaves half a file)."""
    import tempfile  # here: it imports shutil, lzma and bz2 (5 ms), which commands printing to stdout never need

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any file the user writes
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
