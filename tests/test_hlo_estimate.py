"""Memory without a TPU buffer assignment: HLO text and CPU dumps, checked against libtpu's exact figures.

The programs of sample_profiles/estimate_suite.py (scan + remat, while loops, multi-output fusions, attention with
head dims 80 and 96, collectives on a 2x2 mesh, host offload, donation, int4 and fp8, a Keras model through TF) were
compiled with libtpu on several generations; `estimate/manifest.json` holds each compile's exact peak (the
HloProto's buffer assignment, equal to XProf's memory viewer), `estimate/*.after_optimizations.txt.gz` its HLO text
and `estimate/cpu/*` the host CPU dump of some of them.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import SAMPLES

from tpuprof.analyses import hlo_estimate
from tpuprof.commands import memory as command
from tpuprof.models import shape as shapes
from tpuprof.sources import hlo_text

ESTIMATE = SAMPLES / "estimate"
MANIFEST = json.loads((ESTIMATE / "manifest.json").read_text())
CPU_DUMPS = sorted(p.name for p in (ESTIMATE / "cpu").iterdir()) if (ESTIMATE / "cpu").is_dir() else []


def _text_file(name: str, tmp_path):
    path = tmp_path / f"{name}.after_optimizations.txt"
    path.write_bytes(gzip.decompress((ESTIMATE / f"{name}.after_optimizations.txt.gz").read_bytes()))
    return path


def test_the_suite_covers_the_programs_and_generations():
    programs = {entry["program"] for entry in MANIFEST.values()}
    generations = {entry["target"] for entry in MANIFEST.values()}
    assert {"scan_remat", "while_loop", "multi_output", "attention_hd80", "attention_hd96", "collectives_2x2",
            "host_offload", "donation", "int4_fp8", "keras_mlp"} <= programs
    assert {"v5e", "v6e", "v5p"} <= generations and generations & {"v2", "v3", "v4"}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_text_estimate_is_within_10_percent_of_the_exact_peak_and_labelled(name, tmp_path):
    exact = MANIFEST[name]["exact"]
    result = command.module_memories(_text_file(name, tmp_path), target=MANIFEST[name]["target"], top=5)[0]
    assert result.estimated is True and result.method == "hlo_liveness"
    assert result.expected_error_percent == hlo_estimate.EXPECTED_ERROR_PERCENT == 10
    error = result.peak_heap_bytes / exact["peak_heap_bytes"] - 1
    assert abs(error) <= 0.10, f"{name}: estimate {result.peak_heap_bytes:,} vs exact {exact['peak_heap_bytes']:,}"
    # Arguments and outputs are read from the layouts and the aliasing: exact, tuple tables included.
    assert result.argument_bytes == exact["argument_bytes"]
    assert result.output_bytes == exact["output_bytes"]


def test_json_says_how_each_figure_was_obtained(cli, tmp_path):
    name = "attention_hd96_v5e"
    out = cli("memory", _text_file(name, tmp_path), "--target", "v5e", "--json")
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)["modules"][0]
    assert (module["method"], module["estimated"], module["expected_error_percent"]) == ("hlo_liveness", True, 10)
    table = cli("memory", _text_file(name, tmp_path), "--target", "v5e")
    assert "Estimate, expected within 10% of the compiler's peak" in " ".join(table.stdout.split())


def test_libtpu_default_tiles_on_the_suite_parameters():
    """Entry parameters carry libtpu's default layouts: the tiles tpuprof assumes for text without TPU layouts
    must give the same padded sizes (f32, bf16, int4, fp8, s32, s64, pred, rank 1 and scalars, v2 to v6e)."""
    checked = 0
    for name in MANIFEST:
        text = gzip.decompress((ESTIMATE / f"{name}.after_optimizations.txt.gz").read_bytes()).decode()
        module = hlo_text.parse(text)
        for instruction in module.entry_instructions:
            shape = instruction.shape
            if instruction.opcode != "parameter" or shape.is_tuple or not (shape.layout and shape.layout.tiles):
                continue
            bare = shapes.Shape(shape.dtype, shape.dims, shapes.Layout(shape.layout.minor_to_major))
            laid_out = hlo_estimate.default_tpu_layout(bare, MANIFEST[name]["target"])
            assert laid_out.padded_bytes() == shape.padded_bytes(), f"{name}: {shape.text()} vs {laid_out.text()}"
            checked += 1
    assert checked >= 40


@pytest.mark.parametrize("text, target, expected", [
    ("bf16[]", "v5e", 256 * 2),  # T(256)
    ("f32[]", "v2", 256 * 4),  # v2/v3: T(256)
    ("f32[10]", "v6e", 128 * 4),
    ("bf16[5,4096]", "v5e", 8 * 4096 * 2),  # T(8,128)(2,1): 8 rows, not 16
    ("s8[5,4096]", "v5e", 8 * 4096),  # T(8,128)(4,1)
    ("s4[5,4096]", "v5e", 8 * 4096 // 2),  # T(8,128)(8,1)E(4): packed
    ("f32[2,1000]", "v5e", 2 * 1024 * 4),  # T(2,128)
    ("f32[3,1000]", "v5e", 4 * 1024 * 4),  # T(4,128)
])
def test_default_tiles(text, target, expected):
    assert hlo_estimate.default_tpu_layout(shapes.parse_shape(text), target).padded_bytes() == expected


@pytest.mark.parametrize("text, expected", [
    ("f32[64,96,1]{2,1,0}", 64 * 128 * 4),  # a time-major regression target: libtpu {1,2,0:T(1,128)}, 32 KiB
    ("f32[4096,1]{1,0}", 4096 * 4),  # {0,1:T(1,128)}
    ("s32[4096,1,1]{2,1,0}", 4096 * 4),  # Qwen3-8B's text (scratch/oom.txt): {0,2,1:T(1,128)}
])
def test_a_size_1_minor_dim_of_a_cpu_layout_is_not_padded_to_128_lanes(text, expected):
    """A CPU dump lays arrays row-major, so [time, batch, 1] has its 1 minor; libtpu lays the batch in the lanes
    instead (preflight of a JAX GRU step, x: [64, batch, 128], y: [64, batch, 1], on v5e). Taking the CPU's order
    counted 128x its size and advised squeezing a dimension the compiler already moves."""
    assert hlo_estimate.default_tpu_layout(shapes.parse_shape(text), "v5e").padded_bytes() == expected


def test_tuple_tables_per_generation():
    """Measured on libtpu 0.0.42.1 (buffer assignments of 3- to 40-element result tuples)."""
    assert [hlo_estimate.tuple_table_bytes(n, "v6e") for n in (3, 5, 9, 17, 40)] == [32, 32, 64, 96, 160]
    assert hlo_estimate.tuple_table_bytes(40, "v5p") == 160
    assert hlo_estimate.tuple_table_bytes(40, "v4") == hlo_estimate.tuple_table_bytes(3, "v5e") == 512
    assert hlo_estimate.tuple_table_bytes(40, "v2") == 1024
    # TPU7x, probed on libtpu 0.0.42.1: tuples of 3, 9 and 40 arrays got index tables of 32, 64 and 160 bytes.
    assert [hlo_estimate.tuple_table_bytes(n, "tpu7x") for n in (3, 9, 40)] == [32, 64, 160]


@pytest.mark.parametrize("program", CPU_DUMPS)
def test_cpu_dump_is_never_passed_off_as_tpu_memory(program, cli):
    """A host CPU dump carries the CPU buffer assignment. --no-compile: an estimate, labelled, whose range holds
    the exact v5e peak of the same program."""
    folder = ESTIMATE / "cpu" / program
    out = cli("memory", folder, "--target", "v5e", "--no-compile", "--json")
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)["modules"][0]
    assert module["estimated"] is True and module["method"] == "unscheduled_bound"
    assert any("CPU buffer assignment" in note for note in module["notes"])
    low, high = module["peak_range_bytes"]
    exact = MANIFEST[f"{program}_v5e"]["exact"]["peak_heap_bytes"]
    assert low <= exact <= high
    # Without --target it cannot be sized for a TPU at all: one sentence, exit 2.
    bare = cli("memory", folder)
    assert bare.returncode == 2 and "--target" in bare.stderr


@pytest.mark.compile
def test_cpu_dump_is_recompiled_exactly_by_default(cli):
    """libtpu is installed and the target known: the module proto is recompiled; the figures are exact."""
    pytest.importorskip("libtpu")
    program = "multi_output"
    if program not in CPU_DUMPS:
        pytest.skip("no CPU dump of multi_output in sample_profiles/estimate/cpu")
    out = cli("memory", ESTIMATE / "cpu" / program, "--target", "v5e", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    module = json.loads(out.stdout)["modules"][0]
    assert module["estimated"] is False and module["method"] == "recompiled"
    assert any("recompiled for v5e" in note for note in module["notes"])
    assert module["argument_bytes"] == MANIFEST[f"{program}_v5e"]["exact"]["argument_bytes"]


def test_report_of_a_saved_estimate_says_it_in_words(cli, tmp_path):
    """A saved --json of a CPU dump (range and all) is read back by `report`, whose page names the method."""
    saved = tmp_path / "cpu_memory.json"
    out = cli("memory", ESTIMATE / "cpu" / "donation", "--target", "v5e", "--no-compile", "--json")
    assert out.returncode == 0, out.stderr
    saved.write_text(out.stdout)
    page = tmp_path / "report.html"
    report = cli("report", saved, "--output", page)
    assert report.returncode == 0, report.stderr
    text = " ".join(page.read_text().split())
    assert "Estimate for v5e without a TPU schedule or layouts" in text and "the real peak lies between" in text


DUMPS_WITH_BOTH = sorted(p.name for p in (SAMPLES / "dumps").iterdir()
                         if any(p.glob("*.after_optimizations.txt")) and any(p.glob("*.hlo.pb")))


@pytest.mark.parametrize("dump", DUMPS_WITH_BOTH)
def test_each_row_of_a_text_estimate_is_its_own_shapes_bytes_as_the_hloproto_says(dump):
    """A row of the estimate's buffer table names one array: its padded and unpadded bytes are that array's, and
    where the same module's HloProto has a logical buffer of that name, the compiler's size of it (exact). A buffer
    set that holds more (a temporary packed into an output's allocation) is named after the array its size is
    (diff_b64: copy-start.14{0} f32[64,512] read 512 KiB, fusion.89's, for its own 128 KiB)."""
    folder = SAMPLES / "dumps" / dump
    (text,) = folder.glob("*.after_optimizations.txt")
    (proto,) = folder.glob("*.hlo.pb")
    (estimate,) = command.module_memories(text, top=100_000)
    (exact,) = command.module_memories(proto, top=100_000)
    assert estimate.estimated and not exact.estimated
    compiler = {b.instruction: b.size_bytes for b in exact.buffers}
    checked = 0
    for row in estimate.buffers:
        shape = shapes.parse_shape(row.shape)
        if not shape.is_tuple:  # a tuple's row is its index table, sized per generation
            assert (row.size_bytes, row.unpadded_bytes) == (shape.padded_bytes(), shape.unpadded_bytes()), row
        if row.instruction in compiler:
            assert row.size_bytes == compiler[row.instruction], (row.instruction, row.shape)
            checked += 1
    assert checked >= 0.9 * len(estimate.buffers)
