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
from tpuprof.units import INT64_MAX, quote, read_int

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


HOST_MEMORY_SPACE = 5  # xla::Layout::kHostMemorySpace: S(5), pinned host memory (where offloaded activations live)


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
        m2m = self.layout.minor_to_major or tuple(range(len(self.dims) - 1, -1, -1))
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
        dynamic = self.dynamic
        dims = ",".join(("<=" if i < len(dynamic) and dynamic[i] else "") + str(d) for i, d in enumerate(self.dims))
        out = f"{self.dtype}[{dims}]"
        if with_layout and self.layout is not None:
            out += self.layout.text()
        return out

    def subshape(self, index: tuple[int, ...] | list[int]) -> "Shape":
        shape = self
        for i in index:
            if not shape.is_tuple or not 0 <= i < len(shape.tuple_shapes):  # damaged protos: negative indices
                break
            shape = shape.tuple_shapes[i]
        return shape


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# ---------------------------------------------------------------------------------------------
# Text form: f32[128,256]{1,0:T(8,128)}, bf16[<=8,4]{...}, (f32[2], s32[]), token[]
# ---------------------------------------------------------------------------------------------

_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_LAYOUT_ITEM_RE = re.compile(r"([A-Z]+)\(([^()]*)\)")


def strip_comments(text: str) -> str:
    """TEXT without its /*...*/ comments (long tuples carry /*index=5*/ markers). A scan rather than a regex: a
    lazy `.*?` between the markers rescans to the end of the line for every unclosed '/*', quadratic on a long
    hostile line."""
    if "/*" not in text:
        return text
    parts, pos = [], 0
    while True:
        start = text.find("/*", pos)
        end = text.find("*/", start + 2) if start >= 0 else -1
        if end < 0:
            parts.append(text[pos:])
            return "".join(parts)
        parts.append(text[pos:start])
        pos = end + 2


def parse_shape(text: str) -> Shape:
    """Parse an HLO shape string, layout included. Raises UserError on anything unknown."""
    text = strip_comments(text).strip()
    shape, rest = _parse_at(text, 0)
    if text[rest:].strip():
        raise UserError(f"cannot read the shape {quote(text)}: unexpected text after position {rest}.")
    return shape


def parse_shape_prefix(text: str, pos: int = 0) -> tuple[Shape, int]:
    """Parse the shape that starts at POS (e.g. after `%x = ` in an HLO line); return it and where it ends."""
    return _parse_at(text, pos)


MAX_TUPLE_DEPTH = 100  # tuples nest a few levels in real programs; a deeper nest is not a shape


def _parse_at(text: str, pos: int, depth: int = 0) -> tuple[Shape, int]:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    start = pos
    if depth > MAX_TUPLE_DEPTH:
        raise UserError(f"cannot read the shape {quote(text[start:start + 100])}: tuples nested more than "
                        f"{MAX_TUPLE_DEPTH} deep.")
    if text.startswith("(", pos):
        elements = []
        pos += 1
        while True:
            while pos < len(text) and text[pos] in " ,":
                pos += 1
            if pos >= len(text):
                raise UserError(f"cannot read the shape {quote(text[start:start + 100])}: unclosed tuple.")
            if text[pos] == ")":
                return Shape("tuple", tuple_shapes=tuple(elements)), pos + 1
            element, pos = _parse_at(text, pos, depth + 1)
            elements.append(element)
    match = _ARRAY_RE.match(text, pos)
    if not match:
        raise UserError(f"cannot read the shape {quote(text[start:start + 100])}: expected dtype[dims].")
    dtype = match.group(1)
    if dtype not in ELEMENT_BITS and dtype not in NON_ARRAY_TYPES:
        raise UserError(f"unknown element type {quote(dtype)} in shape {quote(text[start:start + 100])}.")
    dims, dynamic = [], []
    what = f"a dimension of the shape {quote(text[start:start + 100])}"
    for part in filter(None, (p.strip() for p in match.group(2).split(","))):
        is_dynamic = part.startswith("<=") or part == "?"
        dims.append(read_int(part.removeprefix("<="), what) if part != "?" else 0)
        dynamic.append(is_dynamic)
    pos = match.end()
    layout = None
    if text.startswith("{", pos):
        end = _matching_brace(text, pos)
        layout = _parse_layout(text[pos + 1:end], text[start:end + 1])
        pos = end + 1
    shape = Shape(dtype, tuple(dims), layout, dynamic=tuple(dynamic) if any(dynamic) else ())
    check(shape, text[start:pos])
    return shape, pos


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise UserError(f"cannot read the shape {quote(text[start:start + 100])}: unclosed layout.")


