"""What `tpuprof preflight` shows, from its `tpuprof.preflight/1` document (tpuprof/documents_preflight.py): a
verdict per slice, the slices' figures side by side (memory, the batch search, the bf16 comparison) and their step
estimates, then per slice what the table cannot hold (what stays unsharded, a compile stopped at its layout, the
remat policies, the curve, the compiler's refusal, the slowest ops), which TPU to rent, and where the memory of each
compile goes. The terminal, Markdown, the report page and the notebook print this section. A document read back may
lack any optional part (an older tpuprof, another tool): what is missing is left out."""

from __future__ import annotations

from tpuprof.presentation.memory import module_section
from tpuprof.presentation.model import Caveats, Fact, Fixes, Note, Section, Table, Verdict, fits_word, text
from tpuprof.units import fmt_bytes, fmt_ms, fmt_parameters, fmt_usd

TOP = 8  # rows of each compile's memory tables
ESTIMATE_TITLE = "Step estimate per chip (estimated from the compiled program)"
MEMORY_TITLE = "where the memory goes"  # each compile's memory section ends its title so (the page replaces them)
MISSING = "-"  # a figure a slice lacks; a row no slice has is left out
NOT_RUN = "none: it does not fit"  # the step time of a slice whose step cannot run


def section(document: dict, top: int = TOP, spec: str | None = None) -> Section:
    """SPEC: the step or model as the user named it (the command line knows it; the document does not)."""
    targets = [_runnable(t) for t in document.get("targets") or [] if isinstance(t, dict)]
    out = Section("tpuprof preflight" + (f" {spec}" if spec else ""))
    if not targets:
        out.blocks.append(Note("No target in this document."))
        return out
    sharded = any(t.get("mesh") for t in targets)
    out.blocks.append(Note("sharded over every device of the slice, compiled with libtpu; memory per device"
                           if sharded else "compiled with libtpu for one device, per-device batch"))
    out.blocks += [Verdict(target_label(t), _fits(t), verdict_words(t)) for t in targets]
    columns = (text(""),) + tuple(text(_header(t)) for t in targets)
    out.blocks.append(Table(columns, _rows(_memory_rows(targets, sharded), targets)))
    estimated = any(t.get("estimate") for t in targets)
    if estimated:
        out.blocks.append(Table(columns, _rows(_estimate_rows(), targets), ESTIMATE_TITLE))
    for t in targets:
        out.blocks += _details(t, target_label(t))
    if estimated:
        out.blocks += [Fact("which TPU", line) for line in _choice(targets)]
        out.blocks.append(Note(_estimate_method()))
    if targets[0].get("cache"):
        out.blocks.append(Note(f"compiles are cached in {targets[0]['cache']} (--no-cache to recompile)"))
    out.sections += [Section(f"{target_label(t)} at batch {t.get('batch_size')}: {MEMORY_TITLE}",
                             sections=[_memory_section(t, top)])
                     for t in targets if isinstance(t.get("memory"), dict)]
    return out


def _runnable(t: dict) -> dict:
    """The slice's entry without a step estimate where the step does not fit: a program that cannot run has no step
    time, throughput, MFU or cost (this tpuprof writes none; a document of an earlier version may hold one)."""
    if t.get("estimate") is None or _fits(t) is not False:
        return t
    return {key: value for key, value in t.items() if key != "estimate"}


def _memory_section(t: dict, top: int) -> Section:
    """The memory command's breakdown of the compile's dump, under the compile's own verdict: its buffer assignment
    is dumped before code generation, which changes the temporaries and adds the code, so its peak is not the
    figure the step fits by (a step over HBM by 371.79 MiB had a breakdown peaking at 76.6% of it)."""
    memory = module_section(t["memory"], top)
    peak, required = t["memory"].get("peak_heap_bytes"), t.get("required_bytes")
    if peak is None or required is None:
        return memory
    counted = "lays out" if t.get("fast") else "counts"  # stopped at the layout: a lower bound, said above
    verdict = Verdict(str(t["memory"].get("name")), _fits(t),
                      f"{verdict_words(t)}: the compile's memory_analysis() {counted} {fmt_bytes(required)}; the "
                      f"buffer assignment below, dumped before code generation, peaks at {fmt_bytes(peak)}")
    memory.blocks = [verdict, *(b for b in memory.blocks if not isinstance(b, Verdict))]
    return memory


