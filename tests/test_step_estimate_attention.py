"""FLOPs of the Pallas attention kernels that carry no cost_estimate (tpuprof.analyses.attention_kernels).

Ground truth is built into programs, not into the assertions: jax's flash-attention and splash-attention
kernels (forward and backward, causal, and splash with a local window) are compiled by libtpu for one v5e device, and so are plain-einsum
programs that do exactly the matmuls each kernel does (the forward's QK^T and PV; dq's QK^T, dP, dQ; dkv's
QK^T, dV, dP, dK) on exactly the (query block, key block) pairs the kernel runs, the causal mask applied
inside the diagonal blocks. Splash shrinks the local window's forward mask to its widest row ([heads, 4, 2]):
the fraction is still of the whole 4 x 4 grid. The step estimate's FLOPs for a reference program are XLA's own counting
(test_step_estimate checks them against HloCostAnalysis); the kernels' estimated FLOPs must match them,
less the reference's few elementwise FLOPs per score (softmax, mask), which the rule leaves out.
Fifteen small compiles (the references stack their block pairs into one einsum per matmul), about 20 s.
"""

from __future__ import annotations

import pytest

from tpuprof import documents_preflight
from tpuprof.analyses import step_estimate
from tpuprof.models.preflight import TargetEstimate

pytestmark = pytest.mark.compile  # libtpu compiles in this process

B, H, S, D = 2, 4, 1024, 128
BLOCK = 256


def blocks(causal: bool | str) -> list[tuple[int, int]]:
    """The (query block, key block) pairs a kernel runs: all, those on or below the diagonal, or ("local", a
    window of BLOCK keys) the diagonal and the block before it."""
    n = S // BLOCK
    if causal == "local":
        return [(r, c) for r in range(n) for c in range(n) if r - 1 <= c <= r]
    return [(r, c) for r in range(n) for c in range(n) if not causal or c <= r]


def reference(phase: str, causal: bool | str):
    """The matmuls of one kernel phase over the blocks the kernel runs: the (query block, key block) pairs
    stacked, so that each matmul is one einsum over all of them (a quick compile, the same FLOPs)."""
    import jax.numpy as jnp
    import numpy as np

    pairs = blocks(causal)
    diagonal = np.array([r == c for r, c in pairs])[:, None, None, None, None]
    lower = np.tril(np.ones((BLOCK, BLOCK), bool))

    def stack(x, which):  # [pairs, B, H, BLOCK, D]: the row (0) or column (1) block of each pair
        return jnp.stack([x[:, :, p[which] * BLOCK:(p[which] + 1) * BLOCK, :] for p in pairs])

    def program(q, k, v, do):
        qr, dor, kc, vc = stack(q, 0), stack(do, 0), stack(k, 1), stack(v, 1)
        s = jnp.einsum("nbhqd,nbhkd->nbhqk", qr, kc, preferred_element_type=jnp.float32)
        p = jnp.exp(jnp.where(lower | ~diagonal, s, -1e30) if causal else s)
        if phase == "fwd":
            return jnp.einsum("nbhqk,nbhkd->nbhqd", p.astype(v.dtype), vc)
        dp = jnp.einsum("nbhqd,nbhkd->nbhqk", dor, vc, preferred_element_type=jnp.float32)
        ds = (p * dp).astype(q.dtype)
        dq = jnp.einsum("nbhqk,nbhkd->nbhqd", ds, kc)
        if phase == "dq":
            return dq
        dkv = (jnp.einsum("nbhqk,nbhqd->nbhkd", p.astype(q.dtype), dor),  # dV
               jnp.einsum("nbhqk,nbhqd->nbhkd", ds, qr))  # dK
        return dkv + (dq,) if phase == "fused" else dkv  # splash's fused backward: dQ in the dkv kernel

    return program


