"""What `tpuprof memory` shows, from its `tpuprof.memory/1` document (tpuprof/documents_memory.py): per module
whether it fits, how its figures were obtained, the peak and its parts, the largest buffers, the framework ops and
the fixes. The terminal, Markdown, the report page and the notebook print this section. A document read back may
lack any optional part (an older tpuprof, another tool): what is missing is left out."""

from __future__ import annotations

from tpuprof.presentation.model import (Caveats, Fact, Fixes, Note, Section, Table, Verdict, fits_share, name,
                                        number, text)
from tpuprof.units import fmt_bytes

TOP = 15  # rows of each table unless the command says otherwise


def method_words(method: str | None, target: str | None, error_percent: float | None,
                 peak_range: tuple[int, int] | list[int] | None) -> str:
    """How a module's figures were obtained, in one sentence."""
    tpu = target or "the TPU"
    if method == "recompiled":
        return f"Exact: recompiled with libtpu for {tpu}; figures from its buffer assignment."
    if method == "recompiled_one_device":
        return (f"Not per device: the module is sharded, recompiled here on one {tpu} device, so these are the whole "
                "program's figures on one chip; `tpuprof preflight` compiles it over the slice for per-device ones.")
    if method == "hlo_liveness":
        within = f", expected within {error_percent:g}% of the compiler's peak" if error_percent is not None else ""
        return (f"Estimate{within}: liveness over the scheduled HLO text (no buffer assignment); "
                "the HloProto (--xla_dump_hlo_as_proto) gives exact figures.")
    if method == "unscheduled_bound":
        span = (f": the real peak lies between {fmt_bytes(peak_range[0])} and {fmt_bytes(peak_range[1])}"
                if peak_range else "")
        return (f"Estimate for {tpu} without a TPU schedule or layouts (libtpu's default tiles){span}; "
                "recompile the module proto with libtpu (--compile) for exact figures.")
    return "Exact: the compiler's TPU buffer assignment."


def section(document: dict, top: int = TOP, modules: int | None = None) -> Section:
    """Every module (or the first MODULES), each with its TOP largest buffers and ops (0: all), in the document's
    order: the module the answer is about first (advice.memory.answer_first), then by peak."""
    found = document.get("modules") or []
    out = Section("tpuprof memory")
    if not found:
        out.blocks.append(Note("No module with HBM buffers found."))
        return out
    shown = found[:modules] if modules else found
    out.sections += [module_section(m, top) for m in shown]
    if len(shown) < len(found):
        out.blocks.append(Note(f"{len(found)} modules; the first {len(shown)} are shown, the one the answer is about "
                               "first (`--json` has every one)."))
    return out


def _capacity(m: dict) -> str:
    capacity, target = m["hbm_capacity_bytes"], m.get("target")
    try:
        from tpuprof import targets

        device = targets.get(target).device if target else None
    except Exception:  # a document read back may name a generation this tpuprof does not know
        device = None
    offered = f"the {fmt_bytes(capacity)} of HBM the compiler offers" + (f" {device} of {target}" if device else "")
    return fits_share(_required(m), capacity, of=offered)


def _required(m: dict) -> int | None:
    """The verdict's figure; a document from before required_bytes has its peak."""
    return m.get("required_bytes", m.get("peak_heap_bytes"))