# --- the verdict ---------------------------------------------------------------------------------------------

def _fits(t: dict) -> bool | None:
    """Red unless the step fits HBM and, when it offloads, the host's memory too."""
    if t.get("fits") and t.get("host_fits") is False:
        return False
    return t.get("fits")


def verdict_words(t: dict) -> str:
    """Whether a slice fits and by how much: the document's own sentence when it wrote one (the weights alone do not
    fit), else its share of HBM and what is spare, or what it lacks."""
    if t.get("verdict"):
        return t["verdict"]
    required, capacity = t.get("required_bytes"), t.get("hbm_capacity_bytes")
    if t.get("fits"):
        hbm = f" ({required / capacity:.0%} of HBM, {fmt_bytes(capacity - required)} spare)" \
            if required is not None and capacity else ""
        if t.get("host_fits") is False:  # HBM is not all: what it offloads does not fit the host
            return f"fits in HBM{hbm}, not in host memory"
        return f"{fits_word(True)}{hbm}"
    if t.get("fits") is None:
        return fits_word(None)
    if required is not None and capacity:
        bound = "at least " if t.get("fast") else ""  # a layout's figures: code generation adds to them
        return f"{fits_word(False)} (over by {bound}{fmt_bytes(required - capacity)})"
    return f"{fits_word(False)} (the compiler refused it: RESOURCE_EXHAUSTED)"


# --- the figures side by side --------------------------------------------------------------------------------

def target_label(t: dict) -> str:
    """The slice as people name it (tpuprof/documents_preflight.py words it); a document read back that names
    neither its slice nor its generation is 'the target'."""
    from tpuprof.documents_preflight import target_label as label

    try:
        return label(t)
    except (AttributeError, KeyError, TypeError):
        return str(t.get("target") or "the target")


def _header(t: dict) -> str:
    device = t.get("device")  # an older document names the device in words
    device = device.get("description") if isinstance(device, dict) else device
    inside = "; ".join(part for part in (t.get("topology"), f"per device = {device}" if device else None) if part)
    return target_label(t) + (f" ({inside})" if inside else "")


def _count(value) -> int:
    return value if isinstance(value, int) else 0


def _part(t: dict, key: str) -> dict:
    """A part of a slice's entry, empty when a document read back lacks it or words it another way."""
    return t[key] if isinstance(t.get(key), dict) else {}


def _rows(rows: list, targets: list[dict]) -> tuple[tuple[str, ...], ...]:
    """(label, cell per slice) for every row some slice has a figure for (none when the compiler refused it)."""
    out = []
    for label, cell in rows:
        cells = [_safe(cell, t) for t in targets]
        if any(c != MISSING for c in cells):
            out.append((label, *cells))
    return tuple(out)


def _safe(cell, t: dict) -> str:
    """A figure of a document read back that lacks what it is made of is missing, not an error."""
    try:
        return cell(t)
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return MISSING


def _size(key: str):
    return lambda t: fmt_bytes(t[key]) if t.get(key) is not None else MISSING


