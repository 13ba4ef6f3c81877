"""`tpuprof serve` for Gemma 4 on vLLM TPU: its full-attention layers (heads of 512, their own key/value heads) and
its sliding layers (heads of 256) each get their own cache, one block count for all (tpu-inference b8692ff0
runner/kv_cache_manager.py get_kv_cache_spec, vLLM 001cabc1 UniformTypeKVCacheSpecs), checked against the public
vLLM TPU start-up logs of gemma-4-E2B (tests/fixtures/serving) and the published minimum of tpu-recipes' Trillium
recipe (inference/trillium/vLLM/Gemma4/README.md @ c8cfe2f6: 4 v6e chips for the 31B and the 26B-A4B, served at
--max-model-len 16384, TP 8 on v6e-8)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_cli

import tpuprof
from tpuprof.analyses import serve_memory
from tpuprof.sources import llm, tpu_compile

SERVING = Path(__file__).parent / "fixtures" / "serving"
GiB = 1 << 30
RECIPE_MAX_MODEL_LEN = 16384

# gemma-4-E2B-it's 15 layers that own a KV cache (its last 20 share theirs, and tpuprof builds no per-layer input
# embeddings, so these stand for E2B's cache alone): one KV head of 256 on the sliding layers, one of 512 on the full
# ones (layers 4, 9, 14), attention_k_eq_v off (google/gemma-4-E2B-it config.json's text_config).
E2B_CACHE_LAYERS = {
    "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 1536, "intermediate_size": 6144,
    "num_hidden_layers": 15, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
    "global_head_dim": 512, "attention_k_eq_v": False, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 3, "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0, "max_position_embeddings": 131072}


def _e2b_log(name: str) -> dict:
    text = (SERVING / name).read_text()
    return {"available": float(re.search(r"total_hbm_avail_gb=([\d.]+)GiB", text).group(1)),
            "blocks": int(re.search(r"num_blocks=\[(\d+),", text).group(1)),
            "block": int(re.search(r"regular_attn_shape=\(num_blocks, \((\d+), ", text).group(1)),
            "tokens": int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", "")),
            "layers": len(re.search(r"num_blocks=\[([\d, ]+)\]", text).group(1).split(","))}


@pytest.mark.parametrize("log", ["xbill9_gemma4_e2b_v6e1_tp1.txt", "xbill9_gemma4_e2b_v5e1_util095.txt"])
def test_each_kind_of_layer_has_its_own_cache_as_the_vllm_tpu_log_of_gemma4_shows(log):
    """vLLM TPU gave each of gemma-4-E2B's 15 cache layers the same block count (17,996 on v6e-1, 10,903 on v5e-1),
    each its own page: 12 sliding layers of 1 KiB a token and 3 full ones of 2 KiB, 18 KiB a token in all. The
    log's available HBM (printed to 0.01 GiB) over that, in blocks, is the log's block count and its KV tokens; one
    layout for every layer (the sliding one: 15 KiB a token) gives 20% more blocks than the engine allocated."""
    figures = _e2b_log(log)
    config = llm.parse_config(E2B_CACHE_LAYERS, "gemma-4-E2B cache layers", "test")
    kv = serve_memory.kv_layout(config, "vllm", 1, "auto", 16384, figures["block"], 8)
    assert [(k.attention, k.layers, k.cache_slots, k.padded_head_dim) for k in kv.kinds] == [
        ("sliding", 12, 2, 256), ("full", 3, 2, 512)]
    assert figures["layers"] == 15 and kv.kv_bytes_per_token_per_device == 18 * 1024
    low, high = ((figures["available"] + half) * GiB // kv.page_bytes for half in (-0.005, 0.005))
    assert low <= figures["blocks"] <= high
    assert figures["tokens"] == figures["blocks"] * figures["block"]
    one_layout = 15 * 2 * 256 * 2 * figures["block"]  # every layer as a sliding one
    assert (figures["available"] - 0.005) * GiB // one_layout > 1.15 * figures["blocks"]


@pytest.mark.parametrize("name", ["gemma4-31b", "gemma4-26b-a4b"])
def test_the_smallest_v6e_slice_that_serves_gemma4_is_the_recipes_four_chips(name):
    """tpu-recipes' Trillium Gemma 4 recipe: "Min TPUs (Chips) 4x" for both, at --max-model-len 16384 (served there
    at TP 8 on v6e-8). v6e slices have 1, 4 or 8 chips: on one chip the bf16 weights alone exceed what vLLM may use
    (31.25 GiB x 0.92), on four a request of 16,384 tokens fits, and on the recipe's eight more do."""
    answer = tpuprof.serve(name, "v6e-1,v6e-4,v6e-8", max_model_len=RECIPE_MAX_MODEL_LEN, compile=False)
    targets = {t.slice.name: t for t in answer.targets}
    one, four, eight = targets["v6e-1"], targets["v6e-4"], targets["v6e-8"]
    assert one.capacity.kv_budget_bytes_per_device <= 0 and one.problems
    assert four.tensor_parallel_size == 4 and four.capacity.max_concurrency >= 1 and not four.problems
    assert eight.tensor_parallel_size == 8 and eight.capacity.max_concurrency > four.capacity.max_concurrency
    from test_schemas import validate

    from tpuprof.renderers.markdown import render

    document = answer.to_dict()
    assert validate(document) == "serve"
    (launch,) = [t for t in document["targets"] if t["slice"]["name"] == "v6e-8"]
    hub = {"gemma4-31b": "google/gemma-4-31B-it", "gemma4-26b-a4b": "google/gemma-4-26B-A4B-it"}[name]
    assert launch["command"].startswith(f"vllm serve {hub} --tensor-parallel-size 8 --max-model-len 16384 ")
    assert [k["attention"] for k in launch["kv"]["layer_kinds"]] == ["sliding", "full"]
    assert "full layers: 1 KV head(s) per device, replicated, head_dim 512 stored as 512" in render(document)


