"""Every real public artefact in shared/real_data/ (tests/real_data.py), with what the compiler or XProf says
about it as the expected figure: the OOM logs of real TPU jobs (numbers as the compiler printed them, times
1024^k), the Pallas-matmul HloProto (memory exact against XProf's memory_viewer), and XProf's GPU demo capture
(refused: not a TPU). The TPU captures themselves are in test_analyze_real_tpu.py; the LLM HLO texts in the
estimate's tests.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from helpers.real_data import (
    GPU_DEMO_CAPTURE, OOM_LIST_TAIL, OOM_QWEN3_CUT_LIST, OOM_QWEN3_JOB_LOG, OOM_TF1_DETECTION,
    TPU_PALLAS_MATMUL_HLO_PROTO, real_artefact,
)
from test_oom import b, report_of
from helpers.xprof_oracle import memory_viewer

from tpuprof.advice import oom as advice
from tpuprof.analyses import memory
from tpuprof.analyses import oom as analysis

MiB = 1 << 20


def _report(artefact, tmp_path):
    return report_of(real_artefact(artefact, tmp_path))


def _facts(report, **expected):
    for key, value in expected.items():
        assert getattr(report, key) == value, key


def _listed_sizes_agree_with_the_tiling_math(report):
    for entry in report.allocations:
        assert entry.disagreements == [], f"#{entry.index}: {entry.disagreements}"
        if entry.shape and entry.size_bytes is not None:
            assert abs(entry.recomputed_padded_bytes - entry.size_bytes) <= analysis.size_tolerance(entry.size_text)


def test_qwen3_job_log_with_20_allocations_and_multi_kb_labels(tmp_path):
    report = _report(OOM_QWEN3_JOB_LOG, tmp_path)
    _facts(report, kind="compile", memory_space="hbm", used_bytes=b("45.12G"), capacity_bytes=b("31.25G"),
           exceeded_bytes=b("13.87G"), total_bytes=b("45.37G"), reserved_bytes=b("260.00M"),
           program_bytes=b("45.12G"), arguments_bytes=0, output_bytes=0, output_shared_bytes=0,
           global_bytes=b("4.41M"), scoped_bytes=b("272.5K"), hlo_temp_bytes=b("45.11G"),
           unpadded_bytes=b("44.86G"), padded_bytes=b("44.86G"), utilization=100.0,
           fragmentation_bytes=b("254.07M"), framework="jax", training=True, line_number=75, error_code=None)
    assert report.notes == []
    assert [a.index for a in report.allocations] == list(range(1, 21))
    first = report.allocations[0]
    assert (first.size_bytes, first.shape) == (b("2.32G"), "f32[4096,151936]{1,0:T(8,128)}")
    assert first.recomputed_padded_bytes == 4096 * 151936 * 4  # 151936 is a multiple of 128: no padding
    assert first.op_name == "jit(train_step)/forward_backward/jvp()/convert_element_type"
    assert max(len(a.xla_label or "") for a in report.allocations) > 2000  # the multi-KB label lines are read
    _listed_sizes_agree_with_the_tiling_math(report)


def test_qwen3_crash_with_the_list_cut_off_says_so_and_blames_fragmentation(tmp_path):
    report = _report(OOM_QWEN3_CUT_LIST, tmp_path)
    _facts(report, kind="compile", used_bytes=b("35.40G"), capacity_bytes=b("31.25G"), exceeded_bytes=b("4.15G"),
           total_bytes=b("35.65G"), reserved_bytes=b("260.00M"), program_bytes=b("29.68G"),
           arguments_bytes=b("5.72G"), output_bytes=b("5.72G"), output_shared_bytes=b("5.72G"),
           global_bytes=b("336.5K"), scoped_bytes=b("6.25M"), hlo_temp_bytes=b("29.67G"),
           unpadded_bytes=b("19.09G"), padded_bytes=b("19.09G"), utilization=100.0,
           fragmentation_bytes=b("10.58G"), framework="jax")
    assert report.allocations == []
    assert report.notes == ["the log is cut off after 'Largest program allocations': none of the listed "
                            "allocations is in the input"]
    tips = advice.suggest(report, analysis.estimate_batch(report))
    fragmentation = next(t for t in tips if t["kind"] == "fragmentation")
    # 10.58G of gaps is more than the 4.15G missing: packing alone would fit, so it is a blocking fix.
    assert fragmentation["severity"] == "blocking" and "35.7%" in fragmentation["message"]


def test_only_the_tail_of_an_allocation_list(tmp_path):
    report = _report(OOM_LIST_TAIL, tmp_path)
    assert report.kind == "compile" and report.used_bytes is None and report.capacity_bytes is None
    assert report.headline.startswith("(only the allocation list")
    assert [(a.index, a.size_bytes, a.shape) for a in report.allocations] == [
        (16, 512, "s32[32]{0:T(128)}"), (17, 512, "s32[16]{0:T(128)}"), (18, 512, "s32[32]{0:T(128)}"),
        (19, 512, "s32[32]{0:T(128)}"), (20, 512, "s32[32]{0:T(128)}")]
    assert [a.unpadded_bytes for a in report.allocations] == [128, 64, 128, 128, 128]
    assert report.notes == ["the allocation list starts at item 16: items 1-15, the largest, are not in the input"]
    _listed_sizes_agree_with_the_tiling_math(report)


def test_tf1_detection_job_with_arguments_of_unknown_size(tmp_path):
    report = _report(OOM_TF1_DETECTION, tmp_path)
    _facts(report, kind="compile", used_bytes=b("17.60G"), capacity_bytes=b("16.00G"), exceeded_bytes=b("1.60G"),
           total_bytes=b("17.60G"), reserved_bytes=b("528.00M"), program_bytes=b("17.08G"),
           arguments_bytes=None, arguments_unknown=True, output_bytes=None, global_bytes=b("980.0K"),
           scoped_bytes=b("5.41M"), hlo_temp_bytes=b("17.08G"), utilization=92.8,
           fragmentation_bytes=b("53.61M"), framework="tf1")
    first = report.allocations[0]
    assert (first.size_bytes, first.shape, first.unpadded_bytes) == (
        b("512.00M"), "f32[4,128,128,9,18]{4,3,0,2,1:T(8,128)}", b("40.50M"))
    assert first.op_type == "OneHot" and first.expansion == 12.6
    _listed_sizes_agree_with_the_tiling_math(report)
    assert "arguments_unknown" in json.loads(run_cli("oom", str(real_artefact(OOM_TF1_DETECTION, tmp_path)),
                                                     "--json").stdout)


def test_the_bf16_claim_rests_on_the_programs_own_buffers(tmp_path):
    """oom's bf16 advice takes a 16-bit buffer as the program's choice only when it is an argument or a cast the
    program wrote: it counted every listed bf16 buffer, the compiler's own copies included. The Qwen3 job lists 18
    bf16 dot_general fusions (3.38G) and no bf16 argument or cast; its float32 is the logits it cast up itself and
    their loss kernel, kept on purpose: no bf16 advice, on that ground. The TF1 detection job's bf16 buffers (Relu,
    FusedBatchNorm fusions) are neither: the advice stands and no longer leans on them. tensor2tensor's bf16 XLA_Args
    is an argument: a 16-bit program."""
    from test_oom import FIXTURES

    qwen = _report(OOM_QWEN3_JOB_LOG, tmp_path / "qwen")
    sixteen = [a for a in qwen.allocations if a.shape.startswith("bf16")]
    assert len(sixteen) == 18 and advice.program_16bit(qwen.allocations) == []
    f32 = [a for a in qwen.allocations if a.shape.startswith("f32")]
    assert len(f32) == 2 and all(advice._kept_f32(a) for a in f32)  # convert_element_type; the loss's backward
    assert "bf16" not in [s["kind"] for s in advice.suggest(qwen, analysis.estimate_batch(qwen))]

    detection = _report(OOM_TF1_DETECTION, tmp_path / "detection")
    assert advice.program_16bit(detection.allocations) == []
    (fix,) = [s for s in advice.suggest(detection, analysis.estimate_batch(detection)) if s["kind"] == "bf16"]
    assert "the 768.00M of 16-bit listed buffers are no argument or cast of the program's" in fix["evidence"]

    t2t = report_of(FIXTURES / "tensor2tensor_1382_tpu_estimator.txt")
    assert [a.op_name for a in advice.program_16bit(t2t.allocations)] == ["XLA_Args"]


def test_pallas_matmul_hlo_proto_memory_equals_xprof_memory_viewer(tmp_path):
    proto = real_artefact(TPU_PALLAS_MATMUL_HLO_PROTO, tmp_path / "in")
    xprof = memory_viewer(proto, tmp_path / "xprof")
    ours = memory.dump_memory(proto)[0]
    assert ours.peak_heap_bytes == round(xprof["peakHeapMib"] * MiB)
    assert ours.peak_unpadded_heap_bytes == round(xprof["peakUnpaddedHeapMib"] * MiB)
    theirs = sorted(round(o["logicalBufferSizeMib"] * MiB) for o in xprof["maxHeap"])
    mine = sorted(buffer.size_bytes for buffer in ours.buffers if buffer.live_at_peak)
    assert sum(mine) == sum(theirs) == ours.peak_heap_bytes
    # The program: C f32[2048,2048] = A f32[2048,1024] @ B f32[1024,2048], every size a multiple of the tile.
    assert ours.peak_heap_bytes >= 2048 * 2048 * 4


def test_gpu_demo_capture_is_refused_in_one_sentence(tmp_path):
    capture = real_artefact(GPU_DEMO_CAPTURE, tmp_path)
    out = run_cli("analyze", str(capture))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "GPU" in out.stderr and "TPU" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_job_at_one_example_per_chip_is_told_none_fits_not_zero(tmp_path):
    """The Qwen3 job runs one sequence per chip and needs 45.12G of 31.25G: the estimate's batch that fits is 0, which
    the answer printed as 'batch that fits: 0' beside 'the batch cannot shrink further'."""
    log = real_artefact(OOM_QWEN3_JOB_LOG, tmp_path)
    document = json.loads(run_cli("oom", str(log), "--json").stdout)
    assert document["batch_estimate"]["fitting_batch"] == 0 and document["batch_estimate"]["current_batch"] == 1
    text = run_cli("oom", str(log), env={"COLUMNS": "200"}).stdout
    assert "batch that fits: none, not even 1 (now 1; confidence medium)" in text
    assert "batch that fits: 0" not in text


def test_a_tf1_jobs_remat_evidence_does_not_look_for_jax_checkpoint(tmp_path):
    """The TF1 detection job's remat evidence said 'no op name or label shows jax.checkpoint': a TF job never shows
    it, and tf.recompute_grad leaves the op names as they are, so the log cannot tell whether it recomputes."""
    report = _report(OOM_TF1_DETECTION, tmp_path)
    remat = next(s for s in advice.suggest(report, analysis.estimate_batch(report)) if s["kind"] == "remat")
    assert report.framework == "tf1" and "jax.checkpoint" not in remat["evidence"]
    assert "tf.recompute_grad leaves no mark in the op names, so whether the step rematerialises already is not in " \
           "the log: check before adding it" in remat["evidence"]
