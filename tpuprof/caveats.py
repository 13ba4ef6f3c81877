"""What an estimated figure leaves out, as plain sentences: the `caveats` list of every estimate in the --json
documents (and so in the Markdown, which is rendered from them).

Derived in this one place from what the documents already say (a memory module's `method`, `estimated`,
`expected_error_percent` and `peak_range_bytes`; preflight's `estimate.not_modelled` and
`kernels_without_estimate`; analyze's step counts, notes and warnings; an OOM batch estimate's confidence and
reason), rather than in each estimator, so that a figure and its caveats cannot disagree and a new estimate only
needs a rule here. `annotate` adds them in place; it is idempotent (a document read back is annotated again to
the same lists).
"""

from __future__ import annotations

from tpuprof.units import fmt_bytes

MIN_STEPS = 5  # tpuprof.analyses.coverage.MIN_STEPS (not imported: that module pulls in the step analysis)

# Memory spaces besides HBM (0) are named by number, as layouts print them (`S(1)`); 5 is XLA's host memory
# space (xla::Layout::kHostMemorySpace).
MEMORY_SPACES = {5: "host memory (S(5))"}


def annotate(command: str, document: dict) -> dict:
    """Add `caveats` to every estimated figure of a command's --json document, in place; returns the document."""
    if command == "memory":
        for module in document.get("modules") or []:
            module["caveats"] = memory(module)
    elif command == "oom":
        _oom(document)
    elif command == "preflight":
        for target in document.get("targets") or []:
            preflight(target)
    elif command == "analyze":
        document["caveats"] = analyze(document)
    elif command == "capture" and isinstance(document.get("analysis"), dict) and "steps" in document["analysis"]:
        document["analysis"]["caveats"] = analyze(document["analysis"])
    elif command == "diff":
        for group in document.get("groups") or []:
            group["caveats"] = diff_group(group)
    return document


def memory(module: dict) -> list[str]:
    """A memory module's peak: how it was obtained and what it does not count."""
    out = []
    method = module.get("method")
    error = module.get("expected_error_percent")
    if method == "hlo_liveness":
        out.append("Estimated from the liveness of scheduled HLO, not the compiler's buffer assignment"
                   + (f": expected error up to {error:g}%." if error is not None else "; no error bound is known."))
    elif method == "unscheduled_bound":
        low_high = module.get("peak_range_bytes")
        where = (f" the real peak can land anywhere from {fmt_bytes(low_high[0])} to {fmt_bytes(low_high[1])}"
                 if low_high else " no range is known")
        out.append("Text estimate without a TPU schedule or layouts:" + where
                   + (f" (expected error {error:g}%)." if error is not None else "."))
    elif module.get("estimated"):
        out.append("Estimated, not the compiler's TPU buffer assignment"
                   + (f": expected error up to {error:g}%." if error is not None else "."))
    if module.get("estimated") or method in ("hlo_liveness", "unscheduled_bound"):
        out.append("Fragmentation not simulated: the allocator may need more than the sum of live buffers.")
    others = {k: v for k, v in (module.get("other_memory_spaces") or {}).items() if v}
    if others:
        spaces = ", ".join(f"{fmt_bytes(v)} in {MEMORY_SPACES.get(_int(k), f'memory space S({k})')}"
                           for k, v in others.items())
        out.append(f"Not in the HBM peak: {spaces}.")
    if module.get("peak_heap_bytes") is not None:
        out.append("One program's peak: HBM held by other programs, the runtime and the input pipeline is not "
                   "counted.")
    return out


def batch_estimate(estimate: dict) -> list[str]:
    """An OOM triage's batch that fits: a linear extrapolation."""
    if not estimate or estimate.get("fitting_batch") is None and estimate.get("scale") is None:
        return []
    out = ["Assumes memory grows linearly with the batch; fragmentation not simulated."]
    if estimate.get("confidence") in ("low", "rough"):
        reason = estimate.get("reason") or "few figures are known"
        out.append(f"{reason[0].upper()}{reason[1:]} (confidence {estimate['confidence']}).")
    return out


def _oom(document: dict) -> None:
    if isinstance(document.get("batch_estimate"), dict):
        document["batch_estimate"]["caveats"] = batch_estimate(document["batch_estimate"])


