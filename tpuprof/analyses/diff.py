"""What changed between two results of the same kind (memory, steps, preflight), and CI thresholds.

Works on the commands' --json documents, so that a dump and a saved `tpuprof memory --json` compare
alike. Sizes stay integer bytes; changes are B - A, percentages relative to A.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tpuprof.errors import UserError

MEMORY_METRICS = (
    ("peak_heap_bytes", "bytes"), ("peak_unpadded_heap_bytes", "bytes"), ("padding_at_peak_bytes", "bytes"),
    ("argument_bytes", "bytes"), ("output_bytes", "bytes"), ("temp_bytes", "bytes"), ("buffer_count", "count"),
)
PREFLIGHT_METRICS = (
    ("required_bytes", "bytes"), ("peak_heap_bytes", "bytes"), ("peak_unpadded_heap_bytes", "bytes"),
    ("argument_bytes", "bytes"), ("temp_bytes", "bytes"), ("max_batch_size", "count"),
)
# The step categories of `tpuprof analyze` (tpuprof.models.profile.CATEGORIES; repeated so that a diff does not
# import the analysis). Older --json documents lack host_transfer and collective: their metrics are n/a.
CATEGORIES = ("compute", "input", "host_transfer", "collective", "host_overhead", "compile", "other")
UNIT_BYTES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}  # powers of 1024, as XLA prints
# A per-example growth needs the batch dimension to explain most of the bytes whose shape changed.
BATCH_SHARE = 0.5


@dataclass
class Metric:
    name: str
    unit: str  # bytes | ms | percent | count
    a: float | None
    b: float | None

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def percent(self) -> float | None:
        """Relative change. None for shares (unit percent): those change in percentage points, and a relative
        change of a share (2 % -> 61 %: +2850 %) says nothing."""
        if self.change is None or self.unit == "percent":
            return None
        if self.a == 0:
            return 0.0 if self.b == 0 else math.copysign(math.inf, self.b)
        return 100.0 * self.change / abs(self.a)

    def to_json(self) -> dict:
        percent = self.percent
        return {"name": self.name, "unit": self.unit, "a": self.a, "b": self.b, "change": self.change,
                "percent": None if percent is None or math.isinf(percent) else round(percent, 2)}


# ---------------------------------------------------------------- metrics per kind

def _memory_groups(document: dict) -> list[tuple[str, dict]]:
    return [(m.get("name") or f"module {i}", m) for i, m in enumerate(document.get("modules", []))]


def _memory_metrics(module: dict) -> list[Metric]:
    metrics = [Metric(name, unit, module.get(name), None) for name, unit in MEMORY_METRICS]
    peak = module.get("peak_heap_bytes")
    if peak:
        metrics.append(Metric("padding_at_peak_percent", "percent",
                              round(100.0 * (module.get("padding_at_peak_bytes") or 0) / peak, 3), None))
    return metrics


# Another name for the same figure: one row per metric, either name works in --fail-if.
ALIASES = {"input_percent": "input_bound_percent"}


def _steps_metrics(document: dict) -> list[Metric]:
    """Step time and its shares. Nothing that grows with the length of the capture (the step count, totals):
    two captures of one job compare alike however long each ran."""
    steps = document.get("steps", {})
    metrics = [Metric(f"{name}", "ms", steps.get(name), None) for name in ("median_ms", "mean_ms", "p90_ms")]
    for category in CATEGORIES:
        name = ALIASES.get(f"{category}_percent", f"{category}_percent")  # input: XProf's input_bound_percent
        metrics.append(Metric(name, "percent", document.get("breakdown_percent", {}).get(category), None))
        metrics.append(Metric(f"{category}_ms_per_step", "ms",
                              document.get("breakdown_ms_per_step", {}).get(category), None))
    return metrics


def _batches_per_step(document: dict) -> int:
    """Batches one step runs (Keras steps_per_execution: the iterator's calls per step call); 1 when not said."""
    value = (document.get("steps") or {}).get("batches_per_step")
    return value if isinstance(value, (int, float)) and value >= 1 else 1


# A program's fingerprint (`jit_f(12190760917235803885)`) changes with every recompile of the same function.
_FINGERPRINT = re.compile(r"\(\d{6,}\)")


def _step_sources(document: dict) -> list[str]:
    """What each host's steps are (`executions of program `jit_f` of 4 TPU chip(s)`, `step markers `train``), once
    each, without program fingerprints: two captures whose steps are different programs compare different work."""
    found = [_FINGERPRINT.sub("", h.get("step_source") or "") for h in document.get("hosts", [])]
    return [s for s in dict.fromkeys(found) if s]


def _per_batch(a: dict, b: dict) -> list[Metric]:
    """Step time per batch, when a step of A or B runs several batches: one step of 64 batches against one of 1
    compares different work (spe1 -> spe64 read +4,720% step time where each batch got 25% faster)."""
    batches_a, batches_b = _batches_per_step(a), _batches_per_step(b)
    if batches_a == batches_b == 1:
        return []

    def per_batch(document: dict, name: str, batches: int) -> float | None:
        value = (document.get("steps") or {}).get(name)
        return None if value is None else round(value / batches, 3)

    return [Metric(f"{name}_per_batch", "ms", per_batch(a, name, batches_a), per_batch(b, name, batches_b))
            for name in ("median_ms", "mean_ms")]


def _groups(kind: str, document: dict) -> list[tuple[str, list[Metric], dict]]:
    if kind == "memory":
        return [(name, _memory_metrics(m), m) for name, m in _memory_groups(document)]
    if kind == "steps":
        return [("steps", _steps_metrics(document), document)]
    if kind == "preflight":
        return [(str(t.get("target")), [Metric(n, u, t.get(n), None) for n, u in PREFLIGHT_METRICS], t)
                for t in document.get("targets", [])]
    raise UserError(f"tpuprof diff compares dumps, profiles and preflight results, not {kind} inputs.")


def _pair(a: list, b: list) -> list[tuple]:
    """Pair groups by name; what is left pairs in order (module names carry run-specific ids)."""
    b_names = {g[0]: g for g in b}
    pairs, left_a = [], []
    for group in a:
        if group[0] in b_names:
            pairs.append((group, b_names.pop(group[0])))
        else:
            left_a.append(group)
    left_b = [g for g in b if g[0] in b_names]
    pairs += list(zip(left_a, left_b))
    return pairs


# ---------------------------------------------------------------- buffers

def _buffer_row(row: dict) -> dict:
    return {k: row.get(k) for k in ("instruction", "shape", "size_bytes", "padding_bytes", "op_name")}


def compare_buffers(a: dict, b: dict, top: int) -> dict:
    """Buffers that appear, disappear or change size, matched by HLO instruction name (stable for one program)."""
    a_rows = {r["instruction"]: r for r in a.get("buffers", [])}
    b_rows = {r["instruction"]: r for r in b.get("buffers", [])}
    appeared = sorted((r for k, r in b_rows.items() if k not in a_rows), key=lambda r: -r["size_bytes"])
    disappeared = sorted((r for k, r in a_rows.items() if k not in b_rows), key=lambda r: -r["size_bytes"])
    changed = []
    for key, row in a_rows.items():
        other = b_rows.get(key)
        if other is not None and (other["size_bytes"] != row["size_bytes"] or other["shape"] != row["shape"]):
            changed.append({"instruction": key, "a_shape": row["shape"], "b_shape": other["shape"],
                            "a_bytes": row["size_bytes"], "b_bytes": other["size_bytes"],
                            "change": other["size_bytes"] - row["size_bytes"], "op_name": other.get("op_name")})
    changed.sort(key=lambda r: -abs(r["change"]))
    # A saved --json lists only the top buffers: one missing from it may merely have fallen off the list.
    partial = any(len(d.get("buffers", [])) < (d.get("buffer_count") or 0) for d in (a, b))
    limit = top if top > 0 else None
    return {"appeared": [_buffer_row(r) for r in appeared[:limit]], "appeared_count": len(appeared),
            "disappeared": [_buffer_row(r) for r in disappeared[:limit]], "disappeared_count": len(disappeared),
            "changed": changed[:limit], "changed_count": len(changed), "partial": partial}


def compare_ops(a: dict, b: dict, top: int) -> list[dict]:
    """Top ops' self time per step (a capture's totals grow with its length; per step they compare).
    Ops use their time per step inside the measured steps (`self_ms_per_step`: a device op's per chip, averaged
    over chips, matched by HLO op; a host op's where the host measured the steps); a host op without it (steps
    measured on the chips) divides its self time over the capture by the steps. Only the ops in each report's top
    list are known: one missing from a list is `None`, not zero."""
    def per_step(document: dict) -> dict:
        steps = (document.get("steps") or {}).get("count") or 0
        found = {}
        for o in document.get("top_ops", []):
            key = (o["where"], o.get("hlo_op") or o["name"])
            if o.get("self_ms_per_step") is not None:
                found[key] = (o["self_ms_per_step"], o)
            elif steps:
                found[key] = (o["self_ms"] / steps, o)
        return found

    a_ops, b_ops = per_step(a), per_step(b)
    rows = []
    for key in dict.fromkeys([*a_ops, *b_ops]):
        ms_a, op_a = a_ops.get(key, (None, {}))
        ms_b, op_b = b_ops.get(key, (None, {}))
        change = None if ms_a is None or ms_b is None else ms_b - ms_a
        op = op_b or op_a
        row = {"where": key[0], "name": op.get("name", key[1]), "a_ms_per_step": ms_a, "b_ms_per_step": ms_b,
               "change_ms": change}
        if op.get("hlo_op"):
            row.update(hlo_op=op["hlo_op"], category=op.get("category"))
        rows.append(row)
    rows.sort(key=lambda r: -abs(r["change_ms"] if r["change_ms"] is not None
                                 else (r["a_ms_per_step"] or r["b_ms_per_step"] or 0)))
    return rows[: top if top > 0 else None]


_DIMS = re.compile(r"^\s*\w+\[([\d,]*)\]")


def _dims(shape: str | None) -> tuple[int, ...] | None:
    match = _DIMS.match(shape or "")
    if not match or any(len(d) > 19 for d in match.group(1).split(",")):  # past int64: not a real shape
        return None
    return tuple(int(d) for d in match.group(1).split(",") if d)


def infer_batches(a: dict, b: dict) -> tuple[int, int, str] | None:
    """(batch A, batch B, evidence) from the one dimension that differs in most bytes of the same buffers."""
    a_rows = {r["instruction"]: r for r in a.get("buffers", [])}
    weights: dict[tuple[int, int], int] = {}
    changed_bytes = 0
    for row in b.get("buffers", []):
        other = a_rows.get(row["instruction"])
        if other is None or other["shape"] == row["shape"]:
            continue
        da, db = _dims(other["shape"]), _dims(row["shape"])
        if da is None or db is None or len(da) != len(db):
            continue
        changed_bytes += row["size_bytes"]
        differing = [(x, y) for x, y in zip(da, db) if x != y]
        if len(differing) == 1:
            weights[differing[0]] = weights.get(differing[0], 0) + row["size_bytes"]
    if not weights or not changed_bytes:
        return None
    (batch_a, batch_b), weight = max(weights.items(), key=lambda item: item[1])
    if weight < BATCH_SHARE * changed_bytes:
        return None
    share = weight / changed_bytes
    return batch_a, batch_b, (f"inferred from the shapes: one dimension goes {batch_a} -> {batch_b} in "
                              f"{share:.0%} of the bytes of the buffers whose shape changed")


def per_example(a: dict, b: dict, batch_a: int, batch_b: int, evidence: str,
                key: str = "peak_heap_bytes") -> dict | None:
    """Memory = fixed + per_example * batch, through the two points; and the batch that fits, if linear."""
    if batch_a == batch_b:
        return None
    peak_a, peak_b = a.get(key), b.get(key)
    if peak_a is None or peak_b is None:
        return None
    slope = (peak_b - peak_a) / (batch_b - batch_a)
    fixed = peak_a - slope * batch_a
    out = {"measure": key, "batch_a": batch_a, "batch_b": batch_b, "evidence": evidence,
           "per_example_bytes": int(round(slope)), "fixed_bytes": int(round(fixed))}
    unpadded_a, unpadded_b = a.get("peak_unpadded_heap_bytes"), b.get("peak_unpadded_heap_bytes")
    if unpadded_a is not None and unpadded_b is not None:
        out["per_example_unpadded_bytes"] = int(round((unpadded_b - unpadded_a) / (batch_b - batch_a)))
    if fixed < 0:
        # Memory does not grow linearly between the two points (padding steps, a different schedule): a line through
        # them is no answer, and no batch is extrapolated from it.
        out["not_linear"] = True
        return out
    capacity = b.get("hbm_capacity_bytes") or a.get("hbm_capacity_bytes")
    if capacity and slope > 0:
        out["hbm_capacity_bytes"] = capacity
        out["largest_batch_if_linear"] = int((capacity - fixed) // slope)
    return out


def _method(module: dict) -> str | None:
    """How a memory module's figures were obtained (tpuprof.models.memory's methods); older documents say only
    whether they are estimated."""
    if module.get("method"):
        return module["method"]
    if module.get("estimated") is not None:
        return "estimate" if module["estimated"] else "buffer_assignment"
    return None


# ---------------------------------------------------------------- the diff

def compare(kind: str, a_doc: dict, b_doc: dict, top: int = 10, batches: tuple[int, int] | None = None,
            batch_source: str = "") -> dict:
    a_groups, b_groups = _groups(kind, a_doc), _groups(kind, b_doc)
    if not a_groups or not b_groups:
        raise UserError("nothing to compare: one of the inputs has no module, step report or target.")
    groups = []
    for (a_name, a_metrics, a_raw), (b_name, b_metrics, b_raw) in _pair(a_groups, b_groups):
        b_values = {m.name: m.a for m in b_metrics}
        metrics = [Metric(m.name, m.unit, m.a, b_values.get(m.name)) for m in a_metrics]
        group = {"name": b_name if a_name == b_name else f"{a_name} -> {b_name}", "a_name": a_name,
                 "b_name": b_name, "metrics": metrics}
        if kind == "memory":
            group["methods"] = {"a": _method(a_raw), "b": _method(b_raw)}
            group["buffers"] = compare_buffers(a_raw, b_raw, top)
            found = (batches[0], batches[1], batch_source) if batches else infer_batches(a_raw, b_raw)
            group["per_example"] = per_example(a_raw, b_raw, *found) if found else None
        if kind == "preflight":
            sizes = (a_raw.get("batch_size"), b_raw.get("batch_size"))
            group["per_example"] = per_example(a_raw, b_raw, *sizes, "the compiled batch sizes",
                                               key="required_bytes") if all(sizes) else None
        if kind == "steps":
            metrics[3:3] = _per_batch(a_raw, b_raw)  # beside the step times they divide
            group["batches_per_step"] = {"a": _batches_per_step(a_raw), "b": _batches_per_step(b_raw)}
            group["step_sources"] = {"a": _step_sources(a_raw), "b": _step_sources(b_raw)}
            group["verdict"] = {"a": a_raw.get("verdict"), "b": b_raw.get("verdict")}
            # Context, not a metric: how many steps each capture measured depends on how long it ran.
            group["steps_measured"] = {"a": (a_raw.get("steps") or {}).get("count"),
                                       "b": (b_raw.get("steps") or {}).get("count")}
            group["ops"] = compare_ops(a_raw, b_raw, top)
        groups.append(group)
    unpaired = abs(len(a_groups) - len(b_groups))
    identical = (not unpaired and all(m.change in (0, None) for g in groups for m in g["metrics"])
                 and all(not (g.get("buffers") or {}).get(k) for g in groups
                         for k in ("appeared", "disappeared", "changed"))
                 and all((g.get("verdict") or {}).get("a") == (g.get("verdict") or {}).get("b") for g in groups))
    return {"kind": kind, "groups": groups, "unpaired": unpaired, "identical": identical}


# ---------------------------------------------------------------- thresholds

_THRESHOLD = re.compile(
    r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|>|<)\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|[kmgt]i?b?|b|ms|s)?\s*$",
    re.IGNORECASE)


