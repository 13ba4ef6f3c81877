"""`tpuprof analyze`: capture files -> per-host steps (one process per host) -> report -> advice -> output."""

from __future__ import annotations

from tpuprof.advice import steps as advice
from tpuprof.analyses import coverage
from tpuprof.analyses import steps as analysis
from tpuprof.analyses.summary import Report, summarize
from tpuprof.sources import inputs, xplane


def analyze(path: str, top: int = 10, workers: int | None = None) -> Report:
    inputs.expect(path, inputs.STEPS)  # a dump given by mistake: name the command that reads it
    files, run = xplane.find_capture(path)
    if len(files) == 1:
        profiles = [analysis.analyze_file(files[0])]
    else:
        # One process per host file: parsing is CPU-bound Python and the hosts are independent.
        import os
        from concurrent.futures import ProcessPoolExecutor

        workers = workers or min(len(files), os.cpu_count() or 1)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            profiles = list(pool.map(analysis.analyze_file, files))
    if all(profile.platform == "gpu" for profile in profiles):
        from tpuprof.errors import UserError

        # A GPU's step time, kernels and roofline are not a TPU's: XProf reads those captures, tpuprof does not.
        raise UserError(f"{path} was captured on GPUs, not on a TPU: tpuprof analyzes TPU (and host-only CPU) "
                        "captures; open this one in XProf.")
    report = summarize(profiles, top=top)
    report.suggestions = [s.to_dict() for s in advice.suggest(report)]
    report.run = run
    report.warnings = [w for w in (coverage.few_steps_warning(report),) if w]
    return report


def result(path: str, top: int = 10):
    """The analyze pipeline's report as the typed result that `tpuprof.analyze()` returns and the CLI renders."""
    from tpuprof.results import AnalyzeResult

    return AnalyzeResult(str(path), analyze(str(path), top=top), top)


def run(path: str, top: int, as_json: bool, csv: str | None = None, format_: str | None = None) -> None:
    from tpuprof.renderers import analyze as render
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_)
    if csv is not None:
        from tpuprof.renderers import csv as render_csv

        render_csv.check_analyze(csv)
        render_csv.print_analyze(analyze(str(path), top=0), csv)  # CSV: every row
        return
    steps = result(path, top)
    if not print_document(steps, format_):
        render.print_tables(steps.report, top)
