"""`tpuprof memory` on real libtpu dumps, checked against XProf 2.24's memory viewer."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import DUMPS, ROOT, hlo_pb, sample_dump
from helpers.xprof_oracle import memory_viewer

from tpuprof.analyses import memory as analysis
from tpuprof.commands import memory as command

MiB = 1 << 20
SMALL = 16 * 1024  # XProf folds buffers under 16 KiB into one "small" heap object
PROTO_SAMPLES = sorted(p.parent.name for p in DUMPS.glob("*/*.after_optimizations.hlo.pb"))


@pytest.mark.parametrize("name", PROTO_SAMPLES)
def test_peak_and_max_heap_equal_xprof_memory_viewer(name, tmp_path):
    pb = hlo_pb(name)
    xprof = memory_viewer(pb, tmp_path)
    ours = analysis.dump_memory(pb)[0]

    assert ours.peak_heap_bytes == round(xprof["peakHeapMib"] * MiB)
    assert ours.peak_unpadded_heap_bytes == round(xprof["peakUnpaddedHeapMib"] * MiB)
    theirs = sorted(
        (o["logicalBufferId"], round(o["logicalBufferSizeMib"] * MiB), round(o["unpaddedShapeMib"] * MiB))
        for o in xprof["maxHeap"] if o["logicalBufferId"] != -1
    )
    mine = sorted((b.id, b.size_bytes, b.unpadded_bytes) for b in ours.buffers
                  if b.live_at_peak and b.size_bytes >= SMALL)
    assert mine == theirs
    small = sum(round(o["logicalBufferSizeMib"] * MiB) for o in xprof["maxHeap"] if o["logicalBufferId"] == -1)
    assert sum(b.size_bytes for b in ours.buffers if b.live_at_peak and b.size_bytes < SMALL) == small


def test_transformer_peak_includes_hbm_temporaries():
    """The bf16 transformer's activations do not fit in VMEM: the heap trace must be replayed."""
    result = command.module_memories(sample_dump("transformer_bf16_v6e"))[0]
    assert result.target == "v6e" or result.target is None
    indefinite = result.argument_bytes + result.output_bytes
    assert result.peak_heap_bytes > indefinite + 10 * MiB
    assert max(result.heap_timeline) == result.peak_heap_bytes
    assert result.heap_timeline[result.peak_position] == result.peak_heap_bytes


def test_json_contract(cli):
    out = cli("memory", sample_dump("transformer_bf16_v6e"), "--json", "--target", "v6e")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    module = document["modules"][0]
    for key in ("name", "source", "target", "peak_heap_bytes", "peak_unpadded_heap_bytes", "argument_bytes",
                "output_bytes", "temp_bytes", "hbm_capacity_bytes", "buffers", "ops", "suggestions"):
        assert key in module
    assert module["target"] == "v6e" and module["hbm_capacity_bytes"] == round(31.25 * (1 << 30))
    buffer = module["buffers"][0]
    assert set(buffer) >= {"instruction", "shape", "size_bytes", "unpadded_bytes", "padding_bytes", "expansion",
                           "allocation_type", "op_name", "source_line"}
    assert all(isinstance(b["size_bytes"], int) for b in module["buffers"])
    assert buffer["padding_bytes"] == buffer["size_bytes"] - buffer["unpadded_bytes"]
    op = module["ops"][0]
    assert set(op) >= {"op_name", "size_bytes", "unpadded_bytes", "padding_bytes", "buffers"}
    # Ops over the peak add up to the peak.
    if module["ops_scope"] == "peak":
        total = sum(o.size_bytes for o in analysis_ops(sample_dump("transformer_bf16_v6e")))
        assert total == module["peak_heap_bytes"]


def analysis_ops(path):
    return command.module_memories(path, top=0)[0].ops


def test_tables_name_the_framework_ops(cli):
    out = cli("memory", sample_dump("transformer_bf16_v6e"))
    assert out.returncode == 0, out.stderr
    assert "Largest HBM buffers" in out.stdout and "By framework op" in out.stdout
    assert "jit(train_step)" in out.stdout


def test_buffer_assignment_text_agrees_with_the_proto():
    folder = sample_dump("transformer_bf16_v6e")
    text = next(folder.glob("*-buffer-assignment.txt"))
    from_text = command.module_memories(text, top=0)[0]
    from_proto = command.module_memories(hlo_pb("transformer_bf16_v6e"), top=0)[0]
    assert from_text.argument_bytes == from_proto.argument_bytes
    assert from_text.output_bytes == from_proto.output_bytes
    by_name = {b.instruction: b.size_bytes for b in from_proto.buffers}
    for buffer in from_text.buffers[:20]:
        assert by_name[buffer.instruction] == buffer.size_bytes
    # Allocation sizes include fragmentation: never below the simulated peak.
    assert from_text.peak_heap_bytes >= from_proto.peak_heap_bytes


