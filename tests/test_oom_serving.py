"""`tpuprof oom` on serving engines' failures: public vLLM-on-TPU logs (tests/fixtures/oom/serving, each with its
source URL on the first line), the forms only servers print (a bare error code behind "(EngineCore pid=...)",
"Attempting to reserve" without its free/reservable clause, a "Used X of Y hbm" quoted alone), and the server
settings read from public start-up logs (tests/fixtures/serving).

Expected numbers are the ones each log prints (sizes times 1024^k, GiB figures times 2^30).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from conftest import run_cli
from tpuprof.advice import oom as advice
from tpuprof.analyses import oom as analysis

ROOT = Path(__file__).resolve().parents[1]
FAILURES = ROOT / "tests" / "fixtures" / "oom" / "serving"
STARTUPS = ROOT / "tests" / "fixtures" / "serving"
UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
GIB = 1 << 30


def b(text: str) -> int:
    return int(round(float(text[:-1]) * UNIT[text[-1]]))


def log_of(path: Path) -> bytes:
    """The log without the fixture's '# source:' line (ours: its words must not decide what the log says)."""
    data = path.read_bytes()
    return b"\n" + data.split(b"\n", 1)[1] if data.startswith(b"# source:") else data


def report_of(data: bytes | str):
    data = data.encode() if isinstance(data, str) else data
    report = analysis.find_in_stream(io.BytesIO(data))
    assert report is not None
    return report


def fixes(report) -> list[dict]:
    return advice.suggest(report, analysis.estimate_batch(report))


def test_every_serving_fixture_names_its_public_source():
    files = sorted(FAILURES.glob("*.txt")) + sorted(STARTUPS.glob("*.txt"))
    assert len(files) >= 10
    for path in files:
        assert path.read_text().startswith("# source: https://"), path.name


# name -> (report fields, serving cause, settings the log shows)
FAILURE_FACTS = {
    "xbill9_gemma4_e2b_v5e1_e0101_reserve": (
        dict(kind="reservation", error_code="E0101", error_name="RuntimeProgramAllocationFailure",
             program_name="jit_structured_decode_fn", requested_bytes=b("384.11M"), free_bytes=b("346.77M"),
             reservable_bytes=b("346.77M"), framework="vllm", training=False),
        "program_load",
        dict(model="google/gemma-4-E2B-it", tpu="v5litepod-1", max_model_len=16384, max_num_batched_tokens=4096,
             gpu_memory_utilization=0.95, kv_cache_tokens=348896, max_concurrency=21.29,
             hbm_limit_bytes=int(round(15.75 * GIB)), kv_budget_bytes=int(round(5.99 * GIB)),
             engine_version="0.26.1rc1.dev125+ga7a204cc6")),
    "tpu_inference_3408_e0101_allocate_tpu7x": (
        dict(kind="runtime_allocation", program_name="jit__forward", requested_bytes=b("1.13G"),
             free_bytes=b("528.72M"), framework="vllm"),
        "program_load",
        dict(tpu="tpu7x-8", tensor_parallel_size=8, gpu_memory_utilization=0.98)),
    "tpu_recipes_151_gpt_oss_tpu7x_reserve": (
        dict(kind="reservation", program_name="jit__multi_slice", requested_bytes=b("6.14G"), free_bytes=None,
             framework="vllm"),
        "program_load",
        dict(gpu_memory_utilization=0.93)),
    "tpu_inference_2458_e1001_code_only": (
        dict(kind="compile", memory_space="vmem", error_code="E1001", error_name="CompileTimeScopedVmemOom",
             kernel="flash_attention.27", framework="vllm"),
        "vmem",
        dict(model="Qwen/Qwen3.5-35B-A3B", tensor_parallel_size=8, block_size=256, max_model_len=8192,
             max_num_batched_tokens=16384, max_num_seqs=256)),
    "tpu_inference_3407_scoped_vmem_tpu6e_tpu7x": (
        dict(kind="compile", memory_space="vmem", used_bytes=b("37.22M"), capacity_bytes=b("32.00M"),
             exceeded_bytes=b("5.22M"), framework="vllm"),
        "vmem", {}),
    "tpu_inference_223_kv_max_model_len_v5e8": (
        dict(kind="kv_budget", memory_space="hbm", required_bytes=16 * GIB, capacity_bytes=int(round(0.71 * GIB)),
             framework="vllm", training=False),
        "kv_budget",
        dict(tpu="v5e-8", max_model_len=131072)),
}


