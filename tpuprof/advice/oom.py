"""Ranked causes and fixes for a TPU out-of-memory report.

Each suggestion is {"kind", "message"} plus "saving_bytes" when the fix frees a size the log lets us
compute. Ranked by that saving; the ones whose effect the log cannot size follow, and "how to get more
detail" comes last.
"""

from __future__ import annotations

from tpuprof.analyses.oom import format_bytes as fmt
from tpuprof.models.oom import (
    COMPILE, EARLY_ABORT, RESERVATION, RUNTIME_ALLOCATION, BatchEstimate, OomAllocation, OomReport,
)

DUMP_FLAGS = "XLA_FLAGS='--xla_dump_to=/tmp/xla_dump --xla_dump_hlo_as_proto --xla_dump_hlo_as_text'"
FAST_EXIT_FLAG = "--xla_tpu_impure_oom_fast_exit_threshold=-1"

_BF16_HINT = {
    "jax": "compute in bfloat16 (dtype=jnp.bfloat16 in the model's layers, parameters may stay float32)",
    "tensorflow": "keras.mixed_precision.set_global_policy('mixed_bfloat16')",
    "torch_xla": "run the step under torch.autocast('xla', dtype=torch.bfloat16)",
}
_REMAT_HINT = {
    "jax": "jax.checkpoint (flax: nn.remat) around the repeated blocks",
    "tensorflow": "tf.recompute_grad around the repeated blocks",
    "torch_xla": "torch_xla.utils.checkpoint around the repeated blocks",
}


def suggest(report: OomReport, estimate: BatchEstimate) -> list[dict]:
    sized: list[dict] = []
    unsized: list[dict] = []
    capacity = report.capacity_bytes
    listed = [a for a in report.allocations if a.size_bytes]

    if report.memory_space in ("vmem", "smem"):
        unsized.append(_scratch_memory(report))
    if report.kind in (RUNTIME_ALLOCATION, RESERVATION):
        unsized.append(_live_buffers(report))
    if report.sparsecore_bytes is not None and report.tensorcore_bytes is not None:
        unsized.append(_sparsecore(report))
    if report.kind == EARLY_ABORT:
        unsized.append({"kind": "shape_bug", "message": (
            f"The compiler estimated {fmt(report.used_bytes)} against {fmt(report.capacity_bytes)} and gave up "
            "before assigning buffers: a tensor is far larger than intended (a wrong reshape or broadcast, an "
            "accidental outer product, a static size used as a batch). Look for the largest shape in the "
            "program.")})

    sized += _padding(report, capacity)
    sized += _bf16(report, listed, capacity)
    if report.arguments_bytes and report.used_bytes and report.arguments_bytes >= 0.4 * report.used_bytes:
        sized.append({"kind": "sharding", "saving_bytes": 0, "message": (
            f"Arguments (parameters, optimizer state, inputs) take {fmt(report.arguments_bytes)} of "
            f"{fmt(report.used_bytes)}: shard them over the devices (FSDP / ZeRO-style sharding), donate "
            "them so outputs reuse their memory (jax: donate_argnums), or keep optimizer state in bfloat16.")})
    if estimate.scale is not None and estimate.scale <= 0 and estimate.fixed_bytes \
            and not any(s["kind"] == "sharding" for s in sized):
        sized.append({"kind": "sharding", "saving_bytes": 0, "message": (
            f"What does not shrink with the batch ({fmt(estimate.fixed_bytes)}: parameters, optimizer state) "
            f"alone exceeds the {fmt(capacity)} available: shard it over more devices (FSDP / ZeRO-style), "
            "or keep it in bfloat16.")})
    remat = _remat(report)
    if remat:
        unsized.append(remat)
    if estimate.scale is not None and 0 < estimate.scale < 1 and report.memory_space not in ("vmem", "smem") \
            and report.kind != EARLY_ABORT:
        batch = _batch(estimate)
        padding = max((s["saving_bytes"] for s in sized if s["kind"] == "padding"), default=0)
        if report.exceeded_bytes and padding >= report.exceeded_bytes:
            batch["message"] += (f" The largest padding fix alone frees {fmt(padding)}, more than the "
                                 f"{fmt(report.exceeded_bytes)} excess: try it before shrinking the batch.")
        unsized.append(batch)
    ops = _largest_ops(listed)
    if ops:
        unsized.append(ops)

    sized.sort(key=lambda s: -s.get("saving_bytes", 0))
    for item in sized:
        if not item.get("saving_bytes"):
            item.pop("saving_bytes", None)
    return sized + unsized + _more_detail(report)


