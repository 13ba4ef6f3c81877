"""TPU-plane XSpaces built from the XPlane schema, with the step breakdown known by construction.

No TPU is attached here, so the device path of `tpuprof analyze` is exercised on XSpaces laid out
the way a TPU capture is: a `/device:TPU:N` plane per core with the lines `Steps` (one event per
step, `group_id` stat), `XLA Modules` (one program execution per step) and `XLA Ops` (HLO ops, whose
metadata carry `hlo_category`, `tf_op` and `shape_with_layout`, as XProf reads them). Each step is:

    [device idle: idle_ms] [program: infeed_ms of infeed, then matmul_ms of convolution, other_ms of fusion]

so input = infeed (+ idle when the host is blocked in the iterator meanwhile), host overhead = idle,
compute = matmul + other. Optionally a `/host:CPU` plane whose iterator GetNext calls span the idle gaps.
For the cases no public capture shows, a step can also end with an all-reduce (collective_ms) and an
outfeed (outfeed_ms); one core can do more work (slow_core, slow_core_ms) while the others wait for it in the
all-reduce; ops can carry FLOPs and bytes and the plane a device type, for the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpuprof.protos import xplane_pb2

PS_PER_MS = 10**9


@dataclass
class Layout:
    steps: int = 20
    idle_ms: float = 1.0
    infeed_ms: float = 0.0
    matmul_ms: float = 6.0
    other_ms: float = 3.0
    matmul_dtype: str = "f32"
    host_waits_in_idle: bool = False  # the host is blocked in IteratorGetNext during the device's idle gaps
    # JAX style: no tf.data; the training thread runs untraced Python (a loader) for all of the device's
    # idle gap but its last `dispatch_ms`, when it dispatches the jitted step (a traced PjitFunction).
    host_loader_in_idle: bool = False
    dispatch_ms: float = 0.2
    cores: int = 1
    with_host: bool = True  # False: a device-only capture (no /host:CPU plane)
    start_ns: int = 1_000_000
    collective_ms: float = 0.0  # an all-reduce at the end of the program
    outfeed_ms: float = 0.0  # an outfeed to the host after it
    slow_core: int = -1  # this core's matmul takes slow_core_ms more; the others wait that long in the all-reduce
    slow_core_ms: float = 0.0
    device_type: str = ""  # the planes' device_type_string, e.g. "TPU v5 Lite"
    matmul_flops: int = 0  # per occurrence, in the op metadata (flops, bytes_accessed)
    matmul_bytes: int = 0
    other_flops: int = 0
    other_bytes: int = 0
    host_compiles_in_idle: bool = False  # the host compiles (backend_compile_and_load) during the idle gaps

    @property
    def step_ms(self) -> float:
        return (self.idle_ms + self.infeed_ms + self.matmul_ms + self.other_ms + self.collective_ms + self.outfeed_ms
                + (self.slow_core_ms if self.slow_core >= 0 else 0.0))


class _Plane:
    def __init__(self, plane):
        self.plane = plane
        self.event_ids: dict[str, int] = {}
        self.stat_ids: dict[str, int] = {}

    def stat_id(self, name: str) -> int:
        if name not in self.stat_ids:
            key = len(self.stat_ids) + 1
            self.stat_ids[name] = key
            self.plane.stat_metadata[key].id = key
            self.plane.stat_metadata[key].name = name
        return self.stat_ids[name]

    def event_id(self, name: str, display: str = "", **stats: str) -> int:
        if name not in self.event_ids:
            key = len(self.event_ids) + 1
            self.event_ids[name] = key
            meta = self.plane.event_metadata[key]
            meta.id, meta.name, meta.display_name = key, name, display or name
            for stat_name, value in stats.items():
                stat = meta.stats.add(metadata_id=self.stat_id(stat_name))
                if isinstance(value, int):
                    stat.int64_value = value
                else:
                    stat.str_value = value
        return self.event_ids[name]

    def line(self, line_id: int, name: str, timestamp_ns: int):
        return self.plane.lines.add(id=line_id, display_id=line_id, name=name, display_name=name,
                                    timestamp_ns=timestamp_ns)

    def event(self, line, name_id: int, start_ps: int, duration_ps: int, **int_stats: int):
        event = line.events.add(metadata_id=name_id, offset_ps=start_ps, duration_ps=duration_ps)
        for stat_name, value in int_stats.items():
            event.stats.add(metadata_id=self.stat_id(stat_name), int64_value=value)
        return event


def tpu_xspace(layout: Layout, hostname: str = "tpu-vm-0"):
    space = xplane_pb2().XSpace()
    space.hostnames.append(hostname)
    ms = lambda value: int(round(value * PS_PER_MS))  # noqa: E731
    for core in range(layout.cores):
        plane = _Plane(space.planes.add(id=core, name=f"/device:TPU:{core}"))
        if layout.device_type:
            plane.plane.stats.add(metadata_id=plane.stat_id("device_type_string"), str_value=layout.device_type)
        steps = plane.line(1, "Steps", layout.start_ns)
        modules = plane.line(2, "XLA Modules", layout.start_ns)
        ops = plane.line(3, "XLA Ops", layout.start_ns)
        module = plane.event_id("jit_train_step(1234)")
        infeed = plane.event_id("infeed.1", "infeed.1", hlo_category="infeed", tf_op="IteratorGetNext",
                                shape_with_layout="(f32[128,784]{1,0}, s32[128]{0})")
        roofline = lambda flops, size: {"flops": flops, "bytes_accessed": size} if flops or size else {}  # noqa: E731
        conv = plane.event_id("convolution.7", "convolution.7", hlo_category="convolution",
                              tf_op="model/dense/MatMul",
                              shape_with_layout=f"{layout.matmul_dtype}[128,1024]{{1,0:T(8,128)}}",
                              **roofline(layout.matmul_flops, layout.matmul_bytes))
        fusion = plane.event_id("fusion.3", "fusion.3", hlo_category="non-fusion elementwise",
                                tf_op="model/dense/Relu", shape_with_layout="f32[128,1024]{1,0}",
                                **roofline(layout.other_flops, layout.other_bytes))
        all_reduce = plane.event_id("all-reduce.2", "all-reduce.2", hlo_category="all-reduce",
                                    tf_op="model/grads/psum", shape_with_layout="f32[1024,1024]{1,0}")
        outfeed = plane.event_id("outfeed.4", "outfeed.4", hlo_category="outfeed", shape_with_layout="f32[128]{0}")
        slow = layout.slow_core_ms if layout.slow_core >= 0 else 0.0
        matmul_ms = layout.matmul_ms + (slow if core == layout.slow_core else 0.0)
        collective_ms = layout.collective_ms + (0.0 if core == layout.slow_core else slow)
        t = 0
        for number in range(layout.steps):
            step_start = t
            plane.event(steps, plane.event_id(str(number)), step_start, ms(layout.step_ms), group_id=number)
            t += ms(layout.idle_ms)
            program = ms(layout.step_ms - layout.idle_ms)
            plane.event(modules, module, t, program, group_id=number)
            for op, duration in ((infeed, layout.infeed_ms), (conv, matmul_ms), (fusion, layout.other_ms),
                                 (all_reduce, collective_ms), (outfeed, layout.outfeed_ms)):
                if duration:
                    plane.event(ops, op, t, ms(duration), group_id=number)
                    t += ms(duration)
    if not layout.with_host:
        return space
    host = _Plane(space.planes.add(id=1000, name="/host:CPU"))
    python = host.line(10, "python", layout.start_ns)
    marker = host.event_id("train")
    get_next = host.line(11, "tf_data_iterator_get_next/1", layout.start_ns)
    for number in range(layout.steps):
        step_start = ms(number * layout.step_ms)
        host.event(python, marker, step_start, ms(layout.step_ms), step_num=number, _r=1)
        if layout.host_waits_in_idle and layout.idle_ms:
            host.event(get_next, host.event_id("IteratorGetNextOp::DoCompute"), step_start, ms(layout.idle_ms))
        if layout.host_compiles_in_idle and layout.idle_ms:
            host.event(python, host.event_id("backend_compile_and_load"), step_start, ms(layout.idle_ms))
        if layout.host_loader_in_idle:
            program_start = step_start + ms(layout.idle_ms)
            host.event(python, host.event_id("PjitFunction(train_step)"), program_start - ms(layout.dispatch_ms),
                       ms(layout.dispatch_ms))
            host.event(python, host.event_id("CommonPjRtBuffer::Await"), program_start,
                       ms(layout.step_ms - layout.idle_ms))
    return space


def write_run(folder: Path, spaces: dict[str, object]) -> Path:
    """A logdir with one run holding one `<host>.xplane.pb` per XSpace; returns the logdir."""
    run = Path(folder, "plugins", "profile", "2026_01_01_00_00_00")
    run.mkdir(parents=True, exist_ok=True)
    for host, space in spaces.items():
        (run / f"{host}.xplane.pb").write_bytes(space.SerializeToString())
    return Path(folder)
