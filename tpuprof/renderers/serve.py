"""`tpuprof serve` on the terminal: its presentation (tpuprof/presentation/serve.py, built from the
`tpuprof.serve/1` document) printed by the terminal printer."""

from __future__ import annotations


def print_table(document: dict) -> None:
    from tpuprof.presentation.serve import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document))
