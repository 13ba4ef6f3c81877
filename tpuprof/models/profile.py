"""What `tpuprof analyze` learns from one host's capture: plain, picklable dataclasses.

Each host is analysed in its own process; only these small summaries travel back, never the XSpace.
Times are integer picoseconds (the XPlane unit) until the renderer turns them into milliseconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

CATEGORIES = ("compute", "input", "host_overhead", "compile", "other")


@dataclass
class Step:
    """One step period: from this step's start to the next one's (the gap between steps is part of it)."""

    number: int
    start_ps: int
    duration_ps: int
    compute_ps: int = 0
    input_ps: int = 0
    host_overhead_ps: int = 0
    compile_ps: int = 0
    other_ps: int = 0
    batches: int = 1  # training batches run by this step (Keras steps_per_execution > 1)


@dataclass
class Stage:
    """One tf.data stage (`Iterator::...::Map`), with the time spent in it and not in its inputs."""

    name: str  # the iterator path, e.g. Iterator::Root::Prefetch::BatchV2::ForeverRepeat[0]::Map
    kind: str  # the last component without the index: Map, BatchV2, TensorSlice, TFRecord...
    count: int
    total_ps: int
    self_ps: int
    py_function_ps: int = 0  # Python (py_function / EagerPyFunc) running inside this stage


@dataclass
class Op:
    name: str  # framework op (tf_op stat or TF op name) when known, else the HLO / event name
    kind: str  # op type or HLO category
    where: str  # device | host
    count: int
    self_ps: int


@dataclass
class HostProfile:
    host: str
    path: str
    platform: str  # tpu | gpu | cpu (the device the steps ran on)
    step_source: str  # how steps were found, in words (shown as evidence)
    steps: list[Step] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    input_visible: bool = False  # tf.data iterator events are in the capture
    untraced_input: bool = False  # idle host time between steps is counted as input (see analyses.steps)
    framework: str = ""  # jax | tf | "" (unknown), from the host's events
    compile_events: list[tuple[str, int, int]] = field(default_factory=list)  # (name, count, ps), largest first
    matmul_ps: int = 0  # device time in matmuls/convolutions
    matmul_f32_ps: int = 0  # ... of which with a 32-bit result
    notes: list[str] = field(default_factory=list)

    def total(self, category: str) -> int:
        return sum(getattr(step, f"{category}_ps") for step in self.steps)

    @property
    def step_ps(self) -> int:
        return sum(step.duration_ps for step in self.steps)

    def durations_ms(self) -> list[float]:
        return [step.duration_ps / 1e9 for step in self.steps]

    def median_step_ms(self) -> float:
        durations = self.durations_ms()
        return statistics.median(durations) if durations else 0.0