def preflight(target: dict) -> None:
    """A preflight target: its step-time estimate, its memory module, its OOM triage, its batch curve."""
    estimate = target.get("estimate")
    if isinstance(estimate, dict):
        estimate["caveats"] = step_estimate(estimate)
    if isinstance(target.get("memory"), dict):
        target["memory"]["caveats"] = memory(target["memory"])
    oom = target.get("oom")
    if isinstance(oom, dict):
        _oom(oom)
    if target.get("curve_fit") and target.get("max_batch_size") is None:
        target["caveats"] = ["Largest batch extrapolated from a linear fit of the compiled batches' memory."]


def step_estimate(estimate: dict) -> list[str]:
    """Preflight's step time: what the roofline and the compiler's cycles leave out."""
    out = [f"Not modelled: {item}." for item in estimate.get("not_modelled") or []]
    estimated = {k.get("name"): k for k in estimate.get("kernels_estimated") or [] if isinstance(k, dict)}
    kernels = [k for k in estimate.get("kernels_without_estimate") or [] if k not in estimated]
    if kernels:
        shown = ", ".join(kernels[:3]) + (f" and {len(kernels) - 3} more" if len(kernels) > 3 else "")
        out.append(f"Pallas/custom kernel{'s' if len(kernels) > 1 else ''} without a cost estimate: {shown} "
                   "(counted by their operands' bytes only, no FLOPs).")
    if estimated:
        shown = ", ".join(f"{k.get('kernel')} ({k.get('blocks')})" for k in list(estimated.values())[:3])
        out.append(f"Estimated, not the kernel's own figure: the FLOPs of {shown}"
                   + (f" and {len(estimated) - 3} more" if len(estimated) > 3 else "")
                   + f"; {estimate.get('kernels_estimated_rule') or 'a rule from their operand shapes'}.")
    if estimate.get("compiler_ms") is None:
        out.append("No compiler cycle estimates in this dump: the roofline alone, a lower bound.")
    if estimate.get("price_per_chip_hour") is not None and not estimate.get("price_verified"):
        out.append("Price from tpuprof's table, not verified today: pass --price for yours.")
    return out


def analyze(document: dict) -> list[str]:
    """A profile's step figures: measured, but over a window, from markers, with heuristic categories."""
    out = []
    hosts = document.get("hosts") or []
    counts = [h.get("steps") or 0 for h in hosts]
    measured = [c for c in counts if c]
    if measured and min(measured) < MIN_STEPS:
        out.append(f"{_count(min(measured), 'step')} measured"
                   + (" on the host with the fewest" if len(hosts) > 1 else "")
                   + ": one slow step moves every share.")
    without = [h.get("host") for h, c in zip(hosts, counts) if not c]
    if without and measured:
        out.append(f"No steps found on {', '.join(map(str, without[:3]))}: left out of the step figures.")
    for host in hosts:
        for note in host.get("notes") or []:
            out.append(f"{host.get('host')}: {note[0].upper()}{note[1:]}" + ("" if note.endswith(".") else "."))
    if measured:
        out.append("Step time split into categories by op kind and thread (XProf-style heuristics): time where "
                   "several overlap counts once, in the first of compile, input, compute, host overhead.")
    roofline = document.get("roofline")
    if isinstance(roofline, dict) and roofline.get("mfu_percent") is not None:
        out.append("MFU from the capture's per-op FLOP counts over the measured steps, against the generation's "
                   "peak from tpuprof.targets.")
    return out


def diff_group(group: dict) -> list[str]:
    """A diff group: the per-example growth is a two-point line; few steps make step figures noisy."""
    out = []
    per_example = group.get("per_example")
    if isinstance(per_example, dict) and per_example.get("per_example_bytes") is not None:
        out.append(f"Per-example growth is a line through two batches ({per_example.get('batch_a')} and "
                   f"{per_example.get('batch_b')}); the largest batch assumes it stays linear.")
    batches = group.get("batches_per_step")
    if isinstance(batches, dict) and batches.get("a") != batches.get("b"):
        out.append(f"A step runs {batches.get('a')} batch(es) in A and {batches.get('b')} in B: step times and "
                   "per-step figures count different work; the *_per_batch metrics compare alike.")
    steps = group.get("steps_measured")
    if isinstance(steps, dict):
        few = [f"{side.upper()} {_count(n, 'step')}" for side, n in steps.items()
               if isinstance(n, int) and n < MIN_STEPS]
        if few:
            out.append(f"Few steps measured ({', '.join(few)}): a change within a step's spread may be noise.")
    return out


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _int(key) -> int | None:
    try:
        return int(key)
    except (TypeError, ValueError):
        return None
