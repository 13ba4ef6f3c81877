"""Live progress of a capture (on stderr) and its summary (rich tables or one JSON document)."""

from __future__ import annotations

import os
import shlex
import threading
import time
from typing import Optional

from tpuprof.sources.addresses import ProfilerAddresses
from tpuprof.sources.capture import CapturedRun, TraceOptions, attempts_started


# XProf's own viewer: the `xprof` command that tensorboard-plugin-profile installs (TensorBoard is not
# a dependency any more), on its default port.
VIEWER_PORT = 8791


def next_commands(result: CapturedRun) -> list[str]:
    fetch = list(dict.fromkeys(h.fetch for h in result.elsewhere if not h.fetch.startswith("tpuprof ")))
    analyze = result.run_dir if result.run_dir and not fetch else result.logdir
    return [
        *fetch,
        f"tpuprof analyze {shlex.quote(analyze)}",
        f"xprof --logdir {shlex.quote(result.logdir)} --port {VIEWER_PORT}",
    ]


def to_json(result: CapturedRun, target: ProfilerAddresses, options: TraceOptions) -> dict:
    return {
        "run": result.run,
        "run_dir": result.run_dir,
        "logdir": result.logdir,
        "addresses": result.addresses,
        "address_source": target.why,
        "notes": target.notes,
        "duration_ms": options.duration_ms,
        "attempts_allowed": options.attempts,
        "attempts_used": result.attempts_used,
        "seconds": round(result.seconds, 3),
        "hosts": [
            {"host": h.host, "path": h.path, "size_bytes": h.size_bytes, "events": h.events, "planes": h.planes}
            for h in result.hosts
        ],
        "hosts_without_events": result.silent,
        "hosts_elsewhere": [{"address": h.address, "where": h.where, "fetch": h.fetch} for h in result.elsewhere],
        "next_commands": next_commands(result),
    }


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def print_summary(result: CapturedRun, target: ProfilerAddresses, options: TraceOptions) -> None:
    from rich.markup import escape

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    if result.run:
        out.print(f"[bold]Captured run {escape(result.run)}[/bold] in {escape(result.run_dir)}.")
    else:
        out.print(f"[bold]Captured[/bold] into {escape(result.logdir)} on each host.")
    for host in result.elsewhere:  # another machine: its profiler server wrote the file where it runs
        out.print(f"{escape(host.address)} is another machine: its trace is in {escape(host.where)} "
                  f"(the newest run); fetch it with: {escape(host.fetch)}")
    attempts = f"{result.attempts_used} attempt{'s' if result.attempts_used != 1 else ''}"
    out.print(f"Traced {options.duration_ms / 1000:g} s on {', '.join(result.addresses)} in {attempts} "
              f"({result.seconds:.1f} s in all).")
    # Where the address came from (target.why) was said on stderr before tracing; only the notes, which
    # can change what the user does next (e.g. a worker left out), are worth repeating here.
    if target.notes:
        notes = "; ".join(target.notes)
        out.print(escape(notes[:1].upper() + notes[1:]) + ".")
    columns = [tables.name("host"), tables.number("file size"), tables.number("events"), tables.number("planes")]
    rows = [(escape(host.host), _size(host.size_bytes), f"{host.events:,}", str(host.planes)) for host in result.hosts]
    out.print(tables.table(columns, rows, out.width))
    if result.silent:
        out.print(f"[bold yellow]No trace event came from {', '.join(result.silent)}[/]: that job was idle or "
                  "between steps, or never started its profiler server; capture again while every worker trains.")
    *_, analyze, viewer = next_commands(result)
    out.print(f"To analyse the run: {escape(analyze)}")
    out.print(f"To browse it in XProf's viewer: {escape(viewer)}, then open http://localhost:{VIEWER_PORT}/")


def say(message: str) -> None:
    """One status line on stderr (kept off stdout so --json stays one document)."""
    import sys

    print(message, file=sys.stderr, flush=True)


class LiveProgress:
    """Countdown while tracing, then 'writing' until the client returns; drawn on the real stderr.

    The capture redirects fds 1 and 2 (the C++ client prints there) while it runs. The progress draws on
    Python's `sys.stderr`, which the CLI keeps apart from fd 2 (tpuprof/library_output.py), and, when
    nothing split them, on the saved fd 2. Only on a terminal: logs and pipes get the one-line status.
    """

    def __init__(self, addresses: list[str], options: TraceOptions):
        self.addresses = addresses
        self.options = options
        self.progress = None
        self.thread: Optional[threading.Thread] = None
        self.stopping = threading.Event()
        self.stream = None

    def start(self, saved_fds: tuple[int, int], log_path: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        import sys

        try:
            ours = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # replaced by a non-file (pytest's capture)
            ours = 2
        self.stream = os.fdopen(os.dup(ours if ours != 2 else saved_fds[1]), "w")
        terminal = Console(file=self.stream, stderr=True)
        if not terminal.is_terminal:
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                                 console=terminal, transient=True)
        window = (self.options.delay_ms + self.options.duration_ms) / 1000
        task = self.progress.add_task(f"Tracing {len(self.addresses)} host(s)", total=window, status="")
        self.progress.start()

        def tick():
            attempt, attempt_start = 0, time.monotonic()
            while not self.stopping.wait(0.1):
                seen = attempts_started(log_path)
                if seen != attempt:
                    attempt, attempt_start = seen, time.monotonic()
                elapsed = time.monotonic() - attempt_start
                left = window - elapsed
                label = f"attempt {max(attempt, 1)}/{self.options.attempts}"
                if left > 0:
                    status = f"{left:4.1f} s left, {label}"
                else:
                    status = f"writing: waiting for the hosts' traces, {label}"
                self.progress.update(task, completed=min(elapsed, window), status=status)

        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread:
            self.thread.join(timeout=2)
        if self.progress:
            self.progress.stop()
            self.progress = None
        if self.stream:
            self.stream.close()
            self.stream = None