@dataclass
class Threshold:
    expression: str
    metric: str
    op: str
    limit: float
    on: str  # percent (relative change) | change (absolute change) | value (B's value)

    def trips(self, metric: Metric) -> bool | None:
        value = printed(metric, self.on)
        if value is None:
            return None
        return {">": value > self.limit, ">=": value >= self.limit, "<": value < self.limit,
                "<=": value <= self.limit}[self.op]


# Decimals of each figure as `tpuprof diff` prints it: a threshold compares the printed figure, so that a
# change shown as +99.0% trips `>=+99%` (the exact change may be +98.996 %). Sizes and counts are exact.
PRINTED_DECIMALS = {"relative": 1, "percent": 1, "ms": 3}


def printed(metric: Metric, on: str) -> float | None:
    """METRIC's relative change, change or B value (ON: percent | change | value), rounded as printed."""
    value = {"percent": metric.percent, "change": metric.change, "value": metric.b}[on]
    if value is None or math.isinf(value):
        return value
    decimals = PRINTED_DECIMALS["relative"] if on == "percent" else PRINTED_DECIMALS.get(metric.unit)
    return round(value, decimals) if decimals is not None else value


def parse_threshold(expression: str) -> Threshold:
    """`peak_heap_bytes>+5%` (relative change), `median_ms>+2` / `temp_bytes>+100M` (absolute change, signed),
    `input_bound_percent>20` / `peak_heap_bytes>14G` (B's value, unsigned)."""
    match = _THRESHOLD.match(expression)
    if not match:
        raise UserError(f"cannot read --fail-if {expression!r}: write METRIC>+5% (relative change), "
                        "METRIC>+2 (absolute change) or METRIC>20 (the new value).")
    metric, op, sign, number, unit = match.groups()
    limit = float(number) * (-1 if sign == "-" else 1)
    unit = (unit or "").lower()
    if unit == "%":
        return Threshold(expression, metric, op, limit, "percent")
    if unit == "s":
        limit *= 1000.0  # metrics are in ms
    elif unit and unit != "ms":
        limit *= UNIT_BYTES[unit[0]]
    return Threshold(expression, metric, op, limit, "change" if sign else "value")


