"""What the Python API returns: one dataclass per command.

Each result holds the pipeline's own objects (modules, the step report, the OOM report...) and offers:

- `to_dict()`: exactly the command's `--json` document (the CLI prints this very dict);
- `to_json()`: the same as a string;
- `suggestions`: what to change, as `tpuprof.models.suggestion.Suggestion` objects, ranked as the command
  ranks them;
- `_repr_html_()`: a compact summary when the result is the last value of a notebook cell.

Importing this module is cheap: what a method needs (renderers, analyses) is imported when it is called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The fields of a Suggestion a suggestion dict may carry, with the types they must have to be taken; the rest
# (and any of these of another type: a --json document read back may have been edited) goes to `extra`.
_TEXT, _NUMBER, _RANGE = (str,), (int, float), (list, tuple)
_SUGGESTION_FIELDS = {"kind": _TEXT, "message": _TEXT, "severity": _TEXT, "saving_bytes": _NUMBER,
                      "saving_bytes_range": _RANGE, "saving_ms_per_step": _NUMBER, "saving_ms_range": _RANGE,
                      "confidence": _TEXT, "evidence": _TEXT, "code": _TEXT, "framework": _TEXT,
                      "source_line": _TEXT}


def as_suggestion(item: Any):
    """A `Suggestion` from what a pipeline produced or a document holds: a Suggestion, its dict, or an older
    suggestion object."""
    from tpuprof.models.suggestion import Suggestion

    if isinstance(item, Suggestion):
        return item
    data = dict(item) if isinstance(item, dict) else {k: getattr(item, k) for k in _SUGGESTION_FIELDS
                                                      if hasattr(item, k)}
    known = {}
    for key, types in _SUGGESTION_FIELDS.items():
        value = data.get(key)
        if isinstance(value, types) and not isinstance(value, bool) \
                and (types is not _RANGE or (len(value) == 2 and all(isinstance(v, _NUMBER) for v in value))):
            known[key] = tuple(value) if types is _RANGE else value
            del data[key]
    if not known.get("saving_bytes"):  # older models said 0 for "no figure"
        known.pop("saving_bytes", None)
    known.setdefault("kind", "")
    known.setdefault("message", "")
    return Suggestion(**known, extra=data)


class Result:
    """What every result offers; subclasses name their `command`, define `_document` and fill `suggestions`."""

    command = ""  # the CLI command whose --json document this is

    def to_dict(self) -> dict:
        """The command's `--json` document: first its schema name ("tpuprof.memory/1", see tpuprof/schemas)."""
        from tpuprof import caveats, schemas

        # Every estimated figure carries what it leaves out, derived from the document itself.
        return caveats.annotate(self.command, {"schema": schemas.name(self.command), **self._document()})

    def _document(self) -> dict:
        raise NotImplementedError

    def to_json(self, indent: int | None = 2) -> str:
        """The `--json` document as text."""
        return json.dumps(self.to_dict(), indent=indent)

    def _repr_html_(self) -> str:
        from tpuprof.renderers import notebook

        return notebook.render(self)


@dataclass(repr=False)
class MemoryResult(Result):
    """`tpuprof.memory()`: HBM per buffer and per framework op, the peak and the fixes, per module."""

    command = "memory"

    path: str
    modules: list  # tpuprof.models.memory.ModuleMemory, largest first
    top: int = 15  # rows of the buffer and op lists in to_dict() (0: all)
    suggestions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suggestions:
            self.suggestions = [as_suggestion(s) for m in self.modules for s in m.suggestions]

    @property
    def module(self):
        """The module with the largest peak (or temporaries, when no peak is known): the one that decides
        whether the program fits."""
        return max(self.modules, key=lambda m: (m.peak_heap_bytes or 0, m.temp_bytes or 0))

    @property
    def peak_heap_bytes(self) -> int | None:
        return self.module.peak_heap_bytes

    @property
    def padding_at_peak_bytes(self) -> int:
        return self.module.padding_at_peak_bytes

    def _document(self) -> dict:
        from tpuprof.documents_memory import document

        return document(self.modules, self.top)

    def __repr__(self) -> str:
        parts = ", ".join(f"{m.name}: peak {_size(m.peak_heap_bytes)}" for m in self.modules[:3])
        more = f", +{len(self.modules) - 3} more" if len(self.modules) > 3 else ""
        return f"MemoryResult({self.path!r}: {parts}{more}; {len(self.suggestions)} suggestions)"