def _memory_rows(targets: list[dict], sharded: bool) -> list:
    rows = [("slice", lambda t: _slice(t["slice"]) if t.get("slice") else MISSING),
            ("mesh", lambda t: " ".join(f"{axis}={size}" for axis, size in t["mesh"].items() if size > 1)
             or "1 device" if t.get("mesh") else MISSING)]
    if sharded:
        rows += [("model", lambda t: _model(t) if t.get("model") else MISSING),
                 ("weights + AdamW state per chip", _size("state_bytes_per_chip")),
                 ("  of it not sharded", lambda t: fmt_bytes(t["unsharded"]["state_bytes_per_chip"])
                  if t.get("unsharded") else MISSING)]
    rows += [("batch per device" if sharded else "batch size",
              lambda t: str(t["batch_size"]) if t.get("batch_size") is not None else MISSING),
             ("batch per chip / global", lambda t: f"{t['batch_per_chip']} / {t['global_batch']}"
              if t.get("global_batch") is not None else MISSING),
             ("required (args+out-alias+temp+code)", _size("required_bytes"))]
    if any(_count(_part(t, "device").get("devices_per_chip")) > 1 for t in targets):
        rows.append(("required per chip", lambda t: fmt_bytes(t["required_bytes"] * t["device"]["devices_per_chip"])
                     if t.get("required_bytes") is not None else MISSING))
    rows += [("HBM the compiler offers", _size("hbm_capacity_bytes")),
             ("  arguments", _size("argument_bytes")),
             ("  outputs", _size("output_bytes")),
             ("  aliased (donated)", _size("alias_bytes")),
             # memory_analysis() counts every temporary allocation of the program; the memory section below counts
             # the buffer assignment's HBM temporaries only: the two differ, so each says which it is.
             ("  temporaries (memory_analysis())", lambda t: f"at least {fmt_bytes(t['temp_bytes'])} (buffer "
              "assignment)" if t.get("fast") and t.get("temp_bytes") is not None else _size("temp_bytes")(t)),
             ("  generated code", lambda t: "not generated" if t.get("fast") else _size("generated_code_bytes")(t))]
    if any(t.get("host_bytes") for t in targets):
        rows.append(("host memory (offloaded, not HBM)", _host))
    rows += [("peak heap padded / unpadded", lambda t: f"{fmt_bytes(t['peak_heap_bytes'])} / "
              f"{fmt_bytes(t['peak_unpadded_heap_bytes'])}" if t.get("peak_heap_bytes") is not None else MISSING),
             ("padding live at peak", _size("padding_at_peak_bytes"))]
    if any("max_batch_per_chip" in t for t in targets):
        rows += [("max batch per chip", lambda t: str(t.get("max_batch_per_chip") or "none fits")),
                 ("  bound by", bound_words), ("memory vs batch", _curve)]
    elif any("max_batch_size" in t for t in targets):
        rows += [("max batch (multiple of 8)", _max), ("  bound by", bound_words),
                 ("recommended (multiple of 128)", lambda t: str(t.get("recommended_batch_size") or MISSING)),
                 ("memory vs batch", _curve)]
    if any(isinstance(t.get("bf16"), dict) for t in targets):
        rows += [("bf16: required", lambda t: fmt_bytes(t["bf16"].get("required_bytes")) if t.get("bf16") else MISSING),
                 ("bf16: peak padded / unpadded", lambda t: f"{fmt_bytes(t['bf16']['peak_heap_bytes'])} / "
                  f"{fmt_bytes(t['bf16']['peak_unpadded_heap_bytes'])}"
                  if (t.get("bf16") or {}).get("peak_heap_bytes") is not None else MISSING),
                 ("bf16: padding live at peak", lambda t: fmt_bytes(t["bf16"].get("padding_at_peak_bytes"))
                  if t.get("bf16") else MISSING)]
        if any("max_batch_size" in (t.get("bf16") or {}) for t in targets):
            rows.append(("bf16: max batch", lambda t: _max(t["bf16"]) if t.get("bf16") else MISSING))
    rows.append(("compiles (this run)", lambda t: str(t["compiles"]) if t.get("compiles") is not None else MISSING))
    return rows