@pytest.mark.parametrize("tpu, settings", [
    # tpu-inference issue 2333 (lk-chen, 2026-04-30): "verified following works" on v6e after the bf16 benchmark ran
    # out of HBM: TP 4, qwix fp8 weights, fp8 KV, 0.98, block 256, 4,096 batched tokens, 16,384 tokens a request.
    ("v6e-4", {"tensor_parallel_size": 4, "quantization": "fp8", "kv_cache_dtype": "fp8",
               "gpu_memory_utilization": 0.98, "block_size": 256, "max_num_batched_tokens": 4096,
               "max_model_len": 16384}),
    # tpu-recipes c8cfe2f6 inference/ironwood/vLLM/Gemma4/gemma4-server.yaml: a 2x2x1 node (8 devices), TP 2 x DP 4,
    # qwix fp8 weights, fp8 KV, 0.9, block 256, 256 requests, 16,384 batched tokens, 1,524 tokens a request.
    ("tpu7x-8", {"tensor_parallel_size": 2, "quantization": "fp8", "kv_cache_dtype": "fp8",
                 "gpu_memory_utilization": 0.9, "block_size": 256, "max_num_batched_tokens": 16384,
                 "max_num_seqs": 256, "max_model_len": 1524})])
def test_the_published_gemma4_31b_launches_serve(tpu, settings):
    """Both published launches of the 31B with fp8 weights and cache start by the engine's rule (a request of
    --max-model-len fits); the Ironwood one's 256 requests of 1,524 tokens do not all fit an engine's cache at once
    (219.8 do). The fp8 cache packs the sliding layers' slots 4 a word (half their bytes) and the full layers' to 4."""
    (target,) = tpuprof.serve("gemma4-31b", tpu, compile=False, **settings).targets
    assert not target.problems and target.replicas * target.tensor_parallel_size == target.slice.devices
    assert target.capacity.max_concurrency >= 1
    sliding, full = target.kv.kinds
    assert sliding.cache_slots == 2 * sliding.kv_heads_per_device and full.cache_slots == 4


