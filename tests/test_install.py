"""TensorFlow only when asked: `pip install tpuprof` brings no TensorFlow, `memory`, `oom` and `analyze` run where
it is missing, the TF-only paths name the `tf` extra, and tpuprof's own protos load beside TensorFlow's.

"Missing" is made as Python reports a package that is not installed: `sys.modules[name] = None` makes every import
of it raise ModuleNotFoundError. docs/install.md has the sizes and times of a real venv without it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from importlib import metadata

import pytest

from conftest import ROOT, SAMPLES, hlo_pb

TENSORFLOW = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tf-nightly", "keras", "tf-keras"}
EXTRA = "pip install 'tpuprof[tf]'"
# What the child processes start with: TensorFlow and Keras not installed, as far as Python can tell.
WITHOUT_TENSORFLOW = "import sys\nfor name in ('tensorflow', 'keras'):\n    sys.modules[name] = None\n"
RUN_CLI = """
import contextlib, io, json
from tpuprof.cli import main

def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit:
            code = exit.code
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
"""
LOADED = ("\nloaded = sorted(m for m, module in sys.modules.items() if module is not None\n"
          "                and m.split('.')[0] in ('tensorflow', 'keras', 'tpuprof'))\n")


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _child(code: str, timeout: float = 300) -> dict:
    """Runs CODE in a fresh interpreter (cwd: the repository) and returns the JSON it prints on its last line."""
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                             timeout=timeout)
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


def test_tensorflow_is_in_the_tf_extra_only():
    project = _project()
    assert not {_name(r) for r in project["dependencies"]} & TENSORFLOW
    extras = {extra: {_name(r) for r in requirements}
              for extra, requirements in project["optional-dependencies"].items()}
    assert "tensorflow" in extras["tf"]
    assert not extras["tpu"] & TENSORFLOW  # a JAX user's `tpuprof[tpu]` brings none either
    # `make test` / `make demo` install every extra, TensorFlow's too.
    assert re.search(r'pip install .*-e "\.\[[^]]*\btf\b', (ROOT / "Makefile").read_text())


def test_the_compiler_comes_with_the_core_install():
    """`preflight --model` and `serve` compile with libtpu: `pip install tpuprof` alone must bring JAX with it."""
    core = {_name(r): r for r in _project()["dependencies"]}
    assert "jax" in core and "tpu" in core["jax"], core.get("jax")


def test_no_core_dependency_pulls_tensorflow_in():
    """Walks the installed metadata from tpuprof's core dependencies (markers evaluated, extras followed), so a
    dependency that starts requiring TensorFlow fails here too, not only one written in pyproject.toml."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}  # distribution -> the chain that brings it
    todo = [(Requirement(r), "tpuprof") for r in _project()["dependencies"]]
    while todo:
        requirement, chain = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen[name] = f"{chain} -> {name}"
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            nested = Requirement(text)
            wanted = [""] + sorted(requirement.extras)
            if nested.marker is None or any(nested.marker.evaluate({"extra": extra}) for extra in wanted):
                todo.append((nested, seen[name]))
    assert "protobuf" in seen and "xprof" in seen  # the walk reached the dependencies' own dependencies
    assert not [seen[name] for name in TENSORFLOW if name in seen]


def test_memory_oom_and_analyze_run_without_tensorflow():
    """On the samples: a libtpu dump's HloProto, an OOM text and a capture's xplane.pb, read with the protos tpuprof
    ships; the process never has TensorFlow."""
    capture = SAMPLES / "captures" / "jax_compute"
    code = WITHOUT_TENSORFLOW + RUN_CLI + f"""
results = {{
    "memory": run("memory", {str(hlo_pb("int8_matmul_v5e"))!r}, "--json"),
    "oom": run("oom", {str(SAMPLES / "oom" / "libtpu_keras_mlp_v5e.txt")!r}, "--json"),
    "analyze": run("analyze", {str(capture)!r}, "--json"),
}}""" + LOADED + "print(json.dumps({'results': results, 'loaded': loaded}))"
    child = _child(code)
    for command, result in child["results"].items():
        assert result["code"] == 0, (command, result["stderr"][-2000:])
        assert json.loads(result["stdout"])["schema"] == f"tpuprof.{command}/1"
    loaded = child["loaded"]
    assert not [m for m in loaded if not m.startswith("tpuprof")], loaded
    assert {"tpuprof._protos.hlo_pb2", "tpuprof._protos.xplane_pb2"} <= set(loaded)


