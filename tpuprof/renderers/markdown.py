"""`--format markdown`: a command's --json document as GitHub-flavoured Markdown, short enough for a pull request
comment or `$GITHUB_STEP_SUMMARY`: the verdict first, the top rows, the fixes with their code, the caveats.

Rendered from the very document `--json` prints (never from the pipeline's objects), so the two cannot drift:
every figure here is a field of the document, formatted. `render(document)` picks the layout from the document's
`schema` (tpuprof.<command>/<version>).
"""

from __future__ import annotations

from tpuprof import schemas
from tpuprof.renderers.printers import (  # noqa: F401 (the building blocks, importable from here)
    MAX_FIXES, caveats, cell, code, fixes, more, table)

TOP = 5  # rows of each table: enough to act on, short enough for a comment
MAX_MODULES = 3  # memory documents of a whole dump folder: the largest peaks


def render(document: dict, top: int = TOP) -> str:
    """The Markdown of any tpuprof --json document (memory, oom, analyze, preflight, diff)."""
    parsed = schemas.parse(document.get("schema"))
    command = parsed[0] if parsed else ""
    renderer = RENDERERS.get(command)
    if renderer is None:
        raise ValueError(f"no Markdown layout for a {document.get('schema')!r} document")
    lines = renderer(document, top)
    return "\n".join(_tidy(lines)).strip() + "\n"


# --- building blocks ---------------------------------------------------------------------------------------

def _tidy(lines: list[str]) -> list[str]:
    """No runs of blank lines."""
    out: list[str] = []
    for line in lines:
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    return out


# --- memory ------------------------------------------------------------------------------------------------

def memory_module(module: dict, top: int, heading: str = "###") -> list[str]:
    """One module as `tpuprof memory` presents it (tpuprof/presentation/memory.py)."""
    from tpuprof.presentation.memory import module_section
    from tpuprof.renderers.printers import markdown

    return markdown(module_section(module, top), level=len(heading))


def _memory(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.memory import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top, modules=MAX_MODULES))


# --- oom ---------------------------------------------------------------------------------------------------

def _oom(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


# --- analyze -----------------------------------------------------------------------------------------------

def _analyze(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.analyze import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


# --- preflight ---------------------------------------------------------------------------------------------

def _preflight(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.preflight import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


# --- diff --------------------------------------------------------------------------------------------------

def _diff(document: dict, top: int) -> list[str]:
    from tpuprof.presentation.diff import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document, top))


def _serve(document: dict, top: int) -> list[str]:
    """Its presentation (tpuprof/presentation/serve.py): the verdicts, the table, per slice the figures and the
    launch command, the ranking."""
    from tpuprof.presentation.serve import section
    from tpuprof.renderers.printers import markdown

    return markdown(section(document))


RENDERERS = {"memory": _memory, "oom": _oom, "analyze": _analyze, "preflight": _preflight, "diff": _diff,
             "serve": _serve}
