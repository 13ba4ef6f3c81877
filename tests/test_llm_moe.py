"""The MoE step's expert side keeps each device's own routing groups (issue #33).

One layout-only compile (seconds): a small Mixtral-shaped config on v5e-4, fsdp over the 4 devices, at a batch
whose layout cannot fit, so that the compile stops at libtpu's buffer assignment.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli

from tpuprof.sources import llm

# Two scanned MoE layers of 8 experts, top-2; one routing group per sequence of 512 tokens.
MIXTRAL = {"model_type": "mixtral", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "num_local_experts": 8,
           "num_experts_per_tok": 2}


def test_the_expert_mlp_holds_the_devices_own_groups_not_the_slices(compile_cache, tmp_path):
    """With the dispatched tokens constrained on their experts alone, the SPMD partitioner met the expert weights
    (divided over fsdp) by gathering the groups of every device: the published Mixtral 8x7B v6e-256 recipe was
    laid out in 1,087 GiB per device, its expert MLP's activations bf16[8,24576,160,14336] (96 groups per device
    x 256 devices). Here the expert side [experts, groups, capacity, width] must hold this device's groups
    (2,048 sequences per chip x 512 tokens / 512), never the slice's 4 x 2,048."""
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    batch, seq, devices = 2048, 512, 4
    result = run_cli("preflight", "--model", str(tmp_path / "config.json"), "--tpu", "v5e-4", "--seq", str(seq),
                     "--batch-per-chip", str(batch), "--json", timeout=900,
                     env={"XDG_CACHE_HOME": str(compile_cache)})
    assert result.returncode == 0, result.stderr
    target = json.loads(result.stdout)["targets"][0]
    assert target["mesh"] == {"data": 1, "fsdp": devices, "tensor": 1, "expert": 1}
    assert not target["fits"] and target["fast"]["stage"] == "buffer_assignment"
    experts, top_k, width = 8, 2, 512
    groups = batch * seq // llm.MOE_GROUP
    capacity = math.ceil(top_k * llm.MOE_GROUP * llm.CAPACITY_FACTOR / experts)
    shapes = [b["shape"].split("{")[0] for b in target["memory"]["buffers"]]
    own = f"bf16[{experts},{groups},{capacity},{width}]"
    assert own in shapes, shapes[:10]
    # The batch fix's check compile stops at its layout too (it came to the end, 90 s more, where the layout fit).
    (fix,) = [f for f in target["memory"]["suggestions"] if f["kind"] == "batch_size"]
    assert target["compiles"] == 2 and fix["confidence"] == "measured", fix
    # Its layout at the fix's batch is within HBM (14.38 GiB of 15.75): a lower bound, not called a fit.
    assert fix["message"].endswith("the layout fits, and code generation adds to it; `--full` compiles it to the end.")
    assert fix["code"].startswith("--batch-per-chip ") and fix["severity"] == "improve"
    whole = [s for s in shapes if s.startswith(f"bf16[{experts},{groups * devices},")]
    assert not whole, whole
    # Nothing the layout holds is as large as one of the slice's expert activations.
    largest = target["memory"]["buffers"][0]["size_bytes"]
    assert largest < experts * groups * devices * capacity * width * 2



