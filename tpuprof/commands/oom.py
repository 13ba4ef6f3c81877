"""`tpuprof oom`: explain a TPU out-of-memory error from a pasted message or a whole training log.

Exit codes: 0 an OOM was found and explained; 2 bad input, or no TPU out-of-memory error in the text.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from tpuprof.analyses.oom_dump import join_dump
from tpuprof.errors import UserError
from tpuprof.models.oom import COMPILE, NOT_TPU

# The start of a log, kept while it is scanned: a job prints its configuration (its per-chip batch) there.
HEAD_BYTES = 1 << 16


class _HeadKept:
    """A binary stream that keeps its first HEAD_BYTES as they are read."""

    def __init__(self, stream):
        self.stream = stream
        self.head = b""

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size)
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[:HEAD_BYTES - len(self.head)]
        return chunk


def run(path: str | None, dump: Path | None = None, batch: int | None = None, target: str | None = None,
        as_json: bool = False, format_: str | None = None) -> None:
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_)
    if path in (None, "-") and (sys.stdin is None or sys.stdin.isatty()):  # a terminal, or stdin closed (<&-)
        raise UserError("give the log file, or pipe the log into `tpuprof oom -`.")
    explained = result(path, dump=dump, batch=batch, target=target)
    if print_document(explained, format_):
        return
    from tpuprof.renderers import oom as renderer

    renderer.print_document(explained.to_dict(), explained.source)


def result(path: str | None, dump: Path | None = None, batch: int | None = None, target: str | None = None,
           text: str | bytes | None = None):
    """The oom pipeline as the typed result that `tpuprof.oom()` returns and the CLI renders."""
    from tpuprof.results import OomResult

    report, estimate, suggestions, joined = explain(path, dump=dump, batch=batch, target=target, text=text)
    source = "stdin" if path in (None, "-") else str(path)
    return OomResult(source, report, estimate, suggestions, joined,
                     document=to_document(report, estimate, suggestions, joined))


def explain(path: str | None, dump: Path | None = None, batch: int | None = None, target: str | None = None,
            text: str | bytes | None = None):
    """The whole pipeline: (report, batch estimate, suggestions, dump join or None). For other commands too.

    PATH is a log file, '-' or None (stdin); TEXT, when given, is the log itself (the Python API) and PATH
    only names it in messages."""
    from tpuprof import targets
    from tpuprof.advice import oom as advice
    from tpuprof.analyses import oom as analysis
    from tpuprof.sources import oom_log

    if batch is not None and batch < 1:
        raise UserError("--batch must be a positive number of examples.")
    generation = targets.get(target) if target else None
    capacity = generation.compiler_hbm_bytes if generation else None
    devices_per_chip = generation.devices_per_chip if generation else 1
    if text is not None:
        stream, opened = io.BytesIO(text.encode() if isinstance(text, str) else text), True
    else:
        stream, opened = oom_log.open_input(path)
    kept = _HeadKept(stream)
    try:
        report = analysis.find_in_stream(kept, target)
    finally:
        if opened:
            stream.close()
    name = "stdin" if path in (None, "-") else path
    if report is None:
        _refuse_another_input(path, name, kept.head, from_stream=path in (None, "-") or text is not None)
        raise UserError(f"no TPU out-of-memory error found in {name}.")
    if report.kind == NOT_TPU:
        raise UserError(f"{name} holds an out-of-memory error of a {report.device} (\"{report.headline[:100]}\"), "
                        "not a TPU out-of-memory error: tpuprof explains TPU memory only.")
    if report.capacity_bytes is None and capacity is not None and report.memory_space in ("hbm", None):
        report.notes.append(f"capacity taken from --target {target}: {analysis.format_bytes(capacity)}")
    batch_source = "--batch" if batch else None
    declared = analysis.declared_batch(kept.head.decode("utf-8", "replace")) if report.kind == COMPILE else None
    if declared and batch is None:
        batch, batch_source = declared[0], f"the log: {declared[1]}"
        report.notes.append(f"per-chip batch {batch} taken from the log's own line \"{declared[1]}\"")
    elif declared and declared[0] != batch:
        report.notes.append(f"--batch {batch} is used; the log says \"{declared[1]}\"")
    joined = join_dump(report, dump, target, batch) if dump else None
    arguments = joined["argument_bytes"] - joined["batch_argument_bytes"] if joined else None
    estimate = analysis.estimate_batch(report, batch, capacity, dump_arguments=arguments,
                                       dump_batch_arguments=joined["batch_argument_bytes"] if joined else 0)
    if estimate.current_batch:
        estimate.batch_source = batch_source
    elif batch_source == "--batch":
        raise UserError(f"--batch is not used for this error: {estimate.reason}.")
    # --target's HBM is the capacity of an HBM message that names none: what a fix must free follows from it.
    hbm = capacity if report.memory_space in ("hbm", None) else None
    suggestions = advice.suggest(report, estimate, hbm, devices_per_chip)
    if joined:  # the dump is the detail the advice would otherwise ask for
        suggestions = [s for s in suggestions if "--xla_dump_to" not in s["message"]]
    if joined and report.framework is None:  # the dump's module and op names say what the log did not
        from tpuprof.analyses import framework

        job = framework.from_module(joined["module"], [r.get("op_name") or "" for r in joined["buffers"]],
                                    [r.get("source_line") or "" for r in joined["buffers"]])
        if job.framework:
            report.framework = job.framework
            report.training = job.training if report.training is None else report.training
            suggestions = advice.suggest(report, estimate, hbm, devices_per_chip)
            suggestions = [s for s in suggestions if "--xla_dump_to" not in s["message"]]
    return report, estimate, suggestions, joined


def _refuse_another_input(path: str | None, name: str, head: bytes, from_stream: bool) -> None:
    """A compiled module or a profile given where a log was expected: one sentence naming the command that reads
    it, instead of "no out-of-memory error found" (true, and no help)."""
    import shlex

    from tpuprof.sources import inputs

    if from_stream:  # memory and analyze read files only
        kind = inputs.text_kind(head)
        if kind:
            raise UserError(f"{name} holds {inputs.KINDS[kind].label.removesuffix(' file')} (an XLA module), not a "
                            "log with an out-of-memory error: save it to a file and run `tpuprof memory FILE` to "
                            "see what it holds in memory.")
        return
    try:
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
    except OSError:
        return
    if gzipped:  # the log reader unpacked it: a gzipped module or capture is told how to read it
        inputs.refuse_compressed(Path(path))
    try:
        source = inputs.identify(path)
    except UserError:  # a binary file of no known kind: no out-of-memory error in it is the answer
        return
    if source.family == inputs.MEMORY:
        raise UserError(f"{name} is {source.kind.label} (an XLA module), not a log with an out-of-memory error: "
                        f"`tpuprof memory {shlex.quote(str(path))}` shows what it holds in memory.")
    if source.family == inputs.STEPS:
        raise UserError(f"{name} is {source.kind.label}, not a log with an out-of-memory error: "
                        f"`tpuprof analyze {shlex.quote(str(path))}` reads it.")


def to_document(report, estimate, suggestions, joined) -> dict:
    """The `--json` document (tpuprof/documents_oom.py)."""
    from tpuprof.documents_oom import document

    return document(report, estimate, suggestions, joined)
