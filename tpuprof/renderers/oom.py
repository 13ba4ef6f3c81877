"""`tpuprof oom` on the terminal: its presentation (tpuprof/presentation/oom.py, built from the `tpuprof.oom/1`
document that tpuprof/documents_oom.py builds) printed by the terminal printer."""

from __future__ import annotations


def print_document(document: dict, source: str) -> None:
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document, source=source))
