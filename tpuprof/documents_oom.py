"""The `tpuprof.oom/1` document (without its schema line and caveats, which `Result.to_dict` adds), built in this
one place from the oom pipeline's typed answer: the report (tpuprof.models.oom.OomReport), the batch estimate, the
suggestions and the dump join. `tpuprof oom`, `report` and the Python API call `document`; it reads models only."""

from __future__ import annotations


def document(report, estimate, suggestions: list[dict], joined: dict | None) -> dict:
    out = report.to_json()
    out["batch_estimate"] = estimate.to_json()
    out["suggestions"] = suggestions
    if joined is not None:
        out["dump"] = joined
    return out
