"""`tpuprof report INPUTS... -o report.html`: any mix of dumps, profiles, OOM logs and tpuprof JSON -> one page.

Each input is recognised by the input registry (tpuprof.sources.inputs), handed to its own command's analysis
(memory, analyze, oom) or read as that command's --json document (preflight and serve too), and becomes one
JSON-like section; the HTML renderer only draws documents. `tpuprof diff` loads its two inputs the same way; both also take results of the
Python API (`tpuprof.report([tpuprof.memory("dump/")], "page.html")`).
"""

from __future__ import annotations

from pathlib import Path

from tpuprof.errors import UserError
from tpuprof.sources import inputs
from tpuprof.sources.inputs import MEMORY, OOM, PREFLIGHT, SERVE, STEPS, Input

# Points kept per memory-over-program-order curve: enough for the eye, small enough for a light page.
MAX_TIMELINE_POINTS = 3000


def load(path, target: str | None = None, top: int = 15) -> Input:
    """Recognise PATH (the input registry, tpuprof.sources.inputs) and run its command's analysis, or read
    its --json document. PATH may also be a result of the Python API (`tpuprof.memory(...)`...)."""
    from tpuprof.results import Result

    if isinstance(path, Result):
        return from_result(path, top)
    path = str(path)
    family = inputs.identify(path).family
    if family == MEMORY:
        return _load_memory(Path(path), target, top)
    if family == STEPS:
        return _load_steps(path, top)
    if family == OOM:
        return _load_oom(path, target)
    return _load_json(Path(path))


def _load_json(path: Path) -> Input:
    kind, document = inputs.read_document(path)
    if kind == PREFLIGHT:
        _reload_preflight_dumps(document)
    return Input(str(path), kind, document, from_json=True)


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte
        return False


def _reload_preflight_dumps(document: dict) -> None:
    """preflight keeps each compile's dump (its cache): when it is still on this machine, analyse it again
    for what the JSON leaves out (the memory curve, each padded buffer's fix)."""
    for target in document["targets"]:
        dump = target.get("dump_dir")
        if not isinstance(dump, str) or not _is_dir(dump) or not isinstance(target.get("memory"), dict):
            continue
        try:
            modules = _load_memory(Path(dump), target.get("target"), 0).document["modules"]
        except UserError:
            continue  # the JSON's own figures stay
        same = [m for m in modules if m.get("name") == target["memory"].get("name")]
        if same:
            # The document's advice was made with what only preflight knew (the compile's aliased bytes, the bf16
            # compile's measured peak, the built-in step's options): it stays; the dump adds the curve and fixes.
            same[0]["suggestions"] = target["memory"].get("suggestions", same[0]["suggestions"])
            target["memory"] = same[0]


def _load_memory(path: Path, target: str | None, top: int) -> Input:
    from tpuprof import documents
    from tpuprof.commands import memory

    meta = {}
    sample = (path if path.is_dir() else path.parent) / "sample.json"
    if sample.is_file():  # the committed samples say how they were made (model, batch, target)
        try:
            meta = documents.load(sample)
        except UserError:
            meta = {}
        if not documents.valid(meta, documents.SAMPLE):  # advisory: a damaged one is ignored
            meta = {}
    # top=0: shapes and source lines for every buffer (diff matches them all, the page picks its rows).
    results = memory.module_memories(path, target=target or meta.get("target"), top=0)
    return memory_input(str(path), results, meta)


def memory_input(path: str, results: list, meta: dict | None = None) -> Input:
    """The memory document of RESULTS (ModuleMemory, in memory's order: the module the answer is about first), with
    each module's curve over
    program order and each padded buffer's fix."""
    from tpuprof.advice.memory import buffer_fixes
    from tpuprof.analyses.memory import describe
    from tpuprof.documents_memory import document as to_json

    for module in results:
        describe(module, module.buffers)  # diff matches every buffer by its shape (done already with top=0)
    document = to_json(results, 0)  # every buffer: diff matches them, the page picks its top rows
    for module, entry in zip(results, document["modules"]):
        entry["timeline"] = _timeline(module)
        fixes = buffer_fixes(module)
        for row in entry["buffers"]:
            if row["instruction"] in fixes:
                row["fix"] = fixes[row["instruction"]]
        for row in entry["ops"]:
            if row["worst_buffer"] in fixes:
                row["fix"] = fixes[row["worst_buffer"]]
    return Input(path, MEMORY, document, meta=meta or {})


