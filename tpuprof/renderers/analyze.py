"""The step report as a JSON document (the `--json` contract) and as rich tables."""

from __future__ import annotations

from tpuprof.analyses.summary import ProfileSummary
from tpuprof.models.profile import CATEGORIES


CATEGORY_LABELS = {"compute": "compute", "input": "waiting for input",
                   "host_transfer": "host transfers (host memory <-> HBM)",
                   "collective": "collectives (waiting for other chips)",
                   "host_overhead": "host overhead (launch, return, between steps)", "compile": "compilation",
                   "other": "other (program running, no op)"}


def _fmt(value, unit: float, digits: int) -> str:
    return "" if value is None or value is False else f"{value / unit:.{digits}f}"


def _ms(ps: int | float) -> float:
    return round(ps / 1e9, 3)


def _rate(value: float | None, digits: int = 0):
    return None if value is None else round(float(value), digits) if digits else int(round(float(value)))


def op_json(report: ProfileSummary, o) -> dict:
    row = {"name": o.name, "kind": o.kind, "where": o.where, "count": o.count, "self_ms": _ms(o.self_ps)}
    if o.where != "device":
        return row
    rates = report.rates(o)
    per_step = report.ms_per_step(o)
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


def roofline_json(report: ProfileSummary) -> dict | None:
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
        "flops_per_step": _rate(program.flops_per_step) if program else None,
        "model_flops_per_step": _rate(program.model_flops_per_step) if program else None,
        "hbm_bytes_per_step": _rate(program.hbm_bytes_per_step) if program else None,
        "host_transfer_bytes_per_step": _rate(program.host_transfer_bytes_per_step) if program else None,
        "how": "per chip per step: FLOPs and bytes from the capture's op stats over the ops inside the measured "
               "steps, averaged over chips, divided by the mean step time; MFU = model FLOPs / (step time x peak)",
    }


def duty_cycle_json(report: ProfileSummary) -> dict | None:
    """XProf's device duty cycle (overview_page), summed over chips: op time over the time from each chip's
    first device op to its last. It counts every program run but only the gaps between runs, so with few runs
    it is higher than the steps' share of compute, which counts each run with the gap after it."""
    chips = [d for _, d in report.devices if d.op_span_ps]
    if not chips:
        return None
    busy, span = sum(d.op_busy_ps for d in chips), sum(d.op_span_ps for d in chips)
    return {"percent": round(100.0 * busy / span, 1), "op_ms_per_chip": _ms(busy / len(chips)),
            "span_ms_per_chip": _ms(span / len(chips)), "program_runs_per_chip": round(
                sum(d.program_runs for d in chips) / len(chips), 1),
            "how": "XProf's duty cycle: device op self time over the time from the first program or op event to "
                   "the last, summed over chips; every program run counts, the gap after the last one does not"}


def duty_cycle_sentence(report: ProfileSummary) -> str | None:
    duty = duty_cycle_json(report)
    if duty is None or not report.step_count:
        return None
    # The steps' device time: what XProf counts as busy (its ops), per step.
    in_steps = sum(report.breakdown_percent[c] for c in ("compute", "host_transfer", "collective", "other"))
    runs = duty["program_runs_per_chip"]
    sentence = (f"Device duty cycle over the capture (XProf's overview figure): {duty['percent']:.1f}% "
                f"({duty['op_ms_per_chip']:,.2f} ms of ops in {duty['span_ms_per_chip']:,.2f} ms from the first "
                f"device event to the last, per chip, {runs:g} program runs).")
    if abs(duty["percent"] - in_steps) >= 1.0:
        chips = [d for _, d in report.devices if d.op_span_ps]
        outside = sum(d.op_span_ps - sum(st.duration_ps for st in d.steps) for d in chips) / len(chips)
        sentence += (f" The steps' device time ({in_steps:.1f}%) differs: a step is one run of the step program "
                     f"with the gap after it, and {_ms(max(outside, 0)):,.2f} ms per chip of that span is outside the "
                     "steps (other programs, time before the first step, the last run, whose gap the capture does "
                     "not hold).")
    return sentence