def _parse_layout(body: str, whole: str) -> Layout:
    order, _, attributes = body.partition(":")
    what = f"the layout of {quote(whole)}"
    minor_to_major = tuple(read_int(x, what) for x in order.split(",") if x.strip())
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
            end = attributes.find(")", pos)
            if end < 0:
                raise UserError(f"cannot read {what}: a tile '(' is not closed.")
            tiles.append(tuple(_tile_dim(x, what) for x in attributes[pos + 1:end].split(",") if x.strip()))
            pos = end + 1
            continue
        in_tiles = False
        item = _LAYOUT_ITEM_RE.match(attributes, pos)
        if item is None:  # a lone marker such as '*' or 'D(...)' content we do not need
            pos += 1
            continue
        name, value = item.groups()
        if name == "E":
            bits = read_int(value, f"the element size E() in {what}", 0, MAX_ELEMENT_BITS)
        elif name == "L":
            tail = read_int(value, f"the tail padding L() in {what}", 1)
        elif name == "S":
            space = read_int(value, f"the memory space S() in {what}")
        pos = item.end()
    return Layout(minor_to_major, tuple(tiles), bits, tail, space)


def _tile_dim(text: str, what: str) -> int:
    text = text.strip()
    return -1 if text == "*" else read_int(text, f"a tile dimension in {what}", 1)  # '*' combines dims: never pads


MAX_ELEMENT_BITS = 1024  # E(bits): XLA's widest element is c128; anything wider is not a real layout


def check(shape: Shape, text: str = "") -> None:
    """Refuse, once where a shape is read, what the size arithmetic cannot take: a layout that does not fit
    the shape's rank, more elements than int64 holds. After this, padded_bytes and padded_dims cannot fail."""
    if shape.is_tuple:
        return

    def where() -> str:  # only for a message: built when one is needed (most shapes are fine)
        return quote(text) if text else shape.text()

    if shape.dynamic and len(shape.dynamic) != len(shape.dims):
        raise UserError(f"the shape {where()} has {len(shape.dynamic)} dynamic-dimension flag(s) for its "
                        f"{len(shape.dims)} dimension(s).")
    if any(d < 0 for d in shape.dims):
        raise UserError(f"the shape {where()} has a negative dimension.")
    if math.prod(shape.dims) > INT64_MAX:
        raise UserError(f"the shape {where()} has more elements than int64 counts: not a real array.")
    layout = shape.layout
    if layout is None:
        return
    rank = len(shape.dims)
    if layout.minor_to_major and sorted(layout.minor_to_major) != list(range(rank)):
        raise UserError(f"the layout of {where()} does not fit its {rank} dimension(s): minor_to_major "
                        f"{list(layout.minor_to_major)} must name each of them once.")
    for tile in layout.tiles:
        if any(d == 0 or d < -1 for d in tile):
            raise UserError(f"the layout of {where()} has a tile dimension that is not positive.")
    if layout.tail_padding_alignment < 1:
        raise UserError(f"the layout of {where()} has a tail padding L() below 1.")
    if not 0 <= layout.element_size_in_bits <= MAX_ELEMENT_BITS:
        raise UserError(f"the layout of {where()} has an element size E() out of range.")
    if layout.memory_space < 0:
        raise UserError(f"the layout of {where()} has a negative memory space.")


# ---------------------------------------------------------------------------------------------
# ShapeProto form (HloProto dumps)
# ---------------------------------------------------------------------------------------------

def from_proto(proto, _depth: int = 0) -> Shape:
    """Convert an `xla.ShapeProto` to a Shape."""
    if not _ENUM_TO_NAME:
        from tpuprof import protos

        enum = protos.xla_data_pb2().PrimitiveType
        for name, number in enum.items():
            _ENUM_TO_NAME[number] = "opaque" if name == "OPAQUE_TYPE" else name.lower()
    dtype = _ENUM_TO_NAME.get(proto.element_type, "")
    if dtype == "tuple":
        if _depth > MAX_TUPLE_DEPTH:
            raise UserError(f"an HLO shape has tuples nested more than {MAX_TUPLE_DEPTH} deep.")
        return Shape("tuple", tuple_shapes=tuple(from_proto(s, _depth + 1) for s in proto.tuple_shapes))
    if dtype not in ELEMENT_BITS and dtype not in NON_ARRAY_TYPES:
        raise UserError(f"unknown element type number {proto.element_type} in an HLO shape.")
    layout = None
    if proto.HasField("layout"):
        lp = proto.layout
        layout = Layout(
            tuple(lp.minor_to_major),
            tuple(tuple(-1 if d == _COMBINE_DIMENSION else d for d in t.dimensions) for t in lp.tiles),
            lp.element_size_in_bits,
            lp.tail_padding_alignment_in_elements or 1,
            lp.memory_space,
        )
    dynamic = tuple(proto.is_dynamic_dimension)
    # An unbounded dynamic dimension ('?') is stored as INT64_MIN; the text form reads it as 0 too.
    dims = tuple(0 if d == _UNBOUNDED_DIMENSION else d for d in proto.dimensions)
    shape = Shape(dtype, dims, layout, dynamic=dynamic if any(dynamic) else ())
    check(shape)
    return shape


_COMBINE_DIMENSION = -(2**63)  # xla::Tile::kCombineDimension: a tile dimension that never pads ('*')
_UNBOUNDED_DIMENSION = -(2**63)  # xla::Shape::kUnboundedSize
