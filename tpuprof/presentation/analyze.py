"""What `tpuprof analyze` shows, from its `tpuprof.analyze/1` document (built by tpuprof/documents_analyze.py): the
run and hosts read, the step statistics and where the step time goes, the chips, the verdict, the roofline, the
tf.data stages, the top device and host ops, the pod and the fixes. The terminal, Markdown, the report page (which
adds its charts) and the notebook print this section. A document read back may lack any optional part (an older
tpuprof, another tool): what is missing is left out."""

from __future__ import annotations

import os

from tpuprof.models.profile import CATEGORIES
from tpuprof.units import fmt_fixed
from tpuprof.presentation.model import Caveats, Fixes, Note, Section, Table, Verdict, name, number, text

TOP = 10  # rows of the stage and op tables unless the command says otherwise
CATEGORY_LABELS = {"compute": "compute", "input": "waiting for input",
                   "host_transfer": "host transfers (host memory <-> HBM)",
                   "collective": "collectives (waiting for other chips)",
                   "host_overhead": "host overhead (launch, return, between steps)", "compile": "compilation",
                   "other": "other (program running, no op)"}
BREAKDOWN_TITLE = "Where the step time goes"
STAGES_TITLE = "tf.data stages by own time (summed over repeat epochs)"
POD_TITLE = "Pod: per host, per step"
DEVICE_OPS_TITLE = "Device ops by time per step (per chip: averaged over chips)"
HOST_OPS_TITLE = "Host ops by self time"
ROOFLINE = "Roofline"


def _num(value, digits: int, unit: float = 1) -> str:
    """VALUE / UNIT to DIGITS decimals, halves rounded up: the document keeps 3 decimals of a millisecond, and
    2.925 read as a float would print 2.92 where the figure it rounds printed 2.93."""
    if value is None:
        return ""
    return fmt_fixed(value / unit, digits)


def section(document: dict, top: int = TOP) -> Section:
    """The whole answer, with TOP rows of the stage and op tables (0: every row the document holds)."""
    d = document
    out = Section("tpuprof analyze")
    blocks = out.blocks
    if d.get("run"):
        blocks.append(Note(run_sentence(d["run"])))
    blocks += _hosts(d)
    steps = d.get("steps") or {}
    if steps.get("count"):
        batches = steps.get("batches_per_step") or 1
        figures = [f"{label} {_num(steps[key], 2)} ms" for label, key in (("mean", "mean_ms"), ("median", "median_ms"),
                                                                          ("p90", "p90_ms")) if key in steps]
        blocks.append(Note("Steps: " + ", ".join([str(steps["count"]), *figures])
                           + (f", {batches:g} batches per step call" if batches > 1 else "")))
        percent, per_step = d.get("breakdown_percent") or {}, d.get("breakdown_ms_per_step") or {}
        blocks.append(Table((text("category"), number("% of step"), number("ms per step")),
                            tuple((CATEGORY_LABELS[c], _num(percent.get(c, 0), 1), _num(per_step.get(c, 0), 2))
                                  for c in CATEGORIES if c in percent), BREAKDOWN_TITLE))
        duty = duty_cycle_sentence(d)
        if duty:
            blocks.append(Note(duty))
    blocks += [Note(w, "warning") for w in d.get("warnings") or []]
    blocks += _chips(d)
    verdict = d.get("verdict") or "unknown"
    good = True if verdict == "compute-bound" else False if "input" in verdict else None
    blocks.append(Verdict("Verdict", good, f"{verdict}. {d.get('verdict_reason') or ''}".strip()))
    roofline = roofline_sentence(d.get("roofline"))
    if roofline:
        blocks.append(Note(roofline))
    blocks += _stages(d, top)
    blocks += _ops(d, top)
    blocks += [Note(f"Straggler: {s['host']} median step {s['median_ms']:.2f} ms vs {s['hosts_median_ms']:.2f} ms",
                    "warning") for s in d.get("stragglers") or []]
    blocks += _pod(d.get("pod"))
    if not d.get("suggestions") and verdict == "compute-bound":
        blocks.append(Note("No change to the input pipeline or the training loop is called for: the step is the "
                           "program's own work; the top ops above are where it goes."))
    if d.get("suggestions"):
        blocks.append(Fixes("Suggestions", tuple(d["suggestions"])))
    blocks.append(Caveats("", tuple(d.get("caveats") or ())))
    return out


def run_sentence(run: dict) -> str:
    """Which run of a logdir was read: the newest, and how many others there are."""
    folder = _as_typed(run["folder"])
    others = run.get("other_runs") or 0
    if not others:
        return f"Run {run['name']}, the only run in {folder}."
    return (f"Run {run['name']}, the newest in {folder}; {others} older run{'s' if others != 1 else ''} not read "
            f"(pass {folder}/RUN to read another).")


def _as_typed(folder: str) -> str:
    """A folder under the working directory as a relative path, the way users type it (JSON keeps it absolute)."""
    if "://" in folder or not os.path.isabs(folder):
        return folder
    relative = os.path.relpath(folder)
    return folder if relative.startswith("..") else relative


