"""The `tpuprof` command line. Options and help only: each command hands its arguments to
`tpuprof.commands.<name>.run`, which does the work. Imports stay inside the commands so that
`tpuprof --help` starts instantly and no command pays for another's dependencies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from tpuprof.errors import UserError

app = typer.Typer(
    name="tpuprof",
    help="Will my model fit in TPU HBM, why not, and why is my step slow?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JSON_HELP = "Print one JSON document on stdout instead of tables."


@app.callback()
def _root() -> None:
    """Will my model fit in TPU HBM, why not, and why is my step slow?"""


@app.command()
def memory(
    path: Path = typer.Argument(..., help="XLA dump folder, *.hlo.pb (HloProto), *-buffer-assignment.txt or HLO text."),
    module: Optional[str] = typer.Option(None, "--module", "-m", help="Analyse only this module of a dump folder (name or substring)."),
    target: Optional[str] = typer.Option(None, "--target", help="TPU generation (v2 v3 v4 v5e v5p v6e) for HLO without TPU layouts, and for the HBM capacity."),
    compile_: bool = typer.Option(False, "--compile", help="Recompile the module proto (*.hlo.pb of a CPU/GPU/TF dump) with libtpu for --target: exact layouts and sizes."),
    top: int = typer.Option(15, "--top", help="Rows in the buffer and op tables and JSON lists (0: all)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    csv: Optional[str] = typer.Option(None, "--csv", help="Print one table as CSV, every row: buffers or ops."),
) -> None:
    """Padded vs unpadded HBM per buffer and per framework op, the peak, and the fixes."""
    from tpuprof.commands import memory as command

    command.run(path, module=module, target=target, compile_=compile_, top=top, as_json=as_json, csv=csv)


@app.command()
def oom(
    log: Optional[str] = typer.Argument(None, help="The error text or a whole training log; '-' or nothing reads stdin."),
    dump: Optional[Path] = typer.Option(None, "--dump", help="XLA dump folder of the same program: join the log with its buffer assignment."),
    batch: Optional[int] = typer.Option(None, "--batch", help="The batch size that failed, to estimate the one that fits."),
    target: Optional[str] = typer.Option(None, "--target", help="TPU generation (v2 v3 v4 v5e v5p v6e): the capacity when the message has none."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Explain a TPU out-of-memory error: the numbers, each buffer's padding, the fixes. Exit 2 if none is found."""
    from tpuprof.commands import oom as command

    command.run(log, dump=dump, batch=batch, target=target, as_json=as_json)