def test_tensorflow_only_paths_name_the_tf_extra_when_it_is_missing():
    """A Keras model file (its factory imports keras), a model file that imports TensorFlow at its top, and a
    Cloud TPU name to resolve: one sentence naming `tpuprof[tf]`, exit 2, no traceback."""
    keras_spec = f"{SAMPLES / 'models' / 'keras_mlp.py'}:factory"
    code = WITHOUT_TENSORFLOW + RUN_CLI + f"""
import pathlib, tempfile
tf_file = pathlib.Path(tempfile.mkdtemp()) / "tf_model.py"
tf_file.write_text("import tensorflow as tf\\n\\ndef factory(batch_size):\\n    return None\\n")
results = {{
    "keras": run("preflight", {keras_spec!r}, "--tpu", "v5e", "--batch", "8", "--no-cache"),
    "tf": run("preflight", f"{{tf_file}}:factory", "--tpu", "v5e", "--batch", "8", "--no-cache"),
    "tpu name": run("capture", "--tpu", "my-tpu", "--project", "p", "--zone", "us-central1-a",
                    "--logdir", str(tf_file.parent / "logs")),
}}
from tpuprof.errors import UserError
from tpuprof.sources import python_step
try:
    python_step._keras_factory(object(), None, None)
    results["api"] = "no error"
except UserError as error:
    results["api"] = str(error)
print(json.dumps(results))"""
    results = _child(code)
    for path, result in results.items():
        if path == "api":
            assert results["api"] == f"Preflight of a Keras model needs TensorFlow, which tpuprof installs only " \
                                     f"when asked ({EXTRA})."
            continue
        assert result["code"] == 2, (path, result)
        sentence = result["stderr"].strip()
        assert EXTRA in sentence and "Traceback" not in sentence and len(sentence.splitlines()) == 1, (path, sentence)
    assert "keras_mlp.py:factory imports keras, so its preflight needs TensorFlow" in results["keras"]["stderr"]
    assert "tf_model.py imports tensorflow, so its preflight needs TensorFlow" in results["tf"]["stderr"]
    assert "Resolving a TPU name needs TensorFlow's TPUClusterResolver" in results["tpu name"]["stderr"]


def test_tpuprof_protos_load_beside_another_version_of_the_same_files():
    """TensorFlow, JAX and XProf register their own hlo.proto and xplane.proto in protobuf's default pool, often of
    another version than tpuprof's: a different file of the same name is there first, and tpuprof still reads."""
    code = WITHOUT_TENSORFLOW + RUN_CLI + f"""
from google.protobuf import descriptor_pb2, descriptor_pool
for name, package in (("xla/service/hlo.proto", "xla"), ("tsl/profiler/protobuf/xplane.proto", "tensorflow.profiler")):
    other = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    other.message_type.add(name="HloProto" if package == "xla" else "XSpace").field.add(
        name="another_version", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    descriptor_pool.Default().AddSerializedFile(other.SerializeToString())
results = {{
    "memory": run("memory", {str(hlo_pb("int8_matmul_v5e"))!r}, "--json"),
    "analyze": run("analyze", {str(SAMPLES / "captures" / "jax_compute")!r}, "--json"),
}}
print(json.dumps({{command: [result["code"], result["stderr"][-1000:]] for command, result in results.items()}}))"""
    assert _child(code) == {"memory": [0, ""], "analyze": [0, ""]}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (tf extra)")
def test_tensorflow_and_tpuprof_in_one_process():
    """tpuprof first, then `import tensorflow`, then both read the same HloProto bytes: TensorFlow's classes and
    tpuprof's are distinct (two pools) and agree on the wire format."""
    proto = hlo_pb("int8_matmul_v5e")
    code = RUN_CLI + f"""
import pathlib, sys
first = run("memory", {str(proto)!r}, "--json")
import tensorflow as tf
from tensorflow.compiler.xla.service import hlo_pb2 as tf_hlo_pb2
from tpuprof import protos
data = pathlib.Path({str(proto)!r}).read_bytes()
theirs, ours = tf_hlo_pb2.HloProto.FromString(data), protos.hlo_pb2().HloProto.FromString(data)
again = run("memory", {str(proto)!r}, "--json")
print(json.dumps({{"codes": [first["code"], again["code"]], "same_output": first["stdout"] == again["stdout"],
                  "module": [theirs.hlo_module.name, ours.hlo_module.name],
                  "distinct": type(theirs) is not type(ours), "tf": tf.__version__}}))"""
    result = _child(code)
    assert result["codes"] == [0, 0] and result["same_output"] and result["distinct"]
    assert result["module"][0] == result["module"][1] != ""
