"""Advice that fits the user's situation: one ranked Suggestion model for every command, the framework and job
found in the input, calls in that framework's API, savings for every fix that frees memory.

Inputs are real: OOM texts from public issues (tests/fixtures/oom, source URL on their first line), the
committed libtpu samples, and a 4-layer transformer train step compiled with libtpu
(tests/fixtures/memory/make_transformer_layers.py builds it; its LAYERS, BATCH, HEADS and SEQ are the ground truth).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import DUMPS, run_cli

from tpuprof.advice import calls
from tpuprof.advice import memory as memory_advice
from tpuprof.advice import oom as oom_advice
from tpuprof.analyses import framework
from tpuprof.analyses import oom as analysis
from tpuprof.models.oom import COMPILE, OomReport
from tpuprof.models.suggestion import Suggestion, rank, rank_across

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "oom"
TRANSFORMER = ROOT / "tests" / "fixtures" / "memory" / "transformer4_bf16_v5p"
G = 1 << 30
M = 1 << 20

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "memory"))
import make_transformer_layers as built  # noqa: E402  (the dump's ground truth: LAYERS, BATCH, HEADS, SEQ)


def report_of(name: str, **kwargs):
    with open(FIXTURES / f"{name}.txt", "rb") as stream:
        report = analysis.find_in_stream(stream, **kwargs)
    assert report is not None, name
    return report


def oom_json(*args) -> dict:
    result = run_cli("oom", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ------------------------------------------------------------------ framework and job

# fixture -> (framework, training) as the log shows them (traceback, error types, op names)
JOBS = {
    "easydel_166_v4_falcon": ("jax", True),  # jit(casual_language_model_train_step)/.../jvp(...)
    "easydel_142_gemma_bf16": ("jax", False),  # pjit(generate)
    "lwm_60_split_headline": ("jax", False),  # self._forward_generate(
    "colabfold_62_alphafold_inference": ("jax", False),  # the prediction step, jit(apply_fn)
    "tensor2tensor_1382_tpu_estimator": ("tf1", True),  # tpu_estimator.py, t2t-trainer, training_loop
    "pytorch_xla_1735_reserve_detailed": ("pytorch_xla", None),  # /job:tpu_worker (XRT)
    "pytorch_xla_8020_runtime_alloc_replica": ("pytorch_xla", None),
    "diffusers_8358_keras_runtime_alloc": ("keras", False),  # keras_nlp ... from_preset
    # vLLM on TPU then ran on PyTorch/XLA; the quoted line says only "Bad StatusOr access" (a URL is no evidence)
    "vllm_8318_smem": ("pytorch_xla", None),
    "tpu_inference_2803_vllm_vmem": ("vllm", False),  # /root/tpu-inference/tpu_inference/runner/...
}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_framework_and_job_of_real_logs(name):
    report = report_of(name)
    assert (report.framework, report.training) == JOBS[name]


def test_urls_are_no_evidence_of_a_framework():
    job = framework.from_text("see https://github.com/pytorch/xla/issues/1 and https://github.com/vllm-project/vllm")
    assert job.framework is None


def test_framework_of_dumps():
    jax_job = framework.from_module("jit_train_step", ["jit(train_step)/transpose(jvp())/dot_general"])
    assert (jax_job.framework, jax_job.training) == ("jax", True)
    from tpuprof.commands import memory

    keras = memory.module_memories(DUMPS / "keras_mlp_v5e", top=0)[0]  # Keras 3 (TF backend) Adam train step
    job = framework.from_module(keras.name, (b.op_name for b in keras.buffers), (b.source_line for b in keras.buffers))
    assert (job.framework, job.training) == ("keras", True)


# ------------------------------------------------------------------ advice in the job's framework

def codes(suggestions) -> str:
    return " ".join(s.get("code", "") for s in suggestions)


def test_pytorch_xla_gets_pytorch_xla_calls_not_jax_ones():
    doc = oom_json(FIXTURES / "pytorch_xla_1735_reserve_detailed.txt")
    live = next(s for s in doc["suggestions"] if s["kind"] == "live_buffers")
    assert live["framework"] == "pytorch_xla" and "xm.mark_step()" in live["code"]
    text = json.dumps(doc["suggestions"])
    assert "donate_argnums" not in text and "jax.live_arrays" not in text


def test_tf1_tpu_estimator_gets_tf1_calls():
    report = report_of("tensor2tensor_1382_tpu_estimator")
    tips = oom_advice.suggest(report, analysis.estimate_batch(report, batch=1024))
    assert all(t.get("framework") in (None, "tf1") for t in tips)
    assert "mixed_precision" not in codes(tips) and "keras" not in codes(tips)
    assert "tf.recompute_grad" in codes(tips) and "TPUEstimator" in codes(tips)
    assert calls.call("bf16", "tf1").count("tf.tpu.bfloat16_scope()") == 1


def test_inference_jobs_get_no_backward_pass_advice():
    for name in ("easydel_142_gemma_bf16", "colabfold_62_alphafold_inference", "lwm_60_split_headline"):
        report = report_of(name)
        kinds = [t["kind"] for t in oom_advice.suggest(report, analysis.estimate_batch(report))]
        assert "remat" not in kinds and "donation" not in kinds, name
    # the same figures as a training job do get it: the job decides, not the numbers
    report = report_of("colabfold_62_alphafold_inference")
    report.training = True
    assert "remat" in [t["kind"] for t in oom_advice.suggest(report, analysis.estimate_batch(report))]


def test_a_log_that_does_not_say_it_trains_a_model_gets_no_training_words():
    # trax #270's paste keeps only the headline: no framework, no training. The same E1000 comes from non-ML
    # programs (Julia/Reactant simulations), so "gradient accumulation" is a condition, not the fix.
    report = report_of("trax_270_reformer")
    assert report.framework is None and report.training is None
    batch = next(t for t in oom_advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "batch_size")
    assert "problem size" in batch["code"] and "a training job keeps" in batch["code"]
    report.training = True
    batch = next(t for t in oom_advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "batch_size")
    assert "problem size" not in batch["code"]


def test_unknown_framework_is_neutral_wording():
    report = report_of("flowpm_27_arguments_unknown")  # a log with no traceback
    report.framework = None
    tips = oom_advice.suggest(report, analysis.estimate_batch(report))
    assert not any(t.get("framework") for t in tips)
    assert not re.search(r"jax\.|torch|keras|tf\.", codes(tips))


# ------------------------------------------------------------------ ranking

def test_rank_puts_what_makes_it_fit_first_then_by_saving():
    fixes = [Suggestion("padding", "3 MiB", saving_bytes=3 * M), Suggestion("remat", "r", saving_bytes=20 * G),
             Suggestion("more_detail", "dump it", severity="info"), Suggestion("bf16", "b", saving_bytes=G),
             Suggestion("batch_size", "b", saving_bytes=40 * G)]
    assert [s.kind for s in rank(fixes, shortfall_bytes=33 * G)] == \
        ["batch_size", "remat", "bf16", "padding", "more_detail"]
    # remat covers a 10G shortfall and comes before the batch only by its saving: both make it fit
    assert [s.kind for s in rank(fixes, shortfall_bytes=10 * G)][:2] == ["batch_size", "remat"]


def test_oom_order_of_fixes_on_real_logs():
    # The one-hot's padding (12.91G) alone covers the 3.98G overshoot and comes first; every fix that frees
    # memory carries a number, so remat and the batch are not left last for lack of one.
    report = report_of("seed_tds_tpu_training_one_hot")
    tips = oom_advice.suggest(report, analysis.estimate_batch(report, batch=128))
    kinds = [t["kind"] for t in tips]
    assert kinds[0] == "padding" and "one-hot" in tips[0]["message"]
    tip = tips[kinds.index("batch_size")]
    assert tip["saving_bytes"] > 0 and tip["severity"] == "blocking"
    # "%fusion.9.remat.1.remat" is XLA's own rematerialisation pass, not the step's: it does not rule remat out
    remat = tips[kinds.index("remat")]
    assert "fusion.9.remat are XLA's own rematerialisation pass" in remat["evidence"]
    sized = [t["saving_bytes"] for t in tips if t.get("saving_bytes")]
    covering = [s for s in sized if s >= report.exceeded_bytes]
    assert sized[:len(covering)] == sorted(covering, reverse=True)
    assert kinds[-1] == "largest_ops"  # context, no saving: last

    # Falcon (33.05G over on a v4): a smaller batch before bf16's 1G. "fusion.1265.remat3" is XLA's memory pass
    # cloning a fusion; the attention scores of every layer are still kept, which jax.checkpoint would not keep.
    report = report_of("easydel_166_v4_falcon")
    tips = oom_advice.suggest(report, analysis.estimate_batch(report))
    kinds = [t["kind"] for t in tips]
    assert "remat" in kinds and kinds.index("batch_size") < kinds.index("bf16")
    assert "fusion.1265.remat3 are XLA's own rematerialisation pass" in tips[kinds.index("remat")]["evidence"]
    attention = tips[kinds.index("attention")]
    assert attention["saving_bytes"] == 2 * G and "4096 x 4096" in attention["message"]
    assert attention["source_line"].endswith("attention_module.py:1059")  # the source line is in the fix


def test_human_oom_output_has_titles_frameworks_and_no_internal_labels():
    result = run_cli("oom", FIXTURES / "easydel_166_v4_falcon.txt")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Fused attention" in out and "JAX: " in out and "framework: JAX, training" in out
    assert not re.search(r"^\d+\. (batch_size|more_detail|remat|bf16):", out, re.M)
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)) or all(lines.count(line) == 1 for line in lines if len(line) > 60)


# ------------------------------------------------------------------ OOM arithmetic

def test_fragmentation_is_a_cause_when_it_exceeds_the_overshoot():
    # The figures of the v6e compile OOM quoted in issue #13: "Used 35.40G of 31.25G hbm. Exceeded hbm
    # capacity by 4.15G", HLO temp with "100.0% utilization" and "35.7% fragmentation (10.58G)".
    temp = int(10.58 * G / 0.357)
    data = int(temp * 0.643)
    report = OomReport(COMPILE, "Ran out of memory in memory space hbm.", memory_space="hbm",
                       used_bytes=int(35.40 * G), capacity_bytes=int(31.25 * G), exceeded_bytes=int(4.15 * G),
                       program_bytes=int(35.40 * G), arguments_bytes=0, hlo_temp_bytes=temp, utilization=100.0,
                       unpadded_bytes=data, padded_bytes=data, fragmentation_bytes=int(10.58 * G), framework="jax")
    analysis.check_totals(report)
    assert report.notes == []  # XLA's utilisation is unpadded / padded: no false "does not match"
    tips = oom_advice.suggest(report, analysis.estimate_batch(report))
    assert tips[0]["kind"] == "fragmentation" and tips[0]["saving_bytes"] == int(10.58 * G)
    assert "more than the" in tips[0]["message"] and tips[0]["severity"] == "blocking"
    # The compiler's fragmentation is exact; what a change frees is at most that: not labelled exact.
    assert tips[0]["confidence"] == "estimated" and "at most" in tips[0]["evidence"]


def test_negligible_fragmentation_stays_silent():
    report = report_of("easydel_166_v4_falcon")  # 0.3% fragmentation (210.89M) of 63.79G
    assert report.fragmentation_bytes and "fragmentation" not in \
        [t["kind"] for t in oom_advice.suggest(report, analysis.estimate_batch(report))]


def test_the_batch_dimension_is_never_a_vocabulary():
    # bf16[256000,3072]: Gemma's embedding table, 256000 is the vocabulary, listed first
    report = report_of("easydel_142_gemma_bf16")
    dim, _ = analysis.shared_dimension(report.allocations)
    assert dim != 256000
    # Falcon's attention scores f32[32,4096,4096]: the leading 32 carries the batch
    report = report_of("easydel_166_v4_falcon")
    assert analysis.shared_dimension(report.allocations)[0] == 32


@pytest.mark.parametrize("name,batch", [("seed_tds_tpu_training_one_hot", 128), ("easydel_166_v4_falcon", 100),
                                        ("tensor2tensor_1382_tpu_estimator", 1024), ("trax_270_reformer", 13),
                                        ("lwm_60_split_headline", 7)])
def test_batch_answers_are_multiples_of_8_at_least_1(name, batch):
    report = report_of(name)
    estimate = analysis.estimate_batch(report, batch=batch)
    fitting = estimate.fitting_batch
    assert fitting is not None and 1 <= fitting <= batch
    assert fitting % 8 == 0 or fitting < 8
    # never more than what the arithmetic allows
    assert fitting <= batch * estimate.scale + 1e-9
    tip = next(t for t in oom_advice.suggest(report, estimate) if t["kind"] == "batch_size")
    assert f"batch of {fitting} (now {batch})" in tip["message"]


def test_batch_of_1_cannot_shrink_further():
    doc = oom_json(FIXTURES / "lwm_60_split_headline.txt", "--batch", "1")
    tip = next(t for t in doc["suggestions"] if t["kind"] == "batch_size")
    assert tip["message"].startswith("The batch cannot shrink further")
    assert "about 0" not in json.dumps(doc) and "batch of 0" not in json.dumps(doc)
    human = run_cli("oom", FIXTURES / "lwm_60_split_headline.txt", "--batch", "1").stdout
    assert "cannot shrink further" in human and "about 0" not in human


def test_gpu_text_is_not_a_tpu_out_of_memory_error():
    result = run_cli("oom", FIXTURES / "not_tpu" / "mesh_transformer_jax_90_gtx1080.txt")
    assert result.returncode == 2 and result.stdout == ""
    assert "not a TPU out-of-memory error" in result.stderr and "GTX 1080" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_requires_is_required_bytes_not_used():
    doc = oom_json(FIXTURES / "jax_7822_early_abort.txt")
    assert doc["required_bytes"] == int(round(3.47 * (1 << 60))) and "used_bytes" not in doc
    assert doc["suggestions"][0]["kind"] == "shape_bug"


def test_scratch_memory_text_without_capacity_has_no_placeholder():
    doc = oom_json(FIXTURES / "pytorch_xla_2628_smem_no_numbers.txt")
    assert "(- here)" not in json.dumps(doc) and "smem is the core's on-chip scratch memory:" in \
        doc["suggestions"][0]["message"]


# ------------------------------------------------------------------ memory advice on a real transformer dump

@pytest.fixture(scope="module")
def transformer():
    from tpuprof.commands import memory

    (module,) = [m for m in memory.module_memories(TRANSFORMER, top=15) if m.buffers]
    return module


def test_attention_scores_kept_per_layer_get_a_fused_kernel_with_the_saving(transformer):
    kinds = [s.kind for s in transformer.suggestions]
    attention = transformer.suggestions[kinds.index("attention")]
    # f32 scores and their bf16 softmax, [batch, heads, seq, seq], for every layer: built into the job
    expected = built.LAYERS * built.BATCH * built.HEADS * built.SEQ * built.SEQ * (4 + 2)
    assert attention.saving_bytes == expected
    assert attention.framework == "jax" and "splash_attention" in attention.code
    assert attention.source_line.endswith("transformer.py:49")


def test_remat_for_activations_kept_across_layers(transformer):
    remat = next(s for s in transformer.suggestions if s.kind == "remat")
    assert f"{built.LAYERS} repeats of one layer" in remat.evidence
    low, high = remat.saving_bytes_range
    assert 0 < low <= remat.saving_bytes <= high < transformer.peak_heap_bytes
    assert "jax.checkpoint" in remat.code


def test_donation_hint_for_a_jax_train_step(transformer):
    donation = next(s for s in transformer.suggestions if s.kind == "donation")
    assert "donate_argnums" in donation.code
    assert donation.saving_bytes == min(transformer.output_bytes, transformer.argument_bytes)


def test_memory_command_shows_source_lines_and_ranked_fixes():
    result = run_cli("memory", TRANSFORMER, "--top", "5")
    assert result.returncode == 0, result.stderr
    assert "transformer.py:49" in result.stdout and "source" in result.stdout
    doc = json.loads(run_cli("memory", TRANSFORMER, "--json").stdout)
    suggestions = doc["modules"][0]["suggestions"]
    savings = [s["saving_bytes"] for s in suggestions if s.get("saving_bytes")]
    assert savings == sorted(savings, reverse=True) and {"attention", "remat", "donation"} <= {s["kind"] for s in suggestions}


def test_padding_advice_in_user_terms_on_the_samples():
    from tpuprof.commands import memory

    conv = memory.module_memories(DUMPS / "conv18_f32_v5e", top=0)[0]  # 18 output channels, NHWC
    padding = next(s for s in conv.suggestions if s.kind == "padding")
    # 16 channels: the bytes at that size (64 MiB for 96 MiB), never 24 (the same bytes for more data)
    assert "18 channels are padded to 24: use 16; frees 32.00 MiB" in padding.message
    assert padding.source_line.endswith("conv18.py:30") and padding.confidence == "estimated"
    # 10 classes: the output layer's f32[512,10] and its gradient, padded 10 -> 16 (libtpu lays them out {0,1})
    onehot = memory.module_memories(DUMPS / "onehot10_v5e", top=0)[0]
    batch = memory_advice.batch_dimension(onehot)
    assert batch == 65536  # the sample's per-chip batch
    classes = memory_advice.class_counts(onehot, batch)
    assert classes == {10}
    texts = [memory_advice.padding_fix(b, batch, classes) for b in onehot.buffers if b.padded_dims]
    # The class count is the task's: described, nothing to change (16 outputs would add classes)
    assert len(texts) == 2 and all("the 10 classes are padded to 16" in t and "no size to change" in t for t in texts)
    assert not any("use 8" in t or "use 16" in t for t in texts)


def test_negligible_padding_is_silent():
    from tpuprof.commands import memory

    module = memory.module_memories(TRANSFORMER, top=0)[0]
    floor = max(memory_advice.MIN_PADDING_BYTES, memory_advice.MIN_PADDING_SHARE * module.peak_heap_bytes)
    for s in module.suggestions:
        if s.kind == "padding":
            assert s.saving_bytes is None or s.saving_bytes >= floor


# ------------------------------------------------------------------ the report over fitting and non-fitting inputs

def test_report_lists_the_fixes_of_what_does_not_fit_first(tmp_path):
    import tpuprof

    fitting = [DUMPS / "conv18_f32_v5e", DUMPS / "transformer_bf16_v6e"]  # 0.8% and 0.3% of HBM
    failing = [FIXTURES / "seed_tds_tpu_training_one_hot.txt", ROOT / "sample_profiles" / "oom" / "libtpu_transformer_v5e.txt"]
    page = tpuprof.report([fitting[0], failing[0], fitting[1], failing[1]], tmp_path / "mix.html")
    html = (tmp_path / "mix.html").read_text()
    section = html[html.index("Memory: what to change"):]
    section = section[:section.index("</ol>")]
    items = re.findall(r"<li>(.*?)</li>", section, re.S)
    inputs = [int(re.search(r"\(input (\d+)\)", item).group(1)) for item in items]
    first_fitting = next(i for i, n in enumerate(inputs) if n in (1, 3))
    assert set(inputs[:first_fitting]) == {2, 4} and not {2, 4} & set(inputs[first_fitting:])
    # the API's suggestions follow the page's order
    import html as html_module

    for suggestion, item in zip(page.suggestions[:5], items):
        assert html_module.escape(suggestion.message[:40], quote=True)[:30] in item


def test_rank_across_inputs():
    failing = ([Suggestion("padding", "p", saving_bytes=5 * M), Suggestion("batch_size", "b", saving_bytes=2 * G)], G)
    fitting = ([Suggestion("bf16", "big", saving_bytes=50 * G)], 0)
    order = [(i, s.kind) for i, s in rank_across([fitting, failing])]
    assert order == [(1, "batch_size"), (1, "padding"), (0, "bf16")]
