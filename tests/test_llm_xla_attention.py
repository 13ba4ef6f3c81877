"""v2 and v3: Mosaic does not compile splash's bf16 matmuls there, so `--model` attends with splash's own XLA
reference (llm._xla_attention). Checked against the splash kernel run in Pallas' interpreter on this CPU (the
same masks, GQA grouping, logit soft-cap and sinks, forward and gradients), then compiled by libtpu for v3."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli

SEQ, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 256, 4, 2, 128, 128


def _config():
    """Gemma 2's sliding window and logit soft-cap, with Llama 4's attention chunks."""
    import dataclasses

    from tpuprof.sources import llm

    gemma2 = llm.parse_config({"model_type": "gemma2", "vocab_size": 512, "hidden_size": 256,
                               "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": HEADS,
                               "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "sliding_window": WINDOW,
                               "attn_logit_softcapping": 50.0}, "small", "small")
    return dataclasses.replace(gemma2, attention_chunk_size=WINDOW)


@pytest.mark.parametrize("window", ["full", "sliding", "chunked"])
def test_the_xla_attention_is_the_splash_kernels(window):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    from tpuprof.sources import llm

    config = _config()
    shape = (SEQ, SEQ)
    mask = {"full": masks.CausalMask(shape), "sliding": masks.LocalMask(shape, window_size=(WINDOW, 0), offset=0),
            "chunked": masks.ChunkedCausalMask(shape, chunk_size=WINDOW)}[window]
    block = 128
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(masks.MultiHeadMask([mask] * HEADS), block_sizes=sizes, head_shards=1,
                                    q_seq_shards=1, attn_logits_soft_cap=config.attn_logit_softcapping,
                                    interpret=True)
    xla = llm._xla_attention(config, window, shape)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((HEADS, SEQ, HEAD_DIM)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((KV_HEADS, SEQ, HEAD_DIM)), jnp.float32) for _ in range(2))
    sinks = jnp.asarray(rng.standard_normal(HEADS), jnp.float32)  # GPT-OSS's, here with the soft-cap

    np.testing.assert_allclose(xla(q, k, v, sinks), kernel(q, k, v, sinks=sinks), atol=1e-5)
    if window == "sliding":  # the backward pass too (the train step's), once
        def loss(attend):
            return lambda q, k, v: (attend(q, k, v) ** 2).sum()

        ours = jax.grad(loss(lambda q, k, v: xla(q, k, v, sinks)), argnums=(0, 1, 2))(q, k, v)
        theirs = jax.grad(loss(lambda q, k, v: kernel(q, k, v, sinks=sinks)), argnums=(0, 1, 2))(q, k, v)
        for mine, splash_grad in zip(ours, theirs):
            np.testing.assert_allclose(mine, splash_grad, rtol=1e-4, atol=1e-3)


@pytest.mark.compile
def test_a_v3_step_compiles_with_xla_attention_and_holds_its_scores(tmp_path, compile_cache):
    """On v3 the step used to fail in Mosaic ("E2001: Unsupported matmul RHS type on target:
    vector<128x128xbf16>"). Its temporaries hold at least one layer's fp32 scores, heads x seq x seq (one
    sequence per device), which the splash kernel never holds whole."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
                                "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": HEADS,
                                "num_key_value_heads": KV_HEADS}))
    seq = 512
    result = run_cli("preflight", "--model", str(path), "--tpu", "v3:1x1", "--seq", str(seq), "--batch-per-chip",
                     "2", "--json", timeout=600, env={"XDG_CACHE_HOME": str(compile_cache)})
    assert result.returncode == 0, result.stderr
    target = json.loads(result.stdout)["targets"][0]
    assert target["fits"] and target["model"]["attention"].startswith("XLA attention")
    assert target["temp_bytes"] >= HEADS * seq * seq * 4, target["temp_bytes"]
    # The table says so on the model's line (its slowest ops name splash's source file, where the reference lives).
    table = run_cli("preflight", "--model", str(path), "--tpu", "v3:1x1", "--seq", str(seq), "--batch-per-chip", "2",
                    timeout=600, env={"XDG_CACHE_HOME": str(compile_cache), "COLUMNS": "200"})
    assert "XLA attention (no Pallas kernels here)" in table.stdout, table.stdout
