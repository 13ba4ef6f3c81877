"""The LLM step's loss (tpuprof/sources/llm.py `cross_entropy`): computed over pieces of the sequence, it is the
same function as the whole-sequence cross-entropy (value and gradients, real JAX on the CPU), as is MaxText's
untiled loss (`whole_cross_entropy`), and the compiled step never holds the whole [batch, seq, vocab] fp32 logits
(a real libtpu compile of a tiny model)."""

from __future__ import annotations

import pytest

from tpuprof.sources import llm

pytestmark = pytest.mark.compile  # libtpu compiles in this process

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def reference_loss(x, head, targets):
    """The textbook formula on whole logits: -mean(log_softmax(x @ head)[target])."""
    log_probabilities = jax.nn.log_softmax(jnp.einsum("bsd,dv->bsv", x, head), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probabilities, targets[..., None], axis=-1))


def maxtext_untiled_loss(x, head, targets):
    return llm.whole_cross_entropy(jnp.einsum("bsd,dv->bsv", x, head), targets)


def chunked_loss(chunks):
    def loss(x, head, targets):
        return llm.cross_entropy(lambda piece: jnp.einsum("bsd,dv->bsv", piece, head), x, targets, chunks)

    return loss


def test_the_chunked_loss_is_the_whole_sequence_loss_and_so_are_its_gradients():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (3, 64, 16), jnp.float32)
    head = jax.random.normal(keys[1], (16, 200), jnp.float32)
    targets = jax.random.randint(keys[2], (3, 64), 0, 200)
    expected, expected_grads = jax.value_and_grad(reference_loss, argnums=(0, 1))(x, head, targets)
    for chunks in (1, 4, 64):
        value, grads = jax.jit(jax.value_and_grad(chunked_loss(chunks), argnums=(0, 1)))(x, head, targets)
        assert value == pytest.approx(float(expected), rel=1e-5)
        for got, want in zip(grads, expected_grads):
            assert jnp.allclose(got, want, rtol=1e-4, atol=1e-6)
    value, grads = jax.jit(jax.value_and_grad(maxtext_untiled_loss, argnums=(0, 1)))(x, head, targets)
    assert value == pytest.approx(float(expected), rel=1e-5)
    for got, want in zip(grads, expected_grads):
        assert jnp.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_the_loss_is_cut_so_that_one_piece_of_fp32_logits_stays_within_the_budget():
    # Llama 3.1 70B (vocabulary 128,256) at 8,192 tokens, one sequence per chip: pieces of 1,024 tokens
    # (512 MiB of fp32 logits); five sequences per chip: 64 pieces of 128 tokens.
    assert llm.loss_chunks(8192, 1, 128256) == 8
    assert llm.loss_chunks(8192, 5, 128256) == 64
    assert llm.loss_chunks(2048, 2, 32000) == 1  # 500 MiB: one piece
    for seq, batch, vocab in ((8192, 1, 128256), (4096, 3, 152064), (256, 2, 1024)):
        chunks = llm.loss_chunks(seq, batch, vocab)
        assert seq % chunks == 0 and batch * (seq // chunks) * vocab * 4 <= llm.LOSS_CHUNK_BYTES
        fewer = next((n for n in range(chunks - 1, 0, -1) if seq % n == 0), None)
        assert fewer is None or batch * (seq // fewer) * vocab * 4 > llm.LOSS_CHUNK_BYTES


@pytest.mark.slow
def test_the_compiled_step_never_holds_the_whole_logits_in_fp32(tmp_path):
    """A 2-layer model with a large vocabulary and Gemma's logit soft cap on v5e-4 (libtpu, compile-only): the
    fp32 logits of the whole sequence would be 256 MiB per chip, bf16 ones 128 MiB. In one piece (MaxText's
    num_vocab_tiling=1, and tpuprof's own choice within the 512 MiB budget) the step is MaxText's untiled loss,
    which libtpu lays out with the bf16 logits kept for the backward and no fp32 [batch, seq, vocab] buffer at
    all (a rematerialised piece with a `take_along_axis` gradient held f32[2,512,65536]: 264.5 MiB of
    temporaries, 392.9 without the soft cap); with --vocab-tiling 16, pieces of 16 MiB, far below either.
    (Short sequences and narrow layers: libtpu's compile time grows with the tokens and the matmuls' width.)"""
    from tpuprof.commands.memory import module_memories
    from tpuprof.sources import tpu_compile

    if not tpu_compile.jax_available():
        pytest.skip("libtpu is not installed")
    config = llm.parse_config({"model_type": "llama", "vocab_size": 65536, "hidden_size": 128,
                               "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "final_logit_softcapping": 30.0}, "wide-vocab", "test")
    devices = tpu_compile.topology_devices("v5e-4")
    whole_logits = 2 * 512 * 65536 * 4  # fp32, 2 sequences per chip

    def compiled(vocab_tiling, dump=None):
        step = llm.Step(config, "test", 512, "full", "bf16", llm.parse_mesh(None, len(devices)),
                        vocab_tiling=vocab_tiling)
        fn, args = llm.build(step, devices, 2)
        return tpu_compile.compile_jax(fn, args, "v5e-4", dump_dir=dump)

    assert llm.loss_chunks(512, 2, 65536) == 1
    untiled = compiled(1, tmp_path / "untiled")
    shapes = {(b.dtype, b.shape.split("{")[0]) for b in module_memories(tmp_path / "untiled", target="v5e",
                                                                        compile_=False)[0].buffers}
    assert ("bf16", "bf16[2,512,65536]") in shapes  # the logits, kept for the backward as MaxText keeps them
    assert not any(shape.startswith("f32[2,512,65536]") for _, shape in shapes)
    assert whole_logits / 2 <= untiled.temp_bytes < whole_logits * 0.6
    assert compiled(16).temp_bytes < whole_logits / 2


def test_vocab_tiling_reaches_the_step_and_its_document(tmp_path, monkeypatch):
    """--vocab-tiling is part of the compiled program (its cache key) and of the document's model; a step that
    cannot fit whatever the batch answers without a compile, so this needs none."""
    import tpuprof
    from tpuprof.sources.llm import Step

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tpuprof.preflight(model="llama3.1-405b", tpu="v6e-4", batch_per_chip=1, seq=8192,
                               vocab_tiling=16).to_dict()["targets"][0]
    assert target["model"]["vocab_tiling"] == 16 and target["fits"] is False and target["compiles"] == 0
    config, source = llm.load_config("llama3.1-8b")
    assert Step(config, source, 8192, vocab_tiling=16).key() != Step(config, source, 8192).key()