def _hosts(d: dict) -> list[Note]:
    hosts = d.get("hosts") or []
    many = (d.get("pod") or {}).get("compact") is not None  # one line per host would bury the answer
    out = []
    if many:
        sources = sorted({h["step_source"] for h in hosts if h.get("step_source")})
        out.append(Note(f"{len(hosts)} hosts: {sum(h.get('steps') or 0 for h in hosts)} steps, steps from "
                        f"{'; '.join(sources) or 'nowhere'}"))
    for h in hosts:
        if not many:
            source = f"steps from {h['step_source']}" if h.get("step_source") else "no steps found"
            out.append(Note(f"{h['host']} ({h.get('platform')}): {h.get('steps') or 0} steps, {source}"))
        out += [Note(f"{h['host'] + ': ' if many else ''}{note}") for note in h.get("notes") or []]
    return out


def duty_cycle_sentence(d: dict) -> str | None:
    """XProf's duty cycle over the capture, and why it differs from the steps' device time when it does."""
    duty = d.get("duty_cycle")
    if not duty or not (d.get("steps") or {}).get("count"):
        return None
    # The steps' device time: what XProf counts as busy (its ops), per step.
    shares = d.get("breakdown_percent") or {}
    in_steps = sum(shares.get(c, 0) for c in ("compute", "host_transfer", "collective", "other"))
    sentence = (f"Device duty cycle over the capture (XProf's overview figure): {duty['percent']:.1f}% "
                f"({duty['op_ms_per_chip']:,.2f} ms of ops in {duty['span_ms_per_chip']:,.2f} ms from the first "
                f"device event to the last, per chip, {duty['program_runs_per_chip']:g} program runs).")
    if abs(duty["percent"] - in_steps) >= 1.0 and duty.get("outside_steps_ms_per_chip") is not None:
        sentence += (f" The steps' device time ({in_steps:.1f}%) differs: a step is one run of the step program "
                     f"with the gap after it, and {duty['outside_steps_ms_per_chip']:,.2f} ms per chip of that span "
                     "is outside the steps (other programs, time before the first step, the last run, whose gap the "
                     "capture does not hold).")
    return sentence


def roofline_sentence(roofline: dict | None) -> str | None:
    """The program's achieved rates per chip against the chip's peaks, its MFU and HBM bandwidth utilisation."""
    if not roofline or roofline.get("flops_per_s") is None:
        return None
    peak, hbm = roofline.get("peak_flops_per_s"), roofline.get("hbm_bytes_per_s")
    sentence = f"{ROOFLINE} ({roofline.get('device_kind')}, per chip): {roofline['flops_per_s'] / 1e12:.2f} TFLOP/s"
    sentence += (f" and {hbm / 1e9:.1f} GB/s of HBM per step" if hbm
                 else " per step (HBM bandwidth not measured: no op has bytes in the capture)")
    if peak:
        source = f" ({roofline['peak_source']})" if roofline.get("peak_source") else ""
        mfu, mbu = roofline.get("mfu_percent"), roofline.get("hbm_utilization_percent")
        peak_hbm = roofline.get("peak_hbm_bytes_per_s")
        sentence += (f" against {peak / 1e12:g} TFLOP/s" + (f" and {peak_hbm / 1e9:g} GB/s" if peak_hbm else "")
                     + f" peaks{source}" + (f"; MFU {mfu:.2f}%" if mfu is not None else "")
                     + (f", HBM bandwidth utilisation {mbu:.1f}%" if mbu is not None else ""))
    return sentence + "."


def _chips(d: dict) -> list:
    devices = d.get("devices") or []
    if len(devices) < 2:
        return []
    one_host = len(d.get("hosts") or []) == 1
    shares = ("compute", "host_transfer", "collective", "host_overhead")
    rows = tuple((x["id"] if one_host else f"{x['host']}/{x['id']}", x.get("kind") or "", str(x.get("steps") or 0),
                  _num(x["median_ms"], 2), _num(x["work_median_ms"], 2),
                  *(_num((x.get("breakdown_percent") or {}).get(c, 0), 1) for c in shares)) for x in devices)
    columns = (name("chip"), text("kind", drop=3), number("steps", drop=2), number("median step ms"),
               number("own work ms"), number("compute %", drop=1), number("host transfer %", drop=1),
               number("collective %", drop=1), number("host overhead %", drop=1))
    out: list = [Table(columns, rows, "Chips (aligned steps; device time per step)")]
    out += [Note(f"Slowest chip: {c['chip']} ({c['host']}): {c['work_median_ms']:.2f} ms of its own work per step vs "
                 f"{c['fastest_work_median_ms']:.2f} ms on the least-busy chip", "warning")
            for c in d.get("slow_chips") or []]
    return out


def _stages(d: dict, top: int) -> list:
    pipeline = d.get("input_pipeline") or {}
    stages = (pipeline.get("stages") or [])[: top if top > 0 else None]
    if not stages:
        return []
    out: list = [Table((name("stage", least=24), number("calls"), number("own ms"), number("in Python ms", drop=1)),
                       tuple((s["stage"], str(s.get("count", "")), _num(s["self_ms"], 1), _num(s["py_function_ms"], 1))
                             for s in stages), STAGES_TITLE)]
    slowest = pipeline.get("bottleneck")
    if slowest:
        out.append(Note(f"Slowest tf.data stage: {slowest['stage']} ({slowest['self_ms']:.1f} ms own time, "
                        f"{slowest['py_function_ms']:.1f} ms in Python)."))
    return out


