"""The versioned shapes of tpuprof's --json documents.

Every document says what it is in its first field: `"schema": "tpuprof.<command>/<version>"` (memory, analyze,
oom, preflight, capture, diff, report, trace). The version changes when a field is removed, renamed or changes type;
new fields keep it. The JSON Schema (draft 2020-12) of each is `<command>.schema.json` beside this file, shipped
in the package: `tpuprof.schemas.schema("memory")`. With --json, a command that fails prints "tpuprof.error/1"
instead (kind: usage, input or internal; the message that stderr shows). Documents written before the field existed still load
(`report` and `diff` then recognise them by their keys).
"""

from __future__ import annotations

import json

PREFIX = "tpuprof."
VERSIONS = {"memory": 1, "analyze": 1, "oom": 1, "preflight": 1, "capture": 1, "diff": 1, "report": 1, "trace": 1,
            "serve": 1,
            # Not a command: what any command prints on stdout with --json when it fails.
            "error": 1}


def name(command: str) -> str:
    """The schema name a command's documents carry: name("memory") == "tpuprof.memory/1"."""
    return f"{PREFIX}{command}/{VERSIONS[command]}"


def parse(text) -> tuple[str, int] | None:
    """("memory", 1) from "tpuprof.memory/1"; None for anything that is not a tpuprof schema name."""
    if not isinstance(text, str) or not text.startswith(PREFIX) or "/" not in text:
        return None
    command, _, version = text[len(PREFIX):].partition("/")
    if not command or not version.isdigit():
        return None
    return command, int(version)


def schema(command: str) -> dict:
    """The JSON Schema of a command's documents, as shipped in the package."""
    from importlib import resources  # only here: every --json document imports this module for name()

    return json.loads(resources.files(__name__).joinpath(f"{command}.schema.json").read_text(encoding="utf-8"))


def all_schemas() -> dict[str, dict]:
    """File name -> schema, for a validator's registry (capture's schema refers to analyze's by file name)."""
    return {f"{command}.schema.json": schema(command) for command in VERSIONS}
