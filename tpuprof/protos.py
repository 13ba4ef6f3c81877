"""XLA and profiler protobuf classes (hlo_pb2, xla_data_pb2, xplane_pb2): tpuprof's own copies (tpuprof._protos).

They need protobuf only, so reading an HloProto or an xplane.pb runs no TensorFlow, and they live in a descriptor pool
of their own, so a process that also imports TensorFlow, JAX or XProf (with their own copies, of any version) loads
both. Each module is imported at its first use, never by `import tpuprof`.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from functools import lru_cache


def _defer_pure_python_messages() -> None:
    """Make protobuf's pure-Python message module a lazy one (importlib.util.LazyLoader): loaded at its first use.

    protobuf's descriptor_pool and builder import `python_message` (and with it text_format, well_known_types,
    datetime and locale) even where it is never used: with upb, protobuf's C implementation and the default, no
    line of it runs. Importing it was about 10 ms of each command that reads a proto (12 ms of the 170 ms of
    `memory` on a 9 MB HloProto). With the pure-Python implementation it is used, so it is loaded as usual."""
    name = "google.protobuf.internal.python_message"
    if name in sys.modules:
        return
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # Their `from google.protobuf.internal import python_message` then takes the package's attribute as it is;
    # a lookup through the import system would read the module's __spec__, which loads it.
    setattr(sys.modules["google.protobuf.internal"], "python_message", module)


_defer_pure_python_messages()  # before anything imports google.protobuf.descriptor_pool


def hlo_pb2() -> types.ModuleType:
    from tpuprof._protos import hlo_pb2

    return hlo_pb2


def xla_data_pb2() -> types.ModuleType:
    from tpuprof._protos import xla_data_pb2

    return xla_data_pb2


def xplane_pb2() -> types.ModuleType:
    from tpuprof._protos import xplane_pb2

    return xplane_pb2


@lru_cache(maxsize=None)
def buffer_view_classes() -> tuple[type, type]:
    """Two message classes over HloProto's wire format for the memory analysis of large modules: the real
    messages' field numbers and types, fewer fields. upb keeps the fields a schema does not declare as unparsed
    bytes and writes them back unchanged, so what one reads, the other (or the real class) can parse again.

    - The index reads only whether each computation is a fusion body; the buffer assignment stays bytes. Most of
      a large module is fusion bodies, whose instructions define no buffer.
    - The view reads the buffer assignment, and of the module its name, entry, stack frames, input_output_alias,
      computations (id, root) and of their instructions only what the analysis reads (id, name, opcode, shape,
      metadata, parameter number): a smaller message parses faster (35% here) and its fields read faster."""
    from google.protobuf import descriptor_pb2, message_factory

    hlo = hlo_pb2()
    field_proto = descriptor_pb2.FieldDescriptorProto

    def pruned(message, keep: dict[str, str | None], name: str = "") -> descriptor_pb2.DescriptorProto:
        """MESSAGE with only the fields in KEEP: a field mapped to a message name takes that type, "bytes" keeps
        the field's bytes unparsed, None keeps the field as it is."""
        proto = descriptor_pb2.DescriptorProto(name=name or message.DESCRIPTOR.name)
        for field in message.DESCRIPTOR.fields:
            if field.name not in keep:
                continue
            # protobuf 7 names it is_repeated (its `label` is gone); protobuf 5 has only the label.
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
            label = field_proto.LABEL_REPEATED if repeated else field_proto.LABEL_OPTIONAL
            copied = proto.field.add(name=field.name, number=field.number, type=field.type, label=label)
            if keep[field.name] == "bytes":
                copied.type = field_proto.TYPE_BYTES
            elif keep[field.name]:
                copied.type_name = keep[field.name]
            elif field.message_type is not None:
                copied.type_name = "." + field.message_type.full_name
        return proto

    package = "tpuprof_buffer_view"
    file = descriptor_pb2.FileDescriptorProto(  # the kept fields' types: hlo.proto's and its imports' (xla_data.proto)
        name="tpuprof/buffer_view.proto", package=package, syntax="proto3",
        dependency=[hlo.DESCRIPTOR.name, *(d.name for d in hlo.DESCRIPTOR.dependencies)])
    file.message_type.extend([
        pruned(hlo.HloProto, {"hlo_module": f".{package}.IndexModule", "buffer_assignment": "bytes"}, "Index"),
        pruned(hlo.HloModuleProto, {"computations": f".{package}.IndexComputation"}, "IndexModule"),
        pruned(hlo.HloComputationProto, {"is_fusion_computation": None}, "IndexComputation"),
        pruned(hlo.HloProto, {"hlo_module": f".{package}.HloModuleProto", "buffer_assignment": None}),
        pruned(hlo.HloModuleProto, {"name": None, "entry_computation_id": None, "stack_frame_index": None,
                                    "input_output_alias": None, "computations": f".{package}.HloComputationProto"}),
        pruned(hlo.HloComputationProto, {"id": None, "root_id": None,
                                         "instructions": f".{package}.HloInstructionProto"}),
        pruned(hlo.HloInstructionProto, {"id": None, "name": None, "opcode": None, "shape": None, "metadata": None,
                                         "parameter_number": None}),
    ])
    pool = hlo.DESCRIPTOR.pool  # tpuprof's own, where hlo.proto and its imports are
    pool.AddSerializedFile(file.SerializeToString())
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
                 for name in ("Index", "HloProto"))
