"""The package's import structure: no import cycles (imports inside functions count too: they hide the
cycle until the function runs), and renderers draw documents without importing any command."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tpuprof"


def _modules() -> dict[str, Path]:
    found = {}
    for file in PACKAGE.rglob("*.py"):
        parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = file
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the tpuprof modules it imports anywhere in its text (top level or inside functions)."""
    modules = _modules()
    graph = {}
    for name, file in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                package = node.module if node.level == 0 else None
                if package is None:
                    raise AssertionError(f"{file}: relative import; tpuprof imports absolutely")
                for alias in node.names:
                    submodule = f"{package}.{alias.name}"
                    edges.add(submodule if submodule in modules else package)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walker_sees_imports_inside_functions():
    graph = import_graph()
    # analyses/memory.py imports hlo_estimate only inside module_memory: the edge must be there.
    assert "tpuprof.analyses.hlo_estimate" in graph["tpuprof.analyses.memory"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_renderers_import_no_command():
    graph = import_graph()
    offenders = {name: sorted(e for e in edges if e.startswith("tpuprof.commands"))
                 for name, edges in graph.items() if name.startswith("tpuprof.renderers")}
    assert not {k: v for k, v in offenders.items() if v}
