"""The `tpuprof.analyze/1` document (without its schema line and caveats, which `Result.to_dict` adds), built in this
one place from the analyze pipeline's typed summary (tpuprof.analyses.summary.ProfileSummary, passed in: this
module imports models alone). `AnalyzeResult.to_dict()` (the CLI, the API, `capture`) calls `document`; `report` and
`diff` call `page_document`, which adds what the report page draws beyond it (every step, every rated op)."""

from __future__ import annotations

from tpuprof.models.profile import CATEGORIES


def _ms(ps: int | float) -> float:
    return round(ps / 1e9, 3)


def _rate(value: float | None, digits: int = 0):
    return None if value is None else round(float(value), digits) if digits else int(round(float(value)))


def op_json(report, o) -> dict:
    row = {"name": o.name, "kind": o.kind, "where": o.where, "count": o.count, "self_ms": _ms(o.self_ps)}
    per_step = report.ms_per_step(o)
    if o.where != "device":
        if per_step is not None:
            row["self_ms_per_step"] = round(per_step, 4)
        return row
    rates = report.rates(o)
    row.update({
        "hlo_op": o.hlo_op, "category": o.category, "program": o.program, "shape": o.shape,
        "self_ms_per_step": None if per_step is None else round(per_step, 4),
        "flops": int(round(o.flops)), "bytes_accessed": int(round(o.bytes_accessed)),
        "flops_source": o.flops_source or None,
        "flops_per_s": _rate(rates.flops_per_s) if rates else None,
        "bytes_per_s": _rate(rates.bytes_per_s) if rates else None,
        "intensity": _rate(rates.intensity, 4) if rates else None,
        "bound": rates.bound if rates else None,
        "percent_of_roof": _rate(rates.percent_of_roof, 1) if rates else None,
    })
    if o.transfer:
        row["transfer"] = o.transfer
    if rates and rates.note:
        row["note"] = rates.note
    return row


def roofline_json(report) -> dict | None:
    roof, program = report.roof, report.roofline
    if roof is None:
        return None
    return {
        "device_kind": roof.device_kind, "peak_flops_per_s": _rate(roof.peak_flops_per_s),
        "peak_hbm_bytes_per_s": _rate(roof.peak_hbm_bytes_per_s),
        "host_link_bytes_per_s": _rate(roof.host_link_bytes_per_s), "host_link": roof.host_link or None,
        "ridge_flops_per_byte": _rate(roof.ridge, 1), "peak_source": roof.source,
        "capture_peak_flops_per_s": next((_rate(d.capture_peak_tflops * 1e12) for _, d in report.devices
                                          if d.capture_peak_tflops), None),
        "flops_per_s": _rate(program.flops_per_s) if program else None,
        "hbm_bytes_per_s": _rate(program.hbm_bytes_per_s) if program else None,
        "mfu_percent": _rate(program.mfu_percent, 4) if program else None,
        "hbm_utilization_percent": _rate(100.0 * program.hbm_bytes_per_s / roof.peak_hbm_bytes_per_s, 4)
        if program and program.hbm_bytes_per_s and roof.peak_hbm_bytes_per_s else None,
        "flops_per_step": _rate(program.flops_per_step) if program else None,
        "model_flops_per_step": _rate(program.model_flops_per_step) if program else None,
        "hbm_bytes_per_step": _rate(program.hbm_bytes_per_step) if program else None,
        "host_transfer_bytes_per_step": _rate(program.host_transfer_bytes_per_step) if program else None,
        "how": "per chip per step: FLOPs and bytes from the capture's op stats over the ops inside the measured "
               "steps, averaged over chips, divided by the mean step time; MFU = model FLOPs / (step time x peak); HBM "
               "bandwidth utilisation = HBM bytes / (step time x peak HBM bandwidth)",
    }


