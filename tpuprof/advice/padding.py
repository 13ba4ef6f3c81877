"""Padding fixes in the user's terms: which tensor, which dimension (batch, classes, channels, heads,
sequence, features), what value to choose, and what it saves.

TPU tiles put an array's minor-most dimension on 128 lanes and the second-minor on 8 sublanes (16 for 16-bit,
32 for 8-bit types). The compiler chooses which logical dimension goes where; the user chooses only the sizes.
So the advice names the dimension by what it is in the model and says which size to pick, not "transpose".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuprof.advice import preconditions
from tpuprof.units import fmt_bytes

_ONE_HOT = re.compile(r"one_?hot", re.I)
CONV = re.compile(r"conv(?!ert)", re.I)  # Conv2D, conv_general_dilated, convolution; not convert
_CLASSES = re.compile(r"logits|softmax_cross|cross_entropy|sparse_categorical|classifier|\bhead\b|/dense_?\d*/|loss",
                      re.I)


# The dimensions whose size the user picks for the model (a layer's width, its channels, heads, a padded sequence
# length) and a size-1 dimension a reshape removes. Not: the batch (the batch suggestion's), the class count (the
# task's), a scan's layer count (the model's depth), an image's height and width (the data's), a constant's length
# (the compiler's).
USER_CHOSEN = ("features", "channels", "heads", "sequence", "size-1")


@dataclass
class PaddedDimension:
    index: int
    size: int
    padded: int
    role: str  # batch, classes, layers, channels, heads, sequence, features, spatial, size-1
    lanes: bool  # True: the minor-most dimension (128 lanes); False: second-minor (sublanes)
    one_hot: bool = False  # the buffer is a one-hot of the labels


@dataclass
class Fix:
    """A size to choose for one padded dimension, and what the buffer would take then."""

    dimension: PaddedDimension
    text: str
    saving_bytes: int  # the buffer's bytes now minus its bytes at the suggested size (same layout and tiles)
    evidence: str


def roles(dims: tuple[int, ...], padded_dims, minor_to_major: tuple[int, ...], op_name: str = "",
          batch: int | None = None, classes: frozenset[int] = frozenset(),
          convolutional: bool = False, layers: frozenset[int] = frozenset()) -> list[PaddedDimension]:
    """What each padded dimension is, from the shape, the framework op, the batch and the model's class
    count when known. CONVOLUTIONAL: the program convolves, so its rank-4 arrays are NHWC images and
    activations or HWIO kernels. LAYERS: the layer counts of scans over stacked weights, which lead their stacked
    parameters (a [layers, hidden] norm scale)."""
    out = []
    minor = minor_to_major[0] if minor_to_major else len(dims) - 1
    for index, size, padded in padded_dims:
        role = _role(dims, index, size, op_name, batch, classes, convolutional, layers)
        out.append(PaddedDimension(index, size, padded, role, index == minor, one_hot=bool(_ONE_HOT.search(op_name))))
    return out


def _role(dims, index: int, size: int, op_name: str, batch: int | None, classes: frozenset[int],
          convolutional: bool = False, layers: frozenset[int] = frozenset()) -> str:
    if size == 1:
        return "size-1"
    if index == len(dims) - 1 and (_ONE_HOT.search(op_name) or size in classes):
        return "classes"
    if (convolutional or CONV.search(op_name)) and len(dims) == 4:
        kernel = dims[0] <= 11 and dims[1] <= 11 and dims[0] == dims[1]  # HWIO: a 3x3 (up to 11x11) window
        if kernel:
            return "spatial" if index < 2 else "channels"
        return {0: "batch", 1: "spatial", 2: "spatial", 3: "channels"}[index]
    if batch and size == batch and index == 0:
        return "batch"
    if preconditions.ATTENTION_OP.search(op_name) and len(dims) == 4:
        if dims[-1] == dims[-2] and index >= 2:
            return "sequence"
        if index == 1:
            return "heads"
    if index == len(dims) - 1 and _CLASSES.search(op_name) and size < 1024:
        return "classes"
    if index == 0 and len(dims) >= 2 and size in layers and size != batch:
        return "layers"
    if index == 0 and len(dims) >= 2:
        return "batch" if batch is None or size == batch else "features"
    return "features"


def fixes(dimensions: list[PaddedDimension], tile_of, size_bytes: int, tensor: str = "") -> list[Fix]:
    """The sizes to choose, largest saving first: only for dimensions the user picks, only sizes that hold no
    more data than now (a multiple of the tile at or below the size: rounding up would add data the model does not
    have), and only where the buffer's bytes recomputed at that size are fewer. TILE_OF(dimension) is the tile the
    layout gives that dimension (128 on the lanes)."""
    found = []
    for dimension in dimensions:
        if dimension.role not in USER_CHOSEN:
            continue
        tile = 128 if dimension.lanes else tile_of(dimension)
        size, padded = dimension.size, dimension.padded
        of = f" of {tensor}" if tensor else ""
        if dimension.role == "size-1" or (dimension.role == "features" and dimension.lanes and size < 64):
            # Removing the dimension (or merging it into its neighbour) leaves the data dense: the padding goes.
            saving = size_bytes - size_bytes * size // padded
            what = ("a size-1 dimension" if dimension.role == "size-1" else f"the last dimension{of}, {size} wide,")
            text = (f"{what} sits in the {'128 lanes' if dimension.lanes else f'sublanes (tiles of {tile})'}, padded "
                    f"to {padded}: {'squeeze it away' if dimension.role == 'size-1' else 'merge it into its neighbour'}"
                    f" (a reshape before the op); frees up to {fmt_bytes(saving)}")
            found.append(Fix(dimension, text, saving, f"dim {dimension.index} is {size}, tiled to {padded}; dense "
                                                      "after the reshape if the compiler keeps the larger dimension "
                                                      "minor"))
            continue
        down = size // tile * tile
        if not down or down == size:
            continue
        new_padded = -(-down // tile) * tile
        saving = size_bytes - size_bytes * new_padded // padded
        if saving <= 0:
            continue
        name = {"channels": f"{size} channels{of}", "heads": f"{size} heads{of}",
                "sequence": f"the sequence length {size}{of}"}.get(dimension.role, f"a feature size of {size}{of}")
        text = f"{name} {'is' if dimension.role != 'channels' else 'are'} padded to {padded}: use {down}; frees " \
               f"{fmt_bytes(saving)}"
        found.append(Fix(dimension, text, saving, f"dim {dimension.index} is {size}, tiled to {padded}; at {down} "
                                                  f"it pads to {new_padded}: {fmt_bytes(size_bytes)} -> "
                                                  f"{fmt_bytes(size_bytes - saving)} (same layout and tiles)"))
    return sorted(found, key=lambda f: -f.saving_bytes)


def describe(dimension: PaddedDimension) -> str:
    """What a padded dimension is when there is nothing for the user to choose."""
    size, padded = dimension.size, dimension.padded
    return {"batch": f"the per-chip batch of {size} is padded to {padded} (the batch is the batch suggestion's)",
            "classes": f"the {size} classes are padded to {padded} (the class count is the task's)",
            "layers": f"the {size} layers stacked for a scan are padded to {padded} (the model's depth)",
            "spatial": f"an image dimension of {size} is padded to {padded} (the data's size, not the model's)",
            }.get(dimension.role, f"dimension {dimension.index} ({size}) is padded to {padded}")