def test_hlo_text_with_tpu_layouts_is_a_labelled_estimate_with_exact_buffer_sizes():
    """Text carries the TPU layouts (sizes exact) but no buffer assignment: the peak is an estimate, and says so."""
    folder = sample_dump("transformer_bf16_v6e")
    text = next(folder.glob("*.after_optimizations.txt"))
    result = command.module_memories(text, top=0)[0]
    exact = command.module_memories(hlo_pb("transformer_bf16_v6e"))[0]
    assert result.estimated and result.method == "hlo_liveness" and result.expected_error_percent == 10
    assert exact.method == "buffer_assignment" and not exact.estimated
    assert result.argument_bytes == exact.argument_bytes and result.output_bytes == exact.output_bytes
    assert abs(result.peak_heap_bytes / exact.peak_heap_bytes - 1) <= 0.10


# ---- bad input: one sentence on stderr, exit code 2 ------------------------------------------

def _assert_clean_failure(out, needle):
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert needle in out.stderr
    # Nothing on stdout, or with --json the error's own document (scripts read it instead of stderr).
    assert out.stdout == "" or json.loads(out.stdout)["error"] == {"kind": "input", "message": out.stderr.strip()[9:]}


def test_truncated_hlo_pb(cli, tmp_path):
    data = hlo_pb("transformer_bf16_v6e").read_bytes()
    bad = tmp_path / "module.after_optimizations.hlo.pb"
    bad.write_bytes(data[: len(data) // 3])
    _assert_clean_failure(cli("memory", bad, "--json"), "not a readable HloProto")


def test_jpeg_renamed_hlo_pb(cli, tmp_path):
    bad = tmp_path / "photo.after_optimizations.hlo.pb"
    shutil.copy(ROOT / "tests" / "fixtures" / "memory" / "photo.jpg", bad)
    _assert_clean_failure(cli("memory", bad), "HloProto")


def test_empty_folder(cli, tmp_path):
    _assert_clean_failure(cli("memory", tmp_path), "is empty")


def test_folder_without_dumps(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    _assert_clean_failure(cli("memory", tmp_path), "holds no XLA dumps")


def test_unknown_dtype_in_hlo_text(cli, tmp_path):
    bad = tmp_path / "broken.txt"
    bad.write_text("HloModule broken\n\nENTRY %main (p: q7[4]) -> q7[4] {\n"
                   "  ROOT %p = q7[4]{0} parameter(0)\n}\n")
    _assert_clean_failure(cli("memory", bad), "unknown element type 'q7'")


def test_missing_path_and_unknown_target(cli, tmp_path):
    _assert_clean_failure(cli("memory", tmp_path / "nope"), "does not exist")
    # An unknown generation is a usage error (the usage line, then the sentence): tests/test_cli.py.
    unknown = cli("memory", sample_dump("int8_matmul_v5e"), "--target", "v9")
    assert unknown.returncode == 2 and "unknown TPU target" in unknown.stderr and "Traceback" not in unknown.stderr


def test_no_tensorflow_or_jax_import(tmp_path):
    """`tpuprof memory` stays light: no TensorFlow or JAX in the process, and none of protobuf's pure-Python message
    code (text_format, well_known_types' calendar and locale come with it), which upb never runs (protos.py)."""
    import subprocess
    import sys

    code = ("import sys; from tpuprof.cli import main\n"
            "try:\n    main(['memory', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('tensorflow', 'jax', 'tensorflow.python', 'google.protobuf.text_format',\n"
            "                     'google.protobuf.internal.decoder') if m in sys.modules]\n"
            "sys.stderr.write('HEAVY=' + ','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code, str(hlo_pb("int8_matmul_v5e"))],
                         capture_output=True, text=True, cwd=ROOT)
    assert "HEAVY=" in out.stderr and out.stderr.strip().endswith("HEAVY="), out.stderr[-500:]


def test_seed_one_hot_is_explained(cli):
    """The TPU training article's one-hot: s32[29360128,10]{1,0:T(8,128)} is 14 GiB padded, 1.09 GiB of data."""
    out = cli("memory", ROOT / "tests" / "fixtures" / "memory" / "seed_onehot_hlo.txt", "--json", "--target", "v3")
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)["modules"][0]
    one_hot = next(b for b in module["buffers"] if b["instruction"] == "one_hot")
    assert one_hot["size_bytes"] == 14 * (1 << 30)
    assert one_hot["unpadded_bytes"] == 29360128 * 10 * 4
    assert one_hot["expansion"] == pytest.approx(12.8)
    assert one_hot["source_line"] == "train.py:42"
    advice = next(s for s in module["suggestions"] if s["kind"] == "one_hot")
    assert "the one-hot of 10 classes is padded 10 -> 128 (12.8x)" in advice["message"]
    assert "sparse" in advice["message"]
    assert advice["saving_bytes"] == 14 * (1 << 30) - 29360128 * 10 * 4
    # Parameter and output live together: the peak is both.
    assert module["peak_heap_bytes"] == one_hot["size_bytes"] + 29360128 * 4


def test_channels_fix_names_the_multiples():
    """A conv activation as libtpu lays it out ({0,3,2,1}: batch minor, 18 channels second-minor)."""
    from tpuprof.advice.memory import padding_fix
    from tpuprof.analyses.memory import fill_shape_details
    from tpuprof.models.memory import Buffer
    from tpuprof.models.shape import parse_shape

    shape = parse_shape("f32[64,32,32,18]{0,3,2,1:T(8,128)}")
    buffer = Buffer(id=1, instruction="convolution.5", opcode="convolution", shape="",
                    size_bytes=shape.padded_bytes(), unpadded_bytes=shape.unpadded_bytes(), allocation_type="temp",
                    op_name="jit(f)/conv_general_dilated")
    fill_shape_details(buffer, shape)
    message = padding_fix(buffer)
    # 16 channels pad to 16: 64x32x32x16 on 128 lanes; 24 would hold more data in the same bytes: not advised
    assert "18 channels are padded to 24: use 16; frees 4.00 MiB" in message
    # the batch on the lanes is not a padding fix (a larger batch adds data): no "batch of 128", no "transpose"
    assert "batch of 128" not in message and "transpose" not in message


def test_tensorflow_hlo_without_tpu_layouts_is_an_estimate(cli):
    folder = sample_dump("tf_hlo_cpu")
    out = cli("memory", folder)
    assert out.returncode == 2 and "--target" in out.stderr
    out = cli("memory", folder, "--target", "v5e", "--json")
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)["modules"][0]
    assert module["estimated"] is True and module["target"] == "v5e"
    # No TPU schedule or layouts: a range, labelled, whose low end is what the program's inputs and outputs need.
    assert module["method"] == "unscheduled_bound" and module["expected_error_percent"] is None
    low, high = module["peak_range_bytes"]
    assert low <= module["peak_heap_bytes"] <= high
    # TF lays NHWC out row-major: the 18 channels become the 128-lane minor dimension in the estimate.
    conv = next(b for b in module["buffers"] if b["shape"].startswith("f32[") and ",18]{3,2,1,0:T(8,128)}" in b["shape"])
    assert conv["size_bytes"] == conv["unpadded_bytes"] * 128 // 18
    assert module["peak_heap_bytes"] >= module["argument_bytes"]


def test_conv_with_18_channels_gets_the_channel_fix_from_a_real_dump(cli):
    """libtpu lays the conv activations out batch-minor ({0,3,2,1}): the 18 channels are second-minor."""
    out = cli("memory", sample_dump("conv18_f32_v5e"), "--json")
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)["modules"][0]
    padding = [s for s in module["suggestions"] if s["kind"] == "padding"]
    assert padding and "18 channels are padded to 24: use 16; frees 32.00 MiB" in padding[0]["message"]
    assert padding[0]["saving_bytes"] >= 1 << 20
    assert "bf16" in {s["kind"] for s in module["suggestions"]}  # an f32 model: bf16 is worth saying


