"""`tpuprof serve` on models with sliding-window or chunked layers (GPT-OSS, Gemma 2 and 3, Llama 4): the KV cache as
each engine allocates it. The expected figures are the engines' own rules written out here from the built-in
configs (layer kinds and windows read from the JSON, not from tpuprof's parser), applied to the budget and page
bytes tpuprof reports (both checked against public start-up logs in tests/test_serve.py):

- vLLM TPU runs vLLM's model code for GptOssForCausalLM (_VLLM_PREFERRED_ARCHITECTURES) and for architectures
  outside its JAX registry (Gemma 2, Gemma 3), whose sliding layers get a SlidingWindowSpec; vLLM's hybrid KV cache
  manager (vllm-project/vllm 001cabc1 v1/core/kv_cache_utils.py) cuts the layers into groups of one kind and one size,
  num_blocks = budget // (group size x page bytes), and a request of L tokens takes ceil(L / page) blocks of each
  full-attention group and ceil(min(window - 1 + max_in_flight_tokens, L) / page) + 1 of each sliding one, where
  max_in_flight_tokens is 2 x max_num_batched_tokens under vLLM's default async scheduling (a step scheduled while
  the one before runs: VllmConfig.max_concurrent_batches, vllm/config/vllm.py @ 000fc94b); vLLM 001cabc1 counted
  max_num_batched_tokens once.
- tpu-inference's JAX models (Llama 4) give every layer a FullAttentionSpec: chunked layers cached in full.
- SGLang-JAX (cddbf6f1) splits its tokens into a full pool and an SWA pool of 0.8 as many (set_num_token_hybrid).
- MaxText gives every layer the same per-slot cache.

No public start-up log of these models on TPU with its KV figures was found (GitHub issues and pages searched for
"GPU KV cache size" / "Maximum concurrency" with gpt-oss, gemma-3, gemma-2 on TPU; SGLang-JAX's "Use Sliding window
memory pool" line), so the rules are checked as their code states them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

import tpuprof
from tpuprof.analyses import serve_memory

CONFIGS = ROOT / "tpuprof" / "llm_configs"
GEMMA3_1B_HF = Path(__file__).parent / "fixtures" / "serving" / "gemma-3-1b-it.config.json"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def layer_kinds(data: dict) -> tuple[int, int, int]:
    """(full layers, sliding layers, window) as the model's Hugging Face code decides them."""
    text = data.get("text_config", data)
    layers, window = text["num_hidden_layers"], text["sliding_window"]
    if "layer_types" in text:
        sliding = sum(kind == "sliding_attention" for kind in text["layer_types"])
    elif text["model_type"].startswith("gemma3"):  # Gemma3DecoderLayer: sliding unless (i + 1) % pattern == 0
        sliding = sum(bool((i + 1) % text.get("sliding_window_pattern", 6)) for i in range(layers))
    else:  # Gemma 2: every even layer
        sliding = sum(i % 2 == 0 for i in range(layers))
    return layers - sliding, sliding, window


def vllm_groups(full: int, sliding: int) -> tuple[int, int, int]:
    """(group size, full groups, sliding groups): _get_kv_cache_groups_uniform_page_size."""
    size = min(full, sliding)
    if max(full, sliding) < 1.5 * size:
        size = max(full, sliding)
    return size, cdiv(full, size), cdiv(sliding, size)


