"""`preflight --model` for the families of 2025-26: DeepSeek (MLA, shared + routed experts, dense first layers),
Llama 4 (interleaved MoE, chunked attention), Qwen3 MoE (QK-norm), Gemma 2/3 (sliding windows, soft-capping),
Gemma 4 (full layers with their own heads, keys as values, a dense MLP beside the experts), GPT-OSS (sinks, alternating windows, expert biases), GPT-3 (LayerNorm, GELU, learned positions, biases).

Parameter counts of the built-in configs against the published figures (no compile); one small config of each
family compiled for real on v5e:2x2 (four chips, the step's arguments whole on each: --mesh data=4), whose
argument bytes are the count x 12 (fp32 weights and two moments) or x 8 (bf16 weights, an fp32 first moment), from the first
answer (the compile stopped at the memory layout); that answer against the whole compile on three families.
Compiles run in this process (the first answer's in a child it stops), cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuprof.sources import llm

# (total, active, which count the card's "active" is, the card's digits, source). "matmul": the card leaves the
# embedding lookup out of its active count (llm.ModelConfig.matmul_parameter_count), "all": it does not.
PUBLISHED = {
    "deepseek-v3": (671e9, 37e9, "matmul", 1e9, "https://huggingface.co/deepseek-ai/DeepSeek-V3 (671B total, 37B "
                    "activated; the 685B of the safetensors add the 14B multi-token-prediction module, not modelled)"),
    # 15.71B and 2.45B here: the card's "2.4B" is cut, not rounded, so the tolerance is one more tenth.
    "deepseek-v2-lite": (15.7e9, 2.4e9, "matmul", 0.2e9,
                         "https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite (15.7B total, 2.4B activated)"),
    # 400.7B for the language model alone (the card's total adds the vision encoder): "400B" within 1B.
    "llama4-maverick": (400e9, 17e9, "all", 2e9,
                        "https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E (17B activated, 400B total)"),
    "qwen3-235b-a22b": (235e9, 22e9, "all", 1e9, "https://huggingface.co/Qwen/Qwen3-235B-A22B (235B, 22B activated)"),
    # 3.35B active here: the card's "3.3B" is cut, not rounded.
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "all", 0.2e9, "https://huggingface.co/Qwen/Qwen3-30B-A3B (30.5B, 3.3B activated)"),
    "gpt-oss-20b": (20.91e9, 3.61e9, "matmul", 0.01e9, "gpt-oss model card, arXiv:2508.10925 Table 1 (20.91B, 3.61B)"),
    "gpt-oss-120b": (116.83e9, 5.13e9, "matmul", 0.01e9,
                     "gpt-oss model card, arXiv:2508.10925 Table 1 (116.83B, 5.13B active)"),
    # The language model alone: 30.70B and 25.23B / 3.82B here (the vision encoder, about 0.55B, is not in the
    # card's figures either: with it the 31B would be 31.2B). The exact counts are test_gemma4_counts_its_modules.
    "gemma4-31b": (30.7e9, 30.7e9, "all", 0.1e9, "Gemma 4 model card, parameter table (31B: 30.7B), as reproduced at "
                   "https://andysmith.ai/wiki/gemma-4-model-card/"),
    "gemma4-26b-a4b": (25.2e9, 3.8e9, "all", 0.1e9, "Gemma 4 model card, parameter table (26B A4B: 25.2B total, "
                       "3.8B active), as reproduced at https://andysmith.ai/wiki/gemma-4-model-card/"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_equal_the_model_cards(name):
    total, active, convention, digit, _source = PUBLISHED[name]
    config, _ = llm.load_config(name)
    counted = config.matmul_parameter_count() if convention == "matmul" else config.active_parameter_count()
    assert abs(config.parameter_count() - total) <= digit / 2, (name, config.parameter_count())
    assert abs(counted - active) <= digit / 2, (name, counted)


def test_counts_the_papers_give_for_dense_families():
    # Gemma 3 technical report (arXiv:2503.19786) Table 1, non-embedding parameters (millions): 12B 10,759,
    # 27B 25,600 (its embedding column and the card's totals add the 417M SigLIP vision encoder's projection).
    for name, millions in (("gemma3-12b", 10_759), ("gemma3-27b", 25_600)):
        config, _ = llm.load_config(name)
        non_embedding = config.parameter_count() - config.vocab_size * config.hidden_size
        assert round(non_embedding / 1e6) == millions, name
    # GPT-3 (arXiv:2005.14165 Table 2.1): "175.0B"; 96 layers of d_model 12,288 with GPT-2's 50,257-token
    # vocabulary and 2,048 learned positions come to 174.6B, the figure the paper rounds.
    gpt3 = llm.load_config("gpt3-175b")[0]
    assert gpt3.parameter_count() == pytest.approx(175.0e9, rel=0.003)
    assert gpt3.learned_positions == 2048 and gpt3.norm_type == "layer" and not gpt3.mlp_gated
    # Llama 4 Scout: the card's 109B total includes the vision encoder; its 17B activated is the language model's.
    scout = llm.load_config("llama4-scout")[0]
    assert round(scout.active_parameter_count() / 1e9) == 17 and 107e9 < scout.parameter_count() < 109e9


def test_the_layer_plans_follow_the_modelling_code():
    plan = {name: llm.load_config(name)[0].plan for name in
            ("gemma3-27b", "gemma2-9b", "llama4-maverick", "llama4-scout", "deepseek-v3", "gpt-oss-20b", "qwen3-235b-a22b")}
    # Gemma 3: five sliding layers (1,024 tokens) and a global one, 62 = 10 x 6 + 2 sliding.
    assert plan["gemma3-27b"] == ((("sliding+dense",) * 5 + ("full+dense",), 10), (("sliding+dense",) * 2, 1))
    assert plan["gemma2-9b"] == ((("sliding+dense", "full+dense"), 21),)
    # Llama 4: chunked RoPE layers, every fourth global (NoPE); Maverick alternates dense and MoE MLPs.
    assert plan["llama4-maverick"] == ((("chunked+dense", "chunked+moe", "chunked+dense", "full+moe"), 12),)
    assert plan["llama4-scout"] == ((("chunked+moe",) * 3 + ("full+moe",), 12),)
    assert plan["deepseek-v3"] == ((("full+dense",), 3), (("full+moe",), 58))
    assert plan["gpt-oss-20b"] == ((("sliding+moe", "full+moe"), 12),)
    assert plan["qwen3-235b-a22b"] == ((("full+moe",), 94),)  # one scanned MoE layer, 94 times
    assert llm.load_config("qwen3-235b-a22b")[0].layer_plan == ()  # stored as the plain case (bare names)
    assert llm.load_config("qwen3-30b-a3b")[0].qk_norm and llm.load_config("gemma3-12b")[0].qk_norm
    gemma2 = llm.load_config("gemma2-27b")[0]
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping, gemma2.sliding_window) == (50.0, 30.0, 4096)
    v3 = llm.load_config("deepseek-v3")[0]
    assert (v3.q_lora_rank, v3.kv_lora_rank, v3.qk_rope_head_dim, v3.shared_expert_intermediate_size,
            v3.mtp_layers) == (1536, 512, 64, 2048, 1)


def _gemma4_modules(text: dict) -> int:
    """Gemma 4's language-model parameters counted from transformers' modules (modeling_gemma4.py:
    Gemma4TextModel, Gemma4TextDecoderLayer, Gemma4TextAttention, Gemma4TextMLP, Gemma4TextRouter,
    Gemma4TextExperts; the layer_scalar buffer included, as the checkpoint holds it), for a config without
    per-layer embeddings: an independent count of what ModelConfig.parameter_count() sums from the step's layout."""
    d, h, layers = text["hidden_size"], text["num_attention_heads"], text["num_hidden_layers"]
    total = text["vocab_size"] * d + d  # embed_tokens (tied to the LM head), norm
    for kind in text["layer_types"]:
        full = kind == "full_attention"
        head = text["global_head_dim"] if full else text["head_dim"]
        k_eq_v = full and text["attention_k_eq_v"]
        kv = text["num_global_key_value_heads"] if k_eq_v else text["num_key_value_heads"]
        attention = d * h * head * 2 + head  # q_proj, o_proj, q_norm
        attention += d * kv * head * (1 if k_eq_v else 2) + head  # k_proj (v_proj), k_norm; v_norm has no weight
        layer = attention + 4 * d + 1 + 3 * d * text["intermediate_size"]  # four norms, layer_scalar, mlp
        if text["enable_moe_block"]:
            e, f = text["num_experts"], text["moe_intermediate_size"]
            layer += d * e + d + e  # router: proj, scale, per_expert_scale
            layer += e * 2 * f * d + e * d * f + 3 * d  # experts' gate_up_proj and down_proj, three more norms
        total += layer
    assert len(text["layer_types"]) == layers
    return total