@pytest.mark.parametrize("name", sorted(FAILURE_FACTS))
def test_public_serving_failures_are_read_as_servers(name):
    fields, cause, settings = FAILURE_FACTS[name]
    report = report_of(log_of(FAILURES / f"{name}.txt"))
    for key, value in fields.items():
        assert getattr(report, key) == value, f"{name}: {key}"
    assert report.serving is not None and report.serving.cause == cause
    for key, value in settings.items():
        assert getattr(report.serving.settings, key) == value, f"{name}: settings.{key}"
    assert not re.match(r"\(\w+ pid=|ERROR \d\d-\d\d", report.headline), report.headline  # engine prefixes go


def test_every_serving_failure_fixture_has_expected_facts():
    assert {p.stem for p in FAILURES.glob("*.txt")} == set(FAILURE_FACTS)


def test_e0101_utilization_is_the_one_the_same_server_started_at():
    """gemma-4-E2B on v5e-1 failed at 0.95 (E0101, 37.34M short) and, per the same run's REPORT.md
    (github.com/xbill9/gemma4-dev, tpu-vllm-v5e1-2b/benchmarks/runs/2026-08-07-gpu-mem-util-v5e1), started at 0.92
    with 321,376 KV tokens. The advice: 0.92 (room for one more program of the failing one's size), 0.94 the most
    for this program alone, and the KV cache it leaves within 0.1% of what the server logged at 0.92."""
    report = report_of(log_of(FAILURES / "xbill9_gemma4_e2b_v5e1_e0101_reserve.txt"))
    first = fixes(report)[0]
    assert first["kind"] == "gpu_memory_utilization" and first["severity"] == "blocking"
    assert first["code"] == "vllm serve google/gemma-4-E2B-it --gpu-memory-utilization 0.92"
    assert "0.94 is the most that makes room for this program alone" in first["message"]
    assert "37.34M short" in first["message"]
    tokens = int(re.search(r"would hold about ([\d,]+) tokens", first["message"]).group(1).replace(",", ""))
    assert abs(tokens - 321376) / 321376 < 0.001
    low, high = first["saving_bytes_range"]
    assert low >= b("37.34M") and high == first["saving_bytes"]  # each step of 0.01 is 161.28M per device


def test_the_serve_command_carries_what_the_log_shows():
    report = report_of(log_of(FAILURES / "xbill9_gemma4_e2b_v5e1_e0101_reserve.txt"))
    assert report.serving.serve_command == (
        "tpuprof serve --model google/gemma-4-E2B-it --tpu v5litepod-1 --max-model-len 16384 "
        "--max-num-batched-tokens 4096 --tensor-parallel-size 1 --gpu-memory-utilization 0.95")
    plan = [f for f in fixes(report) if f["kind"] == "serve_plan"]
    assert plan and plan[0]["code"] == report.serving.serve_command
    report = report_of(log_of(FAILURES / "tpu_inference_2458_e1001_code_only.txt"))
    assert report.serving.serve_command == (
        "tpuprof serve --model Qwen/Qwen3.5-35B-A3B --tpu SLICE --max-model-len 8192 --max-num-seqs 256 "
        "--max-num-batched-tokens 16384 --tensor-parallel-size 8 --block-size 256")
    assert "does not name the TPU slice" in [f for f in fixes(report) if f["kind"] == "serve_plan"][0]["message"]