def vllm_expected(data: dict, target, batched: int, length: int | None = None) -> dict:
    """vLLM's figures at LENGTH tokens per request (default: the target's max_model_len), BATCHED tokens a step, two
    steps in flight."""
    in_flight = 2 * batched
    full, sliding, window = layer_kinds(data)
    size, full_groups, sliding_groups = vllm_groups(full, sliding)
    page, page_bytes, length = target.kv.page_size, target.kv.page_bytes_per_layer, length or target.max_model_len
    blocks = target.capacity.kv_budget_bytes_per_device // (size * page_bytes)
    per_request = full_groups * cdiv(length, page) + sliding_groups * (cdiv(min(window - 1 + in_flight, length),
                                                                            page) + 1)
    return {"blocks": blocks, "concurrency": blocks / per_request, "tokens": int(blocks / per_request * length),
            "per_token": full_groups * size * page_bytes // page, "all_full_concurrency":
            target.capacity.kv_budget_bytes_per_device // ((full + sliding) * page_bytes) * page / length}


SETTINGS = dict(max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=2048, block_size=64,
                gpu_memory_utilization=0.9, compile=False)


# The gain over every layer in full at 32,768 tokens, pages of 64, 2,048 batched tokens (4,096 in flight): GPT-OSS
# (12 + 12 or 18 + 18 layers, window 128): 2 x 512 / (512 + ceil(4223 / 64) + 1) = 1.77; gemma3-12b (8 full, 40
# sliding in 5 groups of 8, window 1024): 6 x 512 / (512 + 5 x 81) = 3.35; gemma3-27b (10 full, 52 sliding padded to
# 6 groups of 10): 6.2 x 512 / (512 + 6 x 81) = 3.18. (One step in flight, as tpuprof counted before: 1.87, 4.06,
# 3.94.)
@pytest.mark.parametrize("name, tpu, gain", [("gpt-oss-20b", "v6e-1", 1.77), ("gpt-oss-120b", "v6e-8", 1.77),
                                             ("gemma3-12b", "v6e-4", 3.35), ("gemma3-27b", "v6e-8", 3.18)])
def test_vllm_tpu_keeps_the_sliding_layers_to_their_window_as_its_hybrid_allocator_does(name, tpu, gain):
    """tpuprof counted every layer in full: it gave gpt-oss-20b on v6e-1 at 32k about half the requests vLLM's rule
    gives, Gemma 3 a quarter."""
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    (target,) = tpuprof.serve(name, tpu, **SETTINGS).targets
    expected = vllm_expected(data, target, SETTINGS["max_num_batched_tokens"])
    assert target.capacity.max_concurrency == pytest.approx(expected["concurrency"], rel=1e-12)
    assert target.capacity.pages == expected["blocks"]
    assert target.capacity.tokens == expected["tokens"]
    assert target.kv.kv_bytes_per_token_per_device == expected["per_token"]
    assert target.kv.window.kept and "SlidingWindowSpec" in target.kv.window.rule
    assert target.command.endswith(" --async-scheduling")  # the setting the reservation rests on
    # Against every layer cached in full: the gain the window brings at 32k tokens.
    assert target.capacity.max_concurrency / expected["all_full_concurrency"] == pytest.approx(gain, abs=0.005)
    # The longest --max-model-len for the 64 requests asked holds 64 of them; one page more does not (or it is the
    # model's positions).
    longest, page = target.capacity.largest_max_model_len, target.kv.page_size
    assert vllm_expected(data, target, 2048, longest)["concurrency"] >= 64
    assert longest == 131072 or vllm_expected(data, target, 2048, longest + page)["concurrency"] < 64


def test_a_decoding_request_holds_the_window_plus_one_page_of_each_sliding_layer():
    """At 1,280 tokens (1,024 in, 256 out) a decoding gpt-oss request holds ceil(1280 / 64) = 20 pages of the full
    group and ceil(128 / 64) + 1 = 3 of the sliding one (SlidingWindowManager frees the pages behind the window)."""
    data = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    (target,) = tpuprof.serve("gpt-oss-20b", "v6e-1", **SETTINGS).targets
    full, sliding, window = layer_kinds(data)
    assert (full, sliding, window) == (12, 12, 128)
    held = target.capacity.pages // (cdiv(1280, 64) + cdiv(128, 64) + 1)
    # The estimate decodes that many when more are asked and --max-num-seqs allows them.
    (asked,) = tpuprof.serve("gpt-oss-20b", "v6e-1", **dict(SETTINGS, max_num_seqs=2048, block_size=256,
                                                            concurrency=100_000)).targets
    page = asked.kv.page_size  # vLLM raises it for 2,048 requests' page table (get_min_page_size): 512
    assert asked.estimate.concurrency == asked.capacity.pages // (cdiv(1280, page) + cdiv(128, page) + 1) > 0
    assert serve_memory.requests_held(target.kv, target.capacity, 1280, "vllm") == held


def test_gemma3_at_its_window_holds_fewer_requests_on_the_hybrid_allocator_than_in_full():
    """The Keras guide's log ran Gemma 3 1B as KerasHub's JAX model (every layer in full, 994.50x at 512 tokens:
    tests/test_serve.py). Google's checkpoint (Gemma3ForCausalLM) runs on vLLM's model code and its hybrid allocator:
    at max_model_len 512 = its window, with the log's max_num_batched_tokens 8192, each of the 6 sliding groups
    reserves ceil(512 / 32) + 1 = 17 pages, and 22 sliding layers pad to 24: fewer requests, not more."""
    data = json.loads(GEMMA3_1B_HF.read_text())
    (target,) = tpuprof.serve(str(GEMMA3_1B_HF), "v5e-1", max_model_len=512, block_size=32,
                              gpu_memory_utilization=0.92, max_num_batched_tokens=8192, compile=False).targets
    expected = vllm_expected(data, target, 8192)
    assert vllm_groups(*layer_kinds(data)[:2]) == (4, 1, 6)
    assert target.capacity.max_concurrency == pytest.approx(expected["concurrency"], rel=1e-12)
    assert target.capacity.max_concurrency < 0.9 * expected["all_full_concurrency"]


def test_llama4_runs_as_tpu_inferences_jax_model_which_caches_its_chunked_layers_in_full():
    """tpu-inference's JAX Llama 4 gives every layer a FullAttentionSpec (get_kv_cache_spec), so its 36 chunked
    layers (chunks of 8192) take every token: the KV tokens are whole pages of all 48 layers, as before."""
    (target,) = tpuprof.serve("llama4-scout", "v6e-8", **SETTINGS).targets
    window, kv = target.kv.window, target.kv
    assert (window.layers, window.window, window.kind, window.kept) == (36, 8192, "chunked", False)
    assert "FullAttentionSpec" in window.rule and "--async-scheduling" not in target.command
    assert kv.kv_bytes_per_token_per_device == 48 * kv.page_bytes_per_layer // kv.page_size
    pages = target.capacity.kv_budget_bytes_per_device // (48 * kv.page_bytes_per_layer)
    assert target.capacity.tokens == pages * kv.page_size


def test_sglang_jax_splits_gemma2s_tokens_into_a_full_and_a_sliding_pool():
    """SGLang-JAX's cell covers every layer (_compute_cell_size); set_num_token_hybrid turns its tokens T into
    T x 42 / (0.8 x 21 + 21) for the full layers and 0.8 of that for the sliding ones."""
    data = json.loads((CONFIGS / "gemma2-9b.json").read_text())
    (target,) = tpuprof.serve("gemma2-9b", "v6e-4", engine="sglang-jax", max_model_len=8192, compile=False).targets
    full_layers, sliding, window = layer_kinds(data)
    kv, page = target.kv, target.kv.page_size
    cell = 8 // 4 * 256 * 2 * (full_layers + sliding) * 2  # kv heads per device x align128(256) x K,V x layers x bf16
    assert kv.kv_bytes_per_token_per_device == cell
    tokens = target.capacity.kv_budget_bytes_per_device // cell // page * page
    full = int(tokens * 42 / (0.8 * sliding + full_layers))
    full -= full % page
    swa = int(full * 0.8)
    swa -= swa % page
    assert target.capacity.tokens == full and target.capacity.max_concurrency == pytest.approx(
        min(full / 8192, swa / window))
    assert target.capacity.window_tokens == swa


def test_sglang_jax_has_no_gemma3_model_and_jetstream_caches_every_layer():
    result = run_cli("serve", "--model", "gemma3-12b", "--tpu", "v6e-4", "--engine", "sglang-jax", "--no-compile")
    assert result.returncode == 2 and "SGLang-JAX has no Gemma 3 model" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    (target,) = tpuprof.serve("gemma3-12b", "v6e-4", engine="jetstream", max_model_len=8192, compile=False).targets
    assert not target.kv.window.kept and "MaxText" in target.kv.window.rule
    assert target.kv.kv_bytes_per_token_per_device == 8 // 4 * 256 * 2 * 48 * 2


def test_the_document_states_the_window_rule_and_follows_its_schema():
    from test_schemas import validate

    document = tpuprof.serve("gpt-oss-20b", "v6e-1", **SETTINGS).to_dict()
    assert validate(document) == "serve"
    (target,) = document["targets"]
    window = target["kv"]["window"]
    assert (window["layers"], window["window"], window["kept"], window["group_size"]) == (12, 128, True, 12)
    assert "hybrid KV cache manager" in window["rule"] and "blocks" in target["kv_cache_how"]


def test_the_estimates_caveat_names_the_window_reading_only_where_it_is_not_modelled():
    """Every estimate said "Not modelled: ... sliding-window attention": of Llama 3.1 8B, which has no window (its
    config names no sliding_window), and of GPT-OSS, whose window layers the decode step reads over the 128-token
    window alone (vLLM TPU keeps only the window). It is not modelled where the engine caches the window layers in
    full (tpu-inference's JAX Llama 4): a kernel that skips the pages outside the chunk there."""
    def caveat(model):
        (target,) = tpuprof.serve(model, "v6e-8", max_model_len=16384, compile=False).to_dict()["targets"]
        return target["estimate"]["caveats"][-1]

    assert "window" not in caveat("llama3.1-8b") and "window" not in caveat("gpt-oss-20b")
    assert "8192-token window (the engine caches them in full" in caveat("llama4-scout")
