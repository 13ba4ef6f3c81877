"""`tpuprof serve` for DeepSeek's multi-head latent attention (MLA) and GPT-OSS's MXFP4 experts, once refused: each
figure against the engine's rule worked out here from the model's config.json, and the engines' own published
serving configurations (tpu-inference's daily benchmark cases). No compile: these models are sized from their shapes
(the compile path says why)."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import ROOT, run_cli

import tpuprof
from tpuprof import targets as tpu_targets

# tpu-inference's daily benchmark cases at commit b8692ff0 (the snapshot docs/serve.md's vLLM rules come from).
CASES = "https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/.buildkite/" \
        "benchmark/cases/daily/"


def config(name: str) -> dict:
    return json.loads((ROOT / "tpuprof" / "llm_configs" / f"{name}.json").read_text())


def align(value: int, to: int) -> int:
    return -(-value // to) * to


def latent(c: dict) -> int:
    """kv_lora_rank and the RoPE key, each padded to 128 (tpu-inference kv_cache_manager.get_kv_cache_spec;
    sglang-jax MLATokenToKVPool)."""
    return align(c["kv_lora_rank"], 128) + align(c["qk_rope_head_dim"], 128)


def mla_attention(c: dict) -> tuple[int, int]:
    """(parameters a TP split leaves whole, parameters split by heads) of one MLA layer's attention."""
    d, h = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, rank = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    whole = d * (rank + rope) + rank  # kv_a_proj_with_mqa and its norm
    q = d * h * (nope + rope)
    if c.get("q_lora_rank"):
        whole += d * c["q_lora_rank"] + c["q_lora_rank"]
        q = c["q_lora_rank"] * h * (nope + rope)
    return whole, q + rank * h * (nope + v) + h * v * d


