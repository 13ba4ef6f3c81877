"""Fixes for tpuprof's built-in LLM train step (`preflight --model`) that change the options it is built with, each
measured by compiling the changed step: its code is tpuprof's, so a fix is an option, and the changed program can
be compiled to see what it frees.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuprof.analyses import preflight_step
from tpuprof.models.memory import LAYOUT_FITS, ModuleMemory
from tpuprof.models.suggestion import Suggestion, rank
from tpuprof.units import fmt_bytes


@dataclass(frozen=True)
class StateChange:
    """A smaller training state: the option that builds it, the verdict's name for it, and what it keeps."""

    code: str  # the option, as typed
    label: str  # as the "does not fit" verdict lists it (analyses.preflight_step.smaller_state)
    option: str  # PreflightOptions' field
    what: str  # the sentence that says what it changes
    arithmetic: str = "the state arithmetic"  # what the bytes it frees are computed from, for the evidence


# Smallest change first: the first moment alone (every TPU7x recipe's setting), the gradients (as much, but not
# kept from one step to the next: only a compile says what the temporaries then hold), then the weights and both
# moments.
MU_BF16 = StateChange("--mu-dtype bfloat16", preflight_step.MU_BF16, "mu_dtype",
                      "Keep AdamW's first moment in bf16 (MaxText's mu_dtype, as every TPU7x recipe trains: 10 bytes "
                      "a parameter with fp32 weights instead of 12).")
GRAD_BF16 = StateChange("--grad-dtype bfloat16", "--grad-dtype bfloat16 (MaxText's grad_dtype)", "grad_dtype",
                        "Cast the fp32 gradients to bf16 right after the backward pass, before the optimizer (MaxText's "
                        "grad_dtype, as the DeepSeek-V3 TPU7x recipes train): the gradients take 2 bytes a parameter "
                        "instead of 4 until the update, which reads them in bf16 (a change of the training's "
                        "numerics).",
                        "the gradients' arithmetic (2 bytes a parameter instead of 4)")
WEIGHTS_BF16 = StateChange("--weight-dtype bfloat16", preflight_step.WEIGHTS_BF16, "weight_dtype",
                           "Keep the weights and AdamW's moments in bf16 (MaxText's weight_dtype: 6 bytes a parameter "
                           "instead of 12; the update is computed in fp32 and stored back in bf16, which changes the "
                           "training's numerics).")


def measured(change: StateChange, batch: int, needed: int | None, needed_is_bound: bool,
             changed_needed: int | None, changed_is_bound: bool, changed_fits: bool, capacity: int,
             state_saved: int, changed_layout_fits: bool = False) -> Suggestion:
    """CHANGE for a step that does not fit, from the compile of the step so changed at the same BATCH per device:
    NEEDED and CHANGED_NEEDED are the two compiles' required bytes (None: the compiler refused the program),
    *_IS_BOUND when a compile stopped at its memory layout (a lower bound). STATE_SAVED: the bytes per device CHANGE
    frees by its arithmetic (change.arithmetic), for the evidence. CHANGED_LAYOUT_FITS: the changed step's compile
    was stopped at a layout within HBM, which code generation adds to: neither fits nor does not."""
    arithmetic = f"{change.arithmetic}: {fmt_bytes(state_saved)} less per device"
    if changed_needed is None:
        return Suggestion(kind="optimizer_state", severity="improve", confidence="measured", code=change.code,
                          message=change.what + f" Compiled so at batch {batch} per device, the compiler refused the "
                          "step: it does not fit either.",
                          evidence=f"measured: the compile with {change.code} at batch {batch} ran out of memory; "
                                   + arithmetic)
    how = " (its memory layout: a lower bound)" if changed_is_bound else ""
    if changed_layout_fits:
        message = (change.what + f" Compiled so up to its memory layout at batch {batch} per device, the step needs "
                   f"at least {fmt_bytes(changed_needed)} of the {fmt_bytes(capacity)} of HBM: {LAYOUT_FITS}; "
                   "`--full` compiles it to the end.")
    else:
        message = (change.what + f" Compiled so at batch {batch} per device, the step needs "
                   f"{fmt_bytes(changed_needed)}{how} of the {fmt_bytes(capacity)} of HBM: "
                   f"{'it fits.' if changed_fits else 'it still does not fit.'}")
    saving = None
    # A whole compile less a layout (a lower bound) is no saving: it may overstate it.
    if needed is not None and needed > changed_needed and not (changed_is_bound and not needed_is_bound):
        saving = needed - changed_needed
        # A layout is a lower bound of the whole compile: the unchanged step's stands for at least what it needs.
        if needed_is_bound and not changed_is_bound:
            message += f" It frees at least {fmt_bytes(saving)}."
    evidence = (f"measured: compiled at batch {batch} per device, the step needs "
                + (f"{fmt_bytes(needed)}{' (its layout, a lower bound)' if needed_is_bound else ''}"
                   if needed is not None else "more than the HBM (the compiler refused it)")
                + f" as it is, {fmt_bytes(changed_needed)}{how} with {change.code}; {arithmetic}")
    return Suggestion(kind="optimizer_state", severity="blocking" if changed_fits else "improve",
                      saving_bytes=saving, confidence="measured", code=change.code, message=message,
                      evidence=evidence)


