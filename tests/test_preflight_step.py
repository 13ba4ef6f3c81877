"""tpuprof.analyses.preflight_step without a compile: the batches a one-device compile means for a slice, the LLM
step's batch per device, and the remat policy ranked best (by the throughput the document states). The compiles
themselves: tests/test_preflight.py and tests/test_llm_preflight.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tpuprof import slices
from tpuprof.analyses import preflight_step
from tpuprof.models.preflight import (Compiled, HostMemory, PreflightOptionError, PreflightTarget, TargetEstimate,
                                      stated_rate)


def test_a_named_slice_has_a_global_batch_and_a_bare_generation_has_none():
    pod = slices.parse("v5p-128")  # 64 chips of one device
    assert preflight_step.slice_batches(pod, 4) == {"batch_per_chip": 4 * pod.target.devices_per_chip,
                                                    "global_batch": 4 * pod.total_devices}
    bare = slices.parse("v6e")
    assert not bare.explicit and preflight_step.slice_batches(bare, 4) == {"batch_per_chip": 4}
    # The LLM step is compiled over the whole topology: its batch names every device all the same.
    assert preflight_step.slice_batches(bare, 4, whole_slice=True)["global_batch"] == 4 * bare.total_devices
    assert preflight_step.slice_batches(pod, None) == {}


def test_the_llm_batch_divides_over_chips_and_devices_or_names_the_keyword():
    two_per_chip = slices.parse("v3-8")  # 4 chips of 2 devices
    assert two_per_chip.target.devices_per_chip == 2
    assert preflight_step.llm_batch_per_device(two_per_chip, 6, None) == 3
    with pytest.raises(PreflightOptionError) as odd:
        preflight_step.llm_batch_per_device(two_per_chip, 3, None)
    assert "batch_per_chip=" in str(odd.value) and "multiple of 2" in str(odd.value)
    assert preflight_step.llm_batch_per_device(two_per_chip, None, 16) == 16 // two_per_chip.total_devices
    with pytest.raises(PreflightOptionError) as uneven:
        preflight_step.llm_batch_per_device(two_per_chip, None, 12)
    assert "global_batch=" in str(uneven.value)
    assert preflight_step.llm_batch_per_device(two_per_chip, None, None) is None  # --max-batch searches it


@dataclass
class _Step:  # the StepEstimate fields TargetEstimate reads
    point_s: float
    target: str = "v6e"


def _answer(step_s: float | None, fits: bool = True, host_fits: bool | None = None, batch: int = 4,
            required: int | None = 1 << 30) -> PreflightTarget:
    compiled = Compiled(batch, fits, required, 1,
                        host=HostMemory(1 << 20, 1 << 30, host_fits) if host_fits is not None else None)
    estimate = TargetEstimate(_Step(step_s), batch, tokens_per_example=1000) if step_s else None
    return PreflightTarget(slices.parse("v6e-8"), compiled, "cache", batch_per_chip=batch, estimate=estimate)


def test_the_best_policy_is_the_fastest_that_fits_and_the_first_of_equal_stated_throughputs():
    slow, fast = _answer(0.2), _answer(0.1)
    assert fast.estimate.tokens_per_s == pytest.approx(4 * 1000 / 0.1)
    assert preflight_step.best([slow, fast]) is fast
    # Beyond HBM, or beyond the host's memory, a policy answers nothing.
    assert preflight_step.best([slow, _answer(0.01, fits=False), _answer(0.01, host_fits=False)]) is slow
    # No estimate: the batch per chip, far below any throughput, still ranks the larger batch first.
    assert preflight_step.best([_answer(None, batch=2), _answer(None, batch=8), slow]) is slow
    assert preflight_step.throughput(_answer(None, batch=8)) > preflight_step.throughput(_answer(None, batch=2))
    # Two throughputs the document states alike (whole tokens/s above 1,000): the first policy stays.
    first, second = _answer(0.400000), _answer(0.399999)
    assert second.estimate.tokens_per_s > first.estimate.tokens_per_s
    assert stated_rate(first.estimate.tokens_per_s) == stated_rate(second.estimate.tokens_per_s)
    assert preflight_step.best([first, second]) is first
    # None fits: the policy that comes closest (--remat all used to report its first, none, which keeps the most).
    none, full, refused = (_answer(None, fits=False, required=50 << 30), _answer(None, fits=False, required=20 << 30),
                           _answer(None, fits=False, required=None))
    assert preflight_step.best([refused, none, full]) is full