def deepseek_weights(c: dict, tp: int, attention_whole: bool) -> int:
    """bf16 bytes per device: attention, dense MLPs and shared experts whole on every device (vLLM TPU's attention
    data parallelism) or split over TP (SGLang-JAX); routed experts, embedding and LM head split over TP."""
    d, layers, first = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    whole, heads = mla_attention(c)
    split = 1 if attention_whole else tp
    attention = whole + heads // split + 2 * d  # and the two norms
    dense = 3 * d * c["intermediate_size"] // split
    shared = 3 * d * c["n_shared_experts"] * c["moe_intermediate_size"] // split
    experts = c["n_routed_experts"] * 3 * d * c["moe_intermediate_size"] // tp
    router = d * c["n_routed_experts"]
    params = layers * attention + first * dense + (layers - first) * (shared + experts + router)
    return 2 * (params + 2 * c["vocab_size"] * d // tp + d)


def budget(generation: str, utilization: float, weights: int) -> int:
    return int(tpu_targets.get(generation).compiler_hbm_bytes * utilization) - weights


# --- MLA on vLLM TPU ----------------------------------------------------------------------------------------

def test_vllm_keeps_one_latent_per_token_on_the_device_that_serves_its_request():
    """tpu-inference refuses an MLA model without attention data parallelism: its TP devices each hold whole pages
    of (align(1024, 32) tokens x 640 latent dims) for their own --max-num-seqs requests. The KV-heads rule gave
    deepseek-v2-lite 55,296 B per token per device on v6e-8, from 16 KV heads of head_dim 192."""
    c = config("deepseek-v2-lite")
    (t,) = tpuprof.serve("deepseek-v2-lite", "v6e-4", max_model_len=8192, concurrency=64,
                         compile=False).to_dict()["targets"]
    page = align(1024, 32) * latent(c) * 2  # bf16
    assert latent(c) == 640 and t["kv"]["page_size"] == 1024 and t["kv"]["page_bytes_per_layer"] == page == 1310720
    on_its_device = c["num_hidden_layers"] * latent(c) * 2
    assert t["kv"]["bytes_per_token_on_its_device"] == on_its_device == 34560
    assert t["kv"]["page_shards"] == 4 and t["kv_bytes_per_token_per_device"] == on_its_device // 4
    assert t["weights_bytes_per_device"] == deepseek_weights(c, 4, attention_whole=True)
    pages_per_device = budget("v6e", 0.92, t["weights_bytes_per_device"]) // (c["num_hidden_layers"] * page)
    assert t["kv_cache_pages"] == 4 * pages_per_device and t["kv_cache_tokens"] == 4 * pages_per_device * 1024
    # 64 requests over 4 devices: 16 each, the --max-num-seqs each device schedules, in its own pages.
    assert t["max_num_seqs"] == 16
    assert t["largest_max_model_len"] == pages_per_device * 1024 // 16 // 1024 * 1024
    command = shlex.split(t["command"])
    assert command[:3] == ["NEW_MODEL_DESIGN=1", "vllm", "serve"] and "--max-num-seqs" in command
    assert json.loads(command[command.index("--additional-config") + 1]) == \
        {"sharding": {"sharding_strategy": {"enable_dp_attention": True}}}
    (wide,) = tpuprof.serve("deepseek-v2-lite", "v6e-8", max_model_len=8192, compile=False).to_dict()["targets"]
    assert wide["kv"]["bytes_per_token_on_its_device"] == 34560 and wide["kv_bytes_per_token_per_device"] == 4320


def test_vllm_packs_the_latent_in_rows_of_32_tokens_in_fp8_as_in_bf16():
    """MLA_KV_PACKING_SIZE is 32 whatever the dtype: fp8 halves the page, and a --block-size of 16 still stores 32
    tokens a page."""
    c = config("deepseek-v2-lite")
    layers = c["num_hidden_layers"]
    (fp8,) = tpuprof.serve("deepseek-v2-lite", "v6e-4", max_model_len=8192, kv_cache_dtype="fp8",
                           compile=False).to_dict()["targets"]
    assert fp8["kv"]["page_bytes_per_layer"] == 1024 * latent(c) * 1 and fp8["kv"]["dtype"] == "fp8"
    assert fp8["kv"]["bytes_per_token_on_its_device"] == layers * latent(c)
    (small,) = tpuprof.serve("deepseek-v2-lite", "v6e-4", max_model_len=8192, block_size=16,
                             compile=False).to_dict()["targets"]
    assert small["kv"]["page_bytes_per_layer"] == align(16, 32) * latent(c) * 2 == 40960
    assert small["kv"]["bytes_per_token_on_its_device"] == layers * 40960 // 16 == 2 * 34560


def test_sglang_jax_copies_the_latent_on_every_tp_device():
    """SGLang-JAX's MLATokenToKVPool shards the pages by DP only: each of the TP devices holds every token's latent
    (`_compute_cell_size`), and its attention splits q_b, kv_b and o by heads."""
    c = config("deepseek-v2-lite")
    (t,) = tpuprof.serve("deepseek-v2-lite", "v6e-4", engine="sglang-jax", max_model_len=8192,
                         compile=False).to_dict()["targets"]
    per_token = c["num_hidden_layers"] * latent(c) * 2
    assert t["kv_bytes_per_token_per_device"] == t["kv"]["bytes_per_token_on_its_device"] == per_token
    assert t["kv"]["page_shards"] == 1 and t["kv"]["replicated"] and t["kv"]["page_size"] == 128
    assert t["weights_bytes_per_device"] == deepseek_weights(c, 4, attention_whole=False)
    pages = budget("v6e", 0.92, t["weights_bytes_per_device"]) // (c["num_hidden_layers"] * 128 * latent(c) * 2)
    assert t["kv_cache_tokens"] == pages * 128
    assert "NEW_MODEL_DESIGN" not in t["command"] and "--tp-size 4" in t["command"]


@pytest.mark.parametrize("engine", ["vllm", "sglang-jax"])
def test_mla_weights_on_one_device_are_the_parameters_preflight_counts(engine):
    """At TP 1 nothing is split or copied: the serving weights equal, byte for byte, twice the parameters of the
    training step's own layout (tpuprof.sources.llm, built apart from serve's arithmetic)."""
    result = tpuprof.serve("deepseek-v2-lite", "v6e-1", engine=engine, max_model_len=4096, compile=False)
    (t,) = result.targets
    assert t.tensor_parallel_size == 1
    assert t.capacity.weights_bytes_per_device == 2 * result.answer.options.model.parameter_count()


def test_jetstream_mla_is_refused_in_one_sentence():
    result = run_cli("serve", "--model", "deepseek-v2-lite", "--tpu", "v6e-8", "--engine", "jetstream", "--no-compile")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "--engine jetstream" in result.stderr
    assert "multi-head latent attention" in result.stderr


def test_deepseek_r1_at_tpu_inference_s_own_benchmark_settings_needs_its_experts_in_fp4():
    """tpu-inference's daily DeepSeek-R1 case (deepseek.json) serves the fp8 checkpoint on v7x-8 at TP 8, fp8 KV,
    utilization 0.95, 5,120 tokens, 16 requests, expert parallel, with MOE_REQUANTIZE_WEIGHT_DTYPE=fp4 and
    MOE_REQUANTIZE_BLOCK_SIZE=512 set: in fp8 the weights leave no KV cache, which the problem says, naming those
    settings and what they leave. (DeepSeek-R1 has DeepSeek-V3's config; the built-in carries its fp8
    quantization_config.)"""
    c = config("deepseek-v3")
    assert c["quantization_config"]["quant_method"] == "fp8"
    result = tpuprof.serve("deepseek-v3", "tpu7x-8", tensor_parallel_size=8, kv_cache_dtype="fp8",
                           gpu_memory_utilization=0.95, max_model_len=5120, max_num_seqs=16,
                           enable_expert_parallel=True)  # compile asked: not done, and said why
    document = result.to_dict()
    assert document["compiled"] is False and "multi-head latent attention" in document["not_compiled"]
    (t,) = document["targets"]
    assert not t["fits"] and "leave no KV cache" in t["problems"][0]
    d, f, e = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
    routed = c["num_hidden_layers"] - c["first_k_dense_replace"]
    fp8_experts = routed * e * 3 * d * f // 8
    fp4_experts = routed * e * (3 * d * f // 2 + 4 * (3 * d * f // 512)) // 8  # 7168 and 2048: whole blocks of 512
    fp4_weights = t["weights_bytes_per_device"] - fp8_experts + fp4_experts
    assert budget("tpu7x", 0.95, t["weights_bytes_per_device"]) < 0 < budget("tpu7x", 0.95, fp4_weights)
    assert "MOE_REQUANTIZE_WEIGHT_DTYPE=fp4 MOE_REQUANTIZE_BLOCK_SIZE=512" in t["problems"][0]
    from tpuprof.units import fmt_bytes
    assert f"{fmt_bytes(fp4_weights)} of weights per device" in t["problems"][0]


# --- MXFP4 on vLLM TPU --------------------------------------------------------------------------------------

def gpt_oss_weights(c: dict, tp: int) -> int:
    """Bytes per device: tpu-inference requantizes the MXFP4 experts to float4_e2m1 in blocks of 512 along each
    contracting dimension (2880 padded to 3072), with a float32 scale per block and float32 biases; attention
    (one of the 8 KV heads per device at TP 8), router, norms, embedding and LM head in bf16."""
    d, h, hd, kv, e = (c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["num_key_value_heads"],
                       c["num_local_experts"])
    padded_d, padded_f = align(d, 512), align(c["intermediate_size"], 512)
    assert padded_d == padded_f == 3072
    values = 3 * padded_d * padded_f
    experts = e * (values // 2 + 4 * (values // 512) + 4 * (2 * padded_f + padded_d)) // tp
    attention = 2 * (2 * d * h * hd // tp + 2 * d * max(kv // tp, 1) * hd)
    layer = experts + attention + 2 * (2 * d) + 2 * d * e
    return c["num_hidden_layers"] * layer + 2 * (2 * c["vocab_size"] * d // tp) + 2 * d


@pytest.mark.parametrize("name, tpu, tp", [("gpt-oss-120b", "v6e-8", 8), ("gpt-oss-20b", "v6e-1", 1)])
def test_gpt_oss_experts_are_sized_as_tpu_inference_stores_them(name, tpu, tp):
    """Counted as bf16, gpt-oss-120b had 27.21 GiB per device on v6e-8 and gpt-oss-20b did not fit v6e-1."""
    (t,) = tpuprof.serve(name, tpu, max_model_len=8192, compile=False).to_dict()["targets"]
    assert t["weights_bytes_per_device"] == gpt_oss_weights(config(name), tp)
    assert t["fits"] and "float4_e2m1" in t["weights_how"]
    assert "--quantization" not in t["command"] and "--additional-config" not in t["command"]


# Published launches of gpt-oss-120b on TPU7x with vLLM (no published throughput or KV figures): (slice, TP, max
# model length, utilization, requests, data-parallel copies).
GPT_OSS_LAUNCHES = [
    # tpu-inference's daily case (CASES + "gpt_oss_120b.json", "C1"): v7x-2.
    ("tpu7x-2", 2, 9216, 0.97, 1024, 1),
    # tpu-recipes inference/ironwood/vLLM/GPT-OSS/README-lustre.md @ 186b468f: a 2x2x1 node, TP 2 x DP 4.
    ("tpu7x-8", 2, 9216, 0.86, 2048, 4),
]


@pytest.mark.parametrize("tpu, tp, length, utilization, requests, copies", GPT_OSS_LAUNCHES)
def test_gpt_oss_serves_at_its_published_launch_settings(tpu, tp, length, utilization, requests, copies):
    """Both run with fp8 KV; with the compile asked for, the answer is the shapes' and says why."""
    result = tpuprof.serve("gpt-oss-120b", tpu, tensor_parallel_size=tp, max_model_len=length, kv_cache_dtype="fp8",
                           gpu_memory_utilization=utilization, max_num_seqs=requests)
    document = result.to_dict()
    assert document["compiled"] is False and "fp4 experts" in document["not_compiled"]
    assert document["workload"]["quantization"] == "mxfp4"
    (t,) = document["targets"]
    assert t["fits"] and t["weights_bytes_per_device"] == gpt_oss_weights(config("gpt-oss-120b"), tp)
    assert t["replicas"] == copies and (f"--data-parallel-size {copies}" in t["command"]) == (copies > 1)
    from test_schemas import validate
    assert validate(document) == "serve"


def test_gpt_oss_on_an_engine_whose_mxfp4_storage_is_not_read_is_refused_in_one_sentence():
    result = run_cli("serve", "--model", "gpt-oss-20b", "--tpu", "v6e-4", "--engine", "sglang-jax", "--no-compile")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "SGLang-JAX has no GPT-OSS model" in result.stderr