@dataclass(repr=False)
class AnalyzeResult(Result):
    """`tpuprof.analyze()`: step time per category, per chip, the input pipeline, the roofline, the fixes."""

    command = "analyze"

    path: str
    report: Any  # tpuprof.analyses.summary.ProfileSummary
    top: int = 10
    suggestions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suggestions:
            self.suggestions = [as_suggestion(s) for s in self.report.suggestions]

    @property
    def median_ms(self) -> float:
        return self.report.median_ms

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def breakdown_percent(self) -> dict:
        return self.report.breakdown_percent

    def _document(self) -> dict:
        from tpuprof.documents_analyze import document

        return document(self.report, self.top)

    def __repr__(self) -> str:
        return (f"AnalyzeResult({self.path!r}: {self.report.step_count} steps, median {self.report.median_ms:.3f} ms, "
                f"{self.report.verdict}; {len(self.suggestions)} suggestions)")


@dataclass(repr=False)
class OomResult(Result):
    """`tpuprof.oom()`: a TPU out-of-memory error explained: the numbers, the buffers, the batch that fits."""

    command = "oom"

    source: str  # the file, or "text" for a string
    report: Any  # tpuprof.models.oom.OomReport
    batch_estimate: Any  # tpuprof.models.oom.BatchEstimate
    advice: list  # the pipeline's suggestions as the document carries them
    dump: dict | None = None  # the join with an XLA dump's buffer assignment (dump=...)
    document: dict = field(default_factory=dict)  # the --json document, made by the oom command's pipeline
    suggestions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suggestions:
            self.suggestions = [as_suggestion(s) for s in self.advice]

    def _document(self) -> dict:
        return json.loads(json.dumps(self.document))  # a copy: the caller may change it

    def __repr__(self) -> str:
        used = f", {_size(self.report.used_bytes)} of {_size(self.report.capacity_bytes)}" \
            if self.report.used_bytes is not None else ""
        return (f"OomResult({self.source!r}: {self.report.kind} in {self.report.memory_space or 'memory'}{used}; "
                f"{len(self.suggestions)} suggestions)")


@dataclass(repr=False)
class PreflightResult(Result):
    """`tpuprof.preflight()`: whether the step fits each target, the largest batch, where the memory goes."""

    command = "preflight"

    spec: str  # what was compiled: file.py:factory, or the function's or model's name
    targets: list  # tpuprof.models.preflight.PreflightTarget, one per slice, in the order given
    top: int = 10
    suggestions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suggestions:
            for target in self.targets:
                if target.compiled.memory is not None:
                    self.suggestions += [as_suggestion(s) for s in target.compiled.memory.suggestions]
                if target.compiled.oom is not None:
                    self.suggestions += [as_suggestion(s) for s in target.compiled.oom.suggestions]

    @property
    def fits(self) -> bool:
        """True when the step fits every target."""
        return all(t.fits for t in self.targets)

    def _document(self) -> dict:
        from tpuprof.documents_preflight import document

        return document(self.targets, self.top)

    def __repr__(self) -> str:
        from tpuprof.presentation import fits_word

        parts = ", ".join(f"{t.generation.name} batch {t.compiled.batch_size}: {fits_word(t.fits)}"
                          for t in self.targets)
        return f"PreflightResult({self.spec!r}: {parts})"


