"""The output format a command was asked for (--json, --format) and printing a result's document in it."""

from __future__ import annotations

import sys

from tpuprof.renderers.output import print_json

FORMATS = ("table", "json", "markdown")


def output_format(as_json: bool, format_: str | None, csv: str | None = None) -> str:
    """The one format asked for: --json is --format json, kept for scripts that use it. --csv TABLE is a format
    too: with --json or another --format it is refused, not silently preferred."""
    from tpuprof.errors import UserError

    if as_json and format_ not in (None, "json"):
        raise UserError(f"--json and --format {format_} ask for two formats: give one.")
    if csv is not None and (as_json or format_ is not None):
        asked = "--json" if as_json else f"--format {format_}"
        raise UserError(f"--csv {csv} and {asked} ask for two formats: give one.")
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