def devices_json(report: ProfileSummary) -> list[dict]:
    out = []
    for host, d in report.devices:
        total = sum(s.duration_ps for s in d.steps)
        out.append({"id": d.id, "host": host, "kind": d.kind, "device_type": d.device_type, "steps": len(d.steps),
                    "median_ms": round(d.median_step_ms(), 3), "work_median_ms": round(d.median_work_ms(), 3),
                    "breakdown_percent": {c: round(100.0 * sum(getattr(s, f"{c}_ps") for s in d.steps) / total, 1)
                                          if total else 0.0 for c in CATEGORIES},
                    "duty_cycle_percent": None if d.duty_cycle_percent() is None else round(d.duty_cycle_percent(), 1)})
    return out


def to_json(report: ProfileSummary, top: int) -> dict:
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
        "matched_steps": pod.matched_steps,
        "residual_ms": None if pod.residual_ms is None else round(pod.residual_ms, 6),
        "stragglers": [_pod_host(r) for r in pod.stragglers],
        "compact": None if pod.compact is None else {k: [_pod_host(r) for r in rows] for k, rows in pod.compact.items()},
        "how": "steps matched by step number; clock offset = median difference of matching step starts against the "
               "reference host, residual = median distance left; delay = a host's own time in a step (step time "
               "less collective wait) minus the next slowest host's, in the steps where it was last, summed",
    }


def run_sentence(run) -> str:
    """Which run of a logdir was read: the newest, and how many others there are."""
    from rich.markup import escape

    folder = escape(_as_typed(run.folder))
    if not run.others:
        return f"Run {escape(run.name)}, the only run in {folder}."
    others = f"{run.others} older run{'s' if run.others != 1 else ''}"
    return f"Run {escape(run.name)}, the newest in {folder}; {others} not read (pass {folder}/RUN to read another)."


def _as_typed(folder: str) -> str:
    """A folder under the working directory as a relative path, the way users type it (JSON keeps it absolute)."""
    import os

    if "://" in folder or not os.path.isabs(folder):
        return folder
    relative = os.path.relpath(folder)
    return folder if relative.startswith("..") else relative


def _precision(report: ProfileSummary) -> dict:
    """Device time in matmuls/convolutions and the part with 32-bit results (TPU planes only)."""
    matmul = sum(h.matmul_ps for h in report.hosts)
    wide = sum(h.matmul_f32_ps for h in report.hosts)
    compute = sum(h.total("compute") for h in report.hosts)
    return {"matmul_ms": _ms(matmul), "matmul_f32_ms": _ms(wide),
            "f32_matmul_percent_of_compute": round(100.0 * wide / compute, 1) if compute and matmul else None}