def test_the_serve_command_takes_the_logs_quantization_in_serves_words():
    """vLLM's --quantization names a checkpoint format (compressed-tensors, awq) or an on-load quantization (fp8,
    tpu_int8); serve takes bf16/fp8/int8 and reads a checkpoint's format from its config.json. Passing
    `--quantization compressed-tensors` through made the suggested command a usage error."""
    import dataclasses
    import shlex

    from tpuprof.analyses import oom_serving

    settings = report_of(log_of(FAILURES / "tpu_inference_3408_e0101_allocate_tpu7x.txt")).serving.settings
    for logged, served in (("compressed-tensors", None), ("awq", None), ("tpu_int8", "int8"), ("fp8", "fp8")):
        command = oom_serving.serve_command(dataclasses.replace(settings, quantization=logged))
        assert ("--quantization" in command) == (served is not None), command
        words = shlex.split(command.replace("--model MODEL", "--model llama3.1-8b"))
        result = run_cli(*words[1:], "--max-model-len", "4096", "--no-compile", "--json")
        assert result.returncode == 0, (command, result.stderr)
        assert json.loads(result.stdout)["targets"][0]["command"] is not None


def test_kv_budget_takes_vllms_own_longest_request():
    report = report_of(log_of(FAILURES / "tpu_inference_223_kv_max_model_len_v5e8.txt"))
    assert report.serving.estimated_max_model_len == 5632
    found = fixes(report)
    assert found[0]["kind"] == "max_model_len" and found[0]["code"].endswith("--max-model-len 5632")
    fp8 = next(f for f in found if f["kind"] == "kv_cache_dtype")
    assert "one KV head per device" in fp8["message"] and fp8["saving_bytes_range"][0] == 0


# Forms reduced to their code, behind vLLM's engine prefix or alone: (line, kind, memory space, code, served)
CODE_ONLY = [
    ("(EngineCore pid=106339) ERROR 06-03 07:41:11 [core.py:1184] jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: "
     "E0101: RuntimeProgramAllocationFailure:", "reservation", "hbm", "E0101", True),
    ("(EngineCore_DP0 pid=927827) jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:",
     "compile", "vmem", "E1001", True),
    ("E0101: RuntimeProgramAllocationFailure:", "reservation", "hbm", "E0101", False),
    ("E1001: CompileTimeScopedVmemOom:", "compile", "vmem", "E1001", False),
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom:", "compile", "hbm", "E1000", False),
    ("(RayWorkerWrapper pid=7, ip=10.0.0.2) E0101: RuntimeProgramAllocationFailure:", "reservation", "hbm", "E0101",
     False),
]


@pytest.mark.parametrize("line,kind,space,code,served", CODE_ONLY, ids=lambda v: str(v)[:30])
def test_an_error_code_with_nothing_after_it_is_recognised(line, kind, space, code, served):
    report = report_of(line + "\n")
    assert (report.kind, report.memory_space, report.error_code) == (kind, space, code)
    assert (report.serving is not None) == served
    assert any("gives no sizes" in note for note in report.notes)
    assert report.headline.startswith(("jax.errors.JaxRuntimeError", code))  # no process or logger prefix
    if served:
        first = fixes(report)[0]
        assert first["kind"] == ("gpu_memory_utilization" if code == "E0101" else "vmem")


def test_reserve_without_its_free_clause_behind_the_engine_prefix():
    line = ("(EngineCore pid=187) ERROR 08-07 23:27:17 [core.py:1349] Error loading program 'jit_step_fn': "
            "Attempting to reserve 2.50G at the bottom of memory.\n")
    report = report_of(line)
    assert report.headline.startswith("Error loading program 'jit_step_fn'")
    assert report.kind == "reservation" and report.requested_bytes == b("2.50G") and report.free_bytes is None
    assert report.serving.cause == "program_load"
    first = fixes(report)[0]
    assert first["kind"] == "gpu_memory_utilization" and "no sizes" not in first["message"]
    # With the clause, and the settings far above it in the log (beyond the 4 KB read around a message).
    head = (FAILURES / "xbill9_gemma4_e2b_v5e1_e0101_reserve.txt").read_text().split("\n")[1:4]
    filler = [f"(EngineCore pid=187) INFO 08-07 23:1{i % 10}:00 [compilation_manager.py:137] Precompile {i}"
              for i in range(3000)]
    tail = [line.rstrip("\n") + " That was not possible. There are 2.10G free, 0B reserved, and 2.10G reservable."]
    report = report_of("\n".join(head + filler + tail) + "\n")
    assert report.serving.settings.model == "google/gemma-4-E2B-it"
    assert report.serving.settings.gpu_memory_utilization == 0.95
    assert fixes(report)[0]["code"].startswith("vllm serve google/gemma-4-E2B-it --gpu-memory-utilization 0.")


