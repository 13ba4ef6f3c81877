"""Ops by self time: XLA ops on TPU cores (with their framework op) and ops run on the host
(TensorFlow kernels `scope/name:Type`, XLA:CPU thunks), plus the share of matmul time in 32 bits."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tpuprof.analyses.timeline import Line, distinct, self_times
from tpuprof.models.profile import Op

TF_OP = re.compile(r"^([^ :]+):([A-Za-z_]\w*)$")
XLA_CPU_LINE = re.compile(r"^tf_XLA")
NOT_OP = re.compile(r"^(ThreadpoolListener|MutexLock|end: |Memory|SlinkyThreadPool|ThunkExecutor|H2D Dispatch|"
                    r"D2H|ExecutorState|ExecutorDoneCallback)")
MATMUL_CATEGORIES = {"convolution", "convolution fusion", "matmul", "dot", "output fusion"}
MATMUL_NAME = re.compile(r"(?i)(^|[%.\s])(convolution|dot|matmul)")
RESULT_TYPE = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u8|u16|u32|u64|f8\w*|bf16|f16|f32|f64|c64|c128)\[")
WIDE_TYPES = {"f32", "f64", "c64", "c128", "s32"}


CONTROL_FLOW = re.compile(r"^(StatefulPartitionedCall|PartitionedCall|while|body|cond|then|else|_\d+)$")


def framework_name(scope: str) -> str:
    """`while/body/_1/while/cond/then/_95/sequential/dense/Relu` -> `sequential/dense/Relu`: the layer, without
    the function-call and control-flow scopes that tf.function and steps_per_execution loops wrap it in."""
    parts = scope.split("/")
    for i, part in enumerate(parts[:-1]):
        if not CONTROL_FLOW.match(part):
            return "/".join(parts[i:])
    return parts[-1]


def _stats(plane, meta, names: dict[int, str] | None = None) -> dict[str, object]:
    names = names if names is not None else {k: m.name for k, m in plane.stat_metadata.items()}
    result = {}
    for stat in meta.stats:
        kind = stat.WhichOneof("value")
        value = names.get(stat.ref_value, "") if kind == "ref_value" else getattr(stat, kind) if kind else None
        result[names.get(stat.metadata_id, "")] = value
    return result


def _aggregate(rows: dict[tuple[str, str], list[int]], line: Line, idx: np.ndarray, label,
               window: tuple[int, int] | None) -> None:
    if not len(idx):
        return
    own = self_times(line.start[idx], line.end[idx])
    mid = line.mid[idx]
    inside = (line.start[idx] >= window[0]) & (line.start[idx] < window[1]) if window else np.zeros(len(idx), bool)
    for key in distinct(mid):
        mask = mid == key
        name, kind = label(key)
        entry = rows.setdefault((name, kind), [0, 0, 0, 0])
        entry[0] += int(mask.sum())
        entry[1] += int(own[mask].sum())
        entry[2] += int((mask & inside).sum())
        entry[3] += int(own[mask & inside].sum())


def host_ops(plane, lines: list[Line], window: tuple[int, int] | None = None) -> list[Op]:
    """Host ops by self time over the capture; with WINDOW, the measured steps' span on the host's clock (start,
    end in ps), also their count and self time inside it (`step_count`, `step_self_ps`): a capture holds parts
    of steps before and after the measured ones, whose ops a division of the whole by the steps would count."""
    labels: dict[int, tuple[str, str]] = {}
    xla_ids = set()
    for key, meta in plane.event_metadata.items():
        match = TF_OP.match(meta.name)
        if match:
            labels[key] = (framework_name(match.group(1)), match.group(2))
        elif meta.name and not NOT_OP.match(meta.name):
            xla_ids.add(key)
            labels[key] = (meta.name, "XLA:CPU")
    tf_ids = set(labels) - xla_ids
    rows: dict[tuple[str, str], list[int]] = {}
    for line in lines:
        ids = tf_ids | (xla_ids if XLA_CPU_LINE.match(line.name) else set())
        _aggregate(rows, line, line.select(ids), labels.__getitem__, window)
    return [Op(name=n, kind=k, where="host", count=c, self_ps=s, step_count=sc, step_self_ps=ss)
            for (n, k), (c, s, sc, ss) in rows.items()]


# --------------------------------------------------------------------------------------------------
# TPU device ops: one row per HLO instruction, with what the capture says about it.

# `S(5)` in a layout is XLA's host memory space (xla::Layout::kHostMemorySpace: pinned host memory).
HOST_MEMORY = "S(5)"
ARRAY = re.compile(r"\b[a-z]\w*\[[\d,]*\](?:\{[^}]*\})?")
# `%name = <result shape> opcode(<operands>), attributes`: the opcode is the first ` word(` after the result.
INSTRUCTION = re.compile(r"^%?(?P<name>[\w.\-]+) = (?P<result>.*?) (?P<opcode>[a-z][a-z0-9\-]*)\((?P<rest>.*)$", re.S)
COLLECTIVE = re.compile(r"(?i)^(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all|ragged-all-to-all|"
                        r"collective-broadcast|send|recv|megascale|dcn)")
COLLECTIVE_CATEGORY = re.compile(r"(?i)all-reduce|all-gather|reduce-scatter|collective|all-to-all|megascale|dcn")
INFEED_OP = re.compile(r"(?i)^infeed")
HOST_OPS = re.compile(r"(?i)^(outfeed|host-compute|move-?to-?host|move-?to-?device)")
# The HBM entry of XProf's MemoryAccessBreakdown (op_metrics.proto: MEMORY_SPACE_HBM = 1).
HBM_SPACE = 1


@dataclass
class DeviceOpInfo:
    """One HLO instruction of a TPU plane's `XLA Ops` line (one event metadata entry)."""

    hlo_op: str
    framework_op: str
    hlo_category: str
    category: str  # compute | host_transfer | collective | input
    program: str
    shape: str
    flops: float = 0.0
    model_flops: float = 0.0
    bytes_accessed: float = 0.0
    hbm_bytes: float | None = None
    flops_source: str = ""
    transfer: str = ""  # to_device | to_host
    async_start: bool = False
    matmul: bool = False
    wide_result: bool = False  # a 32/64-bit result type


