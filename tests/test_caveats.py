"""Caveats: every estimated figure says what it leaves out, derived from what its document already says."""

from __future__ import annotations

import copy

from helpers import golden
from tpuprof import caveats
from tpuprof.units import fmt_bytes


def test_an_unscheduled_estimate_names_its_range_and_fragmentation():
    module = golden.read("memory/tf_hlo_cpu")["modules"][0]
    assert module["method"] == "unscheduled_bound"
    said = " ".join(caveats.memory(module))
    low, high = module["peak_range_bytes"]
    assert f"from {fmt_bytes(low)} to {fmt_bytes(high)}" in said
    assert "Fragmentation not simulated" in said


def test_an_exact_peak_names_only_what_it_does_not_count():
    module = golden.read("memory/conv18_f32_v5e")["modules"][0]
    assert module["method"] == "buffer_assignment"
    said = caveats.memory(module)
    assert not any("stimat" in c or "Fragmentation" in c for c in said)
    assert any(c.startswith("One program's peak") for c in said)


def test_a_step_estimate_names_what_is_not_modelled_and_kernels_without_cost():
    estimate = copy.deepcopy(golden.read("preflight/mlp_factory_bf16")["targets"][0]["estimate"])
    estimate["kernels_without_estimate"] = ["custom-call.7", "custom-call.9"]
    said = caveats.step_estimate(estimate)
    assert estimate["not_modelled"], "the golden estimate names what it leaves out"
    assert [f"Not modelled: {part}." for part in estimate["not_modelled"]] == \
        [c for c in said if c.startswith("Not modelled:")]
    assert any(c.startswith("Pallas/custom kernels without a cost estimate: custom-call.7, custom-call.9") for c in said)


def test_few_steps_are_named_with_their_count():
    document = copy.deepcopy(golden.read("analyze/jax_compute"))
    document["hosts"][0]["steps"] = 2
    assert "2 steps measured: one slow step moves every share." in caveats.analyze(document)
    document["hosts"][0]["steps"] = 50
    assert not any("measured:" in c for c in caveats.analyze(document))


def test_annotating_twice_gives_the_same_document():
    document = golden.read("diff/memory")
    once = caveats.annotate("diff", copy.deepcopy(document))
    assert caveats.annotate("diff", copy.deepcopy(once)) == once
    assert once["groups"][0]["caveats"][0].startswith("Per-example growth is a line through two batches (64 and 128)")
