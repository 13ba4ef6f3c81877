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


@lru_cache(maxsize=None)
def hlo_proto_index_class() -> type:
    """A message class for HloProto files that parses only whether each computation is a fusion body.

    The rest stays unparsed bytes: the buffer assignment is declared `bytes`, and upb keeps the fields a schema does
    not declare (instructions, schedule, shapes) as they were and writes them back unchanged, so a computation found
    here re-serialises to its original bytes for the real `HloComputationProto`. Most of a large module is fusion
    computations that define no buffer; skipping them is most of what `memory` spent reading one. Built from the
    real descriptors (same field numbers and types), with the kept fields only."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    hlo = hlo_pb2()
    package = "tpuprof_hlo_index"
    field_proto = descriptor_pb2.FieldDescriptorProto

    def pruned(message, keep: dict[str, str | None]) -> descriptor_pb2.DescriptorProto:
        """MESSAGE with only the fields in KEEP: a field mapped to a message name takes that type, "bytes" keeps
        the field's bytes unparsed, None keeps the field as it is."""
        proto = descriptor_pb2.DescriptorProto(name=message.DESCRIPTOR.name)
        for field in message.DESCRIPTOR.fields:
            if field.name not in keep:
                continue
            label = field_proto.LABEL_REPEATED if field.is_repeated else field_proto.LABEL_OPTIONAL
            copied = proto.field.add(name=field.name, number=field.number, type=field.type, label=label)
            if keep[field.name] == "bytes":
                copied.type = field_proto.TYPE_BYTES
            elif keep[field.name]:
                copied.type_name = keep[field.name]
        return proto

    file = descriptor_pb2.FileDescriptorProto(name="tpuprof/hlo_index.proto", package=package, syntax="proto3")
    file.message_type.extend([
        pruned(hlo.HloProto, {"hlo_module": f".{package}.HloModuleProto", "buffer_assignment": "bytes"}),
        pruned(hlo.HloModuleProto, {"computations": f".{package}.HloComputationProto"}),
        pruned(hlo.HloComputationProto, {"is_fusion_computation": None}),
    ])
    pool = descriptor_pool.Default()
    pool.AddSerializedFile(file.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.HloProto"))