def _rated(o: dict) -> bool:
    """The capture gave the op a roofline judgement (maybe only a note saying why it has no rate)."""
    return "note" in o or any(o.get(k) is not None for k in ("flops_per_s", "bytes_per_s", "intensity", "bound"))


def _ops(d: dict, top: int) -> list:
    ops = (d.get("top_ops") or [])[: top if top > 0 else None]
    device = [o for o in ops if o.get("where") == "device"]
    host = [o for o in ops if o.get("where") != "device"]
    out: list = []
    if device:
        rows = []
        for o in device:
            bound = o.get("bound") or ""
            if bound and o.get("percent_of_roof") is not None:
                bound += f" {o['percent_of_roof']:.0f}%"
            rows.append((o["name"], o.get("hlo_op") or "", o.get("category") or "", _num(o.get("self_ms_per_step"), 3),
                         _num(o.get("flops_per_s"), 2, 1e12),
                         _num(o.get("bytes_per_s"), 1, 1e9) or ("not measured" if _rated(o) else ""),
                         _num(o.get("intensity"), 2), bound))
        columns = (name("op", least=20), name("HLO op", drop=4), text("category", drop=3), number("ms/step"),
                   number("TFLOP/s", drop=2), number("GB/s", drop=2), number("FLOP/B", drop=1), number("bound"))
        out.append(Table(columns, tuple(rows), DEVICE_OPS_TITLE))
    if host:
        out.append(Table((name("op", least=24), text("type", drop=2), number("count", drop=1), number("self ms")),
                         tuple((o["name"], o.get("kind") or "", str(o.get("count") or ""), _num(o["self_ms"], 2))
                               for o in host), HOST_OPS_TITLE))
    return out


def _pod(pod: dict | None) -> list:
    """Several hosts: their clocks aligned, who holds up the collective everyone waits on, lost device data."""
    if not pod:
        return []
    compact = pod.get("compact")
    shown = [(f"{kind.rstrip('s')}: ", r) for kind in ("slowest", "median", "fastest", "outliers")
             for r in compact[kind]] if compact is not None else [("", r) for r in pod["hosts"]]
    lost = any(r.get("steps_without_device") for _, r in shown)
    # Hosts that are not one job wait for no one: a clock offset from their step starts and a delay at a collective
    # none of them ran would be figures of nothing.
    unrelated = pod.get("not_one_job")
    rows = tuple((label + r["host"], str(r["steps"]), _num(r["median_ms"], 2), _num(r.get("input_ms"), 2),
                  _num(r.get("host_overhead_ms"), 2), _num(r.get("collective_ms"), 2))
                 + (() if unrelated else ("" if r.get("clock_offset_ms") is None else f"{r['clock_offset_ms']:+.3f}",
                                          _num(r["delay_ms"], 2)))
                 + ((str(r.get("steps_without_device") or ""),) if lost else ()) for label, r in shown)
    columns = (name("host"), number("steps", drop=3), number("median step ms"), number("input ms", drop=2),
               number("host overhead ms", drop=2), number("collective ms", drop=2)) \
        + (() if unrelated else (number("clock offset ms", drop=1), number("delay ms"))) \
        + ((number("steps with no device data", drop=1),) if lost else ())
    matched = pod.get("matched_steps")
    if unrelated:
        how = f"not one job: {unrelated}; so no clock offsets and no delays"
    elif matched:
        residual = "" if pod.get("residual_ms") is None else f", residual up to {pod['residual_ms']:.3f} ms"
        how = (f"clocks against {pod.get('reference_host')}, from matching step starts{residual}; delay: how much it "
               f"held up the collective, summed over {matched} matched steps")
    else:
        how = "clocks not aligned: the hosts ran no step number in common"
    many = f"; {len(pod['hosts'])} hosts: slowest, median, fastest, outliers" if compact is not None else ""
    out: list = [Table(columns, rows, f"{POD_TITLE} ({how}{many})")]
    unaligned = [r["host"] for r in pod["hosts"] if r["steps"] and r.get("clock_offset_ms") is None]
    if matched and unaligned:
        out.append(Note(f"Not aligned: {', '.join(unaligned[:8])}{' ...' if len(unaligned) > 8 else ''}: no step "
                        f"number in common with {pod.get('reference_host')}", "warning"))
    out += [Note(f"Holds up the pod: {r['host']} {r['delay_ms']:.2f} ms over {matched} steps (the last to arrive in "
                 f"{r.get('last_steps')})", "warning") for r in pod.get("stragglers") or []]
    without = [r for r in pod["hosts"] if r.get("steps_without_device")]
    if without:
        out.append(Note(f"Steps with no device data: {sum(r['steps_without_device'] for r in without)} on "
                        f"{len(without)} host(s) ({', '.join(r['host'] for r in without[:8])})", "warning"))
    return out