def _op_label(entry: OomAllocation) -> str:
    if entry.op_name:
        name = entry.op_name if len(entry.op_name) <= 80 else entry.op_name[:77] + "..."
        return f"{name}" + (f" ({entry.op_type})" if entry.op_type else "")
    if entry.op_type:
        return entry.op_type
    if entry.xla_label:
        return entry.xla_label.split("=")[0].strip().lstrip("%")[:60]
    return f"allocation {entry.index}"


def _padding(report: OomReport, capacity: int | None) -> list[dict]:
    out: list[dict] = []
    by_shape: dict[str, dict] = {}  # buffers of one shape share the fix: one suggestion, savings summed
    listed = sum(a.size_bytes or 0 for a in report.allocations)
    threshold = 0.01 * capacity if capacity else 0.01 * listed
    for entry in report.allocations:
        # The recomputed sizes are exact where they agree with the log's rounded ones.
        exact = entry.recomputed_padded_bytes is not None and not entry.disagreements
        size = entry.recomputed_padded_bytes if exact else entry.size_bytes
        unpadded = entry.recomputed_unpadded_bytes if exact else entry.unpadded_bytes
        if not size or not unpadded or not entry.shape:
            continue
        padding = size - unpadded
        if padding < threshold or padding < 0.25 * size:
            continue
        if entry.shape in by_shape:
            item = by_shape[entry.shape]
            item["saving_bytes"] += padding
            item["_more"] += 1
            continue
        dims = "; ".join(f"dim {d} is {n}, tiled to {p}" for d, n, p in entry.padded_dims) or "the tiled dims"
        fix = "make that dimension a multiple of the tile or move a large dimension into the two minor positions"
        small_minor = [n for d, n, p in entry.padded_dims if p >= 128 and n <= 16]
        one_hot = "one_hot" in (entry.op_name or "").lower() or (entry.op_type or "") == "OneHot"
        if one_hot:
            fix = ("do not materialise the one-hot: use integer labels with a sparse loss "
                   "(sparse_categorical_crossentropy, optax.softmax_cross_entropy_with_integer_labels) "
                   "or gather the logits at the label index")
        elif any(n == 1 for d, n, p in entry.padded_dims):
            fix = ("a size-1 dimension sits in a tiled position: squeeze it away (reshape) or transpose so a "
                   "large dimension takes its place")
        elif small_minor:
            fix = (f"a minor dimension of {small_minor[0]} fills 128 lanes: reorder/reshape so a large "
                   "dimension is last, or merge the small dimension into a neighbour")
        by_shape[entry.shape] = {"kind": "padding", "saving_bytes": padding, "_more": 0, "message": (
            f"{_op_label(entry)}: {entry.shape} takes {fmt(size)} for {fmt(unpadded)} of data "
            f"({size / unpadded:.1f}x): {dims}. Fix: {fix}.")}
    for item in by_shape.values():
        more = item.pop("_more")
        if more:
            item["message"] += f" {more} more listed buffer{'s' if more > 1 else ''} of this shape: same fix."
        out.append(item)
    if report.padded_bytes and report.unpadded_bytes and not out \
            and report.padded_bytes - report.unpadded_bytes >= threshold \
            and report.unpadded_bytes < 0.75 * report.padded_bytes:
        waste = report.padded_bytes - report.unpadded_bytes
        out.append({"kind": "padding", "saving_bytes": waste, "message": (
            f"HLO temporaries are {fmt(report.padded_bytes)} padded for {fmt(report.unpadded_bytes)} of data: "
            f"{fmt(waste)} is tile padding, spread over buffers the log does not list. Run `tpuprof memory` on "
            "an XLA dump to see which.")})
    return out


def _bf16(report: OomReport, listed: list[OomAllocation], capacity: int | None) -> list[dict]:
    f32 = [a for a in listed if a.dtype == "f32" or (a.shape or "").startswith("f32[")]
    total = sum(a.size_bytes for a in listed)
    f32_bytes = sum(a.size_bytes for a in f32)
    if not total or f32_bytes < 0.4 * total or (capacity and f32_bytes < 0.05 * capacity):
        return []
    hint = _BF16_HINT.get(report.framework or "", "keep activations in bfloat16 (mixed precision)")
    return [{"kind": "bf16", "saving_bytes": f32_bytes // 2, "message": (
        f"{len(f32)} of the {len(listed)} listed buffers are float32 ({fmt(f32_bytes)} of {fmt(total)}): "
        f"bfloat16 halves them: {hint}.")}]