def test_a_bf16_model_is_not_told_to_use_bf16(cli):
    out = cli("memory", sample_dump("transformer_bf16_v6e"), "--json")
    module = json.loads(out.stdout)["modules"][0]
    assert "bf16" not in {s["kind"] for s in module["suggestions"]}


def test_instruction_lookup_without_xla_id_numbering():
    """Older protos do not number instructions (computation id << 32 | n): the lookup must still find them."""
    from tpuprof.sources import hlo_dump

    proto = hlo_dump.read_hlo_proto(hlo_pb("transformer_bf16_v6e"))
    expected = analysis.from_hlo_proto(proto, "numbered")
    for computation in proto.hlo_module.computations:
        computation.id += 1_000_000  # no instruction id points at its computation any more
    renumbered = analysis.from_hlo_proto(proto, "renumbered")
    assert renumbered.peak_heap_bytes == expected.peak_heap_bytes
    assert [(b.id, b.instruction, b.unpadded_bytes) for b in renumbered.buffers] == \
        [(b.id, b.instruction, b.unpadded_bytes) for b in expected.buffers]


def _described(result):
    analysis.describe(result, result.buffers)
    return result, [(b.shape, b.source_line, b.padded_dims, b.tile) for b in result.buffers]


@pytest.mark.parametrize("name", PROTO_SAMPLES)
def test_a_proto_read_without_its_fusion_bodies_gives_the_whole_protos_answer(name):
    """`memory` skips the fusion computations of an HloProto unparsed (most of a large module) and reads a few fields
    of the other instructions: every figure, shape and source line must be the one the whole proto gives."""
    from tpuprof.sources import hlo_dump

    whole = hlo_dump.read_hlo_proto(hlo_pb(name))
    part = hlo_dump.read_buffer_definers(hlo_pb(name))
    fusions = {c.id for c in whole.hlo_module.computations if c.is_fusion_computation}
    assert fusions, "a compiled module has fusion computations"
    assert [c.id for c in part.hlo_module.computations] == \
        [c.id for c in whole.hlo_module.computations if c.id not in fusions]
    assert part.buffer_assignment == whole.buffer_assignment

    assert _described(analysis.from_hlo_proto(part, "x", whole_module=False)) == \
        _described(analysis.from_hlo_proto(whole, "x"))