def test_the_31b_caches_its_full_layers_wider_with_fewer_heads_copied_past_them():
    """gemma4-31b at TP 8: 50 sliding layers of 16 KV heads (2 a device: 4 slots x 256) and 10 full layers of 4 KV
    heads of 512, which TP 8 exceeds (one copied to each device: 2 slots x 512), each at 2 B: 122,880 B a token on a
    device, where one layout for every layer (the sliding one) said 102,400 B. fp8 packs the sliding layers' 4 slots
    a word (half the bytes) and fills 2 of the full layers' 4: no saving there."""
    config = llm.load_config("gemma4-31b")[0]
    kv = serve_memory.kv_layout(config, "vllm", 8, "auto", RECIPE_MAX_MODEL_LEN, None, 256)
    sliding, full = kv.kinds
    assert (sliding.layers, sliding.kv_heads_per_device, sliding.cache_slots, sliding.padded_head_dim) == \
        (50, 2, 4, 256)
    assert (full.layers, full.kv_heads, full.replicated, full.cache_slots, full.padded_head_dim) == \
        (10, 4, True, 2, 512)
    assert kv.kv_bytes_per_token_per_device == 50 * 4 * 256 * 2 + 10 * 2 * 512 * 2 == 122_880
    assert kv.page_bytes == kv.page_size * 122_880 and not kv.window.kept
    fp8 = serve_memory.kv_layout(config, "vllm", 8, "fp8", RECIPE_MAX_MODEL_LEN, None, 256)
    assert fp8.kv_bytes_per_token_per_device == 50 * 4 * 256 + 10 * 4 * 512 == 71_680


@pytest.mark.parametrize("engine, where", [("sglang-jax", "SWAKVPool"), ("jetstream", "models/gemma4.py")])
def test_gemma4_on_the_other_engines_is_one_sentence(engine, where):
    result = run_cli("serve", "--model", "gemma4-31b", "--tpu", "v6e-8", "--engine", engine, "--no-compile")
    assert result.returncode == 2 and not result.stdout and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and where in result.stderr
    assert "tpuprof has not modelled" in result.stderr


# Both kinds of Gemma 4 layer, narrow: a sliding layer of 8 KV heads of 256 (2 a device at TP 4) and a full one of
# 1 head of 512 that is also the values (split over TP 4 by its width, copied into each device's cache), each with
# the 26B-A4B's dense MLP beside 4 experts.
SMALL_GEMMA4 = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
    "num_global_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": True,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": 30.0,
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 128,
    "max_position_embeddings": 4096, "hidden_size_per_layer_input": 0}


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.skipif(not tpu_compile.jax_available(), reason="needs jax[tpu] (libtpu)")
def test_a_small_gemma4_compiles_each_layers_own_cache(tmp_path):
    """The backbone compiled for v5e-4 (JAX's ragged paged attention at heads of 512, and at 2 heads of 256 a device,
    which Mosaic refuses as such and tpuprof hands it in 128-lane slices): the KV pages the compiler allocates are
    the engine's (262,144 B a page of each layer: 4 slots of 256 and 2 of 512), and the compiled weights are the
    shapes' to 0.5% (the norms of q, k and the router's scales are not in the compiled step; one layout for both
    layers compiled the full layer's q and o at 256 and a value projection: 24% less)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_GEMMA4))
    result = tpuprof.serve(str(path), "v5e-4", max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=16)
    (target,) = result.targets
    assert target.tensor_parallel_size == 4 and not target.programs.failures
    assert [(k.cache_slots, k.padded_head_dim, k.page_bytes_per_layer) for k in target.kv.kinds] == [
        (4, 256, 262_144), (2, 512, 262_144)]
    assert target.programs.kv_page_bytes_per_layer * 2 == target.kv.page_bytes == 524_288
    shapes = serve_memory.shape_weights_bytes_per_device(result.answer.options.model, 4, "bf16", False)
    assert target.programs.weights_bytes_per_device == pytest.approx(shapes, rel=0.005)
    assert target.programs.largest.temp_bytes > 0


def test_a_decode_step_reads_a_sliding_layers_window_alone():
    """The 31B's sliding layers are cached in full but the kernel reads only their 1,024-token window (the JAX model
    passes it as sliding_window; RPA v3 starts its KV blocks there): at 16,384 tokens of context a decode step reads
    the full layers' 20,480 B a token and the sliding layers' 102,400 B over 1,024 of them, 26,880 B a token of
    context on a device at TP 8, where every layer over the context is 122,880 B."""
    config = llm.load_config("gemma4-31b")[0]
    kv = serve_memory.kv_layout(config, "vllm", 8, "auto", RECIPE_MAX_MODEL_LEN, None, 256)
    assert serve_memory.kv_read_bytes_per_token(kv, 16384) == 20_480 + 102_400 / 16 == 26_880
    assert serve_memory.kv_read_bytes_per_token(kv, 1024) == kv.kv_bytes_per_token_per_device == 122_880