def test_gemma4_counts_its_modules():
    """The built-in Gemma 4 configs count, to the parameter, what transformers' Gemma 4 modules hold for them
    (30,697,345,340 and 25,233,141,790: no published figure has more digits than the card's above); the 31B's
    full layers have 512-wide heads, 4 key/value heads and no value projection, the 26B's every layer a dense MLP
    of 2,112 beside its 128 experts of 704."""
    for name, expected in (("gemma4-31b", 30_697_345_340), ("gemma4-26b-a4b", 25_233_141_790)):
        config, _ = llm.load_config(name)
        text = json.loads((Path(llm.__file__).parent.parent / "llm_configs" / f"{name}.json").read_text())
        assert config.parameter_count() == _gemma4_modules(text) == expected, name
    dense, moe = llm.load_config("gemma4-31b")[0], llm.load_config("gemma4-26b-a4b")[0]
    assert dense.plan == ((("sliding+dense",) * 5 + ("full+dense",), 10),)
    assert moe.plan == ((("sliding+moe",) * 5 + ("full+moe",), 5),)
    layout = llm._parameter_layout(dense, dict.fromkeys(llm.MESH_AXES, 1))
    assert layout["segment0.layer5.wk"][0] == (10, 5376, 4 * 512) and "segment0.layer5.wv" not in layout
    assert layout["segment0.layer0.wv"][0] == (10, 5376, 16 * 256)
    assert (dense.sliding_window, dense.final_logit_softcapping, dense.query_pre_attn_scalar) == (1024, 30.0, 1.0)
    assert (dense.rope_theta, dense.global_rope_theta, dense.global_rope_fraction) == (10_000.0, 1e6, 0.25)
    layout = llm._parameter_layout(moe, dict.fromkeys(llm.MESH_AXES, 1))
    assert layout["segment0.layer0.we_gate"][0] == (5, 128, 2816, 704)
    assert layout["segment0.layer0.w_gate"][0] == (5, 2816, 2112) and moe.shared_expert_intermediate_size == 0
    assert (moe.num_experts, moe.num_experts_per_tok) == (128, 8)


