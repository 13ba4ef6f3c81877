"""Suggestions from a memory analysis: padding fixes a user can act on, precision, capacity.

TPU tiles put the minor-most dimension on 128 lanes and the second-minor on 8 sublanes (16 for
16-bit, 32 for 8-bit types, packed by the later tile). A dimension that is not a multiple of its
tile dimension is rounded up, so the fix is always "make that dimension a multiple" or "move it out
of the two minor-most positions".
"""

from __future__ import annotations

from tpuprof.models.memory import Buffer, ModuleMemory, Suggestion

MiB = 1 << 20
# Wastes smaller than this are not worth a user's time.
MIN_PADDING_BYTES = 1 * MiB
MAX_PADDING_SUGGESTIONS = 5


def fmt_bytes(value: int | float | None) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def padding_fix(buffer: Buffer) -> str:
    """One sentence: which dimension is padded from what to what, and what to change."""
    if not buffer.padded_dims:
        return f"{buffer.instruction}: {fmt_bytes(buffer.padding_bytes)} of padding."
    rank = len(buffer.minor_to_major)
    minor = buffer.minor_to_major[0] if rank else -1
    parts = []
    for dim_index, size, padded in buffer.padded_dims:
        lane = dim_index == minor
        tile_dim = _tile_dim_for(buffer, dim_index)
        where = "the 128-lane minor dimension" if lane else f"the second-minor dimension (tiles of {tile_dim})"
        ratio = padded / size if size else 0
        parts.append(f"dimension {dim_index} of size {size} sits in {where}: padded to {padded} ({ratio:.1f}x)")
    message = f"{buffer.instruction} {buffer.shape}: " + "; ".join(parts) + ". "
    message += _remedy(buffer, minor)
    return message


def _tile_dim_for(buffer: Buffer, dim_index: int) -> int:
    if not buffer.tile:
        return 0
    position = buffer.minor_to_major.index(dim_index) if dim_index in buffer.minor_to_major else -1
    if position < 0 or position >= len(buffer.tile):
        return 0
    return buffer.tile[len(buffer.tile) - 1 - position]


def _nearest_multiples(size: int, multiple: int) -> str:
    down = (size // multiple) * multiple
    up = -(-size // multiple) * multiple
    return f"{down} or {up}" if down and down != up else f"{up}"


def _remedy(buffer: Buffer, minor: int) -> str:
    name = (buffer.op_name or "").lower()
    fixes = []
    for dim_index, size, padded in buffer.padded_dims:
        tile_dim = _tile_dim_for(buffer, dim_index)
        if "one_hot" in name or "onehot" in name or (dim_index == minor and size <= 16 and "eq" in name):
            fixes.append(
                f"a one-hot of depth {size} puts the class dimension on the 128 lanes: use sparse integer "
                "labels (e.g. sparse_categorical_crossentropy, optax.softmax_cross_entropy_with_integer_labels) "
                "instead of materialising the one-hot, or move the class dimension out of the minor position"
            )
        elif dim_index == minor:
            fixes.append(
                f"make dimension {dim_index} a multiple of 128 (e.g. {_nearest_multiples(size, 128)}), or lay "
                "the array out so that a larger dimension is minor-most (transpose/reshape before the op)"
            )
        else:
            label = "channels" if _looks_like_channels(buffer, dim_index) else f"dimension {dim_index}"
            fixes.append(
                f"{label} {size} -> padded to {padded}: use {_nearest_multiples(size, tile_dim or 8)}"
            )
    unique = list(dict.fromkeys(fixes))
    return "Fix: " + "; ".join(unique) + "."


def _looks_like_channels(buffer: Buffer, dim_index: int) -> bool:
    opcode = buffer.opcode
    name = (buffer.op_name or "").lower()
    return opcode in ("convolution", "fusion") and ("conv" in name) and dim_index in (
        len(buffer.minor_to_major) - 1, 3)


def suggest(result: ModuleMemory) -> list[Suggestion]:
    suggestions: list[Suggestion] = []
    # Padding: the biggest wasters first; prefer buffers live at the peak (they decide fitting).
    candidates = sorted(
        (b for b in result.buffers if b.padding_bytes >= MIN_PADDING_BYTES),
        key=lambda b: (not b.live_at_peak, -b.padding_bytes),
    )
    seen_ops: set[str] = set()
    for buffer in candidates:
        key = buffer.op_name or buffer.instruction
        if key in seen_ops:
            continue
        seen_ops.add(key)
        kind = "one_hot" if "one_hot" in (buffer.op_name or "").lower() else "padding"
        where = " (live at the peak)" if buffer.live_at_peak else ""
        message = (f"{fmt_bytes(buffer.padding_bytes)} of padding{where}, {buffer.expansion:.1f}x expansion"
                   + (f", from {buffer.op_name}" if buffer.op_name else "") + ": " + padding_fix(buffer))
        suggestions.append(Suggestion(kind, message, buffer.padding_bytes))
        if len(suggestions) >= MAX_PADDING_SUGGESTIONS:
            break

    # Precision: f32 arrays at the peak could be halved with bfloat16.
    peak_f32 = sum(b.size_bytes for b in result.buffers
                   if b.live_at_peak and b.shape.startswith("f32[") and b.allocation_type == "temp")
    if result.peak_heap_bytes and peak_f32 >= max(MIN_PADDING_BYTES, 0.25 * result.peak_heap_bytes):
        suggestions.append(Suggestion(
            "bf16",
            f"{fmt_bytes(peak_f32)} of the peak is f32 temporaries (activations/gradients): compute in bfloat16 "
            "(Keras: tf.keras.mixed_precision.set_global_policy('mixed_bfloat16'); JAX: cast activations and "
            "params to jnp.bfloat16 inside the step, keep an f32 master copy) to roughly halve them.",
            peak_f32 // 2,
        ))

    # Capacity: how close the peak is to the HBM the compiler offers.
    if result.hbm_capacity_bytes and result.peak_heap_bytes is not None:
        use = result.peak_heap_bytes / result.hbm_capacity_bytes
        if use > 1:
            suggestions.append(Suggestion(
                "batch_size",
                f"the peak ({fmt_bytes(result.peak_heap_bytes)}) exceeds the {fmt_bytes(result.hbm_capacity_bytes)} "
                f"of HBM by {fmt_bytes(result.peak_heap_bytes - result.hbm_capacity_bytes)}: reduce the per-chip "
                "batch, shard across more chips, or remove the padding above; `tpuprof preflight --max-batch` "
                "finds the largest batch that fits.",
                result.peak_heap_bytes - result.hbm_capacity_bytes,
            ))
        elif use < 0.5 and not result.estimated:
            suggestions.append(Suggestion(
                "batch_size",
                f"the peak uses {use:.0%} of HBM: there is room for a larger per-chip batch (better MXU "
                "utilisation); `tpuprof preflight --max-batch` finds the largest that fits.",
                0,
            ))
    return suggestions
