"""The step-time estimate on golden libtpu dumps (tests/fixtures/step_estimate, made by its generate.py):
FLOPs against the compiler's own cost_analysis(), bytes against the arrays' sizes, loop trip counts
against the programs as written, and the ordering of generations. No compile here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tpuprof import documents_preflight, prices
from tpuprof.analyses import step_estimate
from tpuprof.errors import UserError
from tpuprof.models.preflight import TargetEstimate

GOLDEN = Path(__file__).parent / "fixtures" / "step_estimate"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())


def cost(name: str) -> step_estimate.ProgramCost:
    return step_estimate.load(GOLDEN / name)


def estimate(name: str) -> step_estimate.StepEstimate:
    return step_estimate.estimate(cost(name), MANIFEST[name]["target"])


@pytest.mark.parametrize("name", ["matmul_v5e", "mlp_b16_v5e", "mlp_b32_v5e", "bigmatmul_v5e", "bigmatmul_v6e"])
def test_flops_of_loop_free_programs_equal_xla_cost_analysis(name):
    program = cost(name)
    assert program.stage == "after_codegen" and not program.loops
    assert program.flops == pytest.approx(MANIFEST[name]["cost_analysis_flops"], rel=0.015)


@pytest.mark.parametrize("name", ["scan_v5e", "fori_v5e", "map_v5e"])
def test_loop_bodies_count_once_per_trip(name):
    """cost_analysis() counts a loop body once; nearly all the work is in the body, so the step's FLOPs
    are the trip count times cost_analysis()'s figure."""
    program = cost(name)
    trips = MANIFEST[name]["trip_count"]
    assert [(loop.trip_count, loop.trip_count_source) for loop in program.loops] == [(trips, "inferred")]
    assert program.flops == pytest.approx(trips * MANIFEST[name]["cost_analysis_flops"], rel=0.015)
    assert not program.flops == pytest.approx(MANIFEST[name]["cost_analysis_flops"], rel=0.5)


def test_known_trip_count_wins_over_inference():
    """When the compiler records known_trip_count in the while's backend_config, that is the count."""
    from tpuprof.analyses import op_costs
    from tpuprof.models.hlo_module import HloModule
    from tpuprof.protos import hlo_pb2

    path = next((GOLDEN / "scan_v5e").glob("*.after_codegen.hlo.pb"))
    module = hlo_pb2().HloProto.FromString(path.read_bytes()).hlo_module
    loop = next(i for c in module.computations for i in c.instructions if i.opcode == "while")
    loop.backend_config = json.dumps({"known_trip_count": {"n": "9"}}).encode()
    program = op_costs.walk(HloModule(module))
    assert [(l.trip_count, l.trip_count_source) for l in program.loops] == [(9, "known_trip_count")]
    assert program.flops == pytest.approx(9 / 6 * cost("scan_v5e").flops, rel=0.02)


def test_plain_matmul_reads_both_operands_and_writes_the_result():
    """Tile-aligned bf16 shapes: the HBM bytes are exactly a + b + a@b."""
    sample = MANIFEST["matmul_v5e"]
    assert cost("matmul_v5e").hbm_bytes == sample["argument_bytes"] + sample["output_bytes"]


def test_one_scan_step_reads_one_layer_not_the_stack():
    program = cost("scan_v5e")
    trips = MANIFEST["scan_v5e"]["trip_count"]
    body = [op for op in program.ops if op.count == trips]
    heaviest = max(body, key=lambda op: op.hbm_bytes)
    assert heaviest.hbm_bytes == MANIFEST["scan_v5e"]["layer_bytes"]  # 512x512 bf16, not 6 of them
    # The carry lives in on-chip memory (S(1)) between steps: no HBM traffic for it.
    assert sum(op.hbm_bytes for op in body) < 1.01 * MANIFEST["scan_v5e"]["layer_bytes"]


def test_band_holds_roofline_and_compiler_and_the_point_between():
    for name in MANIFEST:
        result = estimate(name)
        assert result.compiler_s is not None and result.ops_with_cycles > 0
        assert result.low_s == min(result.roofline_s, result.compiler_s)
        assert result.high_s == max(result.roofline_s, result.compiler_s)
        assert result.low_s <= result.point_s <= result.high_s
        assert result.point_s == pytest.approx(math.sqrt(result.roofline_s * result.compiler_s))