def test_a_proto_read_in_part_answers_as_the_whole_one_and_is_read_whole_when_the_part_lacks_a_buffer(tmp_path):
    """The part read first holds every computation but the fusion bodies: it serves without XLA's id numbering
    too; a logical buffer defined in a fusion body (no compiler makes one; a damaged proto can) is not in it, so the
    proto is then read whole, with the same answer."""
    from tpuprof.models.hlo_module import MissingInstructions
    from tpuprof.sources import hlo_dump

    proto = hlo_dump.read_hlo_proto(hlo_pb("transformer_bf16_v6e"))
    for computation in proto.hlo_module.computations:
        computation.id += 1_000_000  # no instruction id points at its computation any more
    renumbered = tmp_path / "module_0000.renumbered.after_optimizations.hlo.pb"
    renumbered.write_bytes(proto.SerializeToString())
    part = analysis.from_hlo_proto(hlo_dump.read_buffer_definers(renumbered), "x", whole_module=False)
    assert _described(part) == _described(analysis.from_hlo_proto(proto, "x"))

    fused = next(c for c in proto.hlo_module.computations if c.is_fusion_computation).instructions[0]
    proto.buffer_assignment.logical_buffers[0].defined_at.instruction_id = fused.id
    damaged = tmp_path / "module_0000.damaged.after_optimizations.hlo.pb"
    damaged.write_bytes(proto.SerializeToString())
    with pytest.raises(MissingInstructions):
        analysis.from_hlo_proto(hlo_dump.read_buffer_definers(damaged), "x", whole_module=False)
    expected = analysis.from_hlo_proto(proto, str(damaged))
    assert any(b.instruction == fused.name for b in expected.buffers)
    assert _described(analysis.dump_memory(damaged)[0]) == _described(expected)


def test_compile_turns_a_cpu_module_proto_into_the_real_tpu_figures(cli, tmp_path):
    """--compile recompiles an HLO module with no TPU layouts; the argument bytes must be the compiler's own."""
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp

    from tpuprof.sources import tpu_compile

    def loss(x, w):
        return jnp.tanh(x @ w).sum()

    step = jax.grad(loss, argnums=1)
    args = (jax.ShapeDtypeStruct((1000, 300), jnp.float32), jax.ShapeDtypeStruct((300, 18), jnp.float32))
    module = tmp_path / "module_0001.jit_loss.before_optimizations.hlo.pb"
    module.write_bytes(jax.jit(step).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto())
    compiled = tpu_compile.compile_jax(step, args, "v5e")

    estimate = json.loads(cli("memory", module, "--target", "v5e", "--no-compile", "--json").stdout)["modules"][0]
    exact = cli("memory", module, "--target", "v5e", "--json")  # libtpu is installed: recompiled by default
    assert exact.returncode == 0, exact.stderr[-2000:]
    result = json.loads(exact.stdout)["modules"][0]
    assert estimate["estimated"] is True and estimate["method"] == "unscheduled_bound"
    assert result["estimated"] is False and result["method"] == "recompiled"
    assert any("recompiled for v5e" in note for note in result["notes"])
    assert result["argument_bytes"] == compiled.argument_bytes
    assert result["output_bytes"] == compiled.output_bytes
    assert any("Compiled from" in note for note in result["notes"])