def _remat(report: OomReport) -> dict | None:
    used = report.used_bytes or report.program_bytes
    if report.kind != COMPILE or not report.hlo_temp_bytes or not used or report.memory_space != "hbm":
        return None
    if report.hlo_temp_bytes < 0.5 * used:
        return None
    already = any(".remat" in (a.xla_label or "") for a in report.allocations)
    hint = _REMAT_HINT.get(report.framework or "", "activation checkpointing around the repeated blocks")
    return {"kind": "rematerialization", "message": (
        f"Temporaries (activations, gradients) are {fmt(report.hlo_temp_bytes)} of {fmt(used)}: recompute "
        f"them in the backward pass instead of keeping them: {hint}."
        + (" XLA already rematerializes some (\".remat\" in the labels), so choose what to save explicitly."
           if already else ""))}


def _batch(estimate: BatchEstimate) -> dict:
    if estimate.fitting_batch is not None:
        what = f"a batch of about {estimate.fitting_batch} (now {estimate.current_batch}) fits"
    else:
        what = f"about {estimate.scale:.0%} of the current batch fits (pass --batch N for a number)"
    if estimate.confidence == "low":
        what = "at most " + what
    return {"kind": "batch_size", "message": f"Smaller batch: {what}; confidence {estimate.confidence}: "
                                            f"{estimate.reason}."}


def _largest_ops(listed: list[OomAllocation]) -> dict | None:
    totals: dict[str, int] = {}
    for entry in listed:
        if entry.op_name or entry.op_type:
            label = _op_label(entry)
            totals[label] = totals.get(label, 0) + entry.size_bytes
    if not totals:
        return None
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:3]
    return {"kind": "largest_ops", "message": "Largest framework ops in the list: "
            + "; ".join(f"{name}: {fmt(size)}" for name, size in top) + "."}


def _scratch_memory(report: OomReport) -> dict:
    space = report.memory_space
    spill = any("spill" in (a.xla_label or "") for a in report.allocations)
    message = (f"{space} is the core's on-chip scratch memory ({fmt(report.capacity_bytes)} here): one fused "
               "kernel needs more than it has, whatever the model's size. Shrink the block/tile sizes of "
               "custom (Pallas) kernels or the chunk size of blockwise attention, or break the fusion; if no "
               "custom kernel is involved, report it to XLA with an HLO dump.")
    if report.kernel:
        message += f" The failing kernel: {report.kernel}."
    if spill:
        message += " Here the register allocator's spill slots take most of it: a kernel with too many live values."
    return {"kind": space, "message": message}


def _live_buffers(report: OomReport) -> dict:
    want, free = report.requested_bytes, report.free_bytes
    message = (f"Run-time: {fmt(want)} was requested with {fmt(free)} free. The memory is held by arrays "
               "still alive (parameters, old batches, copies kept by Python references): delete what is no "
               "longer needed, donate inputs to the step (jax: donate_argnums), load weights sharded instead "
               "of onto one device, and check what is alive (jax.live_arrays(), "
               "jax.profiler.save_device_memory_profile).")
    if want is not None and free is not None and free >= want:
        message += " Free memory exceeds the request, so it is fragmented: allocate the large arrays first."
    if report.kind == RESERVATION and report.currently_allocated_bytes is not None:
        message += f" {fmt(report.currently_allocated_bytes)} was allocated when the program was loaded."
    return {"kind": "live_buffers", "message": message}


def _sparsecore(report: OomReport) -> dict:
    heavier = "SparseCore" if report.sparsecore_bytes > report.tensorcore_bytes else "TensorCore"
    return {"kind": "sparsecore", "message": (
        f"TensorCore uses {fmt(report.tensorcore_bytes)} and SparseCore {fmt(report.sparsecore_bytes)} of "
        f"{fmt(report.capacity_bytes)}; {heavier} dominates. SparseCore memory grows with embedding feature "
        "width, max_unique_nz_per_row and the replica count: shard or shrink the embedding tables.")}


def _more_detail(report: OomReport) -> list[dict]:
    out = []
    short = not report.allocations and report.kind in (COMPILE, EARLY_ABORT) \
        and report.memory_space not in ("vmem", "smem")
    if report.kind == EARLY_ABORT:
        out.append({"kind": "more_detail", "message": (
            f"The compiler stopped early. Set {FAST_EXIT_FLAG} (on a TPU VM: LIBTPU_INIT_ARGS="
            f"'{FAST_EXIT_FLAG}') to make it finish and print the full breakdown with the largest allocations.")})
    if short or report.kind == EARLY_ABORT:
        out.append({"kind": "more_detail", "message": (
            f"For every buffer with its padding and framework op, rerun with {DUMP_FLAGS} and run "
            "`tpuprof oom LOG --dump /tmp/xla_dump` (or `tpuprof memory /tmp/xla_dump`).")})
        out.append({"kind": "more_detail", "message": (
            "To find this before renting a TPU, compile the step for the target here with "
            "`tpuprof preflight` (libtpu compiles for TPUs on a CPU-only machine).")})
    return out