def print_tables(report: ProfileSummary, top: int) -> None:
    from rich.markup import escape

    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    if report.run is not None:
        out.print(run_sentence(report.run))
    many = report.pod is not None and report.pod.compact is not None
    if many:  # one line per host would bury the report: the pod table below has them
        sources = sorted({h.step_source for h in report.hosts if h.step_source})
        out.print(f"[bold]{len(report.hosts)} hosts[/bold]: {sum(len(h.steps) for h in report.hosts)} steps, "
                  f"steps from {escape('; '.join(sources) or 'nowhere')}")
    for h in report.hosts:
        if not many:
            source = f"steps from {escape(h.step_source)}" if h.step_source else "no steps found"
            out.print(f"[bold]{escape(h.host)}[/bold] ({h.platform}): {len(h.steps)} steps, {source}")
        for note in h.notes:
            out.print(f"  [dim]{escape(h.host + ': ' if many else '')}{escape(note)}[/dim]")
    if report.step_count:
        out.print(f"Steps: {report.step_count}, mean {report.mean_ms:.2f} ms, median {report.median_ms:.2f} ms, "
                  f"p90 {report.p90_ms:.2f} ms" + (f", {report.batches_per_step:g} batches per step call"
                                                   if report.batches_per_step > 1 else ""))
        rows = [(CATEGORY_LABELS[category], f"{report.breakdown_percent[category]:.1f}",
                 f"{report.breakdown_ms_per_step[category]:.2f}") for category in CATEGORIES]
        columns = [tables.text("category"), tables.number("% of step"), tables.number("ms per step")]
        out.print(tables.table(columns, rows, out.width, title="Where the step time goes"))
        duty = duty_cycle_sentence(report)
        if duty:
            out.print(escape(duty))
    for warning in report.warnings:
        out.print(f"[bold yellow]Warning:[/bold yellow] {escape(warning)}")
    devices = report.devices
    if len(devices) > 1:
        rows = []
        for row in devices_json(report):
            name = row["id"] if len(report.hosts) == 1 else f"{row['host']}/{row['id']}"
            rows.append((escape(name), escape(row["kind"]), str(row["steps"]), f"{row['median_ms']:.2f}",
                         f"{row['work_median_ms']:.2f}", f"{row['breakdown_percent']['host_transfer']:.1f}",
                         f"{row['breakdown_percent']['collective']:.1f}"))
        columns = [tables.name("chip"), tables.text("kind", drop=3), tables.number("steps", drop=2),
                   tables.number("median step ms"), tables.number("own work ms"),
                   tables.number("host transfer %", drop=1), tables.number("collective %", drop=1)]
        out.print(tables.table(columns, rows, out.width, title="Chips (aligned steps; device time per step)"))
    for chip in report.slow_chips:
        out.print(f"[yellow]Slowest chip:[/yellow] {escape(chip.chip)} ({escape(chip.host)}): {chip.work_ms:.2f} ms of "
                  f"its own work per step vs {chip.fastest_ms:.2f} ms on the least-busy chip")
    colour = "red" if "input" in report.verdict else "yellow" if report.verdict != "compute-bound" else "green"
    out.print(f"Verdict: [bold {colour}]{report.verdict}[/bold {colour}]. {escape(report.verdict_reason)}")
    roofline = roofline_json(report)
    if roofline and roofline["flops_per_s"] is not None:
        peak = roofline["peak_flops_per_s"]
        out.print(f"Roofline ({escape(roofline['device_kind'])}, per chip): "
                  f"{roofline['flops_per_s'] / 1e12:.2f} TFLOP/s" + (
                      f" and {roofline['hbm_bytes_per_s'] / 1e9:.1f} GB/s of HBM per step" if roofline["hbm_bytes_per_s"]
                      else " per step (HBM bandwidth not measured: no op has bytes in the capture)") + (f" against {peak / 1e12:g} TFLOP/s and "
                                     f"{roofline['peak_hbm_bytes_per_s'] / 1e9:g} GB/s peaks; MFU "
                                     f"{roofline['mfu_percent']:.2f}%" if peak else "") + ".")

    if report.stages:
        columns = [tables.name("stage", least=24), tables.number("calls"), tables.number("own ms"),
                   tables.number("in Python ms", drop=1)]
        rows = [(escape(s.name), str(s.count), f"{s.self_ps / 1e9:.1f}", f"{s.py_function_ps / 1e9:.1f}")
                for s in report.stages[: top if top > 0 else None]]
        out.print(tables.table(columns, rows, out.width, title="tf.data stages by own time (summed over repeat epochs)"))
    device = [o for o in report.top_ops if o.where == "device"]
    host = [o for o in report.top_ops if o.where != "device"]
    if device:
        rows = []
        for o in device:
            rates = report.rates(o)
            per_step = report.ms_per_step(o)
            bound = ""
            if rates and rates.bound:
                bound = rates.bound + (f" {rates.percent_of_roof:.0f}%" if rates.percent_of_roof is not None else "")
            rows.append((escape(o.name), escape(o.hlo_op), o.category,
                         f"{per_step:.3f}" if per_step is not None else "",
                         _fmt(rates and rates.flops_per_s, 1e12, 2),
                         _fmt(rates and rates.bytes_per_s, 1e9, 1) or ("not measured" if rates else ""),
                         _fmt(rates and rates.intensity, 1, 2), bound))
        columns = [tables.name("op", least=20), tables.name("HLO op", drop=4), tables.text("category", drop=3),
                   tables.number("ms/step"), tables.number("TFLOP/s", drop=2), tables.number("GB/s", drop=2),
                   tables.number("FLOP/B", drop=1), tables.number("bound", justify="left")]
        out.print(tables.table(columns, rows, out.width,
                               title="Device ops by time per step (per chip: averaged over chips)"))
    if host:
        columns = [tables.name("op", least=24), tables.text("type", drop=2), tables.number("count", drop=1),
                   tables.number("self ms")]
        rows = [(escape(o.name), escape(o.kind), str(o.count), f"{o.self_ps / 1e9:.2f}") for o in host]
        out.print(tables.table(columns, rows, out.width, title="Host ops by self time"))
    for h, value, middle in report.stragglers:
        out.print(f"[yellow]Straggler:[/yellow] {escape(h)} median step {value:.2f} ms vs {middle:.2f} ms")
    if report.pod is not None:
        _print_pod(out, report.pod)
    if not report.suggestions and report.verdict == "compute-bound":
        out.print("No change to the input pipeline or the training loop is called for: the step is the program's "
                  "own work; the top ops above are where it goes.")
    if report.suggestions:
        out.print("[bold]Suggestions[/bold]")
        for i, s in enumerate(report.suggestions, 1):
            out.print(f"{i}. {escape('[' + s['kind'] + ']')} {escape(s['message'])}")
            out.print(f"   [dim]evidence: {escape(s['evidence'])}[/dim]")