def test_twice_the_batch_takes_about_twice_as_long():
    small, large = estimate("mlp_b16_v5e"), estimate("mlp_b32_v5e")
    assert 1.7 < large.point_s / small.point_s < 2.2
    assert large.flops == pytest.approx(2 * small.flops, rel=0.02)


def test_compute_bound_matmul_orders_the_generations_by_peak():
    times = {g: estimate(f"bigmatmul_{g}") for g in ("v5e", "v5p", "v6e")}
    assert times["v6e"].point_s < times["v5p"].point_s < times["v5e"].point_s
    for result in times.values():
        # The matmul is compute-bound; only the prefetch copies of its operands are bound by HBM.
        heaviest = result.top(1)[0]
        assert heaviest.op.opcode == "fusion" and heaviest.compute_s > heaviest.memory_s
        assert result.compute_s > 0.8 * (result.compute_s + result.memory_s)
        # The compiler's cycles for a large matmul imply a utilisation below 100% at the stated clock.
        assert result.flops / (result.compiler_s * result.peaks.bf16_flops) < 1.0


def test_report_throughput_and_cost_follow_from_the_step_time():
    result = estimate("mlp_b32_v5e")
    price = prices.Price(1.5, "test", True)
    out = documents_preflight.estimate(TargetEstimate(result, 32, tokens_per_example=128, price=price))
    assert out["step_ms"] == pytest.approx(result.point_s * 1e3, rel=1e-3)
    assert out["examples_per_s"] == pytest.approx(32 / result.point_s, rel=1e-3)
    assert out["tokens_per_s"] == pytest.approx(128 * 32 / result.point_s, rel=1e-3)
    assert out["cost_per_million_examples"] == pytest.approx(1.5 / 3600 / (32 / result.point_s) * 1e6, rel=1e-3)
    assert out["top_ops"][0]["source_line"].endswith(".py:" + out["top_ops"][0]["source_line"].rsplit(":", 1)[1])
    assert "the input pipeline" in out["not_modelled"]
    unpriced = documents_preflight.estimate(TargetEstimate(result, 32, price=None))
    assert unpriced["cost_per_million_examples"] is None and "--price" in unpriced["price_source"]


def test_choice_names_the_cheapest_that_fits_and_the_fastest():
    def target(name, fits, examples, cost_):
        return {"target": name, "fits": fits, "batch_size": 8,
                "estimate": {"examples_per_s": examples, "cost_per_million_examples": cost_, "step_ms": 1.0,
                             "price_verified": False}}

    line = documents_preflight.choice([target("v5e", True, 100, 3.0), target("v6e", True, 400, 1.9),
                                 target("v5p", False, 900, 0.5)])
    assert line.startswith("cheapest that fits: v6e") and "fastest: v6e" in line and "v5p" not in line


def test_price_overrides_and_bad_prices():
    assert prices.parse_overrides("v6e=2.5,trillium=2.6")["v6e"].usd_per_chip_hour == 2.6
    assert prices.price_for("v5e", {}).verified is False  # the table says when it is unchecked
    for bad in ("v6e", "v6e=cheap", "v6e=-1", "v9=1.0"):
        with pytest.raises(UserError):
            prices.parse_overrides(bad)


def test_a_dump_without_after_codegen_gives_the_roofline_alone(tmp_path):
    """Older dumps (the samples keep after_optimizations only): no compiler cycles, so no band."""
    dump = Path(__file__).parents[1] / "sample_profiles" / "dumps" / "transformer_bf16_v6e"
    program = step_estimate.load(dump)
    assert program.stage == "after_optimizations" and program.target == "v6e" and program.flops > 0
    result = step_estimate.estimate(program, "v6e")
    assert result.compiler_s is None and result.low_s == result.high_s == pytest.approx(result.point_s)
    assert "roofline over the compiled ops only" in documents_preflight.estimate(TargetEstimate(result, 8))["method"]
    with pytest.raises(UserError):
        step_estimate.load(tmp_path)