def duty_cycle_json(report) -> dict | None:
    """XProf's device duty cycle (overview_page), summed over chips: op time over the time from each chip's
    first device op to its last. It counts every program run but only the gaps between runs, so with few runs
    it is higher than the steps' share of compute, which counts each run with the gap after it."""
    chips = [d for _, d in report.devices if d.op_span_ps]
    if not chips:
        return None
    busy, span = sum(d.op_busy_ps for d in chips), sum(d.op_span_ps for d in chips)
    # The span's time that no step holds (other programs, before the first step, the last run).
    outside = sum(d.op_span_ps - sum(st.duration_ps for st in d.steps) for d in chips) / len(chips)
    return {"percent": round(100.0 * busy / span, 1), "op_ms_per_chip": _ms(busy / len(chips)),
            "span_ms_per_chip": _ms(span / len(chips)), "program_runs_per_chip": round(
                sum(d.program_runs for d in chips) / len(chips), 1),
            "outside_steps_ms_per_chip": _ms(max(outside, 0)),
            "how": "XProf's duty cycle: device op self time over the time from the first program or op event to "
                   "the last, summed over chips; every program run counts, the gap after the last one does not"}


def devices_json(report) -> list[dict]:
    out = []
    for host, d in report.devices:
        total = sum(s.duration_ps for s in d.steps)
        out.append({"id": d.id, "host": host, "kind": d.kind, "device_type": d.device_type, "steps": len(d.steps),
                    "median_ms": round(d.median_step_ms(), 3), "work_median_ms": round(d.median_work_ms(), 3),
                    "breakdown_percent": {c: round(100.0 * sum(getattr(s, f"{c}_ps") for s in d.steps) / total, 1)
                                          if total else 0.0 for c in CATEGORIES},
                    "duty_cycle_percent": None if d.duty_cycle_percent() is None else round(d.duty_cycle_percent(), 1)})
    return out


def document(report, top: int) -> dict:
    stage = report.bottleneck_stage
    return {
        "hosts": [
            {
                "host": h.host,
                "file": h.path,
                "platform": h.platform,
                "step_source": h.step_source,
                "steps": len(h.steps),
                "median_ms": round(h.median_step_ms(), 3),
                "breakdown_percent": {c: round(100.0 * h.total(c) / h.step_ps, 1) if h.step_ps else 0.0
                                      for c in CATEGORIES},
                "notes": h.notes,
                "steps_without_device": h.steps_without_device,
                "device_stops_early_ms": _ms(h.device_stops_early_ps) if h.device_stops_early_ps else None,
                "step_list": [
                    {"number": st.number, "duration_ms": _ms(st.duration_ps), "batches": st.batches,
                     **{f"{c}_ms": _ms(getattr(st, f"{c}_ps")) for c in CATEGORIES}}
                    for st in h.steps
                ],
            }
            for h in report.hosts
        ],
        "steps": {"count": report.step_count, "mean_ms": round(report.mean_ms, 3),
                  "median_ms": round(report.median_ms, 3), "p90_ms": round(report.p90_ms, 3),
                  "batches_per_step": report.batches_per_step},
        "breakdown_percent": report.breakdown_percent,
        "breakdown_ms_per_step": {k: round(v, 3) for k, v in report.breakdown_ms_per_step.items()},
        "input_bound_percent": report.input_bound_percent,
        "verdict": report.verdict,
        "verdict_reason": report.verdict_reason,
        "verdict_ops": [o.hlo_op or o.name for o in report.verdict_ops],
        "devices": devices_json(report),
        "duty_cycle": duty_cycle_json(report),
        "slow_chips": [{"host": c.host, "chip": c.chip, "work_median_ms": round(c.work_ms, 3),
                        "fastest_work_median_ms": round(c.fastest_ms, 3)} for c in report.slow_chips],
        "roofline": roofline_json(report),
        "input_pipeline": {
            "bottleneck": None if stage is None else {
                "stage": stage.name, "kind": stage.kind, "count": stage.count, "self_ms": _ms(stage.self_ps),
                "py_function_ms": _ms(stage.py_function_ps)},
            "stages": [{"stage": s.name, "kind": s.kind, "count": s.count, "total_ms": _ms(s.total_ps),
                        "self_ms": _ms(s.self_ps), "py_function_ms": _ms(s.py_function_ps)}
                       for s in report.stages[: top if top > 0 else None]],
        },
        "precision": _precision(report),
        "stragglers": [{"host": h, "median_ms": round(v, 3), "hosts_median_ms": round(m, 3)}
                       for h, v, m in report.stragglers],
        "suggestions": report.suggestions,
        "top_ops": [op_json(report, o) for o in report.top_ops],
        "run": None if report.run is None else {"name": report.run.name, "folder": report.run.folder,
                                                "other_runs": report.run.others},
        "warnings": report.warnings,
        "pod": pod_json(report.pod),
    }