@app.command()
def analyze(
    path: str = typer.Argument(..., help="Profile logdir, run folder (plugins/profile/<run>), <host>.xplane.pb, or a gs:// path; several hosts make one report."),
    top: int = typer.Option(10, "--top", help="Rows in the op and tf.data stage tables (0: all)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    csv: Optional[str] = typer.Option(None, "--csv", help="Print one table as CSV: steps (every step), ops or stages."),
) -> None:
    """Step time, input-pipeline stalls and host overhead from a saved profile, and what to change."""
    from tpuprof.commands import analyze as command

    command.run(path, top=top, as_json=as_json, csv=csv)


@app.command()
def capture(
    tpu: Optional[str] = typer.Option(None, "--tpu", help="Cloud TPU name (resolved with TPUClusterResolver; every worker, profiler port 8466)."),
    zone: Optional[str] = typer.Option(None, "--zone", help="Zone of --tpu (default: this VM's, from the metadata server)."),
    project: Optional[str] = typer.Option(None, "--project", help="Project of --tpu (default: this VM's)."),
    service_addr: Optional[str] = typer.Option(None, "--service-addr", help="Profiler server(s): host:port[,host:port...] or grpc://IP:8470 URLs."),
    port: Optional[int] = typer.Option(None, "--port", help="Profiler port for --tpu, the TPU environment variables and localhost (default 8466)."),
    logdir: str = typer.Option("logs", "--logdir", help="TensorBoard logdir, local or gs://; the run goes to LOGDIR/plugins/profile/<run>/."),
    duration: str = typer.Option("3s", "--duration", help="How long to trace, e.g. 2s, 500ms."),
    attempts: int = typer.Option(3, "--attempts", help="Tries when nothing answers or no trace event is collected."),
    delay: str = typer.Option("0ms", "--delay", help="Start tracing this long after the request, e.g. 1s."),
    host_tracer_level: int = typer.Option(2, "--host-tracer-level", help="0 off, 1 user annotations, 2 + framework ops, 3 verbose."),
    device_tracer_level: int = typer.Option(1, "--device-tracer-level", help="0 off, 1 on."),
    python_tracer_level: int = typer.Option(0, "--python-tracer-level", help="1 traces every Python call (large)."),
    analyze_: bool = typer.Option(False, "--analyze", help="Run `tpuprof analyze` on the new run."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Capture a profile from a running job (TPU name, addresses or environment), from every worker."""
    from tpuprof.commands import capture as command

    command.run(logdir=logdir, tpu=tpu, zone=zone, project=project, service_addr=service_addr, port=port,
                duration=duration, attempts=attempts, delay=delay, host_tracer_level=host_tracer_level,
                device_tracer_level=device_tracer_level, python_tracer_level=python_tracer_level,
                analyze=analyze_, as_json=as_json)


@app.command()
def report(
    inputs: List[str] = typer.Argument(..., help="Any mix of XLA dump folders/files, profiles (logdir, run, *.xplane.pb), OOM logs and tpuprof --json files."),
    output: Path = typer.Option(Path("tpuprof-report.html"), "--output", "-o", help="The HTML file to write (self-contained, opens offline)."),
    target: Optional[str] = typer.Option(None, "--target", help="TPU generation (v2 v3 v4 v5e v5p v6e) for inputs that do not say."),
    top: int = typer.Option(15, "--top", help="Rows in the buffer, op and allocation charts and tables."),
    title: Optional[str] = typer.Option(None, "--title", help="Page title."),
    as_json: bool = typer.Option(False, "--json", help="Print where the page went and what it was made from, as JSON."),
) -> None:
    """One self-contained HTML page: memory over time, padding, step time, input pipeline and ranked fixes."""
    from tpuprof.commands import report as command

    command.run(inputs, output=output, target=target, top=top, title=title, as_json=as_json)


@app.command()
def diff(
    a: str = typer.Argument(..., metavar="A", help="Before: an XLA dump, a profile, or a tpuprof --json file."),
    b: str = typer.Argument(..., metavar="B", help="After: the same kind of input as A."),
    fail_if: Optional[List[str]] = typer.Option(None, "--fail-if", help="Exit 1 when B regresses, e.g. 'peak_heap_bytes>+5%', 'median_ms>+2', 'input_bound_percent>20'; repeatable."),
    batches: Optional[str] = typer.Option(None, "--batches", help="Batch sizes of A and B, e.g. 64,128, for the per-example growth (default: sample.json, else the shapes)."),
    target: Optional[str] = typer.Option(None, "--target", help="TPU generation for inputs that do not say."),
    top: int = typer.Option(10, "--top", help="Rows of buffers that appear, disappear or change."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """What changed between two runs (peak, padding, buffers, step time, input %); --fail-if for CI."""
    from tpuprof.commands import diff as command

    command.run(a, b, fail_if=fail_if or [], batches=batches, target=target, top=top, as_json=as_json)


@app.command()
def preflight(
    spec: str = typer.Argument(..., help="path/to/file.py:factory; factory(batch_size) returns (jax fn, example args), "
                               "(tf.function, TensorSpecs) or (compiled Keras model, x spec, y spec)."),
    tpu: str = typer.Option(..., "--tpu", help="TPU generation (v2 v3 v4 v5e v5p v6e) or topology (v5e:2x2); "
                            "a comma list compares them."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Per-chip batch size to check."),
    max_batch: bool = typer.Option(False, "--max-batch", help="Search the largest per-chip batch that fits."),
    compare_bf16: bool = typer.Option(False, "--compare-bf16", help="Also compile in bfloat16 and compare."),
    top: int = typer.Option(10, "--top", help="Rows in the memory breakdown tables."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompile even if a cached result exists."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Will it fit on a TPU, and the largest batch that does: compiled with libtpu, no TPU needed."""
    from tpuprof.commands import preflight as command

    command.run(spec, tpu, batch=batch, max_batch=max_batch, compare_bf16=compare_bf16, top=top,
                use_cache=not no_cache, as_json=as_json)


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point: bad input is one sentence on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=argv, standalone_mode=False)
        # Typer turns Ctrl-C into Exit(130) and, without standalone mode, *returns* that code.
        if code == 130:
            print("tpuprof: interrupted.", file=sys.stderr)
        if isinstance(code, int) and code:
            sys.exit(code)
    except UserError as error:
        print(f"tpuprof: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        print("tpuprof: interrupted.", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # `tpuprof ... | head` closed the pipe: not an error worth a word.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception as error:  # noqa: BLE001 - the last line of defence against tracebacks
        import click

        if isinstance(error, click.exceptions.Exit):
            sys.exit(error.exit_code)
        if isinstance(error, click.ClickException):
            error.show()
            sys.exit(2)
        if isinstance(error, click.exceptions.Abort):
            sys.exit(130)
        if os.environ.get("TPUPROF_DEBUG"):
            raise
        print(f"tpuprof: internal error: {type(error).__name__}: {error} "
              "(set TPUPROF_DEBUG=1 for the traceback).", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
