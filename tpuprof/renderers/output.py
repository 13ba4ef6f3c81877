"""Shared output helpers: one JSON document on stdout, and a rich console only when tables are asked for."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def print_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False))
    sys.stdout.write("\n")
    sys.stdout.flush()


FORMATS = ("table", "json", "markdown")


def output_format(as_json: bool, format_: str | None) -> str:
    """The one format asked for: --json is --format json, kept for scripts that use it."""
    from tpuprof.errors import UserError

    if as_json and format_ not in (None, "json"):
        raise UserError(f"--json and --format {format_} ask for two formats: give one.")
    return "json" if as_json else (format_ or "table")


def print_document(result, format_: str) -> bool:
    """Print RESULT's --json document as JSON or Markdown (rendered from that same document); False for "table",
    which each command prints from its own objects."""
    if format_ == "json":
        print_json(result.to_dict())
    elif format_ == "markdown":
        from tpuprof.renderers.markdown import render

        sys.stdout.write(render(result.to_dict()))
        sys.stdout.flush()
    else:
        return False
    return True


def console():
    """The rich console of human output; its width follows the one rule in renderers/tables.py."""
    from tpuprof.renderers.tables import console as make_console

    return make_console()


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside PATH and rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any file the user writes
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
