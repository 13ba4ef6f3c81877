"""preflight results as the JSON contract and as rich tables, plus the progress bar for compiles."""

from __future__ import annotations

from contextlib import contextmanager

from tpuprof.documents_preflight import target_label, unsharded_words  # noqa: F401 - markdown imports it here
from tpuprof.presentation import fits_word
from tpuprof.units import fmt_bytes, fmt_ms, fmt_usd


@contextmanager
def progress(enabled: bool):
    """A spinner on stderr while libtpu compiles: `report(label, batch)` before each compile."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda label, batch: None
        return
    count = 0
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("compiling with libtpu", total=None)

        def report(label: str, batch: int) -> None:
            nonlocal count
            count += 1
            bar.update(task, description=f"{label}: compile {count}, batch {batch}")

        yield report


def _verdict(r: dict) -> str:
    if r.get("verdict"):
        return f"[red]{r['verdict']}[/red]"
    if r.get("fits"):
        share = r["required_bytes"] / r["hbm_capacity_bytes"]
        hbm = f"({share:.0%} of HBM, {fmt_bytes(r['hbm_capacity_bytes'] - r['required_bytes'])} spare)"
        if r.get("host_fits") is False:  # HBM is not all: what it offloads does not fit the host
            return f"fits in HBM {hbm}, [red]not in host memory[/red] (below)"
        return f"[green]{fits_word(True)}[/green] {hbm}"
    if r.get("required_bytes") is not None:
        over = r["required_bytes"] - r["hbm_capacity_bytes"]
        bound = "at least " if r.get("fast") else ""  # a layout's figures: code generation adds to them
        return f"[red]{fits_word(False)}[/red] (over by {bound}{fmt_bytes(over)})"
    return f"[red]{fits_word(False)}[/red] (the compiler refused it: RESOURCE_EXHAUSTED)"


def _host(r: dict) -> str:
    """Host memory the device's program holds (offloaded activations), against what a device may hold there
    (targets.Target.host_capacity_bytes)."""
    if not r.get("host_bytes"):
        return "-"
    if r.get("host_capacity_bytes") is None:
        return f"{fmt_bytes(r['host_bytes'])} (no host budget known for this generation)"
    verdict = fits_word(True) if r.get("host_fits") else "[red]more than a device may hold[/red]"
    return f"{fmt_bytes(r['host_bytes'])} of {fmt_bytes(r['host_capacity_bytes'])} a device may hold: {verdict}"


def bound_words(r: dict) -> str:
    """What bounds the largest batch (max_batch_bound), as the table and Markdown say it."""
    bound = r.get("max_batch_bound")
    if bound == "host":
        capacity = r.get("host_capacity_bytes")
        return "host memory" + (f" ({fmt_bytes(capacity)} a device may hold)" if capacity else "")
    return {"hbm": "HBM", "batch_limit": "the search limit", None: "-"}.get(bound, str(bound))


def _parameters(count: int) -> str:
    """A parameter count for people: 8.03B, 45.2M, 1,024 (a tiny model is not "0.00B")."""
    if count >= 10**9:
        return f"{count / 1e9:.2f}B"
    if count >= 10**6:
        return f"{count / 1e6:.1f}M"
    return f"{count:,}"


def print_report(spec: str, results: list[dict], top: int) -> None:
    from rich.markup import escape

    from tpuprof.renderers import memory as memory_render
    from tpuprof.renderers import tables
    from tpuprof.renderers.output import console

    out = console()
    sharded = any(r.get("mesh") for r in results)
    how = ("sharded over every device of the slice, compiled with libtpu; memory per device" if sharded
           else "compiled with libtpu for one device, per-device batch")
    out.print(f"[bold]preflight[/bold] {escape(spec)}  ({how})")
    rows = []

    def row(label, fn):
        cells = [fn(r) for r in results]
        if any(cell != "-" for cell in cells):  # e.g. no compiler figures when it refused the program
            rows.append((label, *cells))

    def size(key):
        return lambda r: fmt_bytes(r[key]) if r.get(key) is not None else "-"

    row("slice", lambda r: _slice(r["slice"]) if r.get("slice") and r["slice"]["name"] != r["target"] else "-")
    row("mesh", lambda r: " ".join(f"{axis}={size}" for axis, size in r["mesh"].items() if size > 1) or "1 device"
        if r.get("mesh") else "-")
    if sharded:
        row("model", lambda r: (f"{r['model']['name']}: {_parameters(r['model']['parameters'])} parameters, "
                                f"seq {r['seq_len']}, remat {r['model']['remat']}, {r['model']['dtype']}"
                                + (f", {r['model']['weight_dtype']} weights"
                                   if r["model"].get("weight_dtype", "float32") != "float32" else ""))
            if r.get("model") else "-")
        row("weights + AdamW state per chip", size("state_bytes_per_chip"))
        row("  of it not sharded", lambda r: fmt_bytes(r["unsharded"]["state_bytes_per_chip"])
            if r.get("unsharded") else "-")
    row("batch size" if not sharded else "batch per device", lambda r: str(r["batch_size"]))
    row("batch per chip / global", lambda r: f"{r['batch_per_chip']} / {r['global_batch']}"
        if r.get("global_batch") is not None else "-")
    row("verdict", _verdict)
    row("how", lambda r: r["fast"]["method"] if r.get("fast") else "-")  # a compile stopped early says why
    row("required (args+out-alias+temp+code)", size("required_bytes"))
    row("HBM the compiler offers", size("hbm_capacity_bytes"))
    row("  arguments", size("argument_bytes"))
    row("  outputs", size("output_bytes"))
    row("  aliased (donated)", size("alias_bytes"))
    # memory_analysis() counts every temporary allocation of the program; the breakdown below counts the
    # buffer assignment's HBM temporaries only: the two differ, so each says which it is.
    row("  temporaries (memory_analysis())", lambda r: f"at least {fmt_bytes(r['temp_bytes'])} (buffer assignment)"
        if r.get("fast") and r.get("temp_bytes") is not None else size("temp_bytes")(r))
    row("  generated code", lambda r: "not generated" if r.get("fast") else size("generated_code_bytes")(r))
    if any(r.get("host_bytes") for r in results):
        row("host memory (offloaded, not HBM)", _host)
    row("peak heap padded / unpadded", lambda r: (f"{fmt_bytes(r['peak_heap_bytes'])} / "
                                                   f"{fmt_bytes(r['peak_unpadded_heap_bytes'])}")
        if r.get("peak_heap_bytes") is not None else "-")
    row("padding live at peak", size("padding_at_peak_bytes"))
    if any("max_batch_per_chip" in r for r in results):
        row("max batch per chip", lambda r: str(r.get("max_batch_per_chip") or "none fits"))
        row("  bound by", bound_words)
        row("memory vs batch", _curve)
    elif any("max_batch_size" in r for r in results):
        row("max batch (multiple of 8)", lambda r: _max(r))
        row("  bound by", bound_words)
        row("recommended (multiple of 128)", lambda r: str(r.get("recommended_batch_size") or "-"))
        row("memory vs batch", _curve)
    if any("bf16" in r for r in results):
        row("bf16: required", lambda r: fmt_bytes(r["bf16"].get("required_bytes")) if r.get("bf16") else "-")
        row("bf16: peak padded / unpadded", lambda r: (
            f"{fmt_bytes(r['bf16']['peak_heap_bytes'])} / {fmt_bytes(r['bf16']['peak_unpadded_heap_bytes'])}")
            if r.get("bf16", {}).get("peak_heap_bytes") is not None else "-")
        row("bf16: padding live at peak", lambda r: fmt_bytes(r["bf16"].get("padding_at_peak_bytes"))
            if r.get("bf16") else "-")
        if any("max_batch_size" in r.get("bf16", {}) for r in results):
            row("bf16: max batch", lambda r: _max(r["bf16"]) if r.get("bf16") else "-")
    if any(r.get("estimate") for r in results):
        _estimate_rows(row)
    row("compiles (this run)", lambda r: str(r["compiles"]))
    columns = [tables.text("")] + [tables.text(f"{target_label(r)} ({r['topology']}; per device = "
                                               f"{r['device']['description']})", justify="right")
                                   for r in results]
    out.print(tables.table(columns, rows, out.width))

    for r in results:
        if r.get("unsharded") and not r.get("verdict"):  # a verdict that no batch fits says it already
            out.print(f"[bold]{target_label(r)}[/bold] weights and AdamW state: "
                      f"{escape(unsharded_words(r['unsharded'], r.get('mesh') or {}))}")
        if r.get("remat_table"):
            cells = "; ".join(f"{t['remat']}: {t['max_batch_per_chip'] or 'none fits'}"
                              + (f" ({fmt_ms(t['step_ms'])})" if t.get("step_ms") else "") for t in r["remat_table"])
            out.print(f"[bold]{target_label(r)}[/bold] largest batch per chip by remat policy (step time estimated): "
                      f"{cells}; reported: remat {r['model']['remat']}")
        if len(r.get("curve", [])) > 1:
            points = ", ".join(f"{p['batch_size']}: {fmt_bytes(p['required_bytes'])}"
                               + (f" (host {fmt_bytes(p['host_bytes'])})" if p.get("host_bytes") else "")
                               if p["required_bytes"] is not None
                               else f"{p['batch_size']}: refused by the compiler" for p in r["curve"])
            out.print(f"[bold]{target_label(r)}[/bold] memory vs batch, as compiled: {points}")
        if r.get("oom"):
            out.print(f"[bold]{target_label(r)}[/bold]: the compiler ran out of memory at batch {r['batch_size']}:")
            out.print(f"  {escape(r['oom']['message'].strip().splitlines()[0])}")
            for s in r["oom"].get("suggestions", [])[:3]:
                out.print(f"  - {escape(s['message'])}")
        if r.get("memory") is not None:
            out.print(f"[bold]{target_label(r)} at batch {r['batch_size']}: where the memory goes[/bold]")
            memory_render.print_tables([r["memory"]], min(top, 8))
    _print_estimates(out, results)
    out.print(f"[dim]compiles are cached in {escape(results[0]['cache'])} (--no-cache to recompile)[/dim]")


def _slice(s: dict) -> str:
    slices = f" x {s['num_slices']} slices" if s.get("num_slices", 1) > 1 else ""
    return f"{s['name']}{slices}: {s['topology']}, {s['chips']} chips, {s['devices']} devices"


def _max(r: dict) -> str:
    if r.get("max_batch_size") is None:
        return "none fits"
    return f"≥ {r['max_batch_size']} (search limit)" if r.get("search_limited") else str(r["max_batch_size"])


def _curve(r: dict) -> str:
    fit = r.get("curve_fit")
    if not fit:
        return "-"
    if fit["fixed_bytes"] < 0:  # the compiles do not lie on a line: no fixed part to state
        return f"≈{fmt_bytes(fit['per_example_bytes'])}/example (not linear)"
    return f"{fmt_bytes(fit['fixed_bytes'])} + {fmt_bytes(fit['per_example_bytes'])}/example"


def _estimate_rows(row) -> None:
    """Step time, throughput, utilisation and cost per generation (estimated from the compiled program)."""

    def get(key, fmt):
        return lambda r: fmt(r["estimate"][key]) if r.get("estimate") and r["estimate"].get(key) is not None else "-"

    row("step time, estimated (band)", lambda r: (
        fmt_ms(r['estimate']['step_ms'], r['estimate']['step_ms_low'], r['estimate']['step_ms_high'])
        if r.get("estimate") else "-"))
    row("  collectives (exposed)", lambda r: (
        f"{fmt_ms(r['estimate']['collective_ms'])} ({fmt_ms(r['estimate']['exposed_collective_ms'])})"
        if r.get("estimate") and r["estimate"].get("collective_ms") else "-"))
    row("  DCN all-reduce across slices", get("dcn_ms", lambda v: fmt_ms(v) if v else "-"))
    row("examples/s per chip", get("examples_per_s", lambda v: f"{v:,}"))
    row("tokens/s per chip", get("tokens_per_s_per_chip", lambda v: f"{v:,}"))
    row("FLOP utilisation", get("flop_utilization_percent", lambda v: f"{v:.0f}%"))
    row("MFU", get("mfu_percent", lambda v: f"{v:.0f}%"))
    row("compute / memory bound", lambda r: (
        f"{r['estimate']['compute_bound_percent']:.0f}% / {r['estimate']['memory_bound_percent']:.0f}%"
        if r.get("estimate") and r["estimate"].get("compute_bound_percent") is not None else "-"))
    row("price per chip-hour", lambda r: (
        f"${r['estimate']['price_per_chip_hour']:.2f}{'' if r['estimate']['price_verified'] else ' (unverified)'}"
        if r.get("estimate") and r["estimate"].get("price_per_chip_hour") else "-"))
    row("cost per 1M examples", get("cost_per_million_examples", fmt_usd))
    row("cost per 1M tokens", get("cost_per_million_tokens", fmt_usd))


def _print_estimates(out, results: list[dict]) -> None:
    from rich.markup import escape

    from tpuprof.analyses.step_estimate import NOT_MODELLED, short_source
    from tpuprof.documents_preflight import choice

    estimated = [r for r in results if r.get("estimate")]
    if not estimated:
        return
    for r in estimated:
        e = r["estimate"]
        ops = ", ".join(f"{escape(op['op_name'] or op['name'])}"
                        f"{' (' + escape(short_source(op['source_line'])) + ')' if op['source_line'] else ''}"
                        f" {fmt_ms(op['ms'])} {op['bound']}" + (f" x{op['count']}" if op["count"] > 1 else "")
                        for op in e["top_ops"][:3])
        out.print(f"[bold]{target_label(r)}[/bold] slowest ops: {ops}")
        estimated_kernels = {k["name"] for k in e.get("kernels_estimated") or []}
        unestimated = [k for k in e.get("kernels_without_estimate") or [] if k not in estimated_kernels]
        if unestimated:
            out.print(f"  [yellow]no estimate for kernel(s) {escape(', '.join(unestimated[:5]))}"
                      "[/yellow]: counted as 0 FLOPs and their operands' bytes")
        if estimated_kernels:
            kinds = sorted({k["kernel"] for k in e["kernels_estimated"]})
            out.print(f"  [yellow]FLOPs estimated from operand shapes for {escape(', '.join(kinds))}[/yellow] "
                      "(attention kernels without a cost_estimate; see caveats)")
        unknown = [loop["name"] for loop in e.get("loops", []) if loop["trip_count_source"] == "unknown"]
        if unknown:
            out.print(f"  [yellow]loop(s) {escape(', '.join(unknown[:5]))}: trip count unknown, counted once[/yellow]")
        if not e.get("compiler_ms"):
            out.print("  [yellow]no compiler cycle estimates in this dump: the band is the roofline alone[/yellow]")
        if e.get("top_collectives"):
            out.print("  slowest collectives: " + ", ".join(
                f"{c['kind']} of {c['group_size']} over {escape(c['axes'])} {fmt_ms(c['ms'])} "
                f"({fmt_ms(c['exposed_ms'])} exposed)" + (f" x{c['count']}" if c["count"] > 1 else "")
                for c in e["top_collectives"][:3]))
        for missing in e.get("not_modelled", [])[:len(e.get("not_modelled", [])) - len(NOT_MODELLED)]:
            out.print(f"  [yellow]not timed: {escape(missing)}[/yellow]")
    lines = choice(results)
    for line in (lines or "").splitlines():
        out.print(f"[bold]which TPU:[/bold] {escape(line)}")
    out.print("[dim]step time: estimated from the compiled program, band = \\[roofline, compiler's cycle "
              "estimates] + collectives on the slice's ICI torus (exposed part; all of it at the high end), "
              "point = geometric mean + exposed collectives (see bench/bench_step_estimate.py). Not modelled: "
              f"{', '.join(NOT_MODELLED)}.[/dim]")