def add(module: ModuleMemory, fix: Suggestion, needed: int | None) -> None:
    """FIX among MODULE's suggestions, ranked with them against the step's shortfall (NEEDED: its compiled total)."""
    capacity = module.hbm_capacity_bytes
    over = max(module.peak_heap_bytes or 0, needed or 0)
    shortfall = over - capacity if capacity and over > capacity else None
    module.suggestions = rank([*module.suggestions, fix], shortfall_bytes=shortfall)


def larger_slice(chosen, batch: int, needed: int, needed_is_bound: bool, state_here: int, found, largest,
                 capacity: int, gradients_here: int = 0, divided=None) -> Suggestion:
    """The fix of a step that no change of its training state makes fit: a larger slice of the same generation, by
    the state arithmetic (analyses.preflight_step.larger_slices: FOUND and LARGEST, each (Slice, state bytes per
    device) or None), not compiled; or that none is large enough. NEEDED: the step's required bytes per device on
    CHOSEN (NEEDED_IS_BOUND: its layout's, a lower bound), STATE_HERE of them its weights and AdamW state.
    The arithmetic keeps the gradients whole, and fsdp divides them as it does the weights: it errs high by up to
    what the slice divides of GRADIENTS_HERE (the gradients per device on CHOSEN). DIVIDED: the slice found with
    them divided too (larger_slices(gradients=True)), the other bound."""
    layout = " (its memory layout: a lower bound)" if needed_is_bound else ""
    rest = needed - state_here
    evidence = (f"the state arithmetic, not compiled: on {chosen.name} at batch {batch} per device the step needs "
                f"{fmt_bytes(needed)}{layout}, {fmt_bytes(state_here)} of it the weights and AdamW state; more devices "
                f"divide the state, and the arithmetic keeps the rest ({fmt_bytes(rest)}: activations, which follow "
                "the batch per device, gradients and temporaries) as it is")
    generation = chosen.target.name
    lower = divided[0] if divided is not None else None
    if found is None:
        where = (f"even on the largest, {largest[0].name} ({largest[0].devices} devices), the state is "
                 f"{fmt_bytes(largest[1])} per device, and with the rest of the step {fmt_bytes(rest + largest[1])}"
                 if largest else f"{chosen.name} is the largest")
        message = (f"No larger {generation} slice makes room for this step at batch {batch} per device by the state "
                   f"arithmetic: {where}, more than the {fmt_bytes(capacity)} of HBM.")
        if lower is not None:
            message += (f" With the gradients ({fmt_bytes(gradients_here)} per device here) divided too, as fsdp "
                        f"divides them, {lower.name} ({lower.devices} devices) would: `tpuprof preflight --tpu "
                        f"{lower.name}` checks it.")
        return Suggestion(kind="sharding", severity="info", confidence="estimated", message=message,
                          evidence=evidence)
    offered, state = found
    saved = state_here - state
    # The gradients shrink with the state on the larger slice (one per parameter, in the weights' dtype).
    overcounted = gradients_here - gradients_here * state // state_here if state_here else 0
    error = (f" The arithmetic errs high: it keeps the gradients whole ({fmt_bytes(gradients_here)} per device "
             f"here), which fsdp divides as it does the weights, {fmt_bytes(overcounted)} less on {offered.name}: "
             f"about {fmt_bytes(needed - saved - overcounted)} with them divided, less where temporaries shrink too"
             if overcounted else "")
    if lower is not None and lower.devices < offered.devices:
        error += f", and with them divided {lower.name} ({lower.devices} devices) would make room too"
    error += "." if error else ""
    checks = f"{offered.name}" + (f" or --tpu {lower.name}" if lower is not None and lower.devices < offered.devices
                                  else "")
    return Suggestion(kind="sharding", severity="blocking", confidence="estimated", saving_bytes=saved,
                      code=f"--tpu {offered.name}",
                      message=f"Use a larger slice: on {offered.name} ({offered.devices} devices), fsdp over them, the "
                              f"weights and AdamW state are {fmt_bytes(state)} per device instead of "
                              f"{fmt_bytes(state_here)}, so the step at batch {batch} per device needs {fmt_bytes(saved)} "
                              f"less: {fmt_bytes(needed - saved)} of the {fmt_bytes(capacity)} of HBM by the state "
                              f"arithmetic, the smallest {generation} slice that makes room (not compiled: "
                              f"`tpuprof preflight --tpu {checks}` checks it).{error}",
                      evidence=evidence)