# A GPT-OSS-shaped MoE (router and expert biases, clamped SwiGLU) with Qwen-MoE's gated shared expert: every
# branch of both MoE implementations.
ROUTED = {"model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 128,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
          "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.slow
def test_dropless_routing_equals_the_capacity_routing_when_nothing_is_dropped(monkeypatch):
    """The dropless MoE (megablox grouped matmuls, run in Pallas' interpreter on this CPU) and the capacity MoE
    with a capacity of every token (factor experts / top-k: nothing dropped) compute the same layer, forward
    and gradients."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    config = dataclasses.replace(llm.parse_config(ROUTED, "routed", "test"), shared_expert_intermediate_size=128,
                                 shared_expert_gate=True)
    layout = llm._layer_layout(config, "full+moe")
    keys = iter(jax.random.split(jax.random.key(0), len(layout) + 1))
    weights = {name: jax.random.normal(next(keys), shape, jnp.float32) / math.sqrt(shape[-2] if len(shape) > 1
                                                                                    else 64)
               for name, (shape, _) in layout.items() if name.startswith(("router", "we_", "be_", "ws_"))}
    y = jax.random.normal(next(keys), (1, 128, config.hidden_size), jnp.float32).astype(jnp.bfloat16)
    mesh = Mesh(np.array(jax.devices("cpu")[:1]).reshape(1, 1, 1, 1), ("data", "fsdp", "tensor", "expert"))

    def matmul(x, w, spec):
        return jnp.einsum(spec, x, w.astype(jnp.bfloat16), preferred_element_type=jnp.bfloat16)

    def glu(gate, up):
        return jax.nn.silu(gate) * up

    monkeypatch.setattr(llm, "CAPACITY_FACTOR", config.num_experts / config.num_experts_per_tok)
    with jax.set_mesh(mesh):
        capacity = llm._moe(config, mesh, None)
        dropless = llm._dropless_moe(config, mesh, None, interpret=True)

        def layer(moe):  # jitted: Pallas' interpreter runs eagerly 5x slower
            return jax.jit(lambda w, y: moe(y, w, matmul, glu, None))

        def gradients(moe):
            return jax.jit(jax.grad(lambda w, y: jnp.sum(moe(y, w, matmul, glu, None).astype(jnp.float32) ** 2)))

        for ours, theirs in ((layer(capacity)(weights, y), layer(dropless)(weights, y)),
                             *zip(gradients(capacity)(weights, y).values(), gradients(dropless)(weights, y).values())):
            np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs, np.float32),
                                       rtol=0.05, atol=0.05 * float(jnp.abs(ours).max()))


QWEN3_MOE = {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
             "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 128, "num_experts": 4, "num_experts_per_tok": 2}


def test_a_dropless_step_runs_its_grouped_matmuls_over_every_routed_token_once(compile_cache, tmp_path,
                                                                               monkeypatch):
    """`--moe dropless` compiled for v5e:2x2 (fsdp over 4 devices) with MaxText's custom remat offloading each
    layer's input and the experts' output (`mlpwo`, as the GPT-OSS recipe does): the grouped-matmul kernels,
    costed from their own cost_estimate, run over exactly the device's tokens x top-k rows (nothing dropped, no
    capacity padding), 11 a layer: the forward's 3 (gate, up, down), gate and up again for the backward (down's
    output is on the host, not recomputed), and the backward's 6 (each kernel's input gradient and the experts'
    weight gradient), each 2 x rows x embedding x expert width FLOPs. The host holds both named activations of
    every layer, bf16; the weights and AdamW state are the parameter count's."""
    import tpuprof

    monkeypatch.setenv("XDG_CACHE_HOME", str(compile_cache))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_MOE))
    seq, layers, d = 128, QWEN3_MOE["num_hidden_layers"], QWEN3_MOE["hidden_size"]
    dropless = tpuprof.preflight(model=str(path), tpu="v5e:2x2", seq=seq, batch_per_chip=1, mesh="fsdp=4",
                                 remat="custom:decoder_layer_input=offload,mlpwo=offload", moe="dropless")
    document = dropless.to_dict()["targets"][0]
    assert document["model"]["moe"].startswith("dropless") and document["fits"]
    # fp32 weights and two moments, over the 4 devices, and the tokens: as the capacity step holds them.
    counted = llm.parse_config(QWEN3_MOE, "small", "small").parameter_count() * 12 / 4
    assert counted <= document["argument_bytes"] <= counted * 1.01
    rows = seq * QWEN3_MOE["num_experts_per_tok"]
    assert document["host_bytes"] == layers * (seq + rows) * d * 2
    kernels = [timed.op for timed in dropless.targets[0].estimate.step.ops
               if timed.op.flops_source == "cost_estimate" and timed.op.name.startswith(("gmm", "tgmm"))]
    one = 2 * rows * d * QWEN3_MOE["moe_intermediate_size"]
    assert sum(op.flops * op.count for op in kernels) == layers * 11 * one


# A DeepSeek-shaped MoE layer (4 routed experts of width 128 over an embedding of 256, a shared expert) after one
# dense layer.
DEEPSEEK = {"model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
            "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
            "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 128,
            "q_lora_rank": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
            "first_k_dense_replace": 1}


