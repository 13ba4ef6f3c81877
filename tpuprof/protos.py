"""XLA and profiler protobuf classes, without importing TensorFlow.

The generated modules (`hlo_pb2`, `xplane_pb2`) ship inside the TensorFlow wheel and need only
`google.protobuf`, but importing them by name runs `tensorflow/__init__.py` first (about 3 s).
We load them with their real module names from TensorFlow's directory while the parent packages
are stood in for by empty namespace modules, then drop those stand-ins again. The `_pb2` modules
stay registered under their real names, so a later real `import tensorflow` reuses them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from functools import lru_cache

from tpuprof.errors import UserError

HLO_PB2 = "tensorflow.compiler.xla.service.hlo_pb2"
XLA_DATA_PB2 = "tensorflow.compiler.xla.xla_data_pb2"
XPLANE_PB2 = "tensorflow.tsl.profiler.protobuf.xplane_pb2"
# Every package above those modules; hlo_pb2 imports xla_data_pb2 and metrics_pb2 from its siblings.
_PARENT_PACKAGES = sorted({
    module.rsplit(".", depth)[0]
    for module in (HLO_PB2, XLA_DATA_PB2, XPLANE_PB2)
    for depth in range(1, module.count(".") + 1)
})


def _tensorflow_dir() -> str:
    spec = importlib.util.find_spec("tensorflow")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "TensorFlow is not installed: tpuprof reads XLA and profiler protos from its wheel "
            "(pip install tensorflow)."
        )
    return list(spec.submodule_search_locations)[0]


@lru_cache(maxsize=None)
def load(module_name: str) -> types.ModuleType:
    """Import one generated `_pb2` module of TensorFlow's without TensorFlow's __init__."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    real_tf = sys.modules.get("tensorflow")
    if real_tf is not None and getattr(real_tf, "__file__", None):
        return importlib.import_module(module_name)

    root = _tensorflow_dir()
    stand_ins = [package for package in _PARENT_PACKAGES if package not in sys.modules]
    for package in stand_ins:
        stub = types.ModuleType(package)
        stub.__path__ = ["/".join([root, *package.split(".")[1:]])]
        sys.modules[package] = stub
    try:
        return importlib.import_module(module_name)
    finally:
        for package in stand_ins:
            sys.modules.pop(package, None)


def hlo_pb2() -> types.ModuleType:
    return load(HLO_PB2)


def xla_data_pb2() -> types.ModuleType:
    return load(XLA_DATA_PB2)


def xplane_pb2() -> types.ModuleType:
    return load(XPLANE_PB2)
