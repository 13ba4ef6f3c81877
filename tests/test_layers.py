"""The layers of CONTRIBUTING.md ("Data flow = package layout"), checked over every import in the package (top
level or inside functions: tests/test_imports.py's graph).

Data flows sources -> analyses -> advice -> renderers, wired by commands: a renderer draws results (models) and
never reads files or computes; an analysis computes on models and never prints. The crossings that exist today are
listed below with the reason they remain; any other crossing fails, and so does a listed one that is gone (so the
list only shrinks).
"""

from __future__ import annotations

from test_imports import import_graph

# The package's top-level modules that hold one fact each (errors, sizes, TPU generations, protos...): every layer
# may use them, and they use no layer but models.
BASE = {"errors", "units", "targets", "protos", "slices", "prices", "version", "schemas", "documents", "caveats",
        "library_output",
        # A command's document built from its typed result where that reads models only (the memory document).
        "documents_memory", "documents_oom", "documents_analyze", "documents_diff"}
# The edge of the package may import anything: the command line, the entry points and the Python API.
EDGE = {"cli", "cli_lazy", "api", "__main__", "tpuprof"}

# Layer -> the layers it may import (besides itself and BASE).
ALLOWED = {
    "base": {"models", "_protos"},
    # XLA's and TSL's generated protos that tpuprof ships (tpuprof.protos loads them): they import only protobuf.
    "_protos": set(),
    "models": set(),
    "sources": {"models"},
    "analyses": {"sources", "models"},
    "advice": {"analyses", "models"},
    "renderers": {"models", "presentation"},
    # What a person is shown (tpuprof/presentation): built from a command's document, printed by the renderers. It
    # may use the prose a document writes (preflight's slice labels, ranking and unsharded-weights words), so that
    # the section and the document say it in the same words.
    "presentation": {"models", "documents_preflight"},
    # The versioned JSON document of a command, built from its typed result (serve's first; issue 32's document
    # layer): it reads analyses' results and is read by results, renderers and commands.
    "documents_serve": {"analyses", "advice", "models"},
    "documents_preflight": {"analyses", "advice", "models"},
    # What a command returns (tpuprof.results): it gives its JSON document and shows itself in a notebook.
    "results": {"renderers", "presentation", "models", "documents_serve", "documents_preflight"},
    "commands": {"sources", "analyses", "advice", "renderers", "results", "models", "documents_serve",
                 "documents_preflight"},
}

DOCUMENT_LAYER = "to move with the document layer (issue 32): the renderer reads what the document should carry"
# (importer, imported) -> why the crossing remains.
KNOWN_CROSSINGS = {
    ("tpuprof.renderers.trace", "tpuprof.analyses.chips"): DOCUMENT_LAYER,
    ("tpuprof.renderers.trace", "tpuprof.analyses.top_ops"): DOCUMENT_LAYER,
    ("tpuprof.renderers.capture", "tpuprof.sources.addresses"): DOCUMENT_LAYER,
    ("tpuprof.renderers.capture", "tpuprof.sources.capture"): DOCUMENT_LAYER,
    ("tpuprof.renderers.html", "tpuprof.sources.inputs"): DOCUMENT_LAYER,
    ("tpuprof.renderers.trace", "tpuprof.sources.xplane"): DOCUMENT_LAYER,
    ("tpuprof.documents_serve", "tpuprof.sources.llm_serve"):
        "the serving step's implementation name: to travel in the typed answer instead",
    ("tpuprof.analyses.preflight", "tpuprof.renderers.output"):
        "the compile cache's atomic write: write_atomically to move to a base module with renderers/output.py's rework",
}


def layer(module: str) -> str:
    """tpuprof.renderers.html -> renderers; tpuprof.units -> base; tpuprof.cli -> edge."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    if len(parts) == 2 and name in BASE:
        return "base"
    if len(parts) <= 2 and (name in EDGE or parts == ["tpuprof"]):
        return "edge"
    return name


def crossings(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair whose layers the rule does not allow."""
    found = set()
    for importer, imported in graph.items():
        source = layer(importer)
        if source == "edge":
            continue
        allowed = ALLOWED[source] | {source, "base"}
        found.update((importer, target) for target in imported if layer(target) not in allowed)
    return found


def test_every_module_has_a_layer():
    unknown = {name for name in import_graph() if layer(name) not in ALLOWED and layer(name) != "edge"}
    assert not unknown, f"modules outside CONTRIBUTING.md's layout (add them to a layer here): {sorted(unknown)}"


def test_no_new_crossing_of_the_layers():
    new = sorted(crossings(import_graph()) - set(KNOWN_CROSSINGS))
    assert not new, "imports across CONTRIBUTING.md's layers: " + "; ".join(f"{a} -> {b}" for a, b in new)


def test_the_known_crossings_still_exist():
    """A crossing removed from the code is removed from the list, so that it cannot come back unnoticed."""
    gone = sorted(set(KNOWN_CROSSINGS) - crossings(import_graph()))
    assert not gone, "no longer crossing, remove from KNOWN_CROSSINGS: " + "; ".join(f"{a} -> {b}" for a, b in gone)


def test_the_rule_catches_a_crossing():
    """The check can fail: a renderer that reads a source, an analysis that prints, a source that analyses."""
    graph = {"tpuprof.renderers.memory": {"tpuprof.sources.hlo_dump", "tpuprof.models.memory", "tpuprof.units"},
             "tpuprof.analyses.memory": {"tpuprof.renderers.tables", "tpuprof.sources.hlo_dump"},
             "tpuprof.sources.hlo_dump": {"tpuprof.analyses.buffers", "tpuprof.protos"},
             "tpuprof.units": {"tpuprof.renderers.tables"},
             "tpuprof.cli": {"tpuprof.commands.memory"}}
    assert crossings(graph) == {("tpuprof.renderers.memory", "tpuprof.sources.hlo_dump"),
                                ("tpuprof.analyses.memory", "tpuprof.renderers.tables"),
                                ("tpuprof.sources.hlo_dump", "tpuprof.analyses.buffers"),
                                ("tpuprof.units", "tpuprof.renderers.tables")}