def _shard_maps(jaxpr):
    """Every shard_map equation of a jaxpr, however deep (scan, remat, custom_vjp, the transposed backward)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _shard_maps(inner)


def test_the_dropless_experts_weights_cross_into_the_shard_map_in_the_compute_dtype():
    """MaxText casts the experts' weights to `dtype` (jnp.asarray(kernel, self.dtype) in generate_kernels) before
    its sparse_matmul's shard_map, so each layer's fsdp gather of them moves bf16. Cast inside, the gather moved
    the fp32 weights: DeepSeek-V3 (256 experts of 7,168 x 2,048) held f32[1,256,7168,2048] temporaries of 14 GiB
    and its published v5p-512 recipe, which runs at batch 4 (yangwhale/tpu-recipes, 68.70 s), was laid out in 122.0
    GiB of 95.7 (94.9 with the cast outside). Traced only (no compile): every array of the experts' shape entering
    or leaving a shard_map of the step, forward or backward, is bf16, with fp32 weights."""
    import jax
    import jax.numpy as jnp

    from tpuprof.sources import tpu_compile

    if not tpu_compile.jax_available():
        pytest.skip("libtpu is not installed")
    config = llm.parse_config(DEEPSEEK, "small-deepseek", "test")
    devices = tpu_compile.topology_devices("v5e-4")
    step = llm.Step(config, "test", 256, "full", "bf16", llm.parse_mesh(None, len(devices)), moe="dropless")
    assert step.weight_dtype == "float32"
    fn, args = llm.build(step, devices, 1)
    experts, d, width = DEEPSEEK["n_routed_experts"], DEEPSEEK["hidden_size"], DEEPSEEK["moe_intermediate_size"]
    shapes = {(experts, d, width), (experts, width, d)}
    crossing = [v.aval for eqn in _shard_maps(jax.make_jaxpr(fn)(*args).jaxpr) for v in (*eqn.invars, *eqn.outvars)
                if tuple(getattr(v.aval, "shape", ())) in shapes]
    # gate, up and down in the forward, and in the backward again with their three gradients coming out
    assert len(crossing) >= 9, crossing
    assert {a.dtype for a in crossing} == {jnp.dtype(jnp.bfloat16)}, crossing


def test_shard_exp_on_fsdp_stores_the_experts_by_expert_over_fsdp(tmp_path):
    """--shard-exp-on-fsdp (MaxText's shard_exp_on_fsdp, moe.py: wi ("embed_no_exp", None, "mlp"), wo
    ("embed_no_exp", "mlp", None)): the experts' weights the step takes, and so their AdamW state and gradients, are
    divided over fsdp by expert, each device holding whole experts, where by default the embedding is divided (on
    DeepSeek-V3 over 256 devices, 28 of 7,168: a minor dimension TPU tiles pad to 128). The same bytes per device,
    so the state arithmetic is unchanged. A model whose experts fsdp does not divide is refused, naming the option,
    as MaxText refuses it. Built, not compiled."""
    import tpuprof
    from tpuprof.sources import tpu_compile

    if not tpu_compile.jax_available():
        pytest.skip("libtpu is not installed")
    config = llm.parse_config(DEEPSEEK, "small-deepseek", "test")
    devices = tpu_compile.topology_devices("v5e-4")
    experts, d, width = DEEPSEEK["n_routed_experts"], DEEPSEEK["hidden_size"], DEEPSEEK["moe_intermediate_size"]
    shards = {}
    for on_fsdp in (False, True):
        step = llm.Step(config, "test", 256, "full", "bf16", llm.parse_mesh(None, len(devices)), moe="dropless",
                        shard_exp_on_fsdp=on_fsdp)
        _, (params, _, _) = llm.build(step, devices, 1)
        shards[on_fsdp] = {name.rsplit(".", 1)[-1]: value.sharding.shard_shape(value.shape)
                           for name, value in params.items() if name.rsplit(".", 1)[-1].startswith("we_")}
        shards[on_fsdp, "state"] = llm.state_bytes_per_device(config, step.mesh_sizes, step.state)
    layers = 1  # the MoE layers after DeepSeek's first dense one
    assert shards[False] == {"we_gate": (layers, experts, d // 4, width), "we_up": (layers, experts, d // 4, width),
                             "we_down": (layers, experts, width, d // 4)}
    assert shards[True] == {"we_gate": (layers, experts // 4, d, width), "we_up": (layers, experts // 4, d, width),
                            "we_down": (layers, experts // 4, width, d)}
    assert shards[False, "state"] == shards[True, "state"]
    # DeepSeek-V3's state cannot fit v5e-8 whatever the batch: answered without a compile, the option in the document
    documents = [tpuprof.preflight(model="deepseek-v3", tpu="v5e-8", seq=256, batch_per_chip=1, moe="dropless",
                                   shard_exp_on_fsdp=on_fsdp).to_dict() for on_fsdp in (False, True)]
    from test_schemas import validate

    validate(documents[1])
    plain, on_fsdp = (document["targets"][0] for document in documents)
    assert on_fsdp["model"]["shard_exp_on_fsdp"] is True and "shard_exp_on_fsdp" not in plain["model"]
    assert on_fsdp["compiles"] == 0 and on_fsdp["state_bytes_per_chip"] == plain["state_bytes_per_chip"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK))  # 4 experts: fsdp over v5e-8's 8 devices cannot divide them
    with pytest.raises(tpuprof.UserError) as refused:
        tpuprof.preflight(model=str(path), tpu="v5e-8", seq=256, batch_per_chip=1, moe="dropless",
                          shard_exp_on_fsdp=True)
    assert str(refused.value).startswith("shard_exp_on_fsdp=") and "4 experts" in str(refused.value), refused.value
    result = run_cli("preflight", "--model", str(path), "--tpu", "v5e-8", "--seq", "256", "--batch-per-chip", "1",
                     "--shard-exp-on-fsdp", env={"XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 2 and "--shard-exp-on-fsdp needs a mixture of experts" in result.stderr, result.stderr
