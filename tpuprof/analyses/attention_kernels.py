"""FLOPs of the Pallas attention kernels that carry no cost_estimate, from their operand shapes (estimated).

jax's TPU flash-attention backward kernels (jax.experimental.pallas.ops.tpu.flash_attention: the dq and dkv
kernels) and all of its splash-attention kernels (splash_attention_kernel: fwd, dq, dkv) give libtpu no
cost_estimate, and the compiler records no cycles for a custom call: without a rule they would count only
their operands' bytes. They are recognised by the name scope jax gives them (`flash_mha_bwd_dq...`,
`flash_mha_bwd_dkv...`, `splash_mha_fwd...`, `splash_mqa_dq...`), and their FLOPs are the matmuls the
kernel source runs on each (query block, key block) pair it does not skip, per query head (H_q) and
sequence (B), with head dim D over S_q queries and S_k keys:

- forward: Q K^T and P V, 2 matmuls;
- dq: recomputes Q K^T, then dP = dO V^T and dQ = dS K, 3 matmuls;
- dkv: recomputes Q K^T, then dV = P^T dO, dP = dO V^T and dK = dS^T Q, 4 matmuls (5 when splash's fused
  backward also accumulates dQ there);
each 2 x B x H_q x S_q x S_k x D, times the fraction of blocks the kernel runs:
- flash with causal=True (its body builds the causal mask from an iota) runs block (r, c) of its
  block_q_major x block_k_major grid (sizes from the name scope) when (r + 1) x block_q - 1 > c x block_k
  (flash_attention.below_or_on_diag); else every block;
- splash runs the blocks its static mask marks non-empty: the non-zero entries of the `block_mask`
  scalar-prefetch operand, a constant of the compiled program; dense when it cannot be read.
Elementwise work (softmax, masking: a few FLOPs per score against 2 x D per matmul) is not counted."""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass

FLASH = re.compile(r"flash_mha_bwd_(dkv|dq)")
SPLASH = re.compile(r"splash_m[hq]a_(fwd|dkv|dq)")
MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
# The (query, key) block sizes of each splash kernel, as its kernel metadata names them (splash BlockSizes).
SPLASH_BLOCK_SIZES = {"fwd": ("block_q", "block_kv"), "dq": ("block_q_dq", "block_kv_dq"),
                      "dkv": ("block_q_dkv", "block_kv_dkv")}
FLASH_DEFAULT_BLOCK = 128  # flash_attention.BlockSizes.get_default()
INTEGER = {"s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64"}
RULE = ("attention kernel without a cost_estimate: FLOPs estimated from its operand shapes, 2 x B x H_q x S_q x "
        "S_k x D per matmul (forward 2: QK^T, PV; dq 3: QK^T recomputed, dP, dQ; dkv 4: QK^T recomputed, dV, dP, "
        "dK), times the fraction of (query, key) blocks the kernel runs (causal block skipping; splash: its "
        "block mask); elementwise work not counted (tpuprof.analyses.attention_kernels)")


@dataclass
class KernelFlops:
    kernel: str  # "flash dq", "splash fwd", ...
    flops: float
    blocks_run: float  # the fraction of (query, key) blocks the kernel computes
    how_blocks: str


def estimate(module, instruction, config: dict) -> KernelFlops | None:
    """The FLOPs of a recognised attention kernel (a tpu_custom_call of MODULE, a models.hlo_module.HloModule),
    else None."""
    names = f"{instruction.name} {instruction.metadata.op_name}"
    flash, splash = FLASH.search(names), SPLASH.search(names)
    if not (flash or splash):
        return None
    phase = (flash or splash).group(1)
    operands = [module.by_id[o] for o in instruction.operand_ids if o in module.by_id]
    arrays = [o for o in operands if module.shape(o).dtype not in INTEGER and not module.shape(o).is_tuple]
    if len(arrays) < 2:
        return None
    q, k = module.shape(arrays[0]), module.shape(arrays[1])
    layout = _layouts(instruction)
    q_dims = list(q.dims) if layout.get("q_layout", 1) == 1 else list(q.dims[:-2]) + [q.dims[-1], q.dims[-2]]
    k_seq = k.dims[-2] if layout.get("k_layout", 1) == 1 else k.dims[-1]
    if len(q_dims) < 2 or not k_seq:
        return None
    head_dim, q_seq = q_dims[-1], q_dims[-2]
    matmuls = MATMULS[phase]
    if splash and phase == "dkv" and _gradients_out(module, instruction, q.dims) > 2:
        matmuls += 1  # the fused backward kernel accumulates dQ too
    if flash:
        fraction, how = _flash_blocks(instruction, config, q_seq, k_seq)
    else:
        fraction, how = _splash_blocks(module, operands, layout, phase, q_seq, k_seq)
    dense = 2.0 * math.prod(q_dims[:-1]) * k_seq * head_dim
    return KernelFlops(f"{'flash' if flash else 'splash'} {phase}", matmuls * dense * fraction, fraction, how)


def _layouts(instruction) -> dict:
    """Splash's q/k layouts from the kernel metadata jax attaches (1 = head dim minor, the default)."""
    raw = instruction.frontend_attributes.map.get("kernel_metadata", "") if instruction.frontend_attributes else ""
    try:
        return json.loads(json.loads(raw).get("xprof_metadata", "{}")) if raw else {}
    except (ValueError, AttributeError, TypeError):
        return {}