def _estimate_rows() -> list:
    """Step time, throughput, utilisation and cost per slice."""

    def get(key, fmt):
        return lambda t: fmt(t["estimate"][key]) if (t.get("estimate") or {}).get(key) is not None else MISSING

    return [
        ("step time (band)", lambda t: fmt_ms(t["estimate"]["step_ms"], t["estimate"]["step_ms_low"],
                                              t["estimate"]["step_ms_high"])
         if (t.get("estimate") or {}).get("step_ms") is not None else NOT_RUN if _fits(t) is False else MISSING),
        ("  collectives (exposed)", lambda t: f"{fmt_ms(t['estimate']['collective_ms'])} "
         f"({fmt_ms(t['estimate']['exposed_collective_ms'])})"
         if (t.get("estimate") or {}).get("collective_ms") else MISSING),
        ("  host transfers (exposed)", lambda t: _host_transfers(t["estimate"]["host_transfers"])
         if (t.get("estimate") or {}).get("host_transfers") else MISSING),
        ("  DCN all-reduce across slices", get("dcn_ms", lambda v: fmt_ms(v) if v else MISSING)),
        ("examples/s per chip", get("examples_per_s", lambda v: f"{v:,}")),
        ("tokens/s per chip", get("tokens_per_s_per_chip", lambda v: f"{v:,}")),
        ("FLOP utilisation", get("flop_utilization_percent", lambda v: f"{v:.0f}%")),
        ("MFU", get("mfu_percent", lambda v: f"{v:.0f}%")),
        ("compute / memory bound", lambda t: f"{t['estimate']['compute_bound_percent']:.0f}% / "
         f"{t['estimate']['memory_bound_percent']:.0f}%"
         if (t.get("estimate") or {}).get("compute_bound_percent") is not None else MISSING),
        ("price per chip-hour", lambda t: f"${t['estimate']['price_per_chip_hour']:.2f}"
         + ("" if t["estimate"].get("price_verified") else " (unverified)")
         if (t.get("estimate") or {}).get("price_per_chip_hour") else MISSING),
        ("cost per 1M examples", get("cost_per_million_examples", fmt_usd)),
        ("cost per 1M tokens", get("cost_per_million_tokens", fmt_usd)),
    ]


def _slice(s: dict) -> str:
    slices = f" x {s['num_slices']} slices" if (s.get("num_slices") or 1) > 1 else ""
    return f"{s.get('name')}{slices}: {s.get('topology')}, {s.get('chips')} chips, {s.get('devices')} devices"


def _model(t: dict) -> str:
    m = t["model"]
    weights = m.get("weight_dtype", "float32")
    return (f"{m['name']}: {fmt_parameters(m['parameters'])} parameters, seq {t.get('seq_len')}, remat {m['remat']}, "
            f"{m['dtype']}" + (f", {weights} weights" if weights != "float32" else "")
            + (f", {m['mu_dtype']} first moment" if m.get("mu_dtype", weights) != weights else "")
            + (f", {m['grad_dtype']} gradients" if m.get("grad_dtype", "float32") != "float32" else "")
            + (", experts over fsdp" if m.get("shard_exp_on_fsdp") else "")
            + (f", loss in {m['vocab_tiling']} pieces" if m.get("vocab_tiling") else "")
            + (", dropless MoE" if m.get("moe", "").startswith("dropless") else "")
            + (", XLA attention (no Pallas kernels here)" if m.get("attention", "").startswith("XLA") else ""))


def _host(t: dict) -> str:
    """Host memory the device's program holds (offloaded activations), against what a device may hold there."""
    if not t.get("host_bytes"):
        return MISSING
    if t.get("host_capacity_bytes") is None:
        return f"{fmt_bytes(t['host_bytes'])} (no host budget known for this generation)"
    verdict = fits_word(True) if t.get("host_fits") else "more than a device may hold"
    return f"{fmt_bytes(t['host_bytes'])} of {fmt_bytes(t['host_capacity_bytes'])} a device may hold: {verdict}"


def bound_words(t: dict) -> str:
    """What bounds the largest batch (max_batch_bound)."""
    bound = t.get("max_batch_bound")
    if bound == "host":
        capacity = t.get("host_capacity_bytes")
        return "host memory" + (f" ({fmt_bytes(capacity)} a device may hold)" if capacity else "")
    return {"hbm": "HBM", "batch_limit": "the search limit", None: MISSING}.get(bound, str(bound))


