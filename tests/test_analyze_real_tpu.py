"""`tpuprof analyze` on real public TPU captures, against XProf 2.24 on the same files.

The captures are not in the repository (sample_profiles/real/README.md says where they come from);
tests/real_data.py finds them and skips with the reason when they are not available here.

- v6e-4 host offload (openxla/xprof test data): a JAX program on 4 chips whose arrays f32[5,1024,1024,256]
  live in pinned host memory (S(5)): each step copies three of them into HBM, adds to them, and copies three
  back. XProf measures no step and calls the copies HBM-bound.
- v6e-1 Pallas matmul (vlasenkoalexey/xprof-cli test fixture): a Pallas kernel with m, k, n = 2048, 1024, 2048
  called 3 times, each call waited for (`block_until_ready`). XProf gives the kernel 0 FLOPs.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli
from helpers.real_data import TPU_HOST_OFFLOAD_MANGLED, TPU_HOST_OFFLOAD_V6E_4, TPU_PALLAS_MATMUL_V6E_1, real_artefact
from helpers.xprof_oracle import roofline_rows, tool_data

from tpuprof.commands import analyze as command
from tpuprof import documents_analyze as render
from tpuprof.presentation.analyze import duty_cycle_sentence

GiB = 1 << 30
ARRAY = "f32[5,1024,1024,256]"
ARRAY_BYTES = 5 * 1024 * 1024 * 256 * 4
PALLAS_M, PALLAS_K, PALLAS_N = 2048, 1024, 2048  # the job's shapes (the fixture's capture_fixtures.py)


@pytest.fixture(scope="module")
def offload(tmp_path_factory):
    path = real_artefact(TPU_HOST_OFFLOAD_V6E_4, tmp_path_factory.mktemp("offload"))
    return path, command.profile_summary(str(path), top=0)


@pytest.fixture(scope="module")
def pallas(tmp_path_factory):
    path = real_artefact(TPU_PALLAS_MATMUL_V6E_1, tmp_path_factory.mktemp("pallas"))
    return path, command.profile_summary(str(path), top=0)


@pytest.fixture(scope="module")
def xprof(tmp_path_factory):
    """XProf's tool output on a copy of a capture (one scratch folder per capture, so its cache is reused)."""
    cache = {}

    def get(path, tool):
        if (path, tool) not in cache:
            cache[(path, tool)] = tool_data(path, tool, tmp_path_factory.mktemp("xprof") / path.stem)
        return cache[(path, tool)]

    return get


def device_op(report, hlo_op):
    return next(o for o in report.device_ops if o.hlo_op == hlo_op)


def program_node(op_profile: dict, prefix: str) -> dict:
    return next(n for n in op_profile["byProgram"]["children"] if n["name"].startswith(prefix))


def category_node(program: dict, category: str) -> dict:
    return next(n for n in program["children"] if n["name"] == category)


# --- v6e-4 host offload ------------------------------------------------------------------------------


def test_steps_per_chip_are_aligned_and_measured_like_xprofs_program_time(offload, xprof):
    path, report = offload
    assert "No step time measured" in xprof(path, "overview_page")[1]["p"]["input_conclusion"]
    program = program_node(xprof(path, "op_profile"), "jit_f")
    # XProf: the program's op time over 4 chips x 100 executions; per execution per chip:
    per_execution_ms = program["metrics"]["rawTime"] / 1e9 / 400
    assert [d.id for _, d in report.devices] == ["TPU:0", "TPU:1", "TPU:2", "TPU:3"]
    for _, chip in report.devices:
        assert chip.kind == "v6e" and chip.device_type == "TPU v6 Lite"
        # 100 executions; the last one's idle gap is not in the capture, so it is left out.
        assert len(chip.steps) == 99
        assert chip.median_step_ms() == pytest.approx(per_execution_ms, rel=1e-3)
    assert report.step_count == 99 and report.median_ms == pytest.approx(per_execution_ms, rel=1e-3)
    # The chips run in lock step: no chip is slower than the others.
    assert report.slow_chips == []