@pytest.mark.parametrize("text", [
    "## vLLM on v5e-8: Used 17.90G of 15.75G hbm\n",
    "Serving Llama 3.1 70B int8 with vLLM fails, the compiler says Used 20.44G of 15.75G hbm. Any idea?\n",
    "> Note: Used 17.9G of 15.75G hbm\n",
])
def test_a_bare_used_of_hbm_fragment_is_an_out_of_memory(text):
    report = report_of(text)
    assert report.kind == "compile" and report.memory_space == "hbm"
    assert report.used_bytes > report.capacity_bytes == b("15.75G")
    if "vLLM" in text:
        assert report.serving.cause == "compile_hbm"
        assert {f["kind"] for f in fixes(report)} >= {"tensor_parallel", "quantization", "serve_plan"}
        # vLLM TPU refuses --quantization for a bf16 checkpoint's weights unless it is a quantized checkpoint's
        # format: they are quantized as they load by qwix rules in --additional-config.
        (quantize,) = [f for f in fixes(report) if f["kind"] == "quantization"]
        assert "--quantization" not in quantize["code"] and '"weight_qtype": "float8_e4m3fn"' in quantize["code"]
    # A program that fitted prints the same words: not an error.
    assert analysis.find_in_stream(io.BytesIO(b"Used 8.00G of 31.25G hbm\n")) is None


def test_smem_page_table_rule_names_the_settings_that_fit():
    """vLLM #8318's SMEM message with the settings beside it: 256 sequences x 16,384 / 16 pages x 4 B = 1 MiB of
    page table, twice the 512 KiB half of SMEM the kernel may use: 128 sequences, or pages of 32 tokens, fit."""
    text = ("vllm serve meta-llama/Llama-3.1-8B --max-model-len 16384 --max-num-seqs 256 --block-size 16\n"
            + log_of(ROOT / "tests/fixtures/oom/vllm_8318_smem.txt").decode())
    report = report_of(text)
    assert report.serving.cause == "smem"
    first = fixes(report)[0]
    assert first["kind"] == "max_num_seqs" and first["code"].endswith("--max-num-seqs 128")
    assert "= 1.00M" in first["message"] and "--block-size 32" in first["message"]


def test_a_training_job_that_mentions_vllm_elsewhere_is_not_a_server():
    head = "pip install vllm-tpu tpu-inference\n" + "step 1 loss 2.3\n" * 2000
    message = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
               "memory space hbm. Used 19.46G of 15.48G hbm. Exceeded hbm capacity by 3.98G.\n"
               "  File \"train.py\", line 88, in train_step\n")
    report = report_of(head + message)
    assert report.serving is None and report.framework == "jax"
    assert any(f["kind"] != "serve_plan" for f in fixes(report))