def _timeline(module) -> dict | None:
    padded, unpadded = module.heap_timeline, module.unpadded_timeline
    if not padded:
        return None
    step = max(1, -(-len(padded) // MAX_TIMELINE_POINTS))
    # Keep each bucket's maximum so that the peak survives the thinning.
    positions = list(range(0, len(padded), step))
    return {
        "position": positions,
        "padded_bytes": [max(padded[i:i + step]) for i in positions],
        "unpadded_bytes": [max(unpadded[i:i + step]) for i in positions] if unpadded else [],
        "peak_position": module.peak_position,
        "length": len(padded),
    }


def _load_steps(path: str, top: int) -> Input:
    from tpuprof.commands import analyze

    return steps_input(path, analyze.profile_summary(path, top=top), top)


def steps_input(path: str, report, top: int) -> Input:
    """The steps document of REPORT (the analyze pipeline's), with what the page draws beyond the JSON."""
    from tpuprof.documents_analyze import page_document

    return Input(path, STEPS, page_document(report, top))


def _load_oom(path: str, target: str | None) -> Input:
    """The same pipeline and document as `tpuprof oom --json`."""
    from tpuprof.commands import oom

    try:
        report, estimate, suggestions, joined = oom.explain(path, target=target)
    except UserError as error:
        if str(error).startswith("no TPU out-of-memory error found"):
            raise UserError(f"{path} is not a dump, a profile or tpuprof JSON, and holds no TPU out-of-memory "
                            "error.") from None
        raise
    return Input(path, OOM, oom.to_document(report, estimate, suggestions, joined))


def from_result(result, top: int = 15) -> Input:
    """A result of the Python API as a report or diff input, as if its path had been given."""
    from tpuprof import results

    if isinstance(result, results.MemoryResult):
        return memory_input(result.path, result.modules)
    if isinstance(result, results.AnalyzeResult):
        return steps_input(result.path, result.report, top)
    if isinstance(result, results.OomResult):
        return Input(result.source, OOM, result.to_dict())
    if isinstance(result, results.PreflightResult):
        document = result.to_dict()
        for target, item in zip(result.targets, document["targets"]):
            if target.compiled.memory is not None:  # the curve and the fixes, which the JSON leaves out
                item["memory"] = memory_input(result.spec, [target.compiled.memory]).document["modules"][0]
        return Input(result.spec, PREFLIGHT, document)
    if isinstance(result, results.ServeResult):
        return Input(f"tpuprof.serve({result.answer.options.model.name!r})", SERVE, result.to_dict())
    if isinstance(result, results.CaptureResult) and result.analysis is not None:
        return steps_input(result.run_dir, result.analysis.report, top)
    raise UserError(f"a {type(result).__name__} is not an input of report or diff: give dumps, profiles, OOM logs, "
                    "preflight or serve results or their tpuprof results.")


def result(inputs: list, output: Path, target: str | None = None, top: int = 15, title: str | None = None,
           force: bool = False):
    """The page over INPUTS (paths or results of the Python API), written to OUTPUT whole or not at all (an
    existing file is replaced only with FORCE; a symlink's target is written): the typed result
    `tpuprof.report()` returns."""
    from tpuprof.renderers import html
    from tpuprof.renderers.output import output_file, write_atomically
    from tpuprof.results import ReportResult, as_suggestion

    if not inputs:
        raise UserError("give at least one input: an XLA dump, a profile, an OOM log or a tpuprof --json file.")
    if target is not None:
        from tpuprof import targets

        target = targets.get(target).name
    output = Path(output)
    written = output_file(output, force, "report.html")
    loaded = [load(path, target, top) for path in inputs]
    page = html.render(loaded, top=top, title=title)
    output_file(output, force, "report.html")  # the path may have changed while the inputs were read
    write_atomically(written, page)
    # The page's order: the fixes of what does not fit first, then by saving (memory), then step time.
    suggestions = [as_suggestion(s) for _, s in html.ranked_suggestions(loaded)] + \
        [as_suggestion(s) for item in loaded if item.kind == STEPS for s in _suggestions(item)]
    return ReportResult(str(output), len(page.encode()), loaded, suggestions)


def _suggestions(item: Input) -> list:
    """Every suggestion an input's document carries, in its order."""
    document = item.document
    if item.kind == MEMORY:
        return [s for m in document.get("modules", []) for s in m.get("suggestions", [])]
    if item.kind == PREFLIGHT:
        return [s for t in document.get("targets", [])
                for s in [*(t.get("memory") or {}).get("suggestions", []), *(t.get("oom") or {}).get("suggestions", [])]]
    return list(document.get("suggestions", []))


def run(inputs: list[str], output: Path, target: str | None, top: int, title: str | None, as_json: bool,
        force: bool = False) -> None:
    page = result(inputs, output, target, top, title, force)
    if as_json:
        from tpuprof.renderers.output import print_json

        print_json(page.to_dict())
    else:
        print(output)