def test_device_time_categories_are_host_transfers_and_compute_as_xprof_times_them(offload, xprof):
    path, report = offload
    program = program_node(xprof(path, "op_profile"), "jit_f")
    copies_ms = category_node(program, "copy-done")["metrics"]["rawTime"] / 1e9 / 400
    fusions_ms = category_node(program, "loop fusion")["metrics"]["rawTime"] / 1e9 / 400
    per_step = report.breakdown_ms_per_step
    assert per_step["host_transfer"] == pytest.approx(copies_ms, rel=5e-3)  # ~760 ms of a 784 ms step
    assert per_step["compute"] == pytest.approx(fusions_ms, rel=5e-3)
    assert report.breakdown_percent["host_transfer"] >= 95
    assert per_step["collective"] == per_step["compile"] == 0 and per_step["input"] < 0.001
    assert abs(sum(report.breakdown_percent.values()) - 100) < 0.5


def test_verdict_names_the_host_transfer_in_the_users_terms(offload):
    _, report = offload
    assert report.verdict == "host-transfer-bound"
    reason = report.verdict_reason
    assert reason.startswith("96.9% of step time") and "pinned host memory, S(5)" in reason
    assert f"3 x {ARRAY} from host memory into HBM (15.00 GiB per step)" in reason
    assert f"3 x {ARRAY} from HBM to host memory (15.00 GiB per step)" in reason
    assert "GB/s" in reason and "of the host link" in reason
    assert [o.hlo_op for o in report.verdict_ops] == ["copy-done.4", "copy-done.2", "copy-done", "copy-done.5"]
    first = report.suggestions[0]
    assert first["kind"] == "host_transfer" and first["severity"] == "blocking"
    assert "Keep the arrays in HBM" in first["message"] and "prefetch to device" in first["message"]
    assert first["saving_ms_per_step"] == pytest.approx(report.breakdown_ms_per_step["host_transfer"], rel=1e-3)
    assert first["host_transfer_bytes_per_step"] == 6 * ARRAY_BYTES


def test_op_times_per_step_are_per_chip_never_summed_over_chips(offload, xprof):
    path, report = offload
    rows = {r["operation"]: r for r in roofline_rows(xprof(path, "roofline_model"))}
    for op in report.device_ops:
        assert report.ms_per_step(op) <= report.median_ms
    copy = device_op(report, "copy-done.4")
    # XProf's average time of one occurrence (us) is one chip's wait for one copy per step.
    assert report.ms_per_step(copy) == pytest.approx(rows["copy-done.4"]["avg_time"] / 1e3, rel=1e-3)
    assert copy.count == 400 and copy.step_count == 4 * 99


def test_per_op_rates_equal_xprofs_roofline_where_it_measures_them(offload, xprof):
    path, report = offload
    compared = 0
    for row in roofline_rows(xprof(path, "roofline_model")):
        op = device_op(report, row["operation"])
        rates = report.rates(op)
        theirs_flops = row["measured_flop_rate"] * 1e9  # GFLOP/s
        theirs_bytes = row["measured_memory_bw"] * GiB  # GiB/s
        if rates.bytes_per_s is None:
            # Where tpuprof gives no rate, XProf's figure is not a measurement: a -start that returns at once,
            # or a -done whose copy had finished (more than the HBM's peak bytes per second).
            assert op.async_start or theirs_bytes > report.roof.peak_hbm_bytes_per_s, row["operation"]
            continue
        compared += 1
        assert rates.flops_per_s == pytest.approx(theirs_flops, rel=0.03), row["operation"]
        assert rates.bytes_per_s == pytest.approx(theirs_bytes, rel=0.03), row["operation"]
    assert compared >= 8  # 4 waited-for copies, 3 fusions, the all-reduce, the broadcast


