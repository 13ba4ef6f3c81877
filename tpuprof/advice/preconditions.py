"""The facts a suggestion rests on, read from the user's own program or log, in one place for every command.

Each suggestion kind is given only when its precondition holds on the input (docs/advice.md lists them):
a step already rematerialised is not told to rematerialise, a program already in bfloat16 is not told to use it
for the float32 it keeps on purpose, a dimension is called the batch only where the input says it is.
"""

from __future__ import annotations

import re
from typing import Iterable

# Rematerialisation the step asks for: JAX's `checkpoint` (jax.checkpoint / nn.remat) in op names and its
# `rematted_computation` / `checkpoint` computations. JAX names the recomputed ops
# ".../checkpoint/rematted_computation/tanh" and the barrier ".../remat2".
_REMATERIALISED = re.compile(r"\bcheckpoint\b|rematted_computation|\bremat\d*\(|/remat\d*\b")
# XLA's own memory pass (HloRematerialization) names each instruction it clones `<name>.remat` (`fusion.12.remat2`
# after several rounds). It runs on any program over its memory limit and recomputes single instructions whose
# operands are still live: it says the compiler tried, not that the step saves only each layer's input.
_COMPILER_REMAT = re.compile(r"[\w-]+(?:\.[\w-]+)*?\.remat\d*\b")


def _first(pattern: re.Pattern, names: Iterable[str]) -> str | None:
    for name in names:
        if name:
            match = pattern.search(name)
            if match:
                return match.group(0)
    return None


def rematerialised(names: Iterable[str]) -> str | None:
    """The first op name or label that shows the step itself recomputes activations (jax.checkpoint), or None."""
    return _first(_REMATERIALISED, names)


def compiler_rematerialised(names: Iterable[str]) -> str | None:
    """The first label XLA's rematerialisation pass gave a clone (`fusion.12.remat2`), or None."""
    return _first(_COMPILER_REMAT, names)


# A program that computes in 16 bits keeps some float32 on purpose (a loss cast, softmax, optimizer state, master
# weights), and XLA:CPU upcasts bf16 arithmetic to f32: its remaining float32 is not the user's dtype choice.
SIXTEEN_BIT = ("bf16", "f16")
SIXTEEN_BIT_SHARE = 0.25


# A cast in the user's program, in each framework's op names: JAX's convert_element_type (jnp.astype, dtype=), TF/Keras
# Cast (mixed precision), PyTorch's .to(dtype) (aten::_to_copy).
CAST_OP = re.compile(r"convert_element_type|(?:^|/)Cast(?:_\d+)?(?:/|$)|_to_copy|aten__to\b|xla::cast", re.I)


def in_16_bits(sixteen_bit_bytes: int, total_bytes: int) -> bool:
    """Whether a program computes in 16 bits: 16-bit arrays hold a quarter of the bytes looked at or more."""
    return bool(total_bytes) and sixteen_bit_bytes >= SIXTEEN_BIT_SHARE * total_bytes


# Attention scores by the op that made them, in every framework's names: einsum equations of Flax/JAX
# ("bqhd,bkhd->bhqk", MaxText's "btnh,bsnh->bnts"), Keras' MultiHeadAttention ("aecd,abcd->acbe"), PyTorch's
# scaled_dot_product_attention and baddbmm, and any op named for attention or its softmax. The shape decides too
# (queries x keys, tpuprof.advice.memory._scores_shape).
ATTENTION_OP = re.compile(r"attention|attn|hqk|bhqk|qk->|qhd|khd|bnts|bnqk|aecd,abcd->acbe|scaled_dot_product|"
                          r"baddbmm|softmax|scores", re.I)


# A fused attention kernel already in the program: jax's Pallas splash and flash attention (their calls and scopes:
# splash_mha_fwd, _splash_attention, flash_mha_bwd_dq, _flash_attention), PyTorch/XLA's and Keras' flash_attention.
# Such a program is not told to use one: what looks like scores there is something else of that shape.
_FUSED_ATTENTION = re.compile(r"splash|flash", re.I)


def fused_attention(names: Iterable[str]) -> str | None:
    """The first op or instruction name that shows the program already runs a fused attention kernel, or None."""
    for name in names:
        if name and _FUSED_ATTENTION.search(name):
            return name
    return None
