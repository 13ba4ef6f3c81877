"""`tpuprof memory` on the terminal: its presentation (tpuprof/presentation/memory.py, built from the
`tpuprof.memory/1` document that tpuprof/documents_memory.py builds) printed by the terminal printer."""

from __future__ import annotations

from tpuprof.documents_memory import document
from tpuprof.models.memory import ModuleMemory


def print_document(document: dict, top: int) -> None:
    from tpuprof.presentation.memory import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document, top))


def print_tables(results: list[ModuleMemory], top: int) -> None:
    """The modules of another command's answer (preflight's compile), as `tpuprof memory` prints them."""
    from tpuprof.presentation.memory import module_section
    from tpuprof.renderers.printers import terminal

    for module in document(results, top)["modules"]:
        terminal(module_section(module, top))