# name -> the engine's figures the fixture's log prints
STARTUP_FACTS = {
    "keras_io_gemma3_1b_v5e1_tp1": dict(tpu="v5e-1", tensor_parallel_size=1, max_model_len=512, block_size=32,
                                        max_num_batched_tokens=8192,
                                        kv_cache_tokens=509184, max_concurrency=994.5, concurrency_tokens=512,
                                        hbm_used_bytes=int(round(1.86 * GIB))),
    "xbill9_gemma4_e2b_v6e1_tp1": dict(model="google/gemma-4-E2B-it", tpu="v6e-1", max_model_len=32768,
                                       block_size=64, kv_cache_tokens=1151744, max_concurrency=35.15,
                                       hbm_limit_bytes=int(round(31.24 * GIB)), hbm_cap_bytes=int(round(28.74 * GIB))),
    "xbill9_gemma4_e2b_v5e1_util095": dict(model="google/gemma-4-E2B-it", tpu="v5litepod-1",
                                           gpu_memory_utilization=0.95, kv_cache_tokens=348896, max_concurrency=21.29),
    "tpu_spec_decode_qwen3_4b_v4_tp1": dict(model="Qwen/Qwen3-4B", tpu="v4-8", devices=1, tensor_parallel_size=1,
                                            max_model_len=1024, max_num_seqs=1, max_num_batched_tokens=1024,
                                            block_size=64, engine_version="0.13.0", kv_cache_tokens=146880,
                                            max_concurrency=143.44, hbm_used_bytes=int(round(7.49 * GIB))),
    "tpu_spec_decode_qwen3_8b_v4_tp1": dict(model="Qwen/Qwen3-8B", tpu="v4-8", kv_cache_tokens=81920,
                                            max_concurrency=80.0, kv_budget_bytes=int(round(11.26 * GIB))),
    "tpu_inference_145_v6e4_tp4": dict(tpu="v6e-4", devices=4, tensor_parallel_size=4, kv_cache_tokens=811008,
                                       max_concurrency=198.0, concurrency_tokens=4096),
}


@pytest.mark.parametrize("name", sorted(STARTUP_FACTS))
def test_start_up_logs_give_the_engines_own_figures(name):
    from tpuprof.sources import serving_log  # the reader `tpuprof oom` and `tpuprof serve` share

    settings = serving_log.read(log_of(STARTUPS / f"{name}.txt").decode())
    assert settings.engine == "vllm"
    for key, value in STARTUP_FACTS[name].items():
        assert getattr(settings, key) == value, f"{name}: {key}"
    assert {p.stem for p in STARTUPS.glob("*.txt")} == set(STARTUP_FACTS)


def test_serving_json_follows_the_schema_and_the_table_renders():
    from test_schemas import validate

    path = FAILURES / "xbill9_gemma4_e2b_v5e1_e0101_reserve.txt"
    result = run_cli("oom", str(path), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert validate(document) == "oom"
    assert document["serving"]["cause"] == "program_load"
    assert document["serving"]["settings"]["kv_cache_tokens"] == 348896
    table = run_cli("oom", str(path), env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "KV cache" in table.stdout and "tpuprof serve --model google/gemma-4-E2B-it" in table.stdout
    assert "batch estimate" not in table.stdout


def test_the_quantization_advice_follows_the_code_tpu_inference_runs_the_model_with():
    """qwix rules in --additional-config quantize a bf16 checkpoint only in tpu-inference's own JAX models
    (models/common/model_loader.py), and its fp8 method on vLLM's model code quantizes no bf16 experts: Qwen3-MoE, which
    tpu-inference runs with vLLM's code, is told to serve an fp8 checkpoint, not given rules the engine ignores."""
    from dataclasses import replace

    from tpuprof.advice.oom_serving import _quantize
    from tpuprof.sources import serving_log

    keras = serving_log.read((Path(__file__).parent / "fixtures" / "serving" /
                              "keras_io_gemma3_1b_v5e1_tp1.txt").read_text())
    assert keras.architecture == "KerasHubForCausalLM"  # a JAX model KerasHub registers with tpu-inference
    jax_model = _quantize(keras, "over")
    assert jax_model.code and "--additional-config" in jax_model.code and "(for the models" not in jax_model.message
    moe = _quantize(replace(keras, architecture=None, model="Qwen/Qwen3-30B-A3B"), "over")
    assert not moe.code and "checkpoint stored in fp8" in moe.message and "vLLM's model code" in moe.message
    unknown = _quantize(replace(keras, architecture=None, model="someone/own-model"), "over")
    assert unknown.code and "one it runs with vLLM's model code needs a checkpoint stored in fp8" in unknown.message
