"""`tpuprof analyze`: capture files -> per-host steps (one process or Ray task per host) -> report -> advice -> output."""

from __future__ import annotations

import posixpath

from tpuprof.advice import steps as advice
from tpuprof.analyses import coverage
from tpuprof.analyses.summary import ProfileSummary, summarize
from tpuprof.commands.hosts import host_profiles
from tpuprof.errors import UserError
from tpuprof.sources import inputs, xplane


def _paths(path) -> list[str]:
    return [str(path)] if isinstance(path, str) or not hasattr(path, "__iter__") else [str(p) for p in path]


def find_hosts(paths: list[str]):
    """The host files every path names, in order, and the logdir run chosen when one path names a logdir.

    Several paths make one pod: a capture from several machines can land in several run folders."""
    files, run = [], None
    for path in paths:
        inputs.expect(path, inputs.STEPS)  # a dump given by mistake: name the command that reads it
        found, run = xplane.find_capture(path)
        files += [f for f in found if f not in files]
    return files, run if len(paths) == 1 else None


def _distinct_hosts(profiles) -> None:
    """Hosts of the same name from different run folders are told apart by their run folder's name, or by the
    whole folder when the runs' names are the same too (captures started in the same second)."""
    names = [p.host for p in profiles]
    same = [p for p in profiles if names.count(p.host) > 1]
    runs = [f"{posixpath.basename(posixpath.dirname(p.path))}/{p.host}" for p in same]
    for profile, run in zip(same, runs):
        profile.host = run if runs.count(run) == 1 else f"{posixpath.dirname(profile.path)}/{profile.host}"


def profile_summary(path, top: int = 10, workers: int | None = None, ray: str | None = None) -> ProfileSummary:
    paths = _paths(path)
    if not paths:
        raise UserError("name a profile to analyze.")
    files, run = find_hosts(paths)
    profiles = host_profiles(files, workers=workers, ray=ray)
    _distinct_hosts(profiles)
    if all(profile.platform == "gpu" for profile in profiles):
        # A GPU's step time, kernels and roofline are not a TPU's: XProf reads those captures, tpuprof does not.
        raise UserError(f"{' '.join(paths)} was captured on GPUs, not on a TPU: tpuprof analyzes TPU (and host-only "
                        "CPU) captures; open this one in XProf.")
    report = summarize(profiles, top=top)
    report.suggestions = [s.to_dict() for s in advice.suggest(report)]
    report.run = run
    report.warnings = [w for w in (coverage.mixed_programs_warning(report), coverage.few_steps_warning(report)) if w]
    return report


def result(path, top: int = 10, workers: int | None = None, ray: str | None = None):
    """The analyze pipeline's report as the typed result that `tpuprof.analyze()` returns and the CLI renders."""
    from tpuprof.results import AnalyzeResult

    paths = _paths(path)
    return AnalyzeResult(" ".join(paths), profile_summary(paths, top=top, workers=workers, ray=ray), top)


def run(path, top: int, as_json: bool, csv: str | None = None, format_: str | None = None,
        workers: int | None = None, ray: str | None = None) -> None:
    from tpuprof.renderers import analyze as render
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_, csv)
    if csv is not None:
        from tpuprof.renderers import csv as render_csv

        render_csv.check_analyze(csv)
        render_csv.print_analyze(profile_summary(path, top=0, workers=workers, ray=ray), csv)  # CSV: every row
        return
    steps = result(path, top, workers=workers, ray=ray)
    if not print_document(steps, format_):
        render.print_document(steps.to_dict(), top)