def evaluate(diff: dict, thresholds: list[Threshold]) -> list[dict]:
    names = sorted({m.name for g in diff["groups"] for m in g["metrics"]})
    units = {m.name: m.unit for g in diff["groups"] for m in g["metrics"]}
    results = []
    for threshold in thresholds:
        name = ALIASES.get(threshold.metric, threshold.metric)
        if name not in names:
            raise UserError(f"--fail-if {threshold.expression!r}: no metric {threshold.metric!r} in a "
                            f"{diff['kind']} diff; metrics: {', '.join(names)}.")
        if threshold.on == "percent" and units[name] == "percent":
            raise UserError(f"--fail-if {threshold.expression!r}: {name} is a share, compared in percentage "
                            f"points: write {name}>+5 (B - A, in points) or {name}>20 (B's value).")
        for group in diff["groups"]:
            metric = next(m for m in group["metrics"] if m.name == name)
            tripped = threshold.trips(metric)
            seen = printed(metric, threshold.on)
            results.append({"expression": threshold.expression, "group": group["name"], "metric": metric.name,
                            "on": threshold.on, "limit": threshold.limit, "a": metric.a, "b": metric.b,
                            "change": metric.change,
                            "percent": None if metric.percent is None or math.isinf(metric.percent)
                            else round(metric.percent, 2),
                            "compared": None if seen is None or math.isinf(seen) else seen,
                            "tripped": bool(tripped), "evaluated": tripped is not None})
    return results
