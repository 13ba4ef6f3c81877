"""A roofline from the capture: each device op's and the program's FLOP/s and bytes/s against the chip's roofs.

Per op, as XProf's roofline_model measures them: FLOPs and bytes accessed per occurrence come from the
capture (op metadata, or per-event stats), times from the ops' self time on the device clock, over every
occurrence on every chip; achieved FLOP/s = FLOPs / time, bytes/s = bytes accessed / time, operational
intensity = FLOPs / HBM bytes. The roofs are the chip's published peaks (tpuprof.targets): an op whose
intensity is above the ridge point (peak FLOP/s / HBM bandwidth) is compute-bound and judged against the
peak FLOP/s, below it HBM-bound and judged against the HBM bandwidth. Where tpuprof differs from XProf:

- copies between host memory and HBM are judged against the host link, not HBM (XProf calls them HBM-bound);
- `-start` ops only issue asynchronous work and return: their bytes move while other ops run, so they get
  no rate (XProf divides 5 GiB by a few nanoseconds); the matching `-done` carries the wait, unless the
  transfer finished before it (a rate above the fastest roof: no rate either);
- collectives move data over the chip interconnect (ICI): bound "ICI", not judged against HBM;
- Pallas and other custom calls whose operands chain like a matmul get 2*M*K*N FLOPs (XProf shows 0),
  marked as estimated in `flops_source`.

For the program: FLOPs and HBM bytes per step per chip (ops inside the measured steps, averaged over chips)
over the mean step time, and MFU = model FLOPs per step / (step time x peak FLOP/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuprof import targets
from tpuprof.models.profile import Op


@dataclass
class Roof:
    device_kind: str
    peak_flops_per_s: float | None
    peak_hbm_bytes_per_s: float | None
    host_link_bytes_per_s: float | None
    host_link: str
    source: str  # where the peaks come from

    @property
    def ridge(self) -> float | None:
        if not self.peak_flops_per_s or not self.peak_hbm_bytes_per_s:
            return None
        return self.peak_flops_per_s / self.peak_hbm_bytes_per_s


def roof_for(kind: str) -> Roof:
    if kind not in targets.TARGETS:
        return Roof(kind, None, None, None, "", f"no published peaks for {kind!r} in tpuprof.targets")
    target = targets.TARGETS[kind]
    # A capture has one plane per device: a TensorCore on v2, v3 and TPU7x (two per chip), a chip on the others
    # (v4 and v5p devices are megacore chips).
    share = target.devices_per_chip
    link = target.host_link_gbps * 1e9 if target.host_link_gbps else None
    source = f"tpuprof.targets: {kind} peak {target.peak_bf16_tflops:g} TFLOP/s bf16, HBM {target.hbm_gbps:g} GB/s per chip"
    if share > 1:
        source += f", halved: a {kind} capture has one plane per TensorCore ({share} per chip)"
    return Roof(kind, target.peak_bf16_tflops * 1e12 / share, target.hbm_gbps * 1e9 / share, link,
                target.host_link, source)


@dataclass
class OpRoofline:
    flops_per_s: float | None
    bytes_per_s: float | None
    hbm_bytes_per_s: float | None
    intensity: float | None  # FLOPs per HBM byte
    bound: str | None  # compute | HBM | host link | ICI | None (nothing to judge)
    percent_of_roof: float | None
    note: str = ""


def op_roofline(op: Op, roof: Roof) -> OpRoofline:
    seconds = op.self_ps / 1e12
    if op.async_start:
        return OpRoofline(None, None, None, None, None, None,
                          "issues an asynchronous transfer and returns; its bytes move while other ops run "
                          "(the matching -done op waits for them)")
    if seconds <= 0 or (not op.flops and not op.bytes_accessed):
        return OpRoofline(None, None, None, None, None, None, "no time, FLOPs or bytes in the capture")
    flops_per_s = op.flops * op.count / seconds
    # No bytes in the capture (a Pallas kernel, a custom call): a rate not measured, not 0 B/s.
    bytes_per_s = op.bytes_accessed * op.count / seconds if op.bytes_accessed else None
    hbm = op.hbm_bytes if op.hbm_bytes is not None else op.bytes_accessed
    hbm_per_s = hbm * op.count / seconds if hbm else None
    intensity = op.flops / hbm if hbm else None
    # A wait shorter than the bytes could take at the fastest memory's peak does not time the transfer: it
    # moved while other ops ran (an overlapped copy whose -done finds it finished). XProf divides anyway.
    fastest = max(filter(None, (roof.peak_hbm_bytes_per_s, roof.host_link_bytes_per_s)), default=None)
    if op.category in ("host_transfer", "collective") and fastest and bytes_per_s and bytes_per_s > fastest:
        return OpRoofline(None, None, None, intensity, None, None,
                          "finished while other ops ran (overlapped): its wait does not time the transfer")
    if op.category == "host_transfer":
        percent = 100.0 * bytes_per_s / roof.host_link_bytes_per_s if roof.host_link_bytes_per_s and bytes_per_s \
            else None
        # FLOPs per HBM byte places compute on the HBM roofline; a copy over the host link has no place there.
        return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, None, "host link", percent,
                          f"judged against the host link ({roof.host_link})" if roof.host_link else
                          "host link bandwidth not published for this generation")
    if op.category == "collective":
        return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, intensity, "ICI", None,
                          "moves data between chips over the interconnect: not judged against HBM")
    if roof.ridge is None:
        return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, intensity, None, None, roof.source)
    if intensity is not None and intensity >= roof.ridge:
        return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, intensity, "compute",
                          100.0 * flops_per_s / roof.peak_flops_per_s, _precision_note(op))
    if hbm:
        return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, intensity, "HBM",
                          100.0 * hbm_per_s / roof.peak_hbm_bytes_per_s)
    # FLOPs and no bytes: the capture does not say what the op read (a Pallas kernel); only the compute roof.
    return OpRoofline(flops_per_s, bytes_per_s, hbm_per_s, intensity, "compute",
                      100.0 * flops_per_s / roof.peak_flops_per_s,
                      "; ".join(filter(None, ("no bytes in the capture: judged against the compute roof only",
                                              _precision_note(op)))))


def _precision_note(op: Op) -> str:
    if "f32[" in op.shape or op.shape.startswith("f32"):
        return "f32 result: the MXU runs 32-bit matmuls in several bf16 passes, so the bf16 peak overstates its roof"
    return ""


@dataclass
class ProgramRoofline:
    roof: Roof
    step_ms: float
    flops_per_step: float
    model_flops_per_step: float
    hbm_bytes_per_step: float | None  # None: no op in the steps has bytes in the capture (not measured)
    host_transfer_bytes_per_step: float

    @property
    def flops_per_s(self) -> float | None:
        return self.flops_per_step / (self.step_ms / 1e3) if self.step_ms else None

    @property
    def hbm_bytes_per_s(self) -> float | None:
        return self.hbm_bytes_per_step / (self.step_ms / 1e3) if self.step_ms and self.hbm_bytes_per_step else None

    @property
    def mfu_percent(self) -> float | None:
        if not self.step_ms or not self.roof.peak_flops_per_s:
            return None
        return 100.0 * self.model_flops_per_step / (self.step_ms / 1e3) / self.roof.peak_flops_per_s


def program_roofline(device_ops: list[Op], chip_steps: int, step_ms: float, roof: Roof) -> ProgramRoofline:
    """FLOPs and bytes per step per chip from the ops inside the measured steps (averaged over chips)."""
    flops = model = hbm = host = 0.0
    for op in device_ops:
        flops += op.flops * op.step_count
        model += op.model_flops * op.step_count
        if op.hbm_bytes is not None:
            hbm += op.hbm_bytes * op.step_count
        elif not op.async_start and op.category != "host_transfer":
            hbm += op.bytes_accessed * op.step_count
        if op.category == "host_transfer" and op.transfer and not op.async_start:
            host += op.bytes_accessed * op.step_count
    steps = max(chip_steps, 1)
    return ProgramRoofline(roof, step_ms, flops / steps, model / steps, hbm / steps if hbm else None, host / steps)
