"""What `tpuprof analyze` learns from one host's capture: plain, picklable dataclasses.

Each host is analysed in its own process; only these small summaries travel back, never the XSpace.
Times are integer picoseconds (the XPlane unit) until the renderer turns them into milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Where step time goes. On TPU planes: compute (MXU and vector ops, Pallas and other custom calls),
# host_transfer (copies to/from host memory such as pinned host S(5), outfeed, host send/recv), input (infeed,
# device idle while the host waits for data), collective (all-reduce, all-gather... and their waits),
# host_overhead (device idle between programs), compile, other (a program running with no op on the timeline).
def median(values) -> float:
    """statistics.median, without its import (10-20 ms of a 0.3 s start: it loads fractions, decimal and random;
    numpy's median loads numpy.ma)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def percentile(values, q: float) -> float:
    """numpy.percentile(values, q) (linear interpolation between the closest ranks), without its import of
    numpy.ma."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


CATEGORIES = ("compute", "input", "host_transfer", "collective", "host_overhead", "compile", "other")


@dataclass(slots=True)  # one per step per chip: a host of many chips holds many
class Step:
    """One step period: from this step's start to the next one's (the gap between steps is part of it)."""

    number: int
    start_ps: int
    duration_ps: int
    compute_ps: int = 0
    input_ps: int = 0
    host_transfer_ps: int = 0
    collective_ps: int = 0
    host_overhead_ps: int = 0
    compile_ps: int = 0
    other_ps: int = 0
    batches: int = 1  # training batches run by this step (Keras steps_per_execution > 1)

    def work_ps(self) -> int:
        """Time the device spent on its own work (not waiting on the host, other chips or the input)."""
        return self.compute_ps + self.host_transfer_ps + self.other_ps


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
class Device:
    """One TPU chip (a `/device:TPU:N` plane) and its own steps, aligned with the other chips' steps."""

    id: str  # TPU:0
    kind: str  # the generation (v6e), or the plane's device_type_string when tpuprof does not know it
    device_type: str  # as the capture says: "TPU v6 Lite"
    steps: list[Step] = field(default_factory=list)
    capture_peak_tflops: float | None = None  # what the capture states (peak_teraflops_per_second)
    # XProf's duty cycle, over the whole capture: op time (self times on `XLA Ops`) over the time from the first
    # device op's start to the last one's end. Steps (above) count each program run with the gap after it.
    op_busy_ps: int = 0
    op_span_ps: int = 0
    program_runs: int = 0  # events on `XLA Modules`

    def duty_cycle_percent(self) -> float | None:
        return 100.0 * self.op_busy_ps / self.op_span_ps if self.op_span_ps else None

    def median_step_ms(self) -> float:
        return median(s.duration_ps / 1e9 for s in self.steps) if self.steps else 0.0

    def median_work_ms(self) -> float:
        return median(s.work_ps() / 1e9 for s in self.steps) if self.steps else 0.0


@dataclass
class Op:
    name: str  # framework op (tf_op stat or TF op name) when known, else the HLO / event name
    kind: str  # op type or HLO category
    where: str  # device | host
    count: int
    self_ps: int  # over the whole capture, summed over chips
    # Inside the measured step periods, summed over chips (device ops) or hosts (host ops, when the host measured
    # the steps: HostProfile.host_ops_in_steps):
    step_self_ps: int = 0  # self time
    step_count: int = 0  # occurrences
    # Device ops only (one row per HLO instruction and program):
    hlo_op: str = ""  # the HLO instruction name, e.g. copy-done.2
    category: str = ""  # one of CATEGORIES: compute, host_transfer, collective, input
    program: str = ""  # the XLA program (module) it belongs to
    flops: float = 0.0  # per occurrence
    model_flops: float = 0.0  # per occurrence (the model's FLOPs, without rematerialisation)
    bytes_accessed: float = 0.0  # per occurrence, every memory space (XProf's roofline bytes)
    hbm_bytes: float | None = None  # per occurrence, HBM only, when the capture breaks bytes down by memory space
    flops_source: str = ""  # how `flops` was obtained (capture metadata, capture event, estimated from shapes)
    shape: str = ""  # result shape with layout
    transfer: str = ""  # to_device | to_host, for copies between host memory and HBM
    async_start: bool = False  # issues asynchronous work (copy-start, all-gather-start...) and returns at once


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
    compile_events_in_steps: bool = False  # compile_events counts those in the measured steps, not the capture's
    devices: list[Device] = field(default_factory=list)  # TPU chips, each with its own aligned steps
    chip_steps: int = 0  # steps measured on every chip, summed over chips (divides device op times per step)
    host_ops_in_steps: bool = False  # its host ops hold their time inside the steps (steps measured on the host)
    matmul_ps: int = 0  # device time in matmuls/convolutions
    matmul_f32_ps: int = 0  # ... of which with a 32-bit result
    notes: list[str] = field(default_factory=list)
    # Lost device data: the host called its step this many more times than the chips ran it, and the chips'
    # events end this long before the host's last step call (0: they do not).
    steps_without_device: int = 0
    device_stops_early_ps: int = 0

    def total(self, category: str) -> int:
        return sum(getattr(step, f"{category}_ps") for step in self.steps)

    @property
    def step_ps(self) -> int:
        return sum(step.duration_ps for step in self.steps)

    def durations_ms(self) -> list[float]:
        return [step.duration_ps / 1e9 for step in self.steps]

    def median_step_ms(self) -> float:
        durations = self.durations_ms()
        return median(durations) if durations else 0.0
