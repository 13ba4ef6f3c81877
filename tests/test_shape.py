"""TPU tiling math against the compiler: every buffer libtpu sized in the sample dumps."""

from __future__ import annotations

import pytest
from conftest import DUMPS

from tpuprof import protos
from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.sources import hlo_dump

GiB = 1 << 30


def test_seed_one_hot_from_the_article():
    s = shapes.parse_shape("s32[29360128,10]{1,0:T(8,128)}")
    assert s.padded_bytes() == 14 * GiB
    assert s.unpadded_bytes() == 29360128 * 10 * 4  # 1.09 GiB
    assert round(s.unpadded_bytes() / GiB, 2) == 1.09
    assert s.padded_dims() == [(1, 10, 128)]
    assert s.padded_bytes() / s.unpadded_bytes() == pytest.approx(12.8)


@pytest.mark.parametrize("text, padded, unpadded", [
    ("f32[3,3,3,18]{3,2,1,0:T(4,128)}", 3 * 3 * 4 * 128 * 4, 3 * 3 * 3 * 18 * 4),
    # Later tiles only pack: bf16 (2,1) adds nothing to the (8,128) rounding.
    ("bf16[10,100]{1,0:T(8,128)(2,1)}", 16 * 128 * 2, 10 * 100 * 2),
    ("s8[33,130]{1,0:T(8,128)(4,1)}", 40 * 256, 33 * 130),
    ("s4[8,128]{1,0:T(8,128)(8,1)E(4)}", 8 * 128 // 2, 8 * 128 // 2),
    ("f32[1000]{0:T(1024)}", 1024 * 4, 4000),
    ("f32[]{:T(128)}", 128 * 4, 4),
    ("pred[64,32,32,18]{0,3,2,1:T(8,128)(4,1)S(1)}", 3145728, 64 * 32 * 32 * 18),
    ("f32[5]{0:L(16)}", 16 * 4, 20),
    ("f32[<=10,128]{1,0:T(8,128)}", 16 * 128 * 4, 10 * 128 * 4),
    ("f32[10,3]", 120, 120),
])
def test_padded_bytes_forms(text, padded, unpadded):
    s = shapes.parse_shape(text)
    assert s.padded_bytes() == padded
    assert s.unpadded_bytes() == unpadded


def test_memory_space_and_tuples():
    s = shapes.parse_shape("(f32[2,3]{1,0:T(2,128)S(1)}, s32[]{:S(2)}, (bf16[4]{0}))")
    assert s.is_tuple and len(s.tuple_shapes) == 3
    assert s.tuple_shapes[0].memory_space == 1
    assert s.subshape([2, 0]).dtype == "bf16"
    assert shapes.parse_shape(s.text()).text() == s.text()


@pytest.mark.parametrize("bad", ["q7[10]{0}", "f32[10", "f32[a,b]", "(f32[1]"])
def test_bad_shapes_are_user_errors(bad):
    with pytest.raises(UserError):
        shapes.parse_shape(bad)


def test_every_xla_primitive_type_is_known():
    for name in protos.xla_data_pb2().PrimitiveType.keys():
        lowered = "opaque" if name == "OPAQUE_TYPE" else name.lower()
        if lowered in ("primitive_type_invalid",):
            continue
        assert lowered in shapes.ELEMENT_BITS or lowered in shapes.NON_ARRAY_TYPES, name


def test_tiling_math_equals_libtpu_for_every_sample_buffer():
    """The compiler sized each logical buffer; recomputing from its layout must give the same bytes."""
    checked = 0
    layouts = set()
    for pb in sorted(DUMPS.glob("*/*.after_optimizations.hlo.pb")):
        proto = hlo_dump.read_hlo_proto(pb)
        by_id = {i.id: i for c in proto.hlo_module.computations for i in c.instructions}
        for lb in proto.buffer_assignment.logical_buffers:
            shape = shapes.from_proto(by_id[lb.defined_at.instruction_id].shape).subshape(
                list(lb.defined_at.shape_index))
            if shape.is_tuple:
                continue  # tuple index tables: the TPU rounds them to its 512-byte granule
            assert shape.padded_bytes() == lb.size, (pb.parent.name, shape.text())
            layouts.add(shape.layout.text().partition(":")[2] if shape.layout else "")
            checked += 1
    assert checked > 200
    # The samples exercise the layout forms the issue lists.
    joined = " ".join(layouts)
    for form in ("T(8,128)}", "(2,1)", "(4,1)", "T(1024)", "T(128)", "S(1)"):
        assert form in joined, form


@pytest.mark.parametrize("bad", [
    "f32[8,128]{1,0:T(8,128}",  # a tile never closed
    "f32[8,128]{0:T(8,128)}",  # minor_to_major shorter than the rank
    "f32[8,128]{5,0:T(8,128)}",  # naming a dimension the shape does not have
    "f32[8,128]{0,0}",  # naming one twice
    "f32[8,128]{1,0:T(8,128)L(0)}",  # tail padding of 0 (a division by zero)
    "f32[8,128]{1,0:T(8,128)E(x)}", "f32[8,128]{1,0:T(8,128)S(-1)}", "f32[8,128]{1,0:T(0,128)}",
    "f32[8,x128]", "f32[" + "9" * 5000 + "]", "f32[4294967296,4294967296,4294967296]",
    "(" * 1000 + "f32[1]" + ")" * 1000,  # nesting: no RecursionError
])
def test_layouts_are_checked_against_the_shape_where_they_are_read(bad):
    with pytest.raises(UserError):
        shapes.parse_shape(bad)


def test_a_layout_from_a_proto_is_checked_too():
    proto = protos.xla_data_pb2().ShapeProto(element_type=protos.xla_data_pb2().F32, dimensions=[8, 128])
    proto.layout.minor_to_major.extend([0])
    proto.layout.tiles.add(dimensions=[8, 128])
    with pytest.raises(UserError, match="does not fit its 2 dimension"):
        shapes.from_proto(proto)