def _hbm_bytes(raw: bytes) -> float | None:
    """HBM bytes from a `memory_access_breakdown` stat (XProf's MemoryAccessBreakdown proto), if readable."""
    try:
        from xprof.protobuf import op_metrics_pb2
    except ImportError:
        return None
    breakdown = op_metrics_pb2.MemoryAccessBreakdown()
    try:
        breakdown.ParseFromString(raw)
    except Exception:  # noqa: BLE001 - a foreign or truncated stat: the breakdown is unknown, not an error
        return None
    return float(sum(m.bytes_accessed for m in breakdown.memory_accessed if m.memory_space == HBM_SPACE))


def matmul_estimate(text: str) -> float | None:
    """FLOPs of a custom call whose two operands chain like a matmul, (..., M, K) x (..., K, N) -> (..., M, N):
    2 * M * K * N per batch element. Pallas kernels carry no FLOPs in XProf; this is an estimate."""
    match = INSTRUCTION.match(text)
    if not match:
        return None
    dims = lambda shape: [int(d) for d in re.match(r"\w+\[([\d,]*)\]", shape).group(1).split(",") if d]  # noqa: E731
    result = ARRAY.findall(match.group("result"))
    operands = ARRAY.findall(match.group("rest").split("), ")[0])
    if len(result) != 1 or len(operands) != 2:
        return None
    out, a, b = dims(result[0]), dims(operands[0]), dims(operands[1])
    if len(a) < 2 or len(a) != len(b) or len(out) != len(a) or a[:-2] != b[:-2] or out[:-2] != a[:-2]:
        return None
    m, k, k2, n = a[-2], a[-1], b[-2], b[-1]
    if k != k2 or out[-2:] != [m, n]:
        return None
    batch = int(np.prod(a[:-2])) if len(a) > 2 else 1
    return 2.0 * batch * m * k * n


def _classify(opcode: str, hlo_category: str, text: str, result: str, operands: str) -> tuple[str, str]:
    """(category, transfer direction) of one HLO instruction."""
    destination = ARRAY.search(result)
    if destination and HOST_MEMORY in destination.group(0):
        return "host_transfer", "to_host"
    if HOST_MEMORY in operands:
        return "host_transfer", "to_device"
    if INFEED_OP.match(opcode) or hlo_category == "infeed":
        return "input", ""
    if HOST_OPS.match(opcode) or hlo_category == "outfeed" or "is_host_transfer=true" in text:
        return "host_transfer", ""
    if COLLECTIVE.match(opcode) or COLLECTIVE_CATEGORY.search(hlo_category):
        return "collective", ""
    return "compute", ""