def _max(t: dict) -> str:
    if t.get("max_batch_size") is None:
        return "none fits"
    return f"≥ {t['max_batch_size']} (search limit)" if t.get("search_limited") else str(t["max_batch_size"])


def _curve(t: dict) -> str:
    fit = t.get("curve_fit")
    if not fit:
        return MISSING
    if fit["fixed_bytes"] < 0:  # the compiles do not lie on a line: no fixed part to state
        return f"≈{fmt_bytes(fit['per_example_bytes'])}/example (not linear)"
    return f"{fmt_bytes(fit['fixed_bytes'])} + {fmt_bytes(fit['per_example_bytes'])}/example"


# --- per slice, what a table cell cannot hold ----------------------------------------------------------------

def _details(t: dict, label: str) -> list:
    """The slice's lines under the tables; each left out when a document read back lacks what it is made of."""
    out: list = []
    for piece in (_batch_from, _unsharded, _fast, _remat, _curve_points, _oom):
        try:
            out += piece(t, label)
        except (AttributeError, KeyError, TypeError, ValueError):
            pass
    e = _part(t, "estimate")
    if e:
        try:
            out += _estimate_details(e, label)
        except (AttributeError, KeyError, TypeError, ValueError):
            pass
    out.append(Caveats(f"{label} step estimate", _strings(e.get("caveats"))))
    out.append(Caveats(f"{label} largest batch", _strings(t.get("caveats"))))
    return out


def _strings(items) -> tuple[str, ...]:
    return tuple(str(i) for i in items) if isinstance(items, list) else ()


def _batch_from(t: dict, label: str) -> list:
    return [Fact(f"{label} batch", f"{t['batch_size']}: {t['batch_from']}")] if t.get("batch_from") else []


def _unsharded(t: dict, label: str) -> list:
    from tpuprof.documents_preflight import unsharded_words

    if not t.get("unsharded") or t.get("verdict"):  # a verdict that no batch fits says it already
        return []
    return [Fact(f"{label} weights and AdamW state", unsharded_words(t["unsharded"], t.get("mesh") or {}))]


def _fast(t: dict, label: str) -> list:
    """A compile stopped at its memory layout: its figures are a lower bound."""
    method = _part(t, "fast").get("method")
    return [Note(f"{label}: {method}", "warning")] if method else []


def _remat(t: dict, label: str) -> list:
    if not t.get("remat_table"):
        return []
    cells = "; ".join(f"{r['remat']}: {r['max_batch_per_chip'] or 'none fits'}"
                      + (f" ({fmt_ms(r['step_ms'])})" if r.get("step_ms") else "") for r in t["remat_table"])
    return [Fact(f"{label} largest batch per chip by remat policy (step time estimated)",
                 f"{cells}; reported: remat {_part(t, 'model').get('remat')}")]


def _curve_points(t: dict, label: str) -> list:
    curve = t.get("curve") or []
    if len(curve) < 2:  # one point is no curve
        return []
    return [Fact(f"{label} memory vs batch, as compiled", ", ".join(
        f"{p['batch_size']}: {fmt_bytes(p['required_bytes'])}"
        + (f" (host {fmt_bytes(p['host_bytes'])})" if p.get("host_bytes") else "")
        if p.get("required_bytes") is not None else f"{p['batch_size']}: refused by the compiler" for p in curve))]


def _oom(t: dict, label: str) -> list:
    """The compiler's refusal: its first line, the fixes of the OOM triage and what its batch estimate leaves out."""
    oom = _part(t, "oom")
    said = _part(oom, "report").get("headline") or oom.get("headline") or oom.get("message") or ""
    out: list = []
    if said.strip():
        out.append(Note(f"{label}: the compiler ran out of memory at batch {t.get('batch_size')}: "
                        f"{said.strip().splitlines()[0]}", "problem"))
    fixes = tuple(s for s in oom.get("suggestions") or [] if isinstance(s, dict) and isinstance(s.get("message"), str)
                  and isinstance(s.get("kind"), (str, type(None))))
    if fixes:
        out.append(Fixes(f"{label}: what to change", fixes))
    out.append(Caveats(f"{label} batch estimate", _strings(_part(oom, "batch_estimate").get("caveats"))))
    return out