def _pod_host(row) -> dict:
    def rounded(value, digits=3):
        return None if value is None else round(value, digits)

    return {"host": row.host, "steps": row.steps, "median_ms": row.median_ms, "input_ms": rounded(row.input_ms),
            "host_overhead_ms": rounded(row.host_overhead_ms), "collective_ms": rounded(row.collective_ms),
            "clock_offset_ms": rounded(row.clock_offset_ms, 6), "residual_ms": rounded(row.residual_ms, 6),
            "delay_ms": rounded(row.delay_ms), "last_steps": row.last_steps,
            "steps_without_device": row.steps_without_device,
            "device_stops_early_ms": rounded(row.device_stops_early_ms)}


def pod_json(pod) -> dict | None:
    """Several hosts: per-host figures, their clocks aligned, stragglers by how much they delay the collective."""
    if pod is None:
        return None
    return {
        "hosts": [_pod_host(r) for r in pod.hosts],
        "reference_host": pod.reference,
        "alignment": pod.alignment,
        "not_one_job": pod.not_one_job,
        "matched_steps": pod.matched_steps,
        "residual_ms": None if pod.residual_ms is None else round(pod.residual_ms, 6),
        "stragglers": [_pod_host(r) for r in pod.stragglers],
        "compact": None if pod.compact is None else {k: [_pod_host(r) for r in rows] for k, rows in pod.compact.items()},
        "how": "steps matched by step number; clock offset = median difference of matching step starts against the "
               "reference host, residual = median distance left; delay = a host's own time in a step (step time "
               "less collective wait) minus the next slowest host's, in the steps where it was last, summed",
    }


def _precision(report) -> dict:
    """Device time in matmuls/convolutions and the part with 32-bit results (TPU planes only)."""
    matmul = sum(h.matmul_ps for h in report.hosts)
    wide = sum(h.matmul_f32_ps for h in report.hosts)
    compute = sum(h.total("compute") for h in report.hosts)
    return {"matmul_ms": _ms(matmul), "matmul_f32_ms": _ms(wide),
            "f32_matmul_percent_of_compute": round(100.0 * wide / compute, 1) if compute and matmul else None}


def page_document(report, top: int) -> dict:
    """The document with what the report page draws beyond the JSON: every tf.data stage (the page keeps the top
    ones), every device op with a rate (the roofline chart; top_ops holds only the top ones) and every step of
    every host (the step chart and the pod's heat map)."""
    out = document(report, top)
    out["input_pipeline"]["stages"] = document(report, 0)["input_pipeline"]["stages"]
    out["roofline_points"] = [op_json(report, o) for o in report.device_ops if report.rates(o)
                              and (report.rates(o).flops_per_s or report.rates(o).bytes_per_s)]
    out["per_step"] = [
        {"host": h.host,
         "steps": [{"number": s.number, "duration_ms": round(s.duration_ps / 1e9, 4),
                    **{f"{c}_ms": round(getattr(s, f"{c}_ps") / 1e9, 4) for c in CATEGORIES}}
                   for s in h.steps]}
        for h in report.hosts
    ]
    return out
