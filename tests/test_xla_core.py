"""The XLA core of CONTRIBUTING.md: one index of an HloModule (models/hlo_module.py) and one reader of what libtpu
writes beside a module (sources/hlo_dump.py), which the memory, estimate, op-cost and collectives analyses share."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import ROOT, SAMPLES

from tpuprof.models.hlo_module import HloModule
from tpuprof.sources import hlo_dump

PACKAGE = ROOT / "tpuprof"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_protos" not in path.parts:
            yield path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."), ast.parse(path.read_text())


def _is_by_id(key, value, element: str) -> bool:
    """`{x.id: x ...}` / `d[x.id] = x`: a lookup of a module's computations or instructions by id."""
    return (isinstance(key, ast.Attribute) and key.attr == "id" and isinstance(key.value, ast.Name)
            and key.value.id == element and isinstance(value, ast.Name) and value.id == element)


def index_builders(tree) -> int:
    """How many by-id lookups of computations or instructions TREE builds."""
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.DictComp):
            for generator in node.generators:
                if (isinstance(generator.iter, ast.Attribute) and generator.iter.attr in ("computations", "instructions")
                        and isinstance(generator.target, ast.Name)):
                    found += _is_by_id(node.key, node.value, generator.target.id)
        if (isinstance(node, ast.For) and isinstance(node.iter, ast.Attribute)
                and node.iter.attr in ("computations", "instructions") and isinstance(node.target, ast.Name)):
            element = node.target.id
            aliases = {element}
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and len(inner.targets) == 1:
                    target = inner.targets[0]
                    if isinstance(target, ast.Name) and isinstance(inner.value, ast.Attribute) \
                            and inner.value.attr == "id" and isinstance(inner.value.value, ast.Name) \
                            and inner.value.value.id == element:
                        aliases.add(target.id)  # instruction_id = instruction.id
                    elif isinstance(target, ast.Subscript) and isinstance(inner.value, ast.Name) \
                            and inner.value.id == element:
                        key = target.slice
                        found += (isinstance(key, ast.Name) and key.id in aliases) or _is_by_id(key, inner.value, element)
    return found


def test_one_index_of_an_hlo_module():
    """Computations and instructions are looked up by id in models/hlo_module.py only (main had three indexes:
    analyses/buffers.py's, step_estimate's walker's and hlo_estimate's)."""
    builders = {name: count for name, tree in _modules() if (count := index_builders(tree))}
    assert set(builders) == {"tpuprof.models.hlo_module"}, builders


def test_the_index_check_catches_an_index():
    tree = ast.parse("by_id = {}\nfor instruction in computation.instructions:\n    by_id[instruction.id] = instruction\n"
                     "computations = {c.id: c for c in module.computations}\n")
    assert index_builders(tree) == 2


def test_one_reader_of_the_files_beside_a_module():
    """Only sources/hlo_dump.py names `*.target_arguments.txt` and `*.execution_options.txt` to read them
    (tpu_compile lists them among the files a compile keeps); main read target_arguments.txt in three places."""
    readers = set()
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.endswith(("target_arguments.txt", "execution_options.txt")):
                readers.add(name)
    assert readers == {"tpuprof.sources.hlo_dump", "tpuprof.sources.tpu_compile"}


def test_target_arguments_of_a_real_dump():
    folder = SAMPLES / "dumps" / "transformer_bf16_v6e"
    module_file = next(folder.glob("*.after_optimizations.hlo.pb"))
    arguments = hlo_dump.read_target_arguments(module_file)
    assert arguments == hlo_dump.TargetArguments("v6e", "default", (2, 2, 1), (1, 1, 1), (False, False, False))
    assert hlo_dump.read_device_assignment(module_file) == []  # this dump kept no execution options
    wrapped = hlo_dump.parse_target_arguments("tpu_topology_args { version: TPU_VERSION_VIPERFISH variant: \"\" "
                                              "wrap { x: true z: true } }")
    assert wrapped.wrap == (True, False, True)


def test_the_index_finds_what_the_memory_analysis_needs():
    """find() visits the computations that own the ids (XLA numbers an instruction computation id << 32 | local
    id), and everything when that numbering does not hold."""
    module_file = next((SAMPLES / "dumps" / "transformer_bf16_v6e").glob("*.after_optimizations.hlo.pb"))
    module = HloModule(hlo_dump.read_hlo_proto(module_file).hlo_module)
    entry = module.entry
    wanted = {i.id for i in entry.instructions[:5]}
    assert set(module.find(wanted)) == wanted
    assert module.find(set()) == {}
    assert {i.name for i in module.find(wanted).values()} <= {i.name for i in module.by_id.values()}


def test_hlo_text_names_each_op_as_its_hloproto_does():
    """XLA prints metadata strings C-escaped (op_name="...state[\\'model\\']..."); the text reader unescapes them, so
    an op has one name whether its module was read from the text or from the HloProto (diff matches ops by name)."""
    from tpuprof.protos import hlo_pb2
    from tpuprof.sources import hlo_text

    folder = SAMPLES / "dumps" / "diff_b64"
    text = next(folder.glob("*.after_optimizations.txt")).read_text()
    assert "\\'" in text  # the escaped form this test is about
    proto = hlo_pb2().HloProto()
    proto.ParseFromString(next(folder.glob("*.after_optimizations.hlo.pb")).read_bytes())
    from_proto = {i.name: i.metadata.op_name for c in proto.hlo_module.computations for i in c.instructions}
    from_text = {i.name: i.op_name for c in hlo_text.parse(text).computations.values() for i in c}
    both = from_proto.keys() & from_text.keys()
    assert len(both) > 100 and any("'" in from_proto[n] for n in both)
    assert {n: from_text[n] for n in both} == {n: from_proto[n] for n in both}