def kernels(which: str, causal: bool | str, layers: int = 0):
    """The gradient of a loss through the kernel: its forward and its dq and dkv kernels. `layers`: run it
    in a rematerialised scan of that many steps, as scanned LLM layers do (the block mask then reaches the
    backward loop's kernels through the loops' carried tuples)."""
    import jax
    import jax.numpy as jnp

    if which == "flash":
        from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

        sizes = BlockSizes(block_q=BLOCK, block_k_major=BLOCK, block_k=BLOCK, block_b=1, block_q_major_dkv=BLOCK,
                           block_k_major_dkv=BLOCK, block_k_dkv=BLOCK, block_q_dkv=BLOCK,
                           block_k_major_dq=BLOCK, block_k_dq=BLOCK, block_q_dq=BLOCK)

        def attention(q, k, v):
            return flash_attention(q, k, v, causal=causal, sm_scale=D ** -0.5, block_sizes=sizes)
    else:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

        fused = which == "splash-fused"
        sizes = splash.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, block_q_dkv=BLOCK,
                                  block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK, use_fused_bwd_kernel=fused,
                                  block_q_dq=None if fused else BLOCK, block_kv_dq=None if fused else BLOCK)
        mask = (masks.LocalMask((S, S), window_size=(BLOCK, 0), offset=0) if causal == "local"
                else masks.CausalMask((S, S)) if causal else masks.FullMask((S, S)))
        kernel = splash.make_splash_mha(masks.MultiHeadMask([mask] * H), block_sizes=sizes, head_shards=1,
                                        q_seq_shards=1)

        def attention(q, k, v):
            return jax.vmap(kernel)(q, k, v)

    if layers:
        plain = attention

        def attention(q, k, v):
            def layer(x, _):
                return jax.checkpoint(lambda x: plain(x, k, v))(x), None

            return jax.lax.scan(layer, q, None, length=layers)[0]

    return jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))


def compiled_cost(fn, arguments: int, folder) -> step_estimate.ProgramCost:
    import jax
    import jax.numpy as jnp

    from tpuprof.sources import tpu_compile

    x = jax.ShapeDtypeStruct((B, H, S, D), jnp.bfloat16)
    tpu_compile.compile_jax(fn, (x,) * arguments, "v5e", folder)
    return step_estimate.load(folder)


@pytest.fixture(scope="module")
def reference_flops(tmp_path_factory):
    pytest.importorskip("libtpu")
    return {(phase, causal): compiled_cost(reference(phase, causal), 4, tmp_path_factory.mktemp(f"{phase}{causal}")).flops
            for phase, causal in [("fwd", True), ("dq", True), ("dkv", True), ("fused", True), ("dq", False),
                                  ("fwd", "local"), ("dq", "local"), ("dkv", "local"),
                                  ("dkv", False)]}


@pytest.mark.parametrize("which,causal,layers", [("flash", True, 0), ("splash", True, 0), ("flash", False, 0),
                                                 ("splash", True, 2), ("splash-fused", True, 0),
                                                 ("splash", "local", 0)])
@pytest.mark.slow
def test_kernel_flops_equal_the_matmuls_of_the_blocks_they_run(which, causal, layers, reference_flops, tmp_path):
    pytest.importorskip("libtpu")
    cost = compiled_cost(kernels(which, causal, layers), 3, tmp_path)
    estimate = step_estimate.estimate(cost, "v5e")
    ops = [op for op in cost.ops if op.kernel_estimate is not None]
    kind = which.split("-")[0]
    phases = {"flash": ["dq", "dkv"], "splash": ["fwd", "dq", "dkv"]}[kind]  # flash's forward has a cost_estimate
    phases = ["fwd", "dkv"] if which == "splash-fused" else phases
    assert sorted({op.kernel_estimate.kernel for op in ops}) == sorted(f"{kind} {p}" for p in phases)
    for op in ops:  # each execution of each kernel (a scan runs it once per layer)
        phase = op.kernel_estimate.kernel.split()[1]
        truth = reference_flops[("fused" if which == "splash-fused" and phase == "dkv" else phase, causal)]
        assert 0.98 * truth <= op.flops <= 1.001 * truth, (op.name, op.flops, truth)
        assert op.kernel_estimate.blocks_run == pytest.approx(len(blocks(causal)) / (S // BLOCK) ** 2)
        assert op.count == max(layers, 1) and op.flops_source == "estimated"
    # Still flagged (no figure of the kernel's own), listed as estimated, and the caveats carry the rule.
    assert {k["name"] for k in estimate.kernels_estimated} == {op.name for op in ops}
    assert {op.name for op in ops} <= set(estimate.kernels_without_estimate)
    from tpuprof import caveats

    report = documents_preflight.estimate(TargetEstimate(estimate, B))
    lines = caveats.step_estimate(report)
    assert any(line.startswith("Estimated, not the kernel's own figure") and "2 x B x H_q" in line for line in lines)