def _print_pod(out, pod) -> None:
    from rich.markup import escape

    from tpuprof.renderers import tables

    def cells(row, label=""):
        return (escape(label + row.host), str(row.steps), f"{row.median_ms:.2f}", f"{row.input_ms:.2f}",
                f"{row.host_overhead_ms:.2f}", f"{row.collective_ms:.2f}",
                "" if row.clock_offset_ms is None else f"{row.clock_offset_ms:+.3f}", f"{row.delay_ms:.2f}")

    if pod.compact is None:
        rows = [cells(r) for r in pod.hosts]
    else:
        rows = [cells(r, f"{kind.rstrip('s')}: ") for kind in ("slowest", "median", "fastest", "outliers")
                for r in pod.compact[kind]]
    columns = [tables.name("host"), tables.number("steps", drop=3), tables.number("median step ms"),
               tables.number("input ms", drop=2), tables.number("host overhead ms", drop=2),
               tables.number("collective ms", drop=2), tables.number("clock offset ms", drop=1),
               tables.number("delay ms")]
    compact = f"; {len(pod.hosts)} hosts: slowest, median, fastest, outliers" if pod.compact is not None else ""
    if pod.matched_steps:
        residual = "" if pod.residual_ms is None else f", residual up to {pod.residual_ms:.3f} ms"
        how = (f"clocks against {pod.reference}, from matching step starts{residual}; delay: how much it held up "
               f"the collective, summed over {pod.matched_steps} matched steps")
    else:
        how = "clocks not aligned: the hosts ran no step number in common"
    out.print(tables.table(columns, rows, out.width, title=f"Pod: per host, per step ({how}{compact})"))
    unaligned = [r.host for r in pod.hosts if r.steps and r.clock_offset_ms is None]
    if pod.matched_steps and unaligned:
        out.print(f"[yellow]Not aligned:[/yellow] {escape(', '.join(unaligned[:8]))}"
                  f"{' ...' if len(unaligned) > 8 else ''}: no step number in common with {escape(pod.reference)}")
    for r in pod.stragglers:
        out.print(f"[yellow]Holds up the pod:[/yellow] {escape(r.host)} {r.delay_ms:.2f} ms over {pod.matched_steps} "
                  f"steps (the last to arrive in {r.last_steps})")
    lost = [r for r in pod.hosts if r.steps_without_device]
    if lost:
        out.print(f"[yellow]Steps with no device data:[/yellow] {sum(r.steps_without_device for r in lost)} on "
                  f"{len(lost)} host(s) ({escape(', '.join(r.host for r in lost[:8]))})")