def test_gemma4_with_per_layer_embeddings_is_refused():
    """E2B and E4B feed each layer its own token embedding and reuse the keys and values of earlier layers in their
    last layers, which the step does not build: their configs and names are refused in one sentence (google/
    gemma-4-E4B's text_config fields, as published)."""
    e4b = {"model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 42,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
        "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 18,
        "attention_k_eq_v": False, "sliding_window": 512, "vocab_size": 262144}}
    with pytest.raises(llm.UserError, match="per-layer input embeddings"):
        llm.parse_config(e4b, "gemma-4-E4B", "config.json")
    # A text_config that names no hidden_size_per_layer_input gets transformers' default, 256: refused too.
    without = {**e4b["text_config"]}
    del without["hidden_size_per_layer_input"]
    with pytest.raises(llm.UserError, match="per-layer input embeddings"):
        llm.parse_config({"text_config": without}, "e4b", "config.json")
    for name in ("gemma4-e2b", "gemma4-e4b"):
        with pytest.raises(llm.UserError, match=f"{name} is not built: Gemma 4's per-layer input embeddings"):
            llm.load_config(name)


# Gemma 3's config.json on the hub is multimodal, and its text_config is written as a diff against transformers'
# Gemma3TextConfig defaults (to_diff_dict): fields equal to a default are left out, and transformers fills them in
# when it loads the model. google/gemma-3-12b-it (https://huggingface.co/google/gemma-3-12b-it/blob/main/config.json)
# names no vocab_size (262,208), head_dim (256) or query_pre_attn_scalar (256); gemma-3-4b-it not even its heads.
GEMMA3_HUB = {
    "12b": {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
            "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
            "mm_tokens_per_image": 256, "model_type": "gemma3",
            "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                            "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
            "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                              "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                              "patch_size": 14, "vision_use_head": False}},
    "4b": {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
           "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                           "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                           "sliding_window": 1024}},
}