def _estimate_details(e: dict, label: str) -> list:
    from tpuprof.documents_preflight import NOT_MODELLED

    out: list = []
    ops = ", ".join(f"{op.get('op_name') or op.get('name')}"
                    + (f" ({op['source_line'].rsplit('/', 1)[-1]})" if op.get("source_line") else "")
                    + f" {fmt_ms(op['ms'])} {op.get('bound')}" + (f" x{op['count']}" if op.get("count", 1) > 1 else "")
                    for op in (e.get("top_ops") or [])[:3])
    if ops:
        out.append(Fact(f"{label} slowest ops", ops))
    if e.get("mfu_percent") is not None and e.get("mfu_source"):
        out.append(Fact(f"{label} MFU {e['mfu_percent']:.0f}%", e["mfu_source"]))
    estimated = {k["name"] for k in e.get("kernels_estimated") or []}
    unestimated = [k for k in e.get("kernels_without_estimate") or [] if k not in estimated]
    if unestimated:
        out.append(Note(f"{label}: no estimate for kernel(s) {', '.join(unestimated[:5])}: counted as 0 FLOPs and "
                        "their operands' bytes", "warning"))
    if estimated:
        kinds = sorted({k["kernel"] for k in e["kernels_estimated"]})
        out.append(Note(f"{label}: FLOPs estimated from operand shapes for {', '.join(kinds)} (attention kernels "
                        "without a cost_estimate; see caveats)", "warning"))
    unknown = [loop["name"] for loop in e.get("loops") or [] if loop.get("trip_count_source") == "unknown"]
    if unknown:
        out.append(Note(f"{label}: loop(s) {', '.join(unknown[:5])}: trip count unknown, counted once", "warning"))
    if not e.get("compiler_ms"):
        out.append(Note(f"{label}: no compiler cycle estimates in this dump: the band is the roofline alone",
                        "warning"))
    if e.get("top_collectives"):
        out.append(Fact(f"{label} slowest collectives", ", ".join(
            f"{c['kind']} of {c['group_size']} over {c['axes']} {fmt_ms(c['ms'])} ({fmt_ms(c['exposed_ms'])} exposed)"
            + (f" x{c['count']}" if c.get("count", 1) > 1 else "") for c in e["top_collectives"][:3])))
    listed = e.get("not_modelled") or []
    out += [Note(f"{label}: not timed: {missing}", "warning") for missing in listed[:len(listed) - len(NOT_MODELLED)]]
    return out


def _choice(targets: list[dict]) -> list[str]:
    """The cheapest and the fastest slice that fits (tpuprof/documents_preflight.py ranks them)."""
    from tpuprof.documents_preflight import choice

    try:
        return (choice(targets) or "").splitlines()
    except (KeyError, TypeError, ValueError):  # a document read back without the figures the ranking needs
        return []


def _host_transfers(host: dict) -> str:
    moved = f"{fmt_bytes(host['to_host_bytes'])} out, {fmt_bytes(host['from_host_bytes'])} back"
    if host.get("ms") is None:
        return f"{moved}: not timed (no host link bandwidth published)"
    return f"{fmt_ms(host['ms'])} ({fmt_ms(host['exposed_ms'])}): {moved}"


def _estimate_method() -> str:
    from tpuprof.documents_preflight import NOT_MODELLED

    return ("step time: estimated from the compiled program, band = [roofline, compiler's cycle estimates] + "
            "collectives on the slice's ICI torus (exposed part; all of it at the high end), point = geometric mean + "
            "exposed collectives (see bench/bench_step_estimate.py). Not modelled: " + ", ".join(NOT_MODELLED) + ".")
