"""`tpuprof oom` on real out-of-memory texts: public issues (tests/fixtures/oom, each with its source URL
on the first line) and libtpu's own messages (sample_profiles/oom, produced by compiling for v5e here).

Expected numbers are the ones printed in each message, times 1024^k: the parser must return exactly what
the log says, and the padding recomputed from each shape must agree with the log's own sizes.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuprof.analyses import oom as analysis
from tpuprof.advice import oom as advice
from tpuprof.cli import main
from tpuprof.models.oom import OomAllocation, OomReport
from tpuprof import targets
from tpuprof.sources import oom_log

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "oom"
LIBTPU = ROOT / "sample_profiles" / "oom"
UNIT = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "E": 1 << 60}


def b(text: str) -> int:
    """'19.46G' -> bytes, the way the messages mean it (powers of 1024)."""
    return int(round(float(text[:-1]) * UNIT[text[-1]]))


def report_of(path: Path, **kwargs) -> OomReport:
    """The report of a fixture's log, without the fixture's '# source:' line: that line is ours, and its words
    ("inference", "training", a framework's name) must not decide what the log says."""
    data = path.read_bytes()
    if data.startswith(b"# source:"):
        data = b"\n" + data.split(b"\n", 1)[1]  # an empty first line: the line numbers stay the file's
    report = analysis.find_in_stream(io.BytesIO(data), **kwargs)
    assert report is not None, path.name
    return report


# name -> fields the message states (None: the message must not claim it)
EXPECTED = {
    "seed_tds_tpu_training_one_hot": dict(
        kind="compile", memory_space="hbm", used_bytes=b("19.46G"), capacity_bytes=b("15.48G"),
        exceeded_bytes=b("3.98G"), total_bytes=b("19.98G"), reserved_bytes=b("530.00M"),
        program_bytes=b("19.46G"), arguments_bytes=0, output_bytes=0, global_bytes=b("276.0K"),
        scoped_bytes=b("173.0K"), hlo_temp_bytes=b("19.46G"), unpadded_bytes=b("6.40G"),
        padded_bytes=b("19.32G"), utilization=33.1, fragmentation_bytes=b("147.91M"), framework="tf2"),
    "flowpm_27_arguments_unknown": dict(
        kind="compile", used_bytes=b("41.74G"), capacity_bytes=b("16.00G"), exceeded_bytes=b("25.74G"),
        reserved_bytes=b("528.00M"), program_bytes=b("41.22G"), arguments_bytes=None, arguments_unknown=True,
        output_bytes=None, hlo_temp_bytes=b("41.19G"), unpadded_bytes=None, padded_bytes=None,
        utilization=24.2, fragmentation_bytes=b("293.84M"), global_bytes=b("29.82M")),
    "flax_1733_no_headline": dict(
        kind="compile", memory_space="hbm", used_bytes=None, capacity_bytes=None, total_bytes=b("11.47G"),
        hlo_temp_bytes=b("10.96G"), unpadded_bytes=b("140.25M"), padded_bytes=b("10.96G"), utilization=1.2,
        fragmentation_bytes=0),
    "easydel_142_gemma_bf16": dict(
        kind="compile", used_bytes=b("30.21G"), capacity_bytes=b("15.48G"), exceeded_bytes=b("14.73G"),
        arguments_bytes=b("15.90G"), program_bytes=b("14.31G"), output_bytes=b("1.0K"),
        global_bytes=b("481.0K"), scoped_bytes=b("512.0K"), hlo_temp_bytes=b("14.31G"),
        unpadded_bytes=b("14.25G"), padded_bytes=b("14.25G"), framework="jax"),
    "easydel_166_v4_falcon": dict(
        kind="compile", used_bytes=b("63.80G"), capacity_bytes=b("30.75G"), exceeded_bytes=b("33.05G"),
        reserved_bytes=b("1.25G"), hlo_temp_bytes=b("63.79G"), fragmentation_bytes=b("210.89M")),
    # The breakdown without its headline, the list's heading with nothing under it: no capacity, no used.
    "easydel_95_headless_empty_list": dict(
        kind="compile", memory_space="hbm", used_bytes=None, capacity_bytes=None, exceeded_bytes=None,
        total_bytes=b("9.50G"), reserved_bytes=b("530.00M"), program_bytes=b("8.98G"), arguments_bytes=0,
        output_bytes=0, output_shared_bytes=0, global_bytes=b("241.0K"), scoped_bytes=b("9.56M"),
        hlo_temp_bytes=b("8.97G"), unpadded_bytes=b("8.94G"), padded_bytes=b("8.94G"), utilization=100.0,
        fragmentation_bytes=b("36.60M"), allocations=[]),
    # The blank lines lost in the paste; the list cut inside item 1's shape.
    "easylm_98_llama7b_v4_cut_list": dict(
        kind="compile", memory_space="hbm", used_bytes=b("87.08G"), capacity_bytes=b("30.75G"),
        exceeded_bytes=b("56.33G"), total_bytes=b("88.33G"), reserved_bytes=b("1.25G"), program_bytes=b("87.08G"),
        arguments_bytes=0, output_bytes=0, global_bytes=b("13.02M"), scoped_bytes=b("529.0K"),
        hlo_temp_bytes=b("87.06G"), unpadded_bytes=b("86.24G"), padded_bytes=b("86.24G"), utilization=100.0,
        fragmentation_bytes=b("841.66M"), framework="jax", training=True),
    "lwm_60_split_headline": dict(
        kind="compile", used_bytes=b("21.95G"), capacity_bytes=b("15.48G"), exceeded_bytes=b("6.47G"),
        total_bytes=b("22.47G"), arguments_bytes=0),
    "openxla_error_1000_one_line": dict(
        kind="compile", used_bytes=b("49.34G"), capacity_bytes=b("32.00G"), exceeded_bytes=b("17.34G"),
        total_bytes=b("49.34G"), reserved_bytes=b("3.12M"), program_bytes=None, program_unknown=True,
        arguments_bytes=b("49.34G"), error_code=None),
    # XLA's error code before the message ("E1000: CompileTimeHbmOom:") is kept and named.
    "jax_e1000_code_prefix_gemma4_scan": dict(
        kind="compile", error_code="E1000", error_name="CompileTimeHbmOom", memory_space="hbm",
        used_bytes=b("31.91G"), capacity_bytes=b("31.25G"), exceeded_bytes=b("681.08M"), framework="jax"),
    # More free than requested but less reservable: the bottom of memory, where programs load, is taken.
    "pytorch_forum_136506_reserve_reservable": dict(
        kind="reservation", requested_bytes=b("5.88G"), free_bytes=b("14.74G"), reserved_bytes=0,
        reservable_bytes=b("4.62G"), program_name=None),
    "tensorflow_tpu_598_glog_remat": dict(
        kind="compile", used_bytes=b("18.56G"), capacity_bytes=b("16.00G"), exceeded_bytes=b("2.56G")),
    "tensorflow_tpu_385_efficientnet": dict(
        kind="compile", used_bytes=b("8.38G"), capacity_bytes=b("8.00G"), exceeded_bytes=b("385.25M")),
    "trax_270_reformer": dict(
        kind="compile", used_bytes=b("18.74G"), capacity_bytes=b("8.00G"), exceeded_bytes=b("10.74G")),
    "pytorch_xla_3041_indented": dict(
        kind="compile", total_bytes=b("8.74G"), reserved_bytes=b("18.00M"), program_bytes=b("1.68G"),
        arguments_bytes=b("7.04G"), output_bytes=b("6.0K"), hlo_temp_bytes=b("1.68G"),
        unpadded_bytes=b("1.12G"), padded_bytes=b("1.67G")),
    "pytorch_xla_6674_bf16_transpose": dict(
        kind="compile", program_bytes=b("15.45G"), global_bytes=b("2.36M"), scoped_bytes=b("3.88M"),
        hlo_temp_bytes=b("15.45G"), unpadded_bytes=b("9.40G"), padded_bytes=b("15.44G")),
    "pytorch_xla_7942_vmem_detailed": dict(
        kind="compile", memory_space="vmem", used_bytes=b("29.95M"), capacity_bytes=b("16.00M"),
        exceeded_bytes=b("13.95M"), scoped_bytes=b("29.95M"), framework="pytorch_xla"),
    "pytorch_xla_9524_vmem": dict(
        kind="compile", memory_space="vmem", used_bytes=b("32.42M"), capacity_bytes=b("16.00M"),
        exceeded_bytes=b("16.42M")),
    "ringattention_11_vmem": dict(
        kind="compile", memory_space="vmem", used_bytes=b("59.79M"), capacity_bytes=b("16.00M"),
        exceeded_bytes=b("43.79M"), framework="jax"),
    "vllm_8318_smem": dict(
        kind="compile", memory_space="smem", used_bytes=b("1.00M"), capacity_bytes=b("1.00M"),
        exceeded_bytes=b("1.7K")),
    "pytorch_xla_2628_smem_no_numbers": dict(kind="compile", memory_space="smem", used_bytes=None),
    "openxla_error_1000_vmem_on_stack": dict(
        kind="compile", memory_space="vmem", used_bytes=None, framework="jax",
        kernel="ragged_latency_optimized_all_gather_lhs_contracting_gated_matmul_kernel.18"),
    # The same form in HBM, its size printed as 0xffffffffffffffff (not known): the shape gives it.
    "openxla_oom_debugging_hbm_allocation": dict(
        kind="compile", memory_space="hbm", requested_bytes=107374182400, capacity_bytes=17179869184, kernel=None),
    "openxla_error_1001_vmem_allocation": dict(
        kind="compile", memory_space="vmem", requested_bytes=134217728, capacity_bytes=67108864,
        kernel="ragged_latency_optimized_all_gather_lhs_contracting_gated_matmul_kernel.2"),
    # "Requires X" is the compiler's estimate of what it would need, not memory it used.
    "jax_7822_early_abort": dict(kind="early_abort", required_bytes=b("3.47E"), used_bytes=None,
                                 capacity_bytes=b("14.49G")),
    "openxla_error_1000_early_abort_flag": dict(
        kind="early_abort", required_bytes=b("3.84T"), used_bytes=None, capacity_bytes=b("90.96G")),
    "openxla_error_1000_sparsecore": dict(
        kind="compile", tensorcore_bytes=b("34.82G"), sparsecore_bytes=b("174.10G"),
        used_bytes=b("34.82G") + b("174.10G"), capacity_bytes=b("95.74G")),
    "colabtools_5126_runtime_alloc": dict(
        kind="runtime_allocation", memory_space="hbm", requested_bytes=b("129.50M"), free_bytes=b("78.17M")),
    "diffusers_8358_keras_runtime_alloc": dict(
        kind="runtime_allocation", requested_bytes=b("4.39G"), free_bytes=b("2.30G")),
    "pytorch_xla_8020_runtime_alloc_replica": dict(
        kind="runtime_allocation", requested_bytes=b("196.00M"), free_bytes=b("134.44M"), framework="pytorch_xla"),
    "mesh_transformer_jax_237_failed_to_allocate": dict(
        kind="runtime_allocation", requested_bytes=33554432, free_bytes=None),
    "pytorch_xla_1735_reserve_detailed": dict(
        kind="reservation", requested_bytes=b("3.95G"), free_bytes=b("1.92G"), capacity_bytes=b("8.00G"),
        reserved_bytes=554696704, currently_allocated_bytes=6532939776, arguments_bytes=b("478.07M"),
        output_bytes=b("5.06G"), hlo_temp_bytes=b("3.93G"), unpadded_bytes=b("3.81G"),
        padded_bytes=b("3.92G")),
    "pytorch_xla_4847_reserve_glog": dict(kind="reservation", requested_bytes=b("7.04G"), free_bytes=b("6.90G")),
    "transformers_22328_fsdp_reserve": dict(
        kind="reservation", requested_bytes=b("10.51G"), free_bytes=b("8.97G"), reserved_bytes=0,
        reservable_bytes=b("8.97G"), framework="pytorch_xla"),
    # The headline alone: nothing says how much of the 21.90G scales with the batch.
    "easydel_78_v2_short_form": dict(
        kind="compile", memory_space="hbm", used_bytes=b("21.90G"), capacity_bytes=b("7.48G"),
        exceeded_bytes=b("14.42G"), allocations=[], framework="jax"),
    # Newer grammars and pastes (2024-2026): a headline wrapped inside its sentence, a program load wrapped the
    # same way, one kernel's scoped VMEM limit, the host's breakdown with no headline, TF 2.2's unnumbered list.
    "jax_38988_vmem_headline_wrapped": dict(
        kind="compile", memory_space="vmem", used_bytes=b("65.05M"), capacity_bytes=b("64.00M"),
        exceeded_bytes=b("1.05M"), scoped_limit=False),
    "autoresearch_v271_load_program_wrapped": dict(
        kind="runtime_allocation", memory_space="hbm", requested_bytes=b("2.12G"), free_bytes=b("995.89M"),
        program_name="jit_train_step"),
    "pytorch_xla_6611_scoped_vmem": dict(
        kind="compile", memory_space="vmem", used_bytes=b("31.07M"), capacity_bytes=b("16.00M"),
        exceeded_bytes=b("15.07M"), scoped_limit=True, kernel="reduce-window.1"),
    "torchprime_28_host_requirement": dict(
        kind="compile", memory_space="host", used_bytes=None, capacity_bytes=None, program_bytes=b("145.69G"),
        hlo_temp_bytes=b("145.69G"), unpadded_bytes=b("145.69G"), padded_bytes=b("145.69G"), utilization=100.0,
        fragmentation_bytes=0),
    "tensorflow_38272_vmem_unnumbered": dict(
        kind="compile", memory_space="vmem", used_bytes=None, framework="tf2",
        training=None),  # "_inferencedistributedfunction" is TF's name for any traced function, Keras's fit too
    # A breakdown pasted from inside its "Total hbm usage" block (no headline, no total line).
    "trax_1343_headless_breakdown": dict(
        kind="compile", memory_space="hbm", used_bytes=None, program_bytes=b("97.92G"), arguments_bytes=0,
        output_bytes=0, output_shared_bytes=0, global_bytes=b("260.0K"), hlo_temp_bytes=b("97.92G"),
        unpadded_bytes=b("87.45G"), padded_bytes=b("97.92G"), utilization=89.3, fragmentation_bytes=0,
        headline="Program hbm requirement 97.92G:"),
    # The error quoted inside a sentence of an issue comment about serving Llama 3.1 405B with vLLM.
    "gke_samples_1467_vllm_in_prose": dict(
        kind="compile", memory_space="hbm", used_bytes=b("20.44G"), capacity_bytes=b("15.75G"),
        exceeded_bytes=b("4.70G"), framework="vllm", training=False),
    "trax_431_jax_fragmentation": dict(
        kind="runtime_allocation", requested_bytes=b("31.06M"), free_bytes=b("58.64M"),
        largest_free_bytes=b("30.56M"), framework="jax", training=True),
    "pytorch_xla_2569_xla_dist_prefix": dict(
        kind="runtime_allocation", memory_space="hbm", requested_bytes=b("180.59M"), free_bytes=b("142.58M")),
    "openxla_error_0101_reserve": dict(
        kind="reservation", requested_bytes=b("29.49G"), free_bytes=b("147.64M"), reserved_bytes=0,
        reservable_bytes=b("147.64M"), program_name="jit_embedding_pipeline_step_fn"),
    "pytorch_xla_1965_glog_entries": dict(kind="compile", memory_space="hbm"),
    "tensor2tensor_1382_tpu_estimator": dict(
        kind="compile", used_bytes=b("8.83G"), capacity_bytes=b("8.00G"), exceeded_bytes=b("848.88M"),
        arguments_bytes=b("64.32M"), output_bytes=b("64.32M"), output_shared_bytes=b("64.25M"),
        hlo_temp_bytes=b("8.25G"), utilization=100.0, fragmentation_bytes=b("1.01M"), framework="tf1",
        training=True),
    "tpu_inference_2803_vllm_vmem": dict(
        kind="compile", memory_space="vmem", used_bytes=b("76.58M"), capacity_bytes=b("64.00M"),
        exceeded_bytes=b("12.58M"), scoped_bytes=b("76.58M"), framework="vllm", training=False),
    "colabfold_62_alphafold_inference": dict(
        kind="compile", used_bytes=b("9.08G"), capacity_bytes=b("7.48G"), exceeded_bytes=b("1.60G"),
        unpadded_bytes=b("8.65G"), padded_bytes=b("9.06G"), utilization=95.4, framework="jax", training=False),
    "tensorflow_30803_untiled_layouts": dict(kind="compile", memory_space="hbm"),
}

# name -> [(index, size, shape, unpadded, padding, expansion, op_name)] as printed
ALLOCATIONS = {
    "seed_tds_tpu_training_one_hot": [
        (1, "14.00G", "s32[29360128,10]{1,0:T(8,128)}", "1.09G", "12.91G", 12.8, "model/loss/one_hot"),
        (2, "2.62G", "f32[128,256,896,18]{0,3,2,1:T(8,128)}", "1.97G", "672.00M", 1.3, "model/layer_1/Conv2D"),
    ],
    "flowpm_27_arguments_unknown": [
        (1, "32.00G", "s32[8388608,8,4]{2,1,0:T(8,128)}", "1.00G", "31.00G", 32.0, "slicewise_79/cic_update/FloorMod"),
    ],
    "pytorch_xla_3041_indented": [
        (1, "570.00M", "f32[29184,2,2560]{2,1,0:T(2,128)}", "570.00M", None, None, None),
        (2, "570.00M", "f32[29184,1,2560]{2,1,0:T(2,128)}", "285.00M", "285.00M", 2.0, None),
    ],
    "pytorch_xla_6674_bf16_transpose": [
        (1, "4.00G", "bf16[2048,1,2048,128]{0,1,3,2:T(4,128)(2,1)}", "1.00G", "3.00G", 4.0, None),
        (2, "4.00G", "bf16[2048,1,2048,128]{0,1,3,2:T(4,128)(2,1)}", "1.00G", "3.00G", 4.0, None),
    ],
    "pytorch_xla_1965_glog_entries": [
        (3, "6.00G", "u32[12582912,1]{1,0:T(8,128)}", "48.00M", "5.95G", 128.0, None),
    ],
    "easydel_142_gemma_bf16": [
        (1, "1.46G", "bf16[256000,3072]{1,0:T(8,128)(2,1)}", "1.46G", None, None,
         "pjit(generate)/jit(main)/FlaxGemmaForCausalLMModule/model/embed_tokens/convert_element_type"
         "[new_dtype=bfloat16 weak_type=False]"),
        (2, "144.00M", None, None, None, None, None),
    ],
    "tensorflow_30803_untiled_layouts": [
        (10, "64.00M", "f32[32,128,32,64]{3,0,2,1}", "32.00M", "32.00M", 2.0, "tpu_140280287273760/conv2d_32/Conv2D"),
        (11, "64.00M", "f32[32,128,32,64]{3,0,2,1}", "32.00M", "32.00M", 2.0,
         "tpu_140280287273760/conv2d_transpose_3/conv2d_transpose"),
    ],
    # "#allocation25 [shape = 'u8[134217728]{0}', space=vmem, size = 0x8000000, tag = '...']": one listed buffer.
    "openxla_error_1001_vmem_allocation": [(25, "128.00M", "u8[134217728]{0}", None, None, None, None)],
    "openxla_oom_debugging_hbm_allocation": [(7, None, "u8[327680,327680]{1,0:T(8,128)(4,1)}", None, None, None, None)],
    "torchprime_28_host_requirement": [
        (1, "63.00G", "bf16[126,2,8192,16384]{3,2,1,0:T(8,128)(2,1)S(5)}", "63.00G", None, None, None),
        (2, "63.00G", None, None, None, None, None),
    ],
    # Printed without numbers or sizes: each entry's shape is its XLA label's result shape.
    "tensorflow_38272_vmem_unnumbered": [
        (None, None, None, None, None, None, None),  # register allocator spill slots
        (None, None, "f32[4,192,1024]{2,0,1:T(4,128)}", None, None, None, None),
        (None, None, "f32[4,192,1024]{2,0,1:T(4,128)}", None, None, None, None),
    ],
    "pytorch_xla_7942_vmem_detailed": [
        (1, "29.66M", None, None, None, None, None),
        (2, "64.0K", "f32[128,3]{1,0}", "1.5K", None, None, None),
    ],
}


def test_every_fixture_names_its_public_source():
    files = sorted(FIXTURES.glob("*.txt"))
    assert len(files) >= 12
    for path in files:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# source: https://"), path.name
    assert {p.stem for p in files} == set(EXPECTED), "every fixture has expected numbers"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_numbers_are_exactly_what_the_message_says(name):
    report = report_of(FIXTURES / f"{name}.txt")
    for key, value in EXPECTED[name].items():
        assert getattr(report, key) == value, f"{name}: {key}"
    cut = [n for n in report.notes if n.startswith("the allocation list starts at item")]
    empty = [n for n in report.notes if n.startswith("the log is cut off after 'Largest program allocations'")]
    assert [n for n in report.notes if n not in cut + empty] == [], f"{name}: the log's own totals add up"
    assert bool(cut) == (name in LIST_TAILS), f"{name}: a list that starts after item 1 is said to be cut"
    assert bool(empty) == (name in EMPTY_LISTS), f"{name}: a heading with nothing below it is said to be cut"


# Pastes whose "Largest program allocations" heading has nothing below it.
EMPTY_LISTS = {"easydel_95_headless_empty_list"}
# Pastes that keep only the tail of the allocation list (its first item is not 1).
LIST_TAILS = {"pytorch_xla_1965_glog_entries", "tensorflow_30803_untiled_layouts", "tpu_inference_2803_vllm_vmem"}


@pytest.mark.parametrize("name", sorted(ALLOCATIONS))
def test_allocations_are_listed_and_their_padding_recomputed(name):
    report = report_of(FIXTURES / f"{name}.txt")
    got = [(a.index, a.size_bytes, a.shape, a.unpadded_bytes, a.padding_bytes, a.expansion, a.op_name)
           for a in report.allocations]
    want = [(i, b(s) if s else None, shape, b(u) if u else None, b(p) if p else None, x, op)
            for i, s, shape, u, p, x, op in ALLOCATIONS[name]]
    assert got == want
    for entry in report.allocations:
        assert entry.disagreements == [], f"{name} #{entry.index}: {entry.disagreements}"
        if entry.shape:
            assert entry.recomputed_padded_bytes is not None
        if entry.shape and entry.size_bytes is not None:
            # the tiling math reproduces the compiler's size within the printed precision
            assert abs(entry.recomputed_padded_bytes - entry.size_bytes) <= analysis.size_tolerance(entry.size_text)


def test_seed_one_hot_exactly():
    report = report_of(FIXTURES / "seed_tds_tpu_training_one_hot.txt")
    one_hot = report.allocations[0]
    assert one_hot.recomputed_padded_bytes == 15032385536 == 14 << 30  # 14.00 GiB to the byte
    assert one_hot.recomputed_unpadded_bytes == 29360128 * 10 * 4  # 1.09 GiB
    assert one_hot.padded_dims == [(1, 10, 128)]  # the class dimension, 10 lanes padded to 128
    assert one_hot.op_type == "OneHot"
    estimate = analysis.estimate_batch(report, batch=128)
    tips = advice.suggest(report, estimate)
    assert tips[0]["kind"] == "padding" and "one_hot" in tips[0]["message"]
    assert tips[0]["saving_bytes"] == 15032385536 - 29360128 * 10 * 4
    assert "sparse" in tips[0]["message"] and tips[0]["confidence"] == "exact"
    # temporaries scale; 15.48G of 19.46G fits: 101 examples, rounded down to a multiple of 8
    assert estimate.fixed_bytes == 0 and estimate.scaling_bytes == b("19.46G")
    assert estimate.fitting_batch == 96 and estimate.confidence == "medium"
    batch_tip = next(t for t in tips if t["kind"] == "batch_size")
    # Both make it fit alone (3.98G short); the padding fix frees more and changes nothing else, so it is first.
    assert batch_tip["saving_bytes"] >= b("3.98G") and tips.index(batch_tip) > 0
    assert "A per-chip batch of 96 (now 128) fits" in batch_tip["message"]


def test_untiled_layouts_are_recomputed_with_the_default_tile():
    report = report_of(FIXTURES / "tensorflow_30803_untiled_layouts.txt")
    for entry in report.allocations:
        assert entry.assumed_tiling == "T(8,128)"
        assert entry.recomputed_padded_bytes == 64 << 20 and entry.padded_dims == [(3, 64, 128)]


def test_padding_fix_per_shape_with_the_dimension_to_change():
    report = report_of(FIXTURES / "pytorch_xla_6674_bf16_transpose.txt")
    tips = [t for t in advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "padding"]
    assert len(tips) == 1 and tips[0]["saving_bytes"] == 2 * 3 << 30  # both 4.00G buffers, 3.00G each
    assert "dim 1 is 1, tiled to 4" in tips[0]["evidence"] and "1 more listed buffer" in tips[0]["message"]
    assert "size-1 dimension" in tips[0]["message"] and "squeeze" in tips[0]["message"]
    # 64 channels on the 128 lanes: no smaller size pads less, and 128 channels would add data: no padding fix.
    report = report_of(FIXTURES / "tensorflow_30803_untiled_layouts.txt")
    assert not [t for t in advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "padding"]


def test_disagreement_between_log_and_tiling_is_flagged():
    # The seed's shape with a size the compiler could not have printed for it.
    report = OomReport("compile", "", memory_space="hbm", allocations=[OomAllocation(
        index=1, size_bytes=b("2.00G"), size_text="2.00G", shape="s32[29360128,10]{1,0:T(8,128)}",
        unpadded_bytes=b("1.09G"), unpadded_text="1.09G")])
    analysis.recompute(report)
    (message,) = report.allocations[0].disagreements
    assert "2.00G" in message and "14.00G" in message


def test_cut_shapes_are_reported_not_crashed_on():
    report = OomReport("compile", "", allocations=[OomAllocation(index=2, shape="bf16[3072,24576]{1,0:T(8")])
    analysis.recompute(report)
    assert "could not be read" in report.allocations[0].disagreements[0]


def test_arguments_larger_than_capacity_leave_no_batch_that_fits():
    report = report_of(FIXTURES / "easydel_142_gemma_bf16.txt")
    estimate = analysis.estimate_batch(report, batch=8)
    assert estimate.fixed_bytes == b("30.21G") - b("14.31G") and estimate.scale < 0
    assert "even a batch of 1 does not fit" in estimate.reason
    kinds = [t["kind"] for t in advice.suggest(report, estimate)]
    assert "sharding" in kinds and "batch_size" not in kinds


def test_batch_estimate_confidence_follows_what_the_message_gives():
    # Arguments and temporaries known, both listed buffers share the 29184 dimension: high.
    report = report_of(FIXTURES / "pytorch_xla_3041_indented.txt")
    estimate = analysis.estimate_batch(report, batch=29184, capacity=targets.get("v2").compiler_hbm_bytes)
    assert estimate.confidence == "high" and estimate.batch_dim == 29184
    assert estimate.fixed_bytes == b("7.04G") and estimate.scaling_bytes == b("1.68G")
    fits = int(29184 * (targets.get("v2").compiler_hbm_bytes - b("7.04G")) / b("1.68G"))
    assert estimate.fitting_batch == fits - fits % 8
    # No word of the arguments: the same arithmetic, but low.
    report = report_of(FIXTURES / "pytorch_xla_6674_bf16_transpose.txt")
    estimate = analysis.estimate_batch(report, capacity=targets.get("v4").compiler_hbm_bytes)
    assert estimate.confidence == "low" and "arguments' size" in estimate.reason
    # Run-time and scratch-memory failures: no estimate at all.
    for name in ("colabtools_5126_runtime_alloc", "pytorch_xla_9524_vmem"):
        assert analysis.estimate_batch(report_of(FIXTURES / f"{name}.txt"), batch=8).scale is None


def test_a_batch_estimated_from_the_total_alone_is_not_called_enough():
    # EasyDeL #78: "Used 21.90G of 7.48G hbm" and nothing else (1.1B parameters on a v2 core; the maintainer's fix
    # was a larger TPU). Assuming all 21.90G scales with the batch makes the batch's saving the shortfall by
    # construction: no figure to rank it by or call it enough with.
    report = report_of(FIXTURES / "easydel_78_v2_short_form.txt")
    estimate = analysis.estimate_batch(report)
    assert estimate.confidence == "low" and estimate.fixed_bytes is None
    batch = next(s for s in advice.suggest(report, estimate) if s["kind"] == "batch_size")
    assert batch["severity"] != "blocking" and "saving_bytes" not in batch
    assert "frees at most 14.42G" in batch["message"] and "does not say how much" in batch["message"]
    # Where the log gives what does not scale (arguments, temporaries), the arithmetic is the log's: enough.
    report = report_of(FIXTURES / "easylm_98_llama7b_v4_cut_list.txt")
    batch = next(s for s in advice.suggest(report, analysis.estimate_batch(report)) if s["kind"] == "batch_size")
    assert batch["severity"] == "blocking" and batch["saving_bytes"] >= report.exceeded_bytes


def test_a_program_that_cannot_be_reserved_shrinks_with_its_batch():
    # transformers #22328: loading the program reserves its code and temporaries (10.51G) where 8.97G is free.
    # The temporaries scale with the batch: a smaller batch is a fix, at most 8.97/10.51 of it fits.
    report = report_of(FIXTURES / "transformers_22328_fsdp_reserve.txt")
    estimate = analysis.estimate_batch(report, batch=8)
    assert estimate.scale == pytest.approx(b("8.97G") / b("10.51G")) and estimate.confidence == "low"
    assert estimate.fitting_batch == 6 and "not what to shrink" not in estimate.reason
    kinds = [s["kind"] for s in advice.suggest(report, estimate)]
    assert kinds[:2] == ["live_buffers", "batch_size"]
    # More free than requested, less reservable: the bottom of memory is taken, the batch is not the cause.
    report = report_of(FIXTURES / "pytorch_forum_136506_reserve_reservable.txt")
    assert analysis.estimate_batch(report, batch=8).scale is None


def test_a_breakdown_without_its_headline_says_only_the_capacity_is_missing():
    # EasyDeL #95: "Total hbm usage >= 9.50G" and the program's breakdown, no "Used X of Y hbm" headline.
    report = report_of(FIXTURES / "easydel_95_headless_empty_list.txt")
    estimate = analysis.estimate_batch(report)
    assert estimate.scale is None
    assert estimate.reason == "the message gives the usage (8.98G) but not the capacity (pass --target)"


def test_targets_capacity_tells_which_fix_makes_it_fit(capsys, monkeypatch):
    # Without the headline the message has no capacity; on a v2 (7.48G) the 8.98G program lacks 1.50G, and the
    # fixes that free that much are said to be enough, as when the message gives the capacity itself.
    path = FIXTURES / "easydel_95_headless_empty_list.txt"
    text = b"\n" + path.read_bytes().split(b"\n", 1)[1]  # without our '# source:' line
    code, out, err = run_cli(["oom", "-", "--json", "--target", "v2"], capsys, stdin=text, monkeypatch=monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    assert "capacity_bytes" not in doc  # the message does not give it: --target's is used, not reported as read
    batch = next(s for s in doc["suggestions"] if s["kind"] == "batch_size")
    assert batch["saving_bytes"] == b("8.98G") - targets.get("v2").compiler_hbm_bytes
    assert batch["severity"] == "blocking"
    # The fixes that cover the 1.50G come first, before the ones that cannot make it fit alone.
    assert [s["severity"] for s in doc["suggestions"][:2]] == ["blocking", "blocking"]


def test_the_layer_count_read_from_a_listed_op_name_is_a_floor():
    # EasyLM #98: LLaMA 7B (32 layers); the one listed buffer is layer 4's. The advice must not say the model has 5.
    report = report_of(FIXTURES / "easylm_98_llama7b_v4_cut_list.txt")
    (entry,) = report.allocations
    assert entry.size_bytes == b("4.00G") and entry.shape == "f32[8"
    assert "/transformer/h/4/attention/sub" in entry.op_name
    remat = next(s for s in advice.suggest(report, analysis.estimate_batch(report)) if s["kind"] == "remat")
    assert "at least 5 layers" in remat["evidence"] and "5 layers in the op names" not in remat["evidence"]


def test_short_forms_say_how_to_get_more_detail():
    report = report_of(FIXTURES / "openxla_error_1000_early_abort_flag.txt")
    tips = advice.suggest(report, analysis.estimate_batch(report))
    text = " ".join(t["message"] for t in tips if t["kind"] == "more_detail")
    assert "--xla_tpu_impure_oom_fast_exit_threshold=-1" in text
    assert "--xla_dump_to=" in text and "tpuprof preflight" in text


def test_host_memory_is_the_hosts_not_hbm():
    """libtpu's own words when what `--remat offload` puts on the host exceeds the host budget it gives a device
    (sample_profiles/oom/libtpu_host_offload_v6e.txt: 2,000 layers x 8 sequences of 8,192 tokens x 1.5 KiB per
    token and layer = 187.5 GiB): read as memory space host, explained as the host's (no HBM fixes: padding,
    bf16, remat of HBM temporaries), and the batch that fits from the program's own arithmetic (8 x 128 / 187.5
    = 5.46: 5)."""
    report = report_of(LIBTPU / "libtpu_host_offload_v6e.txt")
    assert report.kind == "compile" and report.memory_space == "host"
    assert report.used_bytes == b("187.50G") == 2000 * 8 * 8192 * 1536
    assert report.capacity_bytes == b("128.00G") == targets.get("v6e").compiler_host_bytes
    tips = advice.suggest(report, analysis.estimate_batch(report, batch=8))
    kinds = [t["kind"] for t in tips]
    assert "host_memory" in kinds and not {"padding", "bf16", "remat", "attention", "sharding"} & set(kinds)
    host = next(t for t in tips if t["kind"] == "host_memory")
    assert "not HBM" in host["message"] and "bf16[2000,8,8192,256]" in host["message"]
    assert next(t for t in tips if t["kind"] == "batch_size")["batch"] == 5


@pytest.mark.parametrize("path", sorted(LIBTPU.glob("*.txt")), ids=lambda p: p.name)
def test_current_libtpu_messages(path):
    """libtpu 0.0.42.1's own words, from compiling an over-sized program for v5e on this machine."""
    header, message = path.read_text().splitlines()[:2]
    report = report_of(path)
    if "HLO temporaries (" not in message:  # another libtpu form: it must still be read
        assert report.headline.endswith(message.strip()[-40:])
        return
    assert report.kind == "compile" and report.memory_space == "hbm"
    available = message.split("available HBM (")[1].split(")")[0]
    assert report.capacity_bytes == b(available)
    if "_v5e" in path.name:
        assert report.capacity_bytes == targets.get("v5e").compiler_hbm_bytes
    temp = message.split("HLO temporaries (")[1].split(")")[0]
    assert report.hlo_temp_bytes == b(temp) and report.used_bytes is None
    estimate = analysis.estimate_batch(report, batch=4096)
    assert estimate.confidence == "low" and 0 < estimate.scale < 1
    assert any(t["kind"] == "more_detail" for t in advice.suggest(report, estimate))


def test_whole_training_log_streamed_across_chunk_boundaries(monkeypatch, tmp_path):
    """One OOM in the middle of ordinary logging; tiny chunks put every boundary inside the message."""
    message = (FIXTURES / "seed_tds_tpu_training_one_hot.txt").read_bytes()
    noise = b"".join(b"I1121 10:00:%02d.000000 123 train.py:42] step %d loss=2.31 (padding: none)\n" % (i % 60, i)
                     for i in range(2000))
    log = tmp_path / "train.log"
    log.write_bytes(noise + message + b"Traceback (most recent call last):\n  File \"t.py\", line 1\n" + noise)
    alone = report_of(FIXTURES / "seed_tds_tpu_training_one_hot.txt").to_json()
    expected_line = 2000 + alone.pop("line_number")
    expected = report_of(log).to_json()
    expected.pop("line_number")
    # The log around it says more about the job (train.py: training); the message's own facts are the same.
    assert {k: v for k, v in expected.items() if k != "training"} == {k: v for k, v in alone.items() if k != "training"}
    for chunk in (7, 4096, oom_log.CHUNK_BYTES):
        monkeypatch.setattr(oom_log, "CHUNK_BYTES", chunk)
        got = report_of(log).to_json()
        assert got.pop("line_number") == expected_line
        assert got == expected


def test_every_repeat_of_a_message_is_counted(tmp_path):
    """Eight workers repeating a run-time failure thousands of times: each is counted once."""
    message = (FIXTURES / "pytorch_xla_8020_runtime_alloc_replica.txt").read_bytes().split(b"\n", 1)[1]
    log = tmp_path / "pod.log"
    log.write_bytes((message + b"step skipped\n" * 7) * 5000)
    report = report_of(log)
    assert report.messages_found == 5000 and report.requested_bytes == b("196.00M")


def test_gzipped_log(tmp_path, capsys):
    import gzip

    log = tmp_path / "train.log.gz"
    log.write_bytes(gzip.compress(b"step 1\n" * 1000 + (FIXTURES / "easydel_166_v4_falcon.txt").read_bytes()))
    code, out, err = run_cli(["oom", str(log), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["capacity_bytes"] == b("30.75G")
    log.write_bytes(log.read_bytes()[:200])  # cut short
    code, out, err = run_cli(["oom", str(log)], capsys)
    assert code == 2 and "gzip" in err and "Traceback" not in err


def test_most_detailed_message_wins_and_all_are_counted(tmp_path):
    short = (FIXTURES / "tensorflow_tpu_598_glog_remat.txt").read_bytes()
    detailed = (FIXTURES / "flowpm_27_arguments_unknown.txt").read_bytes()
    log = tmp_path / "worker.log"
    log.write_bytes(short + b"\n" * 10 + detailed + b"\n" * 10 + short)
    report = report_of(log)
    assert report.messages_found == 3 and report.used_bytes == b("41.74G") and report.allocations


def run_cli(args, capsys, stdin: bytes | None = None, monkeypatch=None):
    if stdin is not None:
        class FakeStdin:
            buffer = io.BytesIO(stdin)

            def isatty(self):
                return False
        monkeypatch.setattr(sys, "stdin", FakeStdin())
    with pytest.raises(SystemExit) as exit_info:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_json_contract(capsys):
    code, out, err = run_cli(["oom", str(FIXTURES / "seed_tds_tpu_training_one_hot.txt"), "--json", "--batch", "128"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out)
    for key in ("kind", "memory_space", "used_bytes", "capacity_bytes", "exceeded_bytes", "hlo_temp_bytes",
                "unpadded_bytes", "padded_bytes", "allocations", "suggestions"):
        assert key in doc
    assert "requested_bytes" not in doc and "free_bytes" not in doc  # the log does not give them
    assert doc["used_bytes"] == b("19.46G") and isinstance(doc["used_bytes"], int)
    first = doc["allocations"][0]
    assert {"size_bytes", "shape", "unpadded_bytes", "padding_bytes", "expansion", "op_name",
            "allocation_type"} <= set(first)
    assert first["padding_bytes"] == b("12.91G")
    assert all({"kind", "message"} <= set(s) for s in doc["suggestions"])


def test_stdin_and_human_output(capsys, monkeypatch):
    text = (FIXTURES / "colabtools_5126_runtime_alloc.txt").read_bytes()
    for args in (["oom", "-"], ["oom", "--"], ["oom"]):  # '-', '--' (a whole log on stdin) and nothing
        code, out, err = run_cli(args, capsys, stdin=text, monkeypatch=monkeypatch)
        assert code == 0, err
        assert "129.50M" in out and "78.17M" in out and "Live buffers" in out
        assert "live_buffers" not in out  # titles for people, not internal labels


@pytest.mark.parametrize("content", [
    b"",
    b"I1121 10:00:00 train.py:42] step 1 loss=2.3\nEpoch 1/10 - 12s - accuracy: 0.91\nTraining complete.\n",
    bytes(range(256)) * 4096,  # binary junk, no newlines worth the name
], ids=["empty", "normal_log", "binary"])
def test_no_oom_is_exit_2_with_one_sentence(content, tmp_path, capsys):
    path = tmp_path / "log.txt"
    path.write_bytes(content)
    code, out, err = run_cli(["oom", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"tpuprof: no TPU out-of-memory error found in {path}."


@pytest.mark.parametrize("artefact, label", [
    ("QWEN3_8B_TRAIN_STEP_V6E_8_HLO", "an HLO text file"),
    ("TPU_PALLAS_MATMUL_HLO_PROTO", "an HloProto"),
], ids=["hlo_text", "hlo_proto"])
def test_an_xla_module_is_named_with_the_command_that_reads_it(artefact, label, tmp_path, capsys, monkeypatch):
    """A compiled module (the public Qwen3-8B step text, a Pallas matmul's HloProto) holds no OOM message: the
    answer says what it is and names `tpuprof memory FILE`, with --json too, not "no out-of-memory error found"."""
    import shlex

    import real_data

    module = real_data.real_artefact(getattr(real_data, artefact), tmp_path)
    expected = (f"tpuprof: {module} is {label} (an XLA module), not a log with an out-of-memory error: "
                f"`tpuprof memory {shlex.quote(str(module))}` shows what it holds in memory.")
    code, out, err = run_cli(["oom", str(module)], capsys)
    assert code == 2 and out == "" and err.strip() == expected, err
    code, out, err = run_cli(["oom", str(module), "--json"], capsys)
    assert code == 2 and err.strip() == expected, err
    assert json.loads(out)["error"] == {"kind": "input", "message": expected.removeprefix("tpuprof: ")}
    if artefact.endswith("_HLO"):
        import gzip

        packed = tmp_path / (module.name + ".gz")  # shared gzipped, as sample_profiles/estimate keeps its texts
        packed.write_bytes(gzip.compress(module.read_bytes()))
        code, out, err = run_cli(["oom", str(packed)], capsys)
        assert code == 2 and err.startswith(f"tpuprof: {packed} is an XLA dump file, gzip-compressed: `gunzip"), err
        code, out, err = run_cli(["oom", "-"], capsys, stdin=module.read_bytes(), monkeypatch=monkeypatch)
        assert code == 2 and out == "" and "stdin holds an HLO text (an XLA module)" in err, err
        assert "`tpuprof memory FILE`" in err


@pytest.mark.parametrize("path", sorted((FIXTURES / "not_tpu").glob("*.txt")), ids=lambda p: p.name)
def test_gpu_out_of_memory_is_not_a_tpu_one(path, capsys):
    assert path.read_text().startswith("# source: https://")
    code, out, err = run_cli(["oom", str(path)], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    # A GPU's out-of-memory words are recognised and refused as such; a GPU allocator dump holds none.
    assert "not a TPU out-of-memory error" in err or "no TPU out-of-memory error found" in err
    if "Failed to allocate" in path.read_text() or "OOM when allocating" in path.read_text():
        assert "not a TPU out-of-memory error" in err


def test_bad_input_is_one_sentence(tmp_path, capsys):
    code, out, err = run_cli(["oom", str(tmp_path / "missing.log")], capsys)
    assert code == 2 and "cannot read" in err and "Traceback" not in err
    code, out, err = run_cli(["oom", str(FIXTURES / "trax_270_reformer.txt"), "--batch", "0"], capsys)
    assert code == 2 and "--batch" in err


def test_oom_imports_neither_tensorflow_nor_jax():
    code = ("import sys; from tpuprof.cli import main\n"
            "try:\n    main(['oom', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'jax', 'jaxlib')]\n"
            "print('HEAVY', heavy, file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "seed_tds_tpu_training_one_hot.txt")],
                            capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in result.stderr, result.stderr[-2000:]
    assert json.loads(result.stdout)["kind"] == "compile"


# A real job: a JAX step compiled for v5e with libtpu, over-sized on purpose, dumping its buffers.
# It logs ordinary steps, then dies of the OOM with its real traceback, as a training script does.
OOM_JOB = r'''
import os, sys, traceback
os.environ.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_ACCELERATOR_TYPE="v5litepod-4",
                  TPU_WORKER_HOSTNAMES="localhost", TPU_SKIP_MDS_QUERY="1", TF_CPP_MIN_LOG_LEVEL="2",
                  XLA_FLAGS=f"--xla_dump_to={sys.argv[1]} --xla_dump_hlo_as_proto --xla_dump_hlo_as_text")
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding

BATCH, FEATURES = int(sys.argv[2]), 4096
device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
sharding = SingleDeviceSharding(device)

def loss(w, x):
    h = jnp.tanh(x @ w)
    return h.sum() + jnp.tanh(h @ w.T).sum()

x = jax.ShapeDtypeStruct((BATCH, FEATURES), jnp.float32, sharding=sharding)
w = jax.ShapeDtypeStruct((FEATURES, FEATURES), jnp.float32, sharding=sharding)
for step in range(50):
    print(f"I1121 10:00:{step:02d}.000000 4242 train.py:17] step {step} loss=2.{step:02d}", flush=True)
try:
    jax.jit(jax.grad(loss)).lower(w, x).compile()
except Exception:
    traceback.print_exc(file=sys.stdout)
    sys.exit(1)
'''
JOB_BATCH = 1 << 20


@pytest.fixture(scope="session")
def oom_job(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed")
    folder = tmp_path_factory.mktemp("oom_job")
    result = subprocess.run([sys.executable, "-c", OOM_JOB, str(folder / "dump"), str(JOB_BATCH)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "RESOURCE_EXHAUSTED" in result.stdout, result.stderr[-3000:]
    log = folder / "train.log"
    log.write_text(result.stdout)
    return log, folder / "dump"


def test_real_job_log_joined_with_its_dump(oom_job, capsys):
    log, dump = oom_job
    message = next(line for line in log.read_text().splitlines() if "RESOURCE_EXHAUSTED" in line)
    code, out, err = run_cli(["oom", str(log), "--dump", str(dump), "--batch", str(JOB_BATCH), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["framework"] == "jax" and doc["line_number"] > 50  # found after the step logging
    assert doc["hlo_temp_bytes"] == b(message.split("HLO temporaries (")[1].split(")")[0])
    assert doc["capacity_bytes"] == b("15.75G")
    x_bytes, w_bytes = JOB_BATCH * 4096 * 4, 4096 * 4096 * 4
    joined = doc["dump"]
    assert joined["argument_bytes"] == x_bytes + w_bytes  # the job's two arguments, to the byte
    assert joined["batch_argument_bytes"] == x_bytes  # x carries the batch, w does not
    largest_temp = next(r for r in joined["buffers"] if r["allocation_type"] == "temp")
    assert largest_temp["shape"].startswith(f"f32[{JOB_BATCH},4096]") and largest_temp["size_bytes"] == x_bytes
    assert "dot_general" in largest_temp["op_name"]
    estimate = doc["batch_estimate"]
    assert estimate["fixed_bytes"] == w_bytes and estimate["scaling_bytes"] == doc["hlo_temp_bytes"] + x_bytes
    fits = int(JOB_BATCH * (doc["capacity_bytes"] - w_bytes) / estimate["scaling_bytes"])
    assert estimate["fitting_batch"] == fits - fits % 8 and estimate["confidence"] == "medium"
    assert not any("--xla_dump_to" in s["message"] for s in doc["suggestions"])  # the dump is already here


def test_listed_shapes_are_matched_to_dump_buffers(oom_job):
    """libtpu 0.0.42.1 prints only the short form, so the listed-allocation join is checked with the
    job's dump and an allocation list built from that dump's own shapes (as older compilers print them)."""
    from tpuprof.analyses import oom_dump as command

    log, dump = oom_job
    report = report_of(log)
    first = command.join_dump(report, dump, None)["buffers"]
    temp = next(r for r in first if r["allocation_type"] == "temp")
    report.allocations = [OomAllocation(index=7, shape=temp["shape"]),
                          OomAllocation(index=8, shape=temp["shape"].split("{")[0] + "{1,0}")]
    rows = command.join_dump(report, dump, None)["buffers"]
    assert [r["index"] for r in rows] == [7, 8]
    assert rows[0]["shape"] == temp["shape"] and rows[0]["size_bytes"] == JOB_BATCH * 4096 * 4
    assert rows[1]["instruction"] != rows[0]["instruction"]  # each dump buffer is matched once


def test_messages_cut_anywhere_never_crash():
    """Pastes are cut at arbitrary points: every prefix of every message parses or is 'not found'."""
    for path in sorted(FIXTURES.glob("*.txt")):
        data = path.read_bytes()
        for cut in range(0, len(data), max(1, len(data) // 40)):
            with io.BytesIO(data[:cut]) as stream:
                report = analysis.find_in_stream(stream)
            if report is not None:
                estimate = analysis.estimate_batch(report, batch=64, capacity=16 << 30)
                advice.suggest(report, estimate)
                report.to_json()


def test_a_log_listing_thousands_of_allocations_shows_the_largest_and_counts_the_rest():
    """The real Falcon message with its two listed allocations repeated to 1,000 entries (a concatenated log):
    the table keeps its first 30 rows and says how many more --json has (rich took seconds over thousands of rows)."""
    text = (FIXTURES / "easydel_166_v4_falcon.txt").read_text()
    head, first = text.split("  1. Size:", 1)
    entry = "  1. Size:" + first.split("  2. Size:")[0]
    long_text = head + entry * 1000
    from conftest import run_cli

    document = json.loads(run_cli("oom", "-", "--json", stdin=long_text, timeout=60).stdout)
    listed = len(document["allocations"])
    assert listed > 500
    table = run_cli("oom", "-", stdin=long_text, timeout=60)
    assert table.returncode == 0, table.stderr
    assert f"... and {listed - 30} more listed allocations (--json has every one)" in table.stdout
    assert len(table.stdout.splitlines()) < 200


@pytest.mark.parametrize("sentence", [
    "Due to fragmentation, the largest contiguous region of free memory is 1.02G.",
    "The largest contiguous region of free memory is 1.02G due to fragmentation.",
])
def test_runtime_fragmentation_figure_is_read_in_both_word_orders(sentence):
    # The grammar of the TPU runtime allocator's message (jax-ml/jax#7913 is titled after it); no public log
    # with both numbers was found, so the text is put together from the message's own words.
    text = ("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.50G. That was not "
            f"possible. There are 3.00G free. {sentence}; (0x0x0_HBM0)")
    report = analysis.parse_message(text)
    assert (report.kind, report.requested_bytes, report.free_bytes, report.largest_free_bytes) == (
        "runtime_allocation", b("1.50G"), b("3.00G"), b("1.02G"))
    live = next(t for t in advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "live_buffers")
    assert "largest contiguous region is 1.02G" in live["message"]


def test_one_hbm_allocation_larger_than_the_memory_is_named_as_such():
    report = report_of(FIXTURES / "openxla_oom_debugging_hbm_allocation.txt")
    (entry,) = report.allocations
    assert entry.size_bytes is None  # 0xffffffffffffffff is -1, not 16 EiB
    assert entry.recomputed_padded_bytes == 327680 * 327680 == report.requested_bytes  # the shape gives the size
    tips = advice.suggest(report, analysis.estimate_batch(report))
    assert tips[0]["kind"] == "shape_bug" and tips[0]["saving_bytes"] == 107374182400 - 17179869184
    assert "xor_convert_fusion" in tips[0]["message"]


# Lines that carry a log header (glog, timestamps, process tags) are left whole: a header split from its line is
# not a wrapped message.
WRAPPED_WIDTHS = (60, 80, 100)
STATED = ("kind", "memory_space", "used_bytes", "capacity_bytes", "exceeded_bytes", "requested_bytes", "free_bytes",
          "reservable_bytes", "required_bytes", "program_name", "error_code", "error_name", "kernel", "hlo_temp_bytes",
          "tensorcore_bytes", "sparsecore_bytes", "largest_free_bytes")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_message_wrapped_by_a_terminal_or_an_editor_keeps_its_facts(name):
    """Pastes wrap long lines anywhere between words (jax#38988 broke "Ran out of memory in" / "memory space
    vmem."): every message, wrapped at 60, 80 and 100 columns, gives what it gives on its own lines."""
    import textwrap

    text = (FIXTURES / f"{name}.txt").read_text().split("\n", 1)[1]
    want = analysis.find_in_stream(io.BytesIO(text.encode()))
    for width in WRAPPED_WIDTHS:
        wrapped = "\n".join(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
                            if len(line) > width and oom_log.clean_line(line) == line else line
                            for line in text.split("\n"))
        got = analysis.find_in_stream(io.BytesIO(wrapped.encode()))
        assert got is not None, f"{name} at {width} columns"
        assert {k: getattr(got, k) for k in STATED} == {k: getattr(want, k) for k in STATED}, f"{name} at {width}"


def test_an_error_code_on_the_line_before_the_message_is_kept():
    """'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom:' ending its line, the message on the next (how the openxla
    error pages and wrapped pastes print it): the code is the message's, not the log before it."""
    text = (FIXTURES / "jax_e1000_code_prefix_gemma4_scan.txt").read_text()
    split = text.replace("E1000: CompileTimeHbmOom: ", "E1000: CompileTimeHbmOom:\n", 1)
    assert split != text
    report = analysis.find_in_stream(io.BytesIO(split.encode()))
    assert (report.error_code, report.error_name) == ("E1000", "CompileTimeHbmOom")
    assert (report.used_bytes, report.capacity_bytes) == (EXPECTED["jax_e1000_code_prefix_gemma4_scan"]["used_bytes"],
                                                          EXPECTED["jax_e1000_code_prefix_gemma4_scan"]["capacity_bytes"])


COMPILE_REPORTS = ROOT / "tests" / "fixtures" / "compile_reports"


def test_a_successful_compiles_memory_report_is_not_an_out_of_memory_error():
    """libtpu's verbose log prints, for a program that fits, the same breakdown an OOM prints (GKE's DWS/Kueue
    tutorial shows one: 'XLA::TPU program HBM usage: 52.5K / 31.25G', 'Total hbm usage >= 260.14M'). It is not
    an error; a real OOM after it in the same log is still found, and only it is counted."""
    report_text = (COMPILE_REPORTS / "gke_ray_kueue_dws_memory_report.txt").read_bytes()
    assert analysis.find_in_stream(io.BytesIO(report_text)) is None
    result = subprocess.run([sys.executable, "-m", "tpuprof", "oom", str(COMPILE_REPORTS / "gke_ray_kueue_dws_memory_report.txt")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().endswith("no TPU out-of-memory error found in "
                                          f"{COMPILE_REPORTS / 'gke_ray_kueue_dws_memory_report.txt'}.")
    real = (FIXTURES / "easydel_166_v4_falcon.txt").read_bytes()
    report = analysis.find_in_stream(io.BytesIO(report_text + b"\n" + real + b"\n" + report_text))
    assert report.used_bytes == EXPECTED["easydel_166_v4_falcon"]["used_bytes"] and report.messages_found == 1


def test_an_error_quoted_in_prose_is_the_headline_from_its_exception_on():
    headline = report_of(FIXTURES / "gke_samples_1467_vllm_in_prose.txt").headline
    assert headline.startswith("RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile"), headline


def test_a_serving_job_is_not_told_to_accumulate_gradients():
    """AlphaFold inference (colabfold#62) and LWM's vision chat (LWM#60) run no backward pass: a smaller batch is
    the fix, gradient accumulation is not."""
    for name in ("colabfold_62_alphafold_inference", "lwm_60_split_headline"):
        report = report_of(FIXTURES / f"{name}.txt")
        assert report.training is False and report.framework == "jax"
        batch = [t for t in advice.suggest(report, analysis.estimate_batch(report)) if t["kind"] == "batch_size"]
        assert batch and "accumulat" not in batch[0]["code"] and "forward pass" in batch[0]["code"], batch


def test_xla_dists_worker_prefix_is_not_part_of_the_headline():
    """PyTorch/XLA's xla_dist prefixes each worker's line with its address and index ('10.128.0.33 [3]')."""
    headline = report_of(FIXTURES / "pytorch_xla_2569_xla_dist_prefix.txt").headline
    assert headline.startswith("Resource exhausted: Attempting to allocate 180.59M"), headline


def test_the_scoped_limit_is_named_and_its_fix_is_the_limit():
    """'Scoped allocation with size 31.07M and limit 16.00M': the 16 MiB is the kernel's scoped limit on a v5e
    (128 MiB of VMEM), so the advice says which limit to raise, to at least the size asked for."""
    report = report_of(FIXTURES / "pytorch_xla_6611_scoped_vmem.txt")
    text = " ".join(s["message"] for s in advice.suggest(report, analysis.estimate_batch(report)))
    assert "scoped limit" in text and "31.07M" in text and "vmem_limit_bytes" in text
    assert "xla_tpu_scoped_vmem_limit_kib" in text


def test_remat_evidence_on_a_list_with_op_names_does_not_say_it_has_none():
    """EasyLM #98 lists an allocation with its op name and no XLA remat label: the evidence said both that no op
    name shows jax.checkpoint and that the log lists no allocation with an op name."""
    report = report_of(FIXTURES / "easylm_98_llama7b_v4_cut_list.txt")
    remat = next(s for s in advice.suggest(report, analysis.estimate_batch(report)) if s["kind"] == "remat")
    assert "no op name or label shows jax.checkpoint" in remat["evidence"]
    assert "lists no allocation with an op name" not in remat["evidence"]


def test_a_share_of_the_batch_under_one_percent_is_not_said_to_be_zero():
    """XLA's error 0101 example reserves 29.49G with 147.64M free: about 0.5% of the batch fits by the arithmetic,
    which the fix printed as 'At most about 0% of the current per-chip batch fits'."""
    report = report_of(FIXTURES / "openxla_error_0101_reserve.txt")
    estimate = analysis.estimate_batch(report)
    assert 0.001 <= estimate.scale < 0.01
    fix = next(s for s in advice.suggest(report, estimate) if s["kind"] == "batch_size")
    assert fix["message"].startswith(f"At most about {estimate.scale:.1%} of the current per-chip batch fits"), fix


def test_tensorflows_arguments_are_not_called_a_framework_op():
    """tensor2tensor #1382 lists a bf16[256,2048,4096] buffer of op XLA_Args: TensorFlow's name for the arguments it
    hands the program. The largest-ops line named it as a framework op ('XLA_Args: 4.00G')."""
    report = report_of(FIXTURES / "tensor2tensor_1382_tpu_estimator.txt")
    ops = next(s for s in advice.suggest(report, analysis.estimate_batch(report)) if s["kind"] == "largest_ops")
    assert ops["message"] == ("Largest framework ops in the list: XLA_Args (the program's arguments: weights, "
                              "inputs): 4.00G."), ops


@pytest.mark.parametrize("generation, unit", [("v5e", "per-chip"), ("tpu7x", "per-device"), ("v3", "per-device")])
def test_the_batch_of_a_log_is_the_devices_where_a_chip_holds_two(generation, unit):
    """The failed program is one device's: with --target TPU7x, v2 or v3 (a TensorCore a device, two a chip) the
    batch the fix names is the device's."""
    from tpuprof.commands import oom

    log = Path(__file__).resolve().parents[1] / "sample_profiles" / "oom" / "libtpu_keras_mlp_v5e.txt"
    _, _, suggestions, _ = oom.explain(str(log), batch=64, target=generation)
    (fix,) = [s for s in suggestions if s["kind"] == "batch_size"]
    assert fix["message"].startswith(f"At most a {unit} batch of 8 (now 64) fits")
