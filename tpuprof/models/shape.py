"""XLA shapes with TPU layouts, and their padded and unpadded sizes.

Padded size follows XLA's `ShapeUtil::ArraySize`: only the first tile pads (each of its dims rounds
the matching minor-most dims up); later tiles such as `(2,1)` only pack elements and add nothing.
`L(n)` rounds the element count up to a multiple of n, `E(bits)` overrides the element width.
Unpadded size is the dense size: product of dims times element width.

Shapes come from HLO text (`f32[8,128]{1,0:T(8,128)}`) or from `xla.ShapeProto`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tpuprof.errors import UserError

# Bits per element of every primitive type XLA prints (xla_data.proto PrimitiveType, lower-cased).
ELEMENT_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "f4e2m1fn": 4, "f8e8m0fnu": 8,
    "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e3m4": 8,
    "f8e5m2fnuz": 8, "f8e4m3fnuz": 8,
    "c64": 64, "c128": 128,
}
# Types that hold no array data of their own.
NON_ARRAY_TYPES = {"token", "opaque", "tuple", "buffer"}
POINTER_BYTES = 8  # a tuple is a table of pointers to its elements

# ShapeProto.element_type enum numbers -> names; filled from xla_data_pb2 on first use.
_ENUM_TO_NAME: dict[int, str] = {}


def element_bytes(dtype: str) -> int:
    """XLA's ByteSizeOfPrimitiveType: sub-byte types still take one byte unless a layout says E(bits)."""
    return max(1, ELEMENT_BITS[dtype] // 8)


@dataclass(frozen=True)
class Layout:
    minor_to_major: tuple[int, ...] = ()
    tiles: tuple[tuple[int, ...], ...] = ()
    element_size_in_bits: int = 0
    tail_padding_alignment: int = 1  # L(n)
    memory_space: int = 0  # S(n); 0 is HBM ("default") on TPU

    def text(self) -> str:
        parts = ",".join(str(d) for d in self.minor_to_major)
        extra = "".join("(" + ",".join(str(t) for t in tile) + ")" for tile in self.tiles)
        if extra:
            extra = "T" + extra
        if self.tail_padding_alignment != 1:
            extra += f"L({self.tail_padding_alignment})"
        if self.element_size_in_bits:
            extra += f"E({self.element_size_in_bits})"
        if self.memory_space:
            extra += f"S({self.memory_space})"
        return "{" + parts + (":" + extra if extra else "") + "}"


@dataclass(frozen=True)
class Shape:
    """An array shape (dtype, dims, optional layout) or a tuple of shapes."""

    dtype: str
    dims: tuple[int, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple["Shape", ...] = ()
    dynamic: tuple[bool, ...] = field(default=())

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def memory_space(self) -> int:
        return self.layout.memory_space if self.layout else 0

    @property
    def element_count(self) -> int:
        return math.prod(self.dims)

    def padded_bytes(self) -> int:
        """Bytes the buffer takes with its layout (XLA ShapeUtil::ByteSizeOf with ArraySize)."""
        if self.is_tuple:
            return POINTER_BYTES * len(self.tuple_shapes)
        if self.dtype in NON_ARRAY_TYPES:
            return 0
        layout = self.layout
        if layout is None or not layout.tiles:
            count = self.element_count
            if layout is not None and layout.tail_padding_alignment != 1:
                count = _round_up(count, layout.tail_padding_alignment)
            return self._bytes_for(count)
        tile = layout.tiles[0]
        m2m = layout.minor_to_major or tuple(range(len(self.dims) - 1, -1, -1))
        count = 1
        for i in range(len(tile)):
            dim = self.dims[m2m[i]] if i < len(self.dims) else 1
            tile_dim = tile[len(tile) - 1 - i]
            count *= _round_up(dim, tile_dim) if tile_dim > 0 else dim
        for i in range(len(tile), len(self.dims)):
            count *= self.dims[m2m[i]]
        if layout.tail_padding_alignment != 1:
            count = _round_up(count, layout.tail_padding_alignment)
        return self._bytes_for(count)

    def unpadded_bytes(self) -> int:
        """Dense bytes: what the data needs with no tiling (sub-byte types packed)."""
        if self.is_tuple:
            return POINTER_BYTES * len(self.tuple_shapes)
        if self.dtype in NON_ARRAY_TYPES:
            return 0
        return math.ceil(self.element_count * ELEMENT_BITS[self.dtype] / 8)

    def _bytes_for(self, count: int) -> int:
        bits = self.layout.element_size_in_bits if self.layout else 0
        if bits:
            return math.ceil(count * bits / 8)
        return count * element_bytes(self.dtype)

    def padded_dims(self) -> list[tuple[int, int, int]]:
        """(dimension index, size, padded size) for each dim the first tile rounds up."""
        if self.is_tuple or not self.layout or not self.layout.tiles:
            return []
        tile = self.layout.tiles[0]
        m2m = self.layout.minor_to_major
        out = []
        for i in range(min(len(tile), len(self.dims))):
            dim_index = m2m[i]
            tile_dim = tile[len(tile) - 1 - i]
            size = self.dims[dim_index]
            if tile_dim > 0 and size % tile_dim:
                out.append((dim_index, size, _round_up(size, tile_dim)))
        return out

    def text(self, with_layout: bool = True) -> str:
        if self.is_tuple:
            return "(" + ", ".join(s.text(with_layout) for s in self.tuple_shapes) + ")"
        dims = ",".join(("<=" if self.dynamic and self.dynamic[i] else "") + str(d)
                        for i, d in enumerate(self.dims))
        out = f"{self.dtype}[{dims}]"
        if with_layout and self.layout is not None:
            out += self.layout.text()
        return out

    def subshape(self, index: tuple[int, ...] | list[int]) -> "Shape":
        shape = self
        for i in index:
            if not shape.is_tuple or i >= len(shape.tuple_shapes):
                break
            shape = shape.tuple_shapes[i]
        return shape


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# ---------------------------------------------------------------------------------------------
# Text form: f32[128,256]{1,0:T(8,128)}, bf16[<=8,4]{...}, (f32[2], s32[]), token[]
# ---------------------------------------------------------------------------------------------

_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_COMMENT_RE = re.compile(r"/\*.*?\*/")
_LAYOUT_ITEM_RE = re.compile(r"([A-Z]+)\(([^()]*)\)")


def parse_shape(text: str) -> Shape:
    """Parse an HLO shape string, layout included. Raises UserError on anything unknown."""
    text = _COMMENT_RE.sub("", text).strip()  # long tuples carry /*index=5*/ markers
    shape, rest = _parse_at(text, 0)
    if text[rest:].strip():
        raise UserError(f"cannot read the shape {text!r}: unexpected text after position {rest}.")
    return shape


def parse_shape_prefix(text: str, pos: int = 0) -> tuple[Shape, int]:
    """Parse the shape that starts at POS (e.g. after `%x = ` in an HLO line); return it and where it ends."""
    return _parse_at(text, pos)


def _parse_at(text: str, pos: int) -> tuple[Shape, int]:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if text.startswith("(", pos):
        elements = []
        pos += 1
        while True:
            while pos < len(text) and text[pos] in " ,":
                pos += 1
            if pos >= len(text):
                raise UserError(f"cannot read the shape {text!r}: unclosed tuple.")
            if text[pos] == ")":
                return Shape("tuple", tuple_shapes=tuple(elements)), pos + 1
            element, pos = _parse_at(text, pos)
            elements.append(element)
    match = _ARRAY_RE.match(text, pos)
    if not match:
        raise UserError(f"cannot read the shape {text!r}: expected dtype[dims].")
    dtype = match.group(1)
    if dtype not in ELEMENT_BITS and dtype not in NON_ARRAY_TYPES:
        raise UserError(f"unknown element type {dtype!r} in shape {text!r}.")
    dims, dynamic = [], []
    for part in filter(None, (p.strip() for p in match.group(2).split(","))):
        is_dynamic = part.startswith("<=") or part == "?"
        try:
            dims.append(int(part.lstrip("<=")) if part != "?" else 0)
        except ValueError:
            raise UserError(f"cannot read dimension {part!r} in shape {text!r}.") from None
        dynamic.append(is_dynamic)
    pos = match.end()
    layout = None
    if text.startswith("{", pos):
        end = _matching_brace(text, pos)
        layout = _parse_layout(text[pos + 1:end], text)
        pos = end + 1
    return Shape(dtype, tuple(dims), layout, dynamic=tuple(dynamic) if any(dynamic) else ()), pos


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise UserError(f"cannot read the shape {text!r}: unclosed layout.")


def _parse_layout(body: str, whole: str) -> Layout:
    order, _, attributes = body.partition(":")
    try:
        minor_to_major = tuple(int(x) for x in order.split(",") if x.strip())
    except ValueError:
        raise UserError(f"cannot read the layout of {whole!r}.") from None
    tiles: list[tuple[int, ...]] = []
    bits, tail, space = 0, 1, 0
    in_tiles = False
    pos = 0
    while pos < len(attributes):
        ch = attributes[pos]
        if ch == "T":
            in_tiles = True
            pos += 1
            continue
        if ch == "(" and in_tiles:
            end = attributes.index(")", pos)
            tiles.append(tuple(_tile_dim(x) for x in attributes[pos + 1:end].split(",") if x.strip()))
            pos = end + 1
            continue
        in_tiles = False
        item = _LAYOUT_ITEM_RE.match(attributes, pos)
        if item is None:  # a lone marker such as '*' or 'D(...)' content we do not need
            pos += 1
            continue
        name, value = item.groups()
        if name == "E":
            bits = int(value)
        elif name == "L":
            tail = int(value)
        elif name == "S":
            space = int(value)
        pos = item.end()
    return Layout(minor_to_major, tuple(tiles), bits, tail, space)


def _tile_dim(text: str) -> int:
    text = text.strip()
    return -1 if text == "*" else int(text)  # '*' combines dims: never pads


# ---------------------------------------------------------------------------------------------
# ShapeProto form (HloProto dumps)
# ---------------------------------------------------------------------------------------------

def from_proto(proto) -> Shape:
    """Convert an `xla.ShapeProto` to a Shape."""
    if not _ENUM_TO_NAME:
        from tpuprof import protos

        enum = protos.xla_data_pb2().PrimitiveType
        for name, number in enum.items():
            _ENUM_TO_NAME[number] = "opaque" if name == "OPAQUE_TYPE" else name.lower()
    dtype = _ENUM_TO_NAME.get(proto.element_type, "")
    if dtype == "tuple":
        return Shape("tuple", tuple_shapes=tuple(from_proto(s) for s in proto.tuple_shapes))
    if dtype not in ELEMENT_BITS and dtype not in NON_ARRAY_TYPES:
        raise UserError(f"unknown element type number {proto.element_type} in an HLO shape.")
    layout = None
    if proto.HasField("layout"):
        lp = proto.layout
        layout = Layout(
            tuple(lp.minor_to_major),
            tuple(tuple(t.dimensions) for t in lp.tiles),
            lp.element_size_in_bits,
            lp.tail_padding_alignment_in_elements or 1,
            lp.memory_space,
        )
    dynamic = tuple(proto.is_dynamic_dimension)
    return Shape(dtype, tuple(proto.dimensions), layout, dynamic=dynamic if any(dynamic) else ())