def _count(value) -> float:
    """A FLOP or byte count from an op's stats: a finite non-negative number, else 0 (a damaged capture can hold a
    string, a NaN or a negative value there)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**63:
        return 0.0
    return float(value)


def device_op_infos(plane) -> dict[int, DeviceOpInfo]:
    """What the plane's event metadata say about each HLO instruction (flops, bytes, category, shape)."""
    names = {k: m.name for k, m in plane.stat_metadata.items()}
    programs = {}
    infos = {}
    for key, meta in plane.event_metadata.items():
        stats = _stats(plane, meta, names)
        text = meta.name if " = " in meta.name else str(stats.get("long_name") or meta.name)
        match = INSTRUCTION.match(text)
        hlo_op = meta.display_name or (match.group("name") if match else meta.name)
        opcode = match.group("opcode") if match else re.sub(r"\.\d+$", "", hlo_op)
        result = match.group("result") if match else str(stats.get("shape_with_layout") or "")
        operands = match.group("rest").split("), ")[0] if match else ""
        hlo_category = str(stats.get("hlo_category") or "").lower()
        category, transfer = _classify(opcode, hlo_category, text, result, operands)
        shape = str(stats.get("shape_with_layout") or (ARRAY.search(result).group(0) if ARRAY.search(result) else ""))
        flops = _count(stats.get("flops"))
        info = DeviceOpInfo(
            hlo_op=hlo_op, framework_op=str(stats.get("tf_op") or "").rstrip(":") or hlo_op,
            hlo_category=hlo_category or opcode, category=category,
            program=programs.setdefault(stats.get("program_id"), str(stats.get("program_id") or "")),
            shape=shape, flops=flops, model_flops=_count(stats.get("model_flops")) or flops,
            bytes_accessed=_count(stats.get("bytes_accessed")),
            hbm_bytes=_hbm_bytes(stats["memory_access_breakdown"])
            if isinstance(stats.get("memory_access_breakdown"), bytes) else None,
            flops_source="capture (op metadata)" if flops else "",
            transfer=transfer, async_start=opcode.endswith("-start"))
        if hlo_category in MATMUL_CATEGORIES or (not hlo_category and MATMUL_NAME.search(hlo_op)):
            found = RESULT_TYPE.search(" ".join((shape, text)))
            info.matmul = True
            info.wide_result = bool(found and found.group(1) in WIDE_TYPES)
        if opcode == "custom-call":
            estimate = matmul_estimate(text)
            if estimate:
                info.flops = info.model_flops = estimate
                info.flops_source = ("estimated: a custom call whose operands chain like a matmul "
                                     "(..., M, K) x (..., K, N), 2*M*K*N")
        infos[key] = info
    return infos


def fill_from_events(plane, line: Line, infos: dict[int, DeviceOpInfo]) -> None:
    """Some captures put flops and bytes on each event rather than on the op's metadata (Pallas kernels with
    kernel profiling on): take them from the first event of each op that lacks them."""
    from tpuprof.sources.xplane import event_stats

    names = {k: m.name for k, m in plane.stat_metadata.items()}
    present = set(line.first_stats)
    missing = {k for k, info in infos.items() if k in present and (not info.bytes_accessed or not info.flops)}
    if not missing:
        return
    for key in missing:
        values = {names.get(s.metadata_id): s for s in event_stats(_Event(line.first_stats[key]))}
        info = infos[key]
        number = lambda stat: float(getattr(stat, stat.WhichOneof("value") or "int64_value", 0) or 0)  # noqa: E731
        if not info.flops and "flops" in values and number(values["flops"]):
            info.flops = number(values["flops"])
            info.model_flops = number(values["model_flops"]) if "model_flops" in values else info.flops
            info.flops_source = "capture (per-event stat)"
        if not info.bytes_accessed and "bytes_accessed" in values:
            info.bytes_accessed = number(values["bytes_accessed"])


@dataclass
class _Event:
    stats: list  # raw XStat bytes (the first event of an op, kept by timeline.read_line)


def matmul_precision_of(infos: dict[int, DeviceOpInfo], mid: np.ndarray, own: np.ndarray) -> tuple[int, int]:
    """(ps in matmuls/convolutions, of which with a 32-bit result) on one op line."""
    total = wide = 0
    for key, info in infos.items():
        if not info.matmul:
            continue
        spent = int(own[mid == key].sum())
        total += spent
        if info.wide_result:
            wide += spent
    return total, wide
