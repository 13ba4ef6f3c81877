"""The presentation model (tpuprof/presentation/model.py: sections of verdicts, facts, tables, notes, caveats,
commands and HTML-only plots), the one wording of a fit verdict, and `build`: a command's section from its --json
document, by the builder of that command in this package. The printers are tpuprof/renderers/printers.py."""

from __future__ import annotations

from typing import Callable

from tpuprof.presentation.model import (  # noqa: F401 (the model's names, importable from the package)
    FIT, NO_FIT, UNKNOWN, Block, Caveats, Column, Command, Fact, Fixes, Note, Plot, Section, Table, Verdict, fits_share,
    fits_word, name, number, text)


def build(document: dict) -> Section:
    """The presentation of any document that has a builder here (by its "schema": tpuprof.<command>/<n>)."""
    from tpuprof import schemas

    parsed = schemas.parse(document.get("schema"))
    command = parsed[0] if parsed else ""
    if command not in BUILDERS:
        raise ValueError(f"no presentation for a {document.get('schema')!r} document")
    return BUILDERS[command](document)


def _analyze(document: dict) -> Section:
    from tpuprof.presentation.analyze import section

    return section(document)


def _diff(document: dict) -> Section:
    from tpuprof.presentation.diff import section

    return section(document)


def _memory(document: dict) -> Section:
    from tpuprof.presentation.memory import section

    return section(document)


def _oom(document: dict) -> Section:
    from tpuprof.presentation.oom import section

    return section(document)


def _preflight(document: dict) -> Section:
    from tpuprof.presentation.preflight import section

    return section(document)


def _serve(document: dict) -> Section:
    from tpuprof.presentation.serve import section

    return section(document)


BUILDERS: dict[str, Callable[[dict], Section]] = {"analyze": _analyze, "diff": _diff, "memory": _memory, "oom": _oom,
                                                  "preflight": _preflight, "serve": _serve}