def test_roofline_judges_copies_against_the_host_link_and_fusions_against_hbm(offload, xprof):
    path, report = offload
    theirs = {r["operation"]: r["bound_by"] for r in roofline_rows(xprof(path, "roofline_model"))}
    copy, fusion = device_op(report, "copy-done.4"), device_op(report, "broadcast_add_fusion.1")
    assert theirs["copy-done.4"] == "HBM"  # XProf: an HBM-bound op at 1.7% of HBM bandwidth
    assert report.rates(copy).bound == "host link"
    assert report.rates(copy).percent_of_roof == pytest.approx(100 * 27.6e9 / 32e9, abs=1)  # 86% of the link
    assert report.rates(fusion).bound == "HBM" and 75 < report.rates(fusion).percent_of_roof < 90
    assert report.rates(fusion).intensity == pytest.approx(1342177280 / 10737418240)  # 1 FLOP per 8 bytes
    assert report.rates(device_op(report, "copy-start.4")).bytes_per_s is None
    roofline = render.roofline_json(report)
    assert roofline["device_kind"] == "v6e" and roofline["peak_flops_per_s"] == 918e12
    # Per chip per step: 3 fusions of 1.34 GFLOP; HBM: 3 x 10 GiB in fusions, 5 GiB per copy in or out.
    assert roofline["flops_per_step"] == 3 * 1342177280
    assert roofline["hbm_bytes_per_step"] == 3 * 2 * ARRAY_BYTES + 6 * ARRAY_BYTES
    assert report.roofline.mfu_percent == pytest.approx(100 * 3 * 1342177280 / (report.mean_ms / 1e3) / 918e12)


def test_json_document_from_the_cli_has_the_tpu_additions(offload):
    path, _ = offload
    done = run_cli("analyze", path, "--json", "--top", "0")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document["breakdown_percent"]) == {"compute", "input", "host_transfer", "collective",
                                                  "host_overhead", "compile", "other"}
    assert [(d["id"], d["kind"], d["steps"]) for d in document["devices"]] == [
        (f"TPU:{i}", "v6e", 99) for i in range(4)]
    assert all(783 < d["median_ms"] < 786 for d in document["devices"])
    assert set(document["roofline"]) >= {"device_kind", "peak_flops_per_s", "peak_hbm_bytes_per_s", "flops_per_s",
                                         "hbm_bytes_per_s", "mfu_percent"}
    device_ops = [o for o in document["top_ops"] if o["where"] == "device"]
    # --top 0: every op: 17 HLO ops (6 copy-start, 6 copy-done, 3 fusions, an all-reduce, a broadcast; the rows
    # of XProf's roofline_model); the host runs no TF or XLA:CPU ops.
    assert len(device_ops) == len(document["top_ops"]) == 17
    for row in device_ops:
        assert set(row) >= {"hlo_op", "category", "self_ms_per_step", "flops_per_s", "bytes_per_s", "intensity",
                            "bound"}
    copy = next(o for o in device_ops if o["hlo_op"] == "copy-done.4")
    assert copy["category"] == "host_transfer" and copy["transfer"] == "to_device" and copy["bound"] == "host link"
    assert copy["shape"].startswith(ARRAY) and copy["bytes_accessed"] == ARRAY_BYTES