def module_section(m: dict, top: int = TOP, title: str | None = None) -> Section:
    peak, capacity, required = m.get("peak_heap_bytes"), m.get("hbm_capacity_bytes"), _required(m)
    where = f" ({m['source_kind']}: {m.get('source')})" if m.get("source_kind") else ""
    out = Section(title or f"{m.get('name')}{where}")
    if required is not None and capacity:
        out.blocks.append(Verdict(str(m.get("name")), required <= capacity, _capacity(m)))
    method = m.get("method") or ("unscheduled_bound" if m.get("estimated") else "buffer_assignment")
    out.blocks.append(Note(method_words(method, m.get("target"), m.get("expected_error_percent"),
                                        m.get("peak_range_bytes")), "warning" if m.get("estimated") else "note"))
    out.blocks += [Note(note) for note in m.get("notes") or []]
    if peak is not None:
        value = fmt_bytes(peak)
        span = m.get("peak_range_bytes")
        if span:
            value += f" (range {fmt_bytes(span[0])} to {fmt_bytes(span[1])}" + (
                ": may not fit)" if capacity and span[1] > capacity >= peak else ")")
        out.blocks.append(Fact("peak HBM (padded, estimate)" if m.get("estimated") else "peak HBM (padded)", value))
        if m.get("peak_unpadded_heap_bytes") is not None:
            out.blocks.append(Fact("peak HBM (unpadded)", f"{fmt_bytes(m['peak_unpadded_heap_bytes'])} (as XProf "
                                   "counts it: the temporaries unpadded, the arguments/outputs as allocated)"))
        if m.get("padding_at_peak_bytes") is not None:
            out.blocks.append(Fact("padding live at the peak", fmt_bytes(m["padding_at_peak_bytes"])))
        if required is not None and required - peak >= 0.01 * peak:  # under 1% it changes no answer: not shown
            out.blocks.append(Fact("HBM allocated", f"{fmt_bytes(required)}: the arguments, the outputs and the "
                                   "temporaries' one block, which the compiler packed "
                                   f"{fmt_bytes(required - peak)} larger than what is live at the peak and the "
                                   "runtime reserves whole (the verdict's figure)"))
    # An estimate has no buffer assignment to share allocations between temporaries: its figure is their sizes added
    # up over the whole program, larger than what is live at once.
    temporaries = (" (every HBM temporary's size added up over the program: not all live at once; the peak is what "
                   "is)" if m.get("estimated") else " (HBM temporaries of the buffer assignment)")
    for label, key, how in (("arguments", "argument_bytes", ""), ("outputs", "output_bytes", ""),
                            ("temporaries", "temp_bytes", temporaries)):
        if m.get(key) is not None:
            out.blocks.append(Fact(label, fmt_bytes(m[key]) + how))
    for space, size in sorted((m.get("other_memory_spaces") or {}).items()):
        out.blocks.append(Fact(f"memory space S({space})", f"{fmt_bytes(size)} (not HBM: VMEM/SMEM...)"))
    buffers = m.get("buffers") or []
    if buffers:
        shown = buffers[:top] if top > 0 else buffers
        fixes = any(b.get("fix") for b in shown)
        columns = [name("instruction", least=20), text("shape"), number("padded"), number("unpadded", drop=3),
                   number("padding"), number("x", drop=4), text("kind", drop=2), text("peak", drop=5),
                   name("framework op", drop=1), name("source", drop=6)] + ([text("fix", drop=7)] if fixes else [])
        rows = tuple((b["instruction"], wrappable_shape(b.get("shape") or ""), fmt_bytes(b["size_bytes"]),
                      fmt_bytes(b["unpadded_bytes"]), fmt_bytes(b.get("padding_bytes")),
                      f"{b['expansion']:.1f}" if b.get("expansion") is not None else "", b.get("allocation_type") or "",
                      "*" if b.get("live_at_peak") else "", b.get("op_name") or "",
                      (b.get("source_line") or "").rsplit("/", 1)[-1]) + ((_fix_only(b),) if fixes else ())
                     for b in shown)
        count = m.get("buffer_count") or len(buffers)
        out.blocks.append(Table(tuple(columns), rows, f"Largest HBM buffers ({len(shown)} of {count})"))
    ops = m.get("ops") or []
    if ops:
        shown = ops[:top] if top > 0 else ops
        scope = "live at the peak" if m.get("ops_scope") == "peak" else "all buffers"
        columns = (name("framework op", least=24), number("padded"), number("unpadded", drop=2), number("padding"),
                   number("buffers", drop=3), name("worst buffer", drop=1))
        rows = tuple((o.get("op_name") or "", fmt_bytes(o["size_bytes"]), fmt_bytes(o.get("unpadded_bytes")),
                      fmt_bytes(o.get("padding_bytes")), "" if o.get("buffers") is None else str(o["buffers"]),
                      o.get("worst_buffer") or "") for o in shown)
        out.blocks.append(Table(columns, rows, f"By framework op ({scope})"))
    if m.get("suggestions"):
        out.blocks.append(Fixes("What to change: first what makes it fit, then by HBM saved", tuple(m["suggestions"])))
    out.blocks.append(Caveats("", tuple(m.get("caveats") or ())))
    return out


def _fix_only(buffer: dict) -> str:
    """A buffer's fix without the 'instruction shape: ' it starts with (the table's own columns say those)."""
    fix = buffer.get("fix") or ""
    prefix = f"{buffer['instruction']} {buffer.get('shape')}: "
    return fix[len(prefix):] if fix.startswith(prefix) else fix


def wrappable_shape(shape: str) -> str:
    """'bf16[8,512]{1,0:T(8,128)(2,1)}' -> 'bf16[8,512] {1,0:T(8,128)(2,1)}': a narrow column wraps the
    layout onto its own line instead of cutting the dimensions."""
    if shape.startswith("(") or "]{" not in shape:
        return shape
    return shape.replace("]{", "] {", 1)