@dataclass(repr=False)
class CaptureResult(Result):
    """`tpuprof.capture()`: the run folder written, per host file, and (analyze=True) its analysis."""

    command = "capture"

    capture: Any  # tpuprof.sources.capture.CapturedRun
    target: Any  # tpuprof.sources.addresses.ProfilerAddresses: the addresses and why they were chosen
    options: Any  # tpuprof.sources.capture.TraceOptions
    analysis: AnalyzeResult | None = None
    analysis_error: str | None = None  # why the new run could not be analysed (it is saved all the same)
    suggestions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suggestions and self.analysis is not None:
            self.suggestions = list(self.analysis.suggestions)

    @property
    def run_dir(self) -> str:
        return self.capture.run_dir

    def _document(self) -> dict:
        from tpuprof.renderers.capture import to_json

        document = to_json(self.capture, self.target, self.options)
        if self.analysis is not None:
            document["analysis"] = self.analysis.to_dict()
        elif self.analysis_error is not None:
            document["analysis"] = {"error": self.analysis_error}
        return document

    def __repr__(self) -> str:
        return f"CaptureResult({self.capture.run_dir!r}: {len(self.capture.hosts)} host file(s))"


@dataclass(repr=False)
class DiffResult(Result):
    """`tpuprof.diff()`: what changed between two inputs of one kind, and the --fail-if checks."""

    command = "diff"

    diff: dict  # tpuprof.analyses.diff.compare's result, with a, b, thresholds and regression
    suggestions: list = field(default_factory=list)  # a diff suggests nothing: its inputs do

    @property
    def regression(self) -> bool:
        """True when a threshold (fail_if) tripped: the CLI exits 1."""
        return bool(self.diff["regression"])

    @property
    def identical(self) -> bool:
        return bool(self.diff["identical"])

    @property
    def kind(self) -> str:
        return self.diff["kind"]

    def _document(self) -> dict:
        from tpuprof.documents_diff import document

        return document(self.diff)

    def __repr__(self) -> str:
        state = "no change" if self.identical else "changed"
        return f"DiffResult({self.kind}: {state}{', regression' if self.regression else ''})"


@dataclass(repr=False)
class ReportResult(Result):
    """`tpuprof.report()`: where the page went and what it was made from."""

    command = "report"

    output: str
    bytes: int
    inputs: list  # tpuprof.sources.inputs.Input: each input's document, as the page drew it
    suggestions: list = field(default_factory=list)

    def _document(self) -> dict:
        return {"output": self.output, "bytes": self.bytes,
                "inputs": [{"path": i.path, "kind": i.kind} for i in self.inputs]}

    def __repr__(self) -> str:
        return f"ReportResult({self.output!r}: {len(self.inputs)} input(s), {self.bytes} bytes)"


@dataclass(repr=False)
class ServeResult(Result):
    """`tpuprof.serve()`: per slice, whether the model serves as asked, the KV cache, the compiled programs' headroom
    (the largest safe gpu_memory_utilization), speed and cost, and the launch command."""

    command = "serve"

    answer: Any  # tpuprof.models.serve.ServeAnswer
    suggestions: list = field(default_factory=list)

    @property
    def targets(self) -> list:
        """tpuprof.models.serve.ServeTarget, one per slice, in the order given."""
        return self.answer.targets

    @property
    def fits(self) -> bool:
        return all(t.fits for t in self.targets)

    def _document(self) -> dict:
        from tpuprof.documents_serve import document

        return document(self.answer)

    def __repr__(self) -> str:
        parts = ", ".join(f"{t.slice.name}: {'serves' if t.fits else 'does not serve'}, "
                          f"{t.capacity.tokens} KV tokens" for t in self.targets)
        return f"ServeResult({self.answer.options.model.name!r}: {parts})"


@dataclass(repr=False)
class TraceResult(Result):
    """`tpuprof.trace()`: the Perfetto trace written and what it holds."""

    command = "trace"

    output: str
    bytes: int
    hosts: list
    steps: list  # the chosen step numbers, as analyze numbers them
    events: int
    window_ms: float
    suggestions: list = field(default_factory=list)
    run: dict | None = None  # the run read from a logdir (name, folder, other_runs), as analyze's; None: a file

    def _document(self) -> dict:
        return {"output": self.output, "bytes": self.bytes, "hosts": self.hosts, "steps": self.steps,
                "events": self.events, "window_ms": self.window_ms, "run": self.run}

    def __repr__(self) -> str:
        return f"TraceResult({self.output!r}: steps {self.steps} of {len(self.hosts)} host(s), {self.events} events)"


def _size(value) -> str:
    from tpuprof.units import fmt_bytes

    return fmt_bytes(value) if value is not None else "unknown"
