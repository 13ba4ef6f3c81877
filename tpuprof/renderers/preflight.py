"""`tpuprof preflight` on the terminal: its presentation (tpuprof/presentation/preflight.py, built from the
`tpuprof.preflight/1` document that tpuprof/documents_preflight.py builds) printed by the terminal printer; and the
spinner shown while libtpu compiles."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def progress(enabled: bool):
    """A spinner on stderr while libtpu compiles: `report(label, batch)` before each compile, and
    `report.laid_out(label, batch, hbm_bytes, capacity_bytes)` a line of its own when a --model compile has laid out
    memory that may fit and goes on to generate code."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda label, batch: None
        return
    count = 0
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("compiling with libtpu", total=None)

        def report(label: str, batch: int) -> None:
            nonlocal count
            count += 1
            bar.update(task, description=f"{label}: compile {count}, batch {batch}")

        def laid_out(label: str, batch: int, hbm_bytes: int, capacity_bytes: int) -> None:
            """A --model compile's memory layout, while its code is generated (minutes on a large step)."""
            from tpuprof.units import fmt_bytes

            bar.console.print(f"{label}, batch {batch}: memory laid out at {fmt_bytes(hbm_bytes)} of "
                              f"{fmt_bytes(capacity_bytes)} per device before code generation (which changes it, "
                              f"most often upward); compiling to the end for the verdict")

        report.laid_out = laid_out
        yield report


def print_document(document: dict, top: int, spec: str | None = None) -> None:
    from tpuprof.presentation.preflight import section
    from tpuprof.renderers.printers import terminal

    terminal(section(document, min(top, 8), spec))

