"""`tpuprof diff` on the terminal: its presentation (tpuprof/presentation/diff.py, built from the `tpuprof.diff/1`
document that tpuprof/documents_diff.py builds) printed by the terminal printer."""

from __future__ import annotations


def print_document(document: dict) -> None:
    from tpuprof.presentation.diff import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document))
