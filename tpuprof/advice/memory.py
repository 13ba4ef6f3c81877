"""Suggestions from a memory analysis: padding fixes a user can act on, precision, capacity.

TPU tiles put the minor-most dimension on 128 lanes and the second-minor on 8 sublanes (16 for
16-bit, 32 for 8-bit types, packed by the later tile). A dimension that is not a multiple of its
tile dimension is rounded up, so the fix is always "make that dimension a multiple" or "move it out
of the two minor-most positions".
"""

from __future__ import annotations

from tpuprof.models.memory import Buffer, ModuleMemory, Suggestion
from tpuprof.units import fmt_bytes

MiB = 1 << 20
# Wastes smaller than this are not worth a user's time.
MIN_PADDING_BYTES = 1 * MiB
MAX_PADDING_SUGGESTIONS = 5


def padding_fix(buffer: Buffer) -> str:
    """Which dimension is padded from what to what, and what to change, in words a user can act on."""
    if not buffer.padded_dims:
        return f"{buffer.instruction} {buffer.shape}: {fmt_bytes(buffer.padding_bytes)} of padding."
    minor = buffer.minor_to_major[0] if buffer.minor_to_major else -1
    one_hot = any(word in (buffer.op_name or "").lower() for word in ("one_hot", "onehot"))
    fixes = []
    for dim_index, size, padded in buffer.padded_dims:
        tile_dim = _tile_dim_for(buffer, dim_index)
        ratio = f"{padded / size:.1f}x" if size else "n/a"
        if dim_index == minor:
            where = f"sits in the 128-lane minor dimension: {size} -> {padded}, {ratio}"
        else:
            where = f"is the second-minor dimension (tiles of {tile_dim}): {size} -> {padded}, {ratio}"
        if one_hot:
            fixes.append(f"one-hot depth {size} {where}; use sparse integer labels (sparse_categorical_crossentropy, "
                         "optax.softmax_cross_entropy_with_integer_labels) instead of materialising the one-hot, "
                         "or move the class dimension out of the two minor-most positions")
        elif dim_index == minor:
            fixes.append(f"dimension {dim_index} {where}; make it a multiple of 128 "
                         f"(e.g. {_nearest_multiples(size, 128)}) or transpose so that a larger dimension is minor-most")
        else:
            label = "channels" if _looks_like_channels(buffer, dim_index) else f"dimension {dim_index}"
            fixes.append(f"{label} {size} -> padded to {padded}: use {_nearest_multiples(size, tile_dim or 8)}")
    return f"{buffer.instruction} {buffer.shape}: " + "; ".join(dict.fromkeys(fixes)) + "."


def _tile_dim_for(buffer: Buffer, dim_index: int) -> int:
    if not buffer.tile or dim_index not in buffer.minor_to_major:
        return 0
    position = buffer.minor_to_major.index(dim_index)
    return buffer.tile[len(buffer.tile) - 1 - position] if position < len(buffer.tile) else 0


def _nearest_multiples(size: int, multiple: int) -> str:
    down = (size // multiple) * multiple
    up = -(-size // multiple) * multiple
    return f"{down} or {up}" if down and down != up else f"{up}"


def _looks_like_channels(buffer: Buffer, dim_index: int) -> bool:
    """Convolution feature dims: the op is a conv and the dim is the last (NHWC/HWIO) one."""
    name = (buffer.op_name or "").lower()
    return "conv" in name and dim_index == len(buffer.minor_to_major) - 1


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
        kind = "one_hot" if any(w in (buffer.op_name or "").lower() for w in ("one_hot", "onehot")) else "padding"
        where = " live at the peak" if buffer.live_at_peak else ""
        message = (f"{fmt_bytes(buffer.padding_bytes)} of padding{where} ({buffer.expansion:.1f}x)"
                   + (f" from {buffer.op_name}" if buffer.op_name else "") + ": " + padding_fix(buffer))
        suggestions.append(Suggestion(kind, message, buffer.padding_bytes))
        if len(suggestions) >= MAX_PADDING_SUGGESTIONS:
            break

    # Precision: f32 arrays at the peak could be halved with bfloat16.
    at_peak = [b for b in result.buffers if b.live_at_peak]
    peak_f32 = sum(b.size_bytes for b in at_peak if b.dtype == "f32" and b.allocation_type == "temp")
    peak_16bit = sum(b.size_bytes for b in at_peak if b.dtype in ("bf16", "f16"))
    # A model that already computes in 16 bits keeps some f32 on purpose (softmax, loss, optimizer state).
    already_16bit = peak_16bit >= peak_f32
    if result.peak_heap_bytes and not already_16bit and peak_f32 >= max(MIN_PADDING_BYTES,
                                                                          0.25 * result.peak_heap_bytes):
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