def _gradients_out(module, instruction, q_dims) -> int:
    """How many of the kernel's results are per-token gradients: dk, dv [, dq, per key block when fused],
    at least q's rank and ending in its head dim (its scratch outputs are [block, lanes])."""
    out = module.shape(instruction)
    parts = list(out.tuple_shapes) if out.is_tuple else [out]
    return sum(1 for p in parts if len(p.dims) >= len(q_dims) and p.dims[-1] == q_dims[-1])


def _flash_blocks(instruction, config: dict, q_seq: int, k_seq: int) -> tuple[float, str]:
    body = (config.get("custom_call_config") or {}).get("body", "") if isinstance(config, dict) else ""
    try:
        causal = b"tpu.iota" in base64.b64decode(body)
    except (ValueError, TypeError):
        causal = False
    if not causal:
        return 1.0, "every block (not causal)"
    op_name = instruction.metadata.op_name
    sizes = {key: int(value) for key, value in re.findall(r"(block_[qk]_major)=(\d+)", op_name)}
    block_q = sizes.get("block_q_major", FLASH_DEFAULT_BLOCK)
    block_k = sizes.get("block_k_major", FLASH_DEFAULT_BLOCK)
    rows, columns = max(q_seq // block_q, 1), max(k_seq // block_k, 1)
    run = sum(1 for r in range(rows) for c in range(columns) if (r + 1) * block_q - 1 > c * block_k)
    return run / (rows * columns), f"causal: {run} of {rows} x {columns} blocks of {block_q} x {block_k}"


def _splash_blocks(module, operands, layout: dict, phase: str, q_seq: int, k_seq: int) -> tuple[float, str]:
    """The non-empty fraction of splash's block mask: the scalar-prefetch operands come first (data_next,
    block_mask, mask_next; None ones dropped), so the mask is the second integer operand, or the only one.

    Splash shrinks its mask arrays to the widest row of non-empty blocks ([heads, 16, 2] for a 1,024-token window
    over 16 x 16 blocks of 2,048), and the kernel's grid follows them: the fraction is of every (query block, key
    block) pair the heads could run, heads x S_q / block_q x S_k / block_kv, with the block sizes jax records in
    the kernel's metadata. A mask that is not a constant of the program (a program argument) gives its shape:
    the kernel runs at most its grid."""
    leading = []
    for operand in operands:
        if module.shape(operand).dtype not in INTEGER:
            break
        leading.append(operand)
    if not leading:
        return 1.0, "every block (no block mask)"
    block_mask = leading[1] if len(leading) > 1 else leading[0]
    dims = list(module.shape(block_mask).dims)
    cells = math.prod(dims) if dims else 0
    names = SPLASH_BLOCK_SIZES[phase]
    block_q, block_kv = (layout.get(name) for name in names)
    grid = None
    if isinstance(block_q, int) and isinstance(block_kv, int) and block_q > 0 and block_kv > 0 and len(dims) == 3:
        grid = dims[0] * -(-q_seq // block_q) * -(-k_seq // block_kv)
        if grid < cells:  # not the layout assumed here: count against the mask's own cells
            grid = None
    values = _constant_values(module, block_mask)
    if not values:
        if grid and cells:
            return cells / grid, (f"at most the kernel's grid, {cells} of {grid} blocks (the block mask is not a "
                                  "constant of the program)")
        return 1.0, "every block (the block mask is not a constant of the program)"
    run = sum(1 for v in values if v)
    total = grid or len(values)
    return run / total, f"block mask: {run} of {total} blocks non-empty"


def _constant_values(module, instruction, depth: int = 0) -> list[int] | None:
    """The integer values of a constant, followed through copies, bitcasts and loop-invariant tuple slots."""
    if instruction is None or depth > 32:
        return None
    if instruction.opcode == "constant":
        literal = instruction.literal
        for name in ("s8s", "u8s"):
            raw = getattr(literal, name)
            if raw:
                return [int.from_bytes(raw[i:i + 1], "little", signed=name == "s8s") for i in range(len(raw))]
        for name in ("s32s", "u32s", "s64s", "u64s", "s16s", "u16s"):
            values = list(getattr(literal, name, []) or [])
            if values:
                return [int(v) for v in values]
        return None
    if instruction.opcode in ("copy", "copy-done", "copy-start", "bitcast") and instruction.operand_ids:
        return _constant_values(module, module.by_id.get(instruction.operand_ids[0]), depth + 1)
    if instruction.opcode == "get-tuple-element" and instruction.operand_ids:
        source = module.by_id.get(instruction.operand_ids[0])
        if source is None:
            return None
        if source.opcode == "tuple":
            return _constant_values(module, module.by_id.get(source.operand_ids[instruction.tuple_index]), depth + 1)
        if source.opcode == "while":  # a loop's result: what its body returns in that slot (a pass-through)
            body, _ = module.loop_parts(source)
            root = module.by_id.get(body.root_id) if body is not None else None
            if root is not None and root.opcode == "tuple" and instruction.tuple_index < len(root.operand_ids):
                return _constant_values(module, module.by_id.get(root.operand_ids[instruction.tuple_index]),
                                        depth + 1)
        if source.opcode == "parameter":  # a loop body's parameter: the loop's initial tuple holds the value
            init = _loop_init(module, source)
            if init is not None and init.opcode == "tuple" and instruction.tuple_index < len(init.operand_ids):
                return _constant_values(module, module.by_id.get(init.operand_ids[instruction.tuple_index]),
                                        depth + 1)
    return None


def _loop_init(module, parameter):
    """The initial value of the while loop whose body or condition `parameter` belongs to."""
    loop = module.loop_of(parameter)
    return module.by_id.get(loop.operand_ids[0]) if loop is not None else None
