"""`tpuprof analyze` on the terminal: its presentation (tpuprof/presentation/analyze.py, built from the
`tpuprof.analyze/1` document that tpuprof/documents_analyze.py builds) printed by the terminal printer."""

from __future__ import annotations


def print_document(document: dict, top: int) -> None:
    from tpuprof.presentation.analyze import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document, top))
