"""Padding fixes in the user's terms: which tensor, which dimension (batch, classes, channels, heads,
sequence, features), what value to choose, and what it saves.

TPU tiles put an array's minor-most dimension on 128 lanes and the second-minor on 8 sublanes (16 for 16-bit,
32 for 8-bit types). The compiler chooses which logical dimension goes where; the user chooses only the sizes.
So the advice names the dimension by what it is in the model and says which size to pick, not "transpose".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuprof.units import fmt_bytes

_ONE_HOT = re.compile(r"one_?hot", re.I)
_CONV = re.compile(r"conv", re.I)
_ATTENTION = re.compile(r"attention|attn|hqk|bhqk|qhd|khd|softmax|scores", re.I)
_CLASSES = re.compile(r"logits|softmax_cross|cross_entropy|sparse_categorical|classifier|\bhead\b|/dense_?\d*/|loss",
                      re.I)


@dataclass
class PaddedDimension:
    index: int
    size: int
    padded: int
    role: str  # batch, classes, channels, heads, sequence, features, size-1
    lanes: bool  # True: the minor-most dimension (128 lanes); False: second-minor (sublanes)
    one_hot: bool = False  # the buffer is a one-hot of the labels


def roles(dims: tuple[int, ...], padded_dims, minor_to_major: tuple[int, ...], op_name: str = "",
          batch: int | None = None, classes: frozenset[int] = frozenset()) -> list[PaddedDimension]:
    """What each padded dimension is, from the shape, the framework op, the batch and the model's class
    count when known."""
    out = []
    minor = minor_to_major[0] if minor_to_major else len(dims) - 1
    for index, size, padded in padded_dims:
        role = _role(dims, index, size, op_name, batch, classes)
        out.append(PaddedDimension(index, size, padded, role, index == minor, one_hot=bool(_ONE_HOT.search(op_name))))
    return out


def _role(dims, index: int, size: int, op_name: str, batch: int | None, classes: frozenset[int]) -> str:
    if size == 1:
        return "size-1"
    if index == len(dims) - 1 and (_ONE_HOT.search(op_name) or size in classes):
        return "classes"
    if batch and size == batch and index == 0:
        return "batch"
    if _ATTENTION.search(op_name) and len(dims) == 4:
        if dims[-1] == dims[-2] and index >= 2:
            return "sequence"
        if index == 1:
            return "heads"
    if _CONV.search(op_name) and index == len(dims) - 1:
        return "channels"
    if index == len(dims) - 1 and _CLASSES.search(op_name) and size < 1024:
        return "classes"
    if index == 0 and len(dims) >= 2:
        return "batch" if batch is None or size == batch else "features"
    return "features"


def _multiples(size: int, multiple: int) -> str:
    down = (size // multiple) * multiple
    up = -(-size // multiple) * multiple
    return f"{down} or {up}" if down and down != up else f"{up}"


def fix_text(dimension: PaddedDimension, tile: int, padding_bytes: int, tensor: str = "") -> str:
    """One sentence: the dimension by its role, its padding, what to choose and what it saves."""
    return _fix_text(dimension, tile, padding_bytes, tensor).rstrip("; ")


def _fix_text(dimension: PaddedDimension, tile: int, padding_bytes: int, tensor: str) -> str:
    size, padded = dimension.size, dimension.padded
    if dimension.lanes:
        tile = 128
    where = "128 lanes (minor-most)" if dimension.lanes else f"sublanes (second-minor, tiles of {tile})"
    saving = f"frees {fmt_bytes(padding_bytes)}" if padding_bytes else ""
    of = f" of {tensor}" if tensor else ""
    role = dimension.role
    if role == "size-1":
        return (f"a size-1 dimension{of} sits in the {where}, padded to {padded}: squeeze it away (reshape) "
                f"before the op; {saving}")
    if role == "classes" and dimension.one_hot:
        return (f"the {size} classes{of} sit in the {where}, padded to {padded}: pass integer labels with a sparse "
                "loss (sparse_categorical_crossentropy, optax.softmax_cross_entropy_with_integer_labels) instead of "
                f"one-hot targets; {saving}")
    if role == "classes":
        return (f"the {size} classes{of} sit in the {where}, padded to {padded}: the class count is the task's; "
                f"if this buffer matters, give the output layer {_multiples(size, tile).split(' or ')[-1]} outputs "
                f"and mask the extra logits; {saving}")
    if role == "batch":
        if dimension.lanes:
            return (f"the per-chip batch of {size} is the minor-most dimension{of} (the compiler put it on the "
                    f"128 lanes), padded to {padded}: a per-chip batch of {_multiples(size, 128)} costs this buffer "
                    f"no more memory and processes {padded / size:.0f}x the examples; if that does not fit, the "
                    f"waste is the price of batch {size}; {saving}")
        return f"the per-chip batch of {size}{of} is padded to {padded}: use a batch of {_multiples(size, tile)}; {saving}"
    if role == "channels":
        return f"{size} channels{of} are padded to {padded}: use {_multiples(size, tile)} channels; {saving}"
    if role == "heads":
        return f"{size} heads{of} are padded to {padded}: use {_multiples(size, tile)} heads; {saving}"
    if role == "sequence":
        return f"the sequence length {size}{of} is padded to {padded}: use {_multiples(size, tile)}; {saving}"
    if dimension.lanes and size < 64:
        return (f"the last dimension{of} is only {size} wide and fills 128 lanes: reshape so that a large dimension "
                f"is last (merge it into its neighbour), or make it a multiple of 128; {saving}")
    return f"a feature size of {size}{of} is padded to {padded}: use {_multiples(size, tile)}; {saving}"
