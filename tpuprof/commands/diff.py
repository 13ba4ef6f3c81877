"""`tpuprof diff A B`: load both inputs like `tpuprof report`, compare, apply --fail-if thresholds.

Exit codes: 0 no threshold tripped (or none given); 1 a threshold tripped (a regression, for CI);
2 bad input (different kinds, unknown metric, unreadable file).
"""

from __future__ import annotations

import sys

from tpuprof.errors import UserError


def _batches(option, a, b) -> tuple[tuple[int, int] | None, str]:
    if isinstance(option, (tuple, list)):  # the Python API's (64, 128)
        option = ",".join(map(str, option))
    if option:
        try:
            batch_a, batch_b = (int(x) for x in option.split(","))
        except ValueError:
            raise UserError(f"--batches takes two batch sizes, A's and B's, e.g. 64,128 (got {option!r}).") from None
        if batch_a < 1 or batch_b < 1:
            raise UserError("--batches must be positive batch sizes.")
        return (batch_a, batch_b), "given with --batches"
    sizes = (a.meta.get("batch_size"), b.meta.get("batch_size"))
    if all(isinstance(s, int) for s in sizes):
        return sizes, "from the samples' sample.json"
    return None, ""


def compute(a_path, b_path, fail_if: list[str], batches: str | None = None, target: str | None = None,
            top: int = 10) -> dict:
    """A and B (paths, or results of the Python API) loaded like `report` loads them, compared, and the
    --fail-if thresholds checked."""
    from tpuprof.analyses import diff as analysis
    from tpuprof.commands.report import load
    from tpuprof.sources.inputs import KIND_LABELS, SERVE

    thresholds = [analysis.parse_threshold(t) for t in fail_if]  # bad syntax fails before any work
    if target is not None:
        from tpuprof import targets

        target = targets.get(target).name
    a, b = load(a_path, target, top), load(b_path, target, top)
    if a.kind != b.kind:
        raise UserError(f"cannot compare {KIND_LABELS[a.kind]} {a.path} with {KIND_LABELS[b.kind]} {b.path}: "
                        "give two inputs of the same kind.")
    if a.kind == SERVE:
        raise UserError(f"diff compares dumps, profiles, OOM logs and preflight documents, not serve plans: "
                        f"`tpuprof report {a.path} {b.path}` shows both side by side.")
    pair, source = _batches(batches, a, b)
    result = analysis.compare(a.kind, a.document, b.document, top=top, batches=pair, batch_source=source)
    result["a"] = {"path": a.path, "from_json": a.from_json}
    result["b"] = {"path": b.path, "from_json": b.from_json}
    checks = analysis.evaluate(result, thresholds)
    for threshold in thresholds:
        mine = [c for c in checks if c["expression"] == threshold.expression]
        if not any(c["evaluated"] for c in mine):
            raise UserError(f"--fail-if {threshold.expression!r}: {threshold.metric} is missing from A or B.")
    result["thresholds"] = checks
    result["regression"] = any(c["tripped"] for c in checks)
    return result


def result(a, b, fail_if: list[str], batches=None, target: str | None = None, top: int = 10):
    """The comparison as the typed result that `tpuprof.diff()` returns and the CLI renders."""
    from tpuprof.results import DiffResult

    return DiffResult(compute(a, b, fail_if, batches, target, top))


def run(a: str, b: str, fail_if: list[str], batches: str | None, target: str | None, top: int,
        as_json: bool, format_: str | None = None) -> None:
    from tpuprof.renderers import diff as render
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_)
    compared = result(a, b, fail_if, batches, target, top)
    if not print_document(compared, format_):
        render.print_document(compared.to_dict())
    if compared.regression:
        sys.stdout.flush()
        sys.exit(1)
