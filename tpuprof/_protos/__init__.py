"""The XLA and TSL protos tpuprof reads (hlo.proto, xla_data.proto, metrics.proto, xplane.proto), shipped with
tpuprof so that reading an HloProto or an xplane.pb needs protobuf and not TensorFlow. The modules beside this one
are written by tools/generate_protos.py (`make protos`); use them through `tpuprof.protos`.

Their files live in a descriptor pool of tpuprof's own, not in protobuf's default pool. TensorFlow, JAX and XProf
register their own copies of the same files (same file and message names, often another version) in the default
pool, and a pool refuses a second, different file of one name: in one pool, `import tensorflow` after tpuprof (or
the other way round) would crash whenever the versions differ. In a pool of their own both load, and the wire
format, which is all tpuprof exchanges with those libraries, is the same.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool, message, reflection
from google.protobuf.internal import enum_type_wrapper

POOL = descriptor_pool.DescriptorPool()


def build(serialized: bytes, namespace: dict, imports=()):
    """Adds one serialized FileDescriptorProto to POOL and fills a generated module's NAMESPACE with its enums,
    their values and its message classes, as protoc's generated code does (without registering them in protobuf's
    default symbol database, which is keyed by full name and belongs to the default pool). IMPORTS are the modules
    of the files it imports: protobuf's well-known types (any, duration, timestamp) are added to POOL here."""
    for module in imports:
        file = module.DESCRIPTOR
        if file.pool is not POOL:
            try:
                POOL.FindFileByName(file.name)
            except KeyError:
                POOL.AddSerializedFile(file.serialized_pb)
    file = POOL.AddSerializedFile(serialized)
    module_name = namespace["__name__"]
    for name, enum in file.enum_types_by_name.items():
        namespace[name] = enum_type_wrapper.EnumTypeWrapper(enum)
        for value in enum.values:
            namespace[value.name] = value.number
    for name, descriptor in file.message_types_by_name.items():
        namespace[name] = _message_class(descriptor, module_name)
    return file


def _message_class(descriptor, module_name: str, prefix: str = "") -> type:
    """A message class with its nested classes; __module__ and __qualname__ name where it lives, so that its
    instances pickle (a ProcessPoolExecutor or Ray task may return them)."""
    namespace = {name: _message_class(nested, module_name, f"{prefix}{descriptor.name}.")
                 for name, nested in descriptor.nested_types_by_name.items()}
    namespace.update(DESCRIPTOR=descriptor, __module__=module_name, __qualname__=prefix + descriptor.name)
    return reflection.GeneratedProtocolMessageType(descriptor.name, (message.Message,), namespace)
