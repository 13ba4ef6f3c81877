"""Ops by self time: XLA ops on TPU cores (with their framework op) and ops run on the host
(TensorFlow kernels `scope/name:Type`, XLA:CPU thunks), plus the share of matmul time in 32 bits."""

from __future__ import annotations

import re

import numpy as np

from tpuprof.analyses.timeline import Line, read_line, self_times
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


def _stats(plane, meta) -> dict[str, object]:
    names = {k: m.name for k, m in plane.stat_metadata.items()}
    result = {}
    for stat in meta.stats:
        kind = stat.WhichOneof("value")
        value = names.get(stat.ref_value, "") if kind == "ref_value" else getattr(stat, kind) if kind else None
        result[names.get(stat.metadata_id, "")] = value
    return result


def _aggregate(rows: dict[tuple[str, str], list[int]], line: Line, idx: np.ndarray, label) -> None:
    if not len(idx):
        return
    own = self_times(line.start[idx], line.end[idx])
    mid = line.mid[idx]
    for key in np.unique(mid).tolist():
        mask = mid == key
        name, kind = label(key)
        entry = rows.setdefault((name, kind), [0, 0])
        entry[0] += int(mask.sum())
        entry[1] += int(own[mask].sum())


def host_ops(plane, lines: list[Line]) -> list[Op]:
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
        _aggregate(rows, line, line.select(ids), labels.__getitem__)
    return [Op(name=n, kind=k, where="host", count=c, self_ps=s) for (n, k), (c, s) in rows.items()]


def _op_lines(planes):
    for plane in planes:
        for line in plane.lines:
            if line.name == "XLA Ops" and len(line.events):
                yield plane, read_line(line)


def device_ops(planes) -> list[Op]:
    rows: dict[tuple[str, str], list[int]] = {}
    for plane, line in _op_lines(planes):
        labels = {}
        for key, meta in plane.event_metadata.items():
            stats = _stats(plane, meta)
            name = stats.get("tf_op") or meta.display_name or meta.name
            labels[key] = (str(name), str(stats.get("hlo_category") or "xla"))
        _aggregate(rows, line, np.arange(len(line.mid)), labels.__getitem__)
    return [Op(name=n, kind=k, where="device", count=c, self_ps=s) for (n, k), (c, s) in rows.items()]


def matmul_precision(planes) -> tuple[int, int]:
    """(device ps in matmuls/convolutions, of which with a 32-bit result) from the TPU op lines."""
    total = wide = 0
    for plane, line in _op_lines(planes):
        kinds = {}
        for key, meta in plane.event_metadata.items():
            stats = _stats(plane, meta)
            category = str(stats.get("hlo_category") or "").lower()
            text = " ".join(str(stats.get(k) or "") for k in ("shape_with_layout", "long_name")) + " " + meta.name
            if category in MATMUL_CATEGORIES or (not category and MATMUL_NAME.search(meta.display_name or meta.name)):
                found = RESULT_TYPE.search(text)
                kinds[key] = found.group(1) if found else ""
        if not kinds:
            continue
        own = self_times(line.start, line.end)
        for key, dtype in kinds.items():
            spent = int(own[line.mid == key].sum())
            total += spent
            if dtype in WIDE_TYPES:
                wide += spent
    return total, wide