def test_tables_show_chips_roofline_and_host_transfers(offload):
    path, _ = offload
    done = run_cli("analyze", path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "host transfers (host memory <-> HBM)" in out and "Chips (aligned steps" in out
    assert "Verdict: host-transfer-bound" in out and "Roofline (v6e, per chip)" in out
    assert "copy-done.4" in out and "host link 86%" in out


def test_hbm_bandwidth_utilisation_is_the_hbm_bytes_per_step_over_the_step_at_the_chips_peak(offload):
    """Per chip per step the fusions move 3 x 10 GiB and the copies 6 x 5 GiB of HBM (as the roofline test counts
    them), in the mean step, against v6e's published 1638 GB/s: about 5%, said beside MFU wherever the roofline is."""
    from tpuprof.renderers.markdown import render

    path, report = offload
    document = json.loads(run_cli("analyze", path, "--json").stdout)
    expected = 100 * (3 * 2 * ARRAY_BYTES + 6 * ARRAY_BYTES) / (report.mean_ms / 1e3) / 1638e9
    assert document["roofline"]["hbm_utilization_percent"] == pytest.approx(expected, rel=1e-3)
    assert 4.9 < expected < 5.1
    said = f"MFU 0.00%, HBM bandwidth utilisation {expected:.1f}%."
    assert said in " ".join(run_cli("analyze", path, env={"COLUMNS": "200"}).stdout.split())
    assert said in render(document)


def test_a_capture_committed_mangled_is_one_clear_error(tmp_path):
    """openxla/xprof later committed the same file with every byte above 0x7f replaced by U+FFFD."""
    path = real_artefact(TPU_HOST_OFFLOAD_MANGLED, tmp_path)
    done = run_cli("analyze", path)
    assert done.returncode == 2 and done.stdout == ""
    assert "is not a readable xplane.pb" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    # and why: the bytes a copy as text puts in place of every byte that is not UTF-8
    assert "UTF-8 replacement characters (EF BF BD)" in done.stderr and "copied as text" in done.stderr


# --- v6e-1 Pallas matmul -----------------------------------------------------------------------------


def test_pallas_kernel_gets_its_matmul_flops_where_xprof_shows_none(pallas, xprof):
    path, report = pallas
    (row,) = roofline_rows(xprof(path, "roofline_model"))
    assert row["operation"] == "matmul_optimized.1" and row["measured_flop_rate"] == 0
    kernel = device_op(report, "matmul_optimized.1")
    assert kernel.kind == "custom-call" and kernel.category == "compute"
    assert kernel.flops == 2 * PALLAS_M * PALLAS_K * PALLAS_N and kernel.flops_source.startswith("estimated")
    # Same kernel time as XProf's (avg_time in us), so the same FLOP/s once the FLOPs are known.
    achieved = kernel.flops / (row["avg_time"] / 1e6)
    assert report.rates(kernel).flops_per_s == pytest.approx(achieved, rel=0.03)
    assert 100e12 < report.rates(kernel).flops_per_s < 120e12
    assert report.rates(kernel).bound == "compute" and "f32" in report.rates(kernel).note


def test_bandwidth_the_capture_does_not_give_is_not_measured_not_zero(pallas):
    """The Pallas kernel has no bytes in the capture: its GB/s and the program's HBM GB/s are not measured (null,
    'not measured'), never 0.0 GB/s."""
    path, report = pallas
    assert report.rates(device_op(report, "matmul_optimized.1")).bytes_per_s is None
    assert report.roofline.hbm_bytes_per_step is None and report.roofline.hbm_bytes_per_s is None
    document = json.loads(run_cli("analyze", path, "--json").stdout)
    assert document["roofline"]["hbm_bytes_per_s"] is None
    assert [o["bytes_per_s"] for o in document["top_ops"] if o["hlo_op"] == "matmul_optimized.1"] == [None]
    text = run_cli("analyze", path).stdout
    assert "HBM bandwidth not measured" in text and "0.0 GB/s" not in text


def test_pallas_loop_waiting_on_each_call_is_host_overhead_bound_with_the_last_call_left_out(pallas):
    from tpuprof.protos import xplane_pb2

    path, report = pallas
    (chip,) = [d for _, d in report.devices]
    assert chip.id == "TPU:0" and chip.kind == "v6e"
    assert len(chip.steps) == 2  # three calls: the last one has no next call to end its step
    # A step is from one call's start to the next, on the device clock the program events carry.
    plane = next(p for p in xplane_pb2().XSpace.FromString(path.read_bytes()).planes if p.name == "/device:TPU:0")
    offset_id = next(k for k, m in plane.stat_metadata.items() if m.name == "device_offset_ps")
    modules = next(line for line in plane.lines if line.name == "XLA Modules")
    starts = sorted(next(s.int64_value or s.uint64_value for s in e.stats if s.metadata_id == offset_id)
                    for e in modules.events)
    gaps_ms = [(b - a) / 1e9 for a, b in zip(starts, starts[1:])]
    assert [s.duration_ps / 1e9 for s in chip.steps] == pytest.approx(gaps_ms, abs=1e-4)
    assert report.verdict == "host-overhead-bound"
    # Each call is ~76 us of kernel and then the host waits for it before the next: most of the step is idle.
    assert report.breakdown_ms_per_step["compute"] == pytest.approx(0.0757, abs=0.002)
    assert report.breakdown_percent["host_overhead"] > 50


def test_pallas_benchmark_of_two_steps_and_no_batch_is_not_told_to_run_steps_per_call(pallas, xprof):
    """The capture holds 3 runs of one matmul (no step annotation: steps are the program's runs, not a loop's
    iterations) and no batch: "Run 64 steps per call ... [64, batch, ...]" rested on 2 steps of a benchmark,
    blocking, beside the warning that 2 steps are too few to trust."""
    path, report = pallas
    # XProf finds no step in it either (no step annotation): its overview's step time is 0.
    assert xprof(path, "overview_page")[1]["p"]["steptime_ms_average"] == "0.00"
    (host,) = report.hosts
    assert len(host.steps) == 2 and host.step_source.startswith("executions of program")
    assert report.breakdown_percent["host_overhead"] > 50
    assert not [s for s in report.suggestions if s["kind"] == "steps_per_execution"]
    assert not [s for s in report.suggestions if s.get("severity") == "blocking"]
    assert any("too few steps to trust" in w for w in report.warnings)
    text = run_cli("analyze", path).stdout
    assert "steps per call" not in text and "batch, ...]" not in text


def test_diff_uses_the_new_categories_and_per_chip_op_times(offload, tmp_path):
    path, report = offload
    saved = tmp_path / "offload.json"
    done = run_cli("analyze", path, "--json")
    saved.write_text(done.stdout)
    done = run_cli("diff", saved, path, "--json", "--fail-if", "host_transfer_percent>50")
    assert done.returncode == 1, done.stderr  # the threshold trips: 96.9% of the step is host transfers
    document = json.loads(done.stdout)
    (group,) = document["groups"]
    metrics = {m["name"]: m for m in group["metrics"]}
    assert metrics["host_transfer_percent"]["b"] == 96.9 and metrics["host_transfer_percent"]["change"] == 0
    assert metrics["collective_ms_per_step"]["b"] == 0
    ops = {r["hlo_op"]: r for r in group["ops"] if r.get("hlo_op")}
    # One chip's wait per step, not the four chips' summed (XProf-style totals gave 4 x 194 ms).
    assert ops["copy-done.2"]["b_ms_per_step"] == pytest.approx(194.1, abs=0.1)
    assert ops["copy-done.2"]["category"] == "host_transfer" and ops["copy-done.2"]["change_ms"] == 0
    assert all(r["b_ms_per_step"] <= report.median_ms for r in group["ops"])


def test_report_page_shows_the_roofline_and_the_categories(offload, pallas, tmp_path):
    from test_report import plots, title

    (offload_path, report), (pallas_path, _) = offload, pallas
    out = tmp_path / "report.html"
    done = run_cli("report", offload_path, pallas_path, "-o", out)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    figures = {title(layout): (data, layout) for data, layout in plots(page).values()}
    data, layout = figures["Device ops against the roof (marker size: time per step)"]
    assert layout["xaxis"]["type"] == layout["yaxis"]["type"] == "log"
    assert layout["xaxis"]["title"]["text"] == "operational intensity (FLOP/byte of HBM)"
    assert layout["yaxis"]["title"]["text"] == "achieved FLOP/s"
    roof, *points = data
    assert max(roof["y"]) == 918e12 and roof["y"][0] == pytest.approx(roof["x"][0] * 1638e9)
    fusions = next(t for t in points if t["name"] == "compute")
    expected = sorted(report.rates(o).flops_per_s for o in report.device_ops if o.hlo_op.startswith("broadcast_add"))
    assert sorted(fusions["y"]) == pytest.approx(expected)
    bars, layout = figures["Ops that move bytes without FLOPs (copies, collectives): achieved bandwidth"]
    assert "copy-done.4 (host_transfer)" in bars[0]["y"] and layout["xaxis"]["title"]["text"] == "GB/s (log)"
    # A log axis takes shapes, annotations and its range in log10 units: the HBM line at 1638 GB/s sits at
    # x = log10(1638), and the axis spans the bars and the lines (not up to 10^1638).
    lines = {a["text"]: a["x"] for a in layout["annotations"]}
    hbm_line = next(x for text, x in lines.items() if text.startswith("HBM"))
    assert hbm_line == pytest.approx(math.log10(1638)) and [s["x0"] for s in layout["shapes"]] == list(lines.values())
    low, high = layout["xaxis"]["range"]
    achieved = [math.log10(x) for x in bars[0]["x"]] + list(lines.values())
    assert low < min(achieved) and max(achieved) < high and high - low < 6
    step_bars, _ = next(f for t, f in figures.items() if t.startswith("Step time per step, by category"))
    assert [t["name"] for t in step_bars] == ["compute", "waiting for input", "host transfers", "collectives",
                                              "host overhead", "compilation", "other"]
    assert "Where the step time goes" in page and "Chips (aligned steps" in page
    assert "matmul_optimized.1: 113." in page and "estimated: a custom call" in page


def test_vectorised_stat_reader_equals_protobufs_decoding(offload):
    """The device clock comes from stats read straight from the serialized bytes: same values as protobuf's."""
    from tpuprof.protos import xplane_pb2
    from tpuprof.sources import xplane

    path, _ = offload
    light = xplane.read_xspace(str(path))
    full = xplane_pb2().XSpace.FromString(path.read_bytes())
    checked = 0
    for light_plane, plane in zip(light.planes, full.planes):
        wanted = {m.name: k for k, m in plane.stat_metadata.items()
                  if m.name in ("device_offset_ps", "device_duration_ps", "run_id", "program_id", "flops")}
        for light_line, line in zip(light_plane.lines, plane.lines):
            fast = xplane.int_stat_values(light_line.events, wanted)
            for name, key in wanted.items():
                expected = [next((s.int64_value or s.uint64_value for s in e.stats if s.metadata_id == key),
                                 xplane.MISSING) for e in line.events]
                assert fast[name].tolist() == expected, (plane.name, line.name, name)
                checked += int((fast[name] != xplane.MISSING).sum())
    assert checked > 6000  # every op event's device offset and duration, and the programs' run ids


@pytest.mark.parametrize("columns", ["80", "100", "110"])
def test_the_bound_of_an_op_stays_on_its_row_at_every_width(offload, columns):
    """"host link 86%" is a figure with its label: never wrapped onto a second line, whatever the width."""
    path, _ = offload
    done = run_cli("analyze", path, env={"COLUMNS": columns})
    rows = [line for line in done.stdout.splitlines() if line.startswith("copy-done.4 ")]
    assert rows and rows[0].rstrip().endswith("host link 86%") and all(len(line) <= int(columns)
                                                                        for line in done.stdout.splitlines())


def test_copies_over_the_host_link_have_no_place_on_the_hbm_roofline(offload):
    """FLOPs per HBM byte is for ops judged against HBM or compute; every host transfer leaves it empty alike."""
    path, _ = offload
    document = json.loads(run_cli("analyze", path, "--json").stdout)
    copies = [op for op in document["top_ops"] if op["kind"] == "copy-done"]
    assert {op["transfer"] for op in copies} == {"to_device", "to_host"}
    assert all(op["intensity"] is None and op["bound"] == "host link" for op in copies)


# --- XProf's duty cycle against the steps' shares ----------------------------------------------------


def _xprof_duty_cycle(xprof, path) -> float:
    return float(xprof(path, "overview_page")[0]["p"]["device_duty_cycle_percent"].rstrip("%"))


@pytest.mark.parametrize("capture", ["offload", "pallas"])
def test_duty_cycle_equals_xprofs_overview_page(capture, request, xprof):
    path, report = request.getfixturevalue(capture)
    duty = render.duty_cycle_json(report)
    assert duty["percent"] == _xprof_duty_cycle(xprof, path)  # 86.5% and 37.4%, to XProf's printed digit


def test_pallas_steps_leave_out_the_last_run_that_the_duty_cycle_counts(pallas, xprof):
    """3 calls of ~76 us with gaps of 243 and 137 us between them: XProf's duty cycle is 3 runs over the
    607 us from the first to the last (37.4%); the 2 complete steps are 2 runs over 2 runs and 2 gaps
    (28.5%). Both are right about their window; the steady-state share of a step is the second."""
    path, report = pallas
    (_, chip), = report.devices
    assert chip.program_runs == 3 and len(chip.steps) == 2
    assert report.breakdown_percent["compute"] == 28.5
    third_run = chip.op_busy_ps - sum(s.compute_ps for s in chip.steps)
    # The duty cycle's span is the two steps plus the last run: nothing else ran on the chip.
    assert abs(chip.op_span_ps - sum(s.duration_ps for s in chip.steps) - third_run) < 0.01 * chip.op_span_ps
    sentence = duty_cycle_sentence(render.document(report, 10))
    assert "37.4%" in sentence and "28.5%" in sentence and "the last run" in sentence
    assert _xprof_duty_cycle(xprof, path) == 37.4


def test_analyze_json_imports_only_what_it_needs(pallas):
    """The start-up is most of a whole `tpuprof analyze` on a 1 MB capture (bench/bench_analyze_tpu.py): the
    JSON path loads no table library, no typer (a plain command line is parsed without it), no TensorFlow or JAX,
    and none of what numpy's masked-array module or `statistics` would add (np.unique, np.median and np.percentile
    load numpy.ma on first call)."""
    import os
    import subprocess
    import sys

    path, _ = pallas
    code = ("import json, os, sys\nfrom tpuprof.cli import main\nmain(['analyze', sys.argv[1], '--json'])\n"
            "print(json.dumps([sorted(sys.modules), os.environ.get('OPENBLAS_NUM_THREADS')]), file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    names, blas = json.loads(done.stderr.strip().splitlines()[-1])
    modules = set(names)
    assert json.loads(done.stdout)["duty_cycle"]["percent"] == 37.4
    for heavy in ("numpy.ma", "statistics", "rich", "typer", "tensorflow", "jax", "xprof", "google.protobuf.text_format"):
        assert heavy not in modules, heavy
    assert "numpy" in modules and blas == "1"  # numpy's OpenBLAS started one thread, not one per core


def test_two_unrelated_tpu_captures_given_together_hold_no_pod_up(offload, pallas):
    """The Pallas matmul (1 chip) and the host-offload job (4 chips), passed together as a new user may: their
    steps matched by number, the clocks were aligned on them and the offload host was said to hold 'the pod' up
    783.80 ms per step at a collective that no chip ran. Nothing waited: the straggler advice says so, with no
    saving, and a warning says the steps are different programs."""
    report = command.profile_summary([str(pallas[0]), str(offload[0])], top=0)
    assert not any(r.collective_ms for r in report.pod.hosts)
    advice = next(s for s in report.suggestions if s["kind"] == "straggler")
    assert "none waited for it" in advice["message"] and "holding the pod up" not in advice["evidence"]
    assert "no chip of any host ran a collective" in advice["evidence"] and "saving_ms_per_step" not in advice
    assert any("runs of different programs (`jit_matmul_optimized` on host0; `jit_f` on" in w for w in report.warnings)
    assert not any("different programs" in w for w in offload[1].warnings + pallas[1].warnings)


def test_two_unrelated_tpu_captures_get_no_clock_offset_or_delay(offload, pallas):
    """The same two captures: the pod table printed a clock offset of -19,810.916 ms (the two jobs' unrelated clocks,
    from 'matching' step 0 and 1 of different programs) and "Holds up the pod: tpu_inference_2 1567.60 ms over 2
    steps", at a collective no chip ran. Not one job: the table says why, and gives neither figure."""
    paths = [str(pallas[0]), str(offload[0])]
    report = command.profile_summary(paths, top=0)
    pod = report.pod
    assert "runs of different programs" in pod.not_one_job and "no chip of any host ran a collective" in pod.not_one_job
    assert not pod.matched_steps and not pod.stragglers
    assert all(r.clock_offset_ms is None and r.delay_ms == 0 for r in pod.hosts)
    document = json.loads(run_cli("analyze", *paths, "--json").stdout)
    assert document["pod"]["not_one_job"] == pod.not_one_job and document["pod"]["stragglers"] == []
    for format_ in ("terminal", "markdown"):
        text = run_cli("analyze", *paths, *(["--format", format_] if format_ != "terminal" else [])).stdout
        assert "not one job: the hosts' steps are runs of different programs" in " ".join(text.split())
        assert "Holds up the pod" not in text and "clock offset ms" not in text and "-19810" not in text
    # Each capture alone, and one job's hosts, are unchanged: the offload job's 4 chips on one host make no pod.
    assert offload[1].pod is None and pallas[1].pod is None