def test_gemma3_hub_configs_leave_out_what_transformers_defaults(tmp_path):
    """The downloaded gemma-3-12b-it config.json builds the built-in gemma3-12b's program (one compile cache entry,
    the same parameter count); gemma-3-4b-it's, which names neither heads nor head_dim, counts the Gemma 3 report's
    non-embedding parameters (arXiv:2503.19786 Table 1: 4B 3,209M)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_HUB["12b"]))
    downloaded, builtin = llm.load_config(str(path))[0], llm.load_config("gemma3-12b")[0]
    assert downloaded.parameter_count() == builtin.parameter_count() == 11_766_034_176
    assert downloaded.digest() == builtin.digest()
    four = llm.parse_config(GEMMA3_HUB["4b"], "gemma-3-4b-it", "config.json")
    assert (four.num_attention_heads, four.num_key_value_heads, four.head_dim, four.vocab_size) == (8, 4, 256, 262_208)
    assert round((four.parameter_count() - four.vocab_size * four.hidden_size) / 1e6) == 3_209
    assert four.layer_kinds().count("full+dense") == 5 and four.sliding_window == 1024


def test_a_config_of_a_family_tpuprof_does_not_build_is_refused():
    """Qwen3-Next names every field a Qwen MoE does, but three of its four layers are linear attention (Gated
    DeltaNet), which the step does not have: built as a Qwen MoE its figures would be another model's."""
    qwen3_next = {"model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
                  "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "full_attention_interval": 4}
    with pytest.raises(llm.UserError, match="model_type 'qwen3_next', not a family tpuprof builds"):
        llm.parse_config(qwen3_next, "qwen3-next", "config.json")
    with pytest.raises(llm.UserError, match="names no model_type"):
        llm.parse_config({k: v for k, v in qwen3_next.items() if k != "model_type"}, "c", "config.json")


# Small configs of each family (HF field names, as their config.json spells them).
SMALL = {
    "deepseek": {"model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
                 "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 2, "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "kv_lora_rank": 128, "q_lora_rank": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                 "qk_nope_head_dim": 128, "first_k_dense_replace": 1},
    "llama4": {"model_type": "llama4_text", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 256,
               "intermediate_size_mlp": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 128, "num_local_experts": 4, "num_experts_per_tok": 1,
               "interleave_moe_layer_step": 2, "attention_chunk_size": 128, "no_rope_layers": [1, 0]},
    "gemma3": {"model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
               "sliding_window": 128, "sliding_window_pattern": 2, "query_pre_attn_scalar": 128},
    "gpt_oss": {"model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128, "attention_bias": True},
    # Both Gemma 4 kinds of layer (sliding 128-wide heads, full 256-wide with one key/value head that is also the
    # value), each with the 26B's dense MLP beside 4 experts.
    "gemma4": {"model_type": "gemma4_text", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "num_global_key_value_heads": 1, "head_dim": 128, "global_head_dim": 256, "attention_k_eq_v": True,
               "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"],
               "final_logit_softcapping": 30.0, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
               "moe_intermediate_size": 128, "hidden_size_per_layer_input": 0},
    # The three the first answer is checked against the whole compile on.
    "gpt3": {"model_type": "gpt2", "vocab_size": 512, "n_embd": 256, "n_layer": 6, "n_head": 2, "n_positions": 256},
    "gemma2": {"model_type": "gemma2", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
               "sliding_window": 128, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "qwen3_moe": {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
                  "moe_intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 128, "num_experts": 4, "num_experts_per_tok": 2},
}
FAST = ("gpt3", "gemma2", "qwen3_moe")
TOPOLOGY, SEQ = "v5e:2x2", 128


@pytest.fixture(scope="session")
def family_runs(tmp_path_factory):
    """Each family's result through preflight's own path (cached compiles): every config's first answer (stopped
    at the memory layout), FAST's whole compile too, and GPT-3 with bf16 weights."""
    pytest.importorskip("libtpu")
    import os

    from tpuprof.commands import preflight
    from tpuprof.models.preflight import preflight_options

    def options(model: str, **keywords):
        return preflight_options(model=model, tpu=TOPOLOGY, **keywords)

    def answer(result) -> dict:  # the slice's entry of the JSON document, as a user reads it
        return result.to_dict()["targets"][0]

    folder = tmp_path_factory.mktemp("families")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder / "cache")
    try:
        runs = {}
        for name, data in SMALL.items():
            path = folder / f"{name}.json"
            path.write_text(json.dumps(data))
            common = dict(seq=SEQ, batch_per_chip=1, mesh="data=4")
            runs[name, "fast"] = answer(preflight.model_result(options(str(path), **common)))
            if name in FAST:
                runs[name, "full"] = answer(preflight.model_result(options(str(path), full=True, **common)))
        # Both state knobs in one compile: bf16 weights (and second moment) with an fp32 first moment.
        runs["gpt3", "bf16"] = answer(preflight.model_result(options(str(folder / "gpt3.json"),
                                                              weight_dtype="bfloat16", mu_dtype="float32",
                                                              **common)))
        return runs
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


@pytest.mark.parametrize("name", sorted(SMALL))
def test_each_family_compiles_with_its_counted_parameters_as_arguments(family_runs, name):
    """The compiled step's arguments on one chip (data=4: nothing sharded) are the parameter count's fp32 weights
    and two moments, plus the tokens and the tile padding of the stacked norms and biases ([layers, d] pads its
    layers to 8 rows): within 0.5% here."""
    run = family_runs[name, "fast"]
    assert run["fits"] and run["compiles"] == 1
    counted = llm.parse_config(SMALL[name], name, name).parameter_count()
    assert run["model"]["parameters"] == counted
    assert counted * 12 <= run["argument_bytes"] <= counted * 12 * 1.005, (run["argument_bytes"], counted * 12)


def test_the_weights_and_each_moment_are_stored_in_their_own_dtype(family_runs):
    """MaxText's weight_dtype sets the weights' and (optax's default) the second moment's dtype, its mu_dtype the
    first moment's: bf16 weights with an fp32 first moment are 2 + 4 + 2 bytes a parameter, in the compiled step's
    arguments as in the state arithmetic (fp32: 12)."""
    fp32, bf16 = family_runs["gpt3", "fast"], family_runs["gpt3", "bf16"]
    counted = fp32["model"]["parameters"]
    assert (bf16["model"]["weight_dtype"], bf16["model"]["mu_dtype"]) == ("bfloat16", "float32")
    assert "mu_dtype" not in fp32["model"]
    assert counted * 8 <= bf16["argument_bytes"] <= counted * 8 * 1.005
    assert fp32["argument_bytes"] - bf16["argument_bytes"] == pytest.approx(counted * 4, rel=0.005)
    assert bf16["state_bytes_per_chip"] == counted * 8 and fp32["state_bytes_per_chip"] == counted * 12


@pytest.mark.parametrize("name", FAST)
def test_a_step_that_may_fit_gets_the_whole_compiles_answer(family_runs, name):
    """Code generation can add gigabytes to the memory the compiler laid out (7.9 GiB on a Llama 3.1 8B v6e-8
    step), so a step whose layout fits is compiled to the end: the default answer is the whole compile's."""
    default, full = family_runs[name, "fast"], family_runs[name, "full"]
    assert "fast" not in default and default["generated_code_bytes"] > 0
    for key in ("required_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes"):
        assert default[key] == full[key], key
    assert default["estimate"]["compiler_ms"] is not None


def test_a_step_whose_layout_does_not_fit_is_answered_before_code_generation(tmp_path):
    """GPT-3 style small at 16,384 sequences of 128 per chip on v5e: its layout alone needs more than the 15.75 GiB a
    chip offers plus the margin, so the compile stops there and says so (unless the compiler, which refuses
    temporaries beyond HBM right after laying them out, ends first: the same verdict); the arguments are the same
    step's as at one sequence (the weights and AdamW state), only the tokens grow."""
    import os

    from tpuprof.commands import preflight
    from tpuprof.models.preflight import preflight_options

    path = tmp_path / "gpt3.json"
    path.write_text(json.dumps(SMALL["gpt3"]))
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    try:
        result = preflight.model_result(preflight_options(model=str(path), tpu=TOPOLOGY, seq=SEQ, batch_per_chip=16384,
                                                          mesh="data=4"))
    finally:
        os.environ.pop("XDG_CACHE_HOME") if saved is None else os.environ.__setitem__("XDG_CACHE_HOME", saved)
    answer = result.to_dict()["targets"][0]
    assert not answer["fits"]
    if "fast" not in answer:  # the compiler's own refusal (temporaries beyond HBM) came before tpuprof looked
        assert "RESOURCE_EXHAUSTED" in answer["oom"]["message"]
        return
    assert answer["fast"]["stage"] == "buffer_assignment"
    assert answer["required_bytes"] > answer["hbm_capacity_bytes"] + answer["fast"]["margin_bytes"]
    assert answer["generated_code_bytes"] == 0 and "lower bound" in answer["fast"]["method"]
    from tpuprof.renderers import markdown

    document = result.to_dict()
    assert "stopped before code generation" in markdown.render(document)  # the page and the table say it too
    counted = llm.parse_config(SMALL["gpt3"], "gpt3", "gpt3").parameter_count()
    tokens = 16384 * (SEQ + 1) * 4
    assert counted * 12 < answer["argument_bytes"] - tokens < counted * 12 * 1.02  # tile padding on top



@pytest.mark.slow
@pytest.mark.compile
def test_each_splash_kernel_is_costed_by_the_blocks_its_mask_keeps(tmp_path):
    """Gemma 3 small at 2,048 tokens on v5e (splash blocks of 512: a 4 x 4 grid), compiled up to its memory layout
    (the module the step estimate reads): the estimate reads each attention kernel's block mask from the compiled
    program. The global layer's causal kernels run 10 of the 16 (query, key) blocks; the sliding layer's (a
    128-token window) the diagonal and the block before it, 7 of 16, although splash shrinks that mask to
    [heads, 4, 2] (its widest row). Each kernel is built anew per call: one kept and called by both sliding layers
    makes jit pass its masks in as program arguments, and the estimate could then read no mask."""
    pytest.importorskip("libtpu")
    from tpuprof.analyses import step_estimate
    from tpuprof.sources import tpu_compile
    from tpuprof.sources.mesh import parse_mesh

    # Two sliding layers and a global one: a kernel's mask is used by more than one layer.
    config = llm.parse_config({**SMALL["gemma3"], "num_hidden_layers": 3, "sliding_window_pattern": 3}, "gemma3",
                              "gemma3")
    spec = llm.Spec(llm.Step(config, "gemma3", 2048, mesh_sizes=parse_mesh("data=4", 4)), TOPOLOGY)
    tpu_compile.compile_until_layout(spec, 1, None, TOPOLOGY, tmp_path, stop_above=0)
    kernels = step_estimate.estimate(step_estimate.load(tmp_path), "v5e").kernels_estimated
    assert {k["kernel"] for k in kernels} == {"splash fwd", "splash dq", "splash dkv"}
    assert all(k["blocks"].startswith("block mask: ") and k["blocks"].endswith(" of 16 blocks non-empty")
               for k in kernels), [k["blocks"] for k in kernels]
    assert {(k["kernel"], k["blocks_run"]) for k in kernels} == {
        (kind, fraction) for kind in ("splash fwd", "splash dq", "splash dkv") for fraction in (7 / 16, 10 / 16)}


def test_gpt_oss_model_flops_count_the_k_experts_matmuls_and_no_bias():
    """MaxText's calculate_ffn_mamtul_tflops_per_device counts the k routed experts' matmuls and no bias; GPT-OSS's
    expert biases ([layers, experts, width], rank 3) were counted as matmul parameters (829,440 more on gpt-oss-20b,
    1,244,160 on 120b). The count here is every matmul weight of the layout, the experts' scaled by k of E."""
    import math

    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        config, _ = llm.load_config(name)
        layout = llm._parameter_layout(config, dict.fromkeys(llm.MESH_AXES, 1))
        share = config.num_experts_per_tok / config.num_experts
        matmuls = 0.0
        for key, (shape, _) in layout.items():
            leaf = key.rsplit(".", 1)[-1]
            if key == "lm_head" or (len(shape) >= 3 and not leaf.startswith("be_")):
                matmuls += math.prod(shape) * (share if leaf.startswith("we_") else 1)
        assert config.matmul_parameter_count() == round(matmuls), name


def test_gemma4_full_layers_turn_a_quarter_of_each_head():
    """Proportional RoPE (transformers' _compute_proportional_rope_parameters for Gemma 4's full layers): the first
    partial_rotary_factor x head_dim / 2 frequency pairs are 1 / theta^(2i / head_dim), the rest 0, so 3/4 of a
    512-wide head is left as it is and the rest turns as RoPE over the whole head would."""
    import jax.numpy as jnp
    import numpy as np

    head, seq = 512, 8
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, seq, 1, head)), jnp.float32)
    turned, whole = np.asarray(llm._rope(x, 1e6, 0.25)), np.asarray(llm._rope(x, 1e6))
    pairs = np.r_[0:64, 256:320]  # split-half layout: pair i is (i, i + 256)
    kept = np.setdiff1d(np.arange(head), pairs)
    np.testing.assert_array_equal(turned[..., kept], np.asarray(x)[..., kept])
    np.testing.assert_allclose(turned[..., pairs], whole[..., pairs], rtol=1e-6)
    assert not np.allclose(turned[0, 1:, 0, pairs], np.asarray(x)[0, 1:, 0, pairs])
