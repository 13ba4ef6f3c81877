"""Fixes for tpuprof's built-in LLM train step (`preflight --model`) that change the options it is built with, each
measured by compiling the changed step: its code is tpuprof's, so a fix is an option, and the changed program can
be compiled to see what it frees.
"""

from __future__ import annotations

from tpuprof.models.memory import ModuleMemory
from tpuprof.models.suggestion import Suggestion, rank
from tpuprof.units import fmt_bytes

MU_CODE = "--mu-dtype bfloat16"


def mu_dtype(batch: int, needed: int | None, needed_is_bound: bool, changed_needed: int | None,
             changed_is_bound: bool, changed_fits: bool, capacity: int, state_saved: int) -> Suggestion:
    """AdamW's first moment in bf16 (MaxText's mu_dtype) for a step that does not fit with an fp32 one, from the
    compile of the step so changed at the same BATCH per device: NEEDED and CHANGED_NEEDED are the two compiles'
    required bytes (None: the compiler refused the program), *_IS_BOUND when a compile stopped at its memory layout
    (a lower bound). STATE_SAVED: the arithmetic's bytes per device, for the evidence."""
    message = ("Keep AdamW's first moment in bf16 (MaxText's mu_dtype, as every TPU7x recipe trains: 10 bytes a "
               "parameter with fp32 weights instead of 12).")
    evidence = (f"the state arithmetic: {fmt_bytes(state_saved)} less per device (2 of the first moment's 4 bytes a "
                "parameter)")
    if changed_needed is None:
        return Suggestion(kind="optimizer_state", severity="improve", confidence="measured", code=MU_CODE,
                          message=message + f" Compiled so at batch {batch} per device, the compiler refused the "
                          "step: it does not fit either.",
                          evidence=f"measured: the compile with a bf16 first moment at batch {batch} ran out of "
                                   f"memory; {evidence}")
    outcome = "it fits." if changed_fits else "it still does not fit."
    how = " (its memory layout: a lower bound)" if changed_is_bound else ""
    message += (f" Compiled so at batch {batch} per device, the step needs {fmt_bytes(changed_needed)}{how} of the "
                f"{fmt_bytes(capacity)} of HBM: {outcome}")
    saving = None
    if needed is not None and needed > changed_needed:
        saving = needed - changed_needed
        # A layout is a lower bound of the whole compile: the unchanged step's stands for at least what it needs.
        if needed_is_bound and not changed_is_bound:
            message += f" It frees at least {fmt_bytes(saving)}."
    measured = (f"measured: compiled at batch {batch} per device, the step needs "
                + (f"{fmt_bytes(needed)}{' (its layout, a lower bound)' if needed_is_bound else ''}"
                   if needed is not None else "more than the HBM (the compiler refused it)")
                + f" with an fp32 first moment, {fmt_bytes(changed_needed)}{how} with a bf16 one")
    return Suggestion(kind="optimizer_state", severity="blocking" if changed_fits else "improve",
                      saving_bytes=saving, confidence="measured", code=MU_CODE, message=message,
                      evidence=f"{measured}; {evidence}")


def add(module: ModuleMemory, fix: Suggestion, needed: int | None) -> None:
    """FIX among MODULE's suggestions, ranked with them against the step's shortfall (NEEDED: its compiled total)."""
    capacity = module.hbm_capacity_bytes
    over = max(module.peak_heap_bytes or 0, needed or 0)
    shortfall = over - capacity if capacity and over > capacity else None
    module.suggestions = rank([*module.suggestions, fix], shortfall_bytes=shortfall)
