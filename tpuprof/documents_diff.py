"""The `tpuprof.diff/1` document (without its schema line and caveats, which `Result.to_dict` adds), built in this
one place from the comparison tpuprof.analyses.diff.compare made (its metrics are `Metric` objects, turned into
their JSON here): `DiffResult.to_dict()` calls `document`; it reads nothing but the comparison."""

from __future__ import annotations


def document(result: dict) -> dict:
    groups = []
    for g in result["groups"]:
        out = {**g, "metrics": [m.to_json() for m in g["metrics"]]}
        groups.append(out)
    return {"kind": result["kind"], "a": result["a"], "b": result["b"], "identical": result["identical"],
            "summary": "no change" if result["identical"] else "changed", "groups": groups,
            "unpaired_groups": result["unpaired"], "thresholds": result["thresholds"],
            "regression": result["regression"]}
