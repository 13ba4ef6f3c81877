"""Causes and fixes for a TPU out-of-memory report, as ranked `Suggestion`s (tpuprof.models.suggestion).

Every fix that can free HBM carries a saving: exact where it is arithmetic on the log's figures (padding,
fragmentation, donation), estimated with a range where it models how memory scales (bf16, remat, batch,
sharding). `rank` then puts first what can make the program fit (the saving covers the overshoot), largest
first; then the rest by saving; then what carries no number (how to get more detail). The concrete call is in
the framework the log shows (tpuprof.analyses.framework), framework-neutral when it does not say.
"""

from __future__ import annotations

import re

from tpuprof.advice import calls, padding as padding_advice, preconditions
from tpuprof.analyses.oom import format_bytes as fmt
from tpuprof.models import shape as shapes
from tpuprof.models.oom import (
    COMPILE, EARLY_ABORT, RESERVATION, RUNTIME_ALLOCATION, BatchEstimate, OomAllocation, OomReport,
)
from tpuprof.models.suggestion import Suggestion, rank, say_per_device
from tpuprof.units import fmt_share

DUMP_FLAGS = "XLA_FLAGS='--xla_dump_to=/tmp/xla_dump --xla_dump_hlo_as_proto --xla_dump_hlo_as_text'"
FAST_EXIT_FLAG = "--xla_tpu_impure_oom_fast_exit_threshold=-1"
# A leading dimension larger than this is a flattened batch x positions, not a per-chip batch to name.
MAX_GUESSED_BATCH = 65536
# A sharding estimate spreads what does not scale with the batch over the chips of one TPU VM host.
SHARDING_DEVICES = 8
# Attention scores: [batch, heads, queries, keys] with queries == keys (or [b*h, q, k]).
_LAYER = re.compile(r"/(?:layers?|h|blocks?|encoder_layer|decoder_layer)[/_.](\d{1,6})/")  # a layer index, not any digits



def shortfall(report: OomReport, capacity: int | None = None) -> int | None:
    """How many bytes the program lacks: what a fix must free for it to fit. CAPACITY (`--target`'s HBM) stands in
    for the message's when it gives none."""
    if report.exceeded_bytes:
        return report.exceeded_bytes
    capacity = report.capacity_bytes or capacity
    program = report.program_bytes + (report.arguments_bytes or 0) if report.program_bytes is not None else None
    needed = report.used_bytes or report.required_bytes or program or report.hlo_temp_bytes
    if needed and capacity and needed > capacity:
        return needed - capacity
    if report.requested_bytes and report.free_bytes is not None and report.requested_bytes > report.free_bytes:
        return report.requested_bytes - report.free_bytes
    if report.kind == COMPILE and report.requested_bytes and report.capacity_bytes \
            and report.requested_bytes > report.capacity_bytes:  # one allocation larger than the memory: at least
        return report.requested_bytes - report.capacity_bytes
    return None


def suggest(report: OomReport, estimate: BatchEstimate, capacity: int | None = None,
            devices_per_chip: int = 1) -> list[dict]:
    """The ranked suggestions as the --json documents carry them (Suggestion.to_dict)."""
    return [s.to_dict() for s in suggestions(report, estimate, capacity, devices_per_chip)]


def suggestions(report: OomReport, estimate: BatchEstimate, capacity: int | None = None,
                devices_per_chip: int = 1) -> list[Suggestion]:
    """The ranked suggestions for REPORT; CAPACITY (`--target`'s HBM) when the message gives none. DEVICES_PER_CHIP:
    the generation's (`--target`), two on TPU7x, v2 and v3: the failed program is one device's."""
    if report.serving is not None:  # a serving engine's start-up: its own options are the fixes
        from tpuprof.advice import oom_serving

        scratch = _scratch_memory(report) if report.memory_space in ("vmem", "smem") else None
        return oom_serving.suggestions(report, shortfall(report, capacity), scratch)
    found: list[Suggestion] = []
    capacity = report.capacity_bytes or capacity
    listed = [a for a in report.allocations if a.size_bytes or a.recomputed_padded_bytes]
    framework = report.framework
    missing = shortfall(report, capacity)

    if report.memory_space in ("vmem", "smem"):
        found.append(_scratch_memory(report))
    if report.kind in (RUNTIME_ALLOCATION, RESERVATION):
        found.append(_live_buffers(report, missing))
    if report.sparsecore_bytes is not None and report.tensorcore_bytes is not None:
        found.append(_sparsecore(report))
    if report.kind == EARLY_ABORT:
        found.append(_shape_bug(report, missing))
    if report.kind == COMPILE and report.memory_space == "hbm" and report.used_bytes is None \
            and report.requested_bytes and report.capacity_bytes and report.requested_bytes > report.capacity_bytes:
        found.append(_buffer_larger_than_memory(report, missing))

    if report.memory_space == "host":
        found.append(_host_memory(report, listed))
        batch = _batch(report, estimate, missing)
        if batch is not None:
            found.append(batch)
    if report.memory_space in ("hbm", None) and report.kind in (COMPILE, RESERVATION):
        found += _padding(report, capacity, estimate)
        found += _fragmentation(report, missing)
        for make in (_bf16, _attention, _remat, _donation, _sharding):
            item = make(report, listed, estimate, capacity)
            if item is not None:
                found.append(item)
        batch = _batch(report, estimate, missing)
        if batch is not None:
            found.append(batch)
    ops = _largest_ops(listed)
    if ops:
        found.append(ops)
    found += _more_detail(report)
    for item in found:
        item.framework = item.framework or (framework if item.code else None)
        counted = item.saving_bytes_range[0] if item.saving_bytes_range else item.saving_bytes
        if missing and counted is not None and counted >= missing and item.severity != "info":
            item.severity = "blocking"
    say_per_device(found, devices_per_chip)
    return rank(found, shortfall_bytes=missing)


def _code(kind: str, framework: str | None) -> str:
    return calls.call(kind, framework) or ""


def _size(entry: OomAllocation) -> int:
    exact = entry.recomputed_padded_bytes is not None and not entry.disagreements
    return (entry.recomputed_padded_bytes if exact else entry.size_bytes) or 0


def _op_label(entry: OomAllocation) -> str:
    if (entry.op_name or "").split("/")[-1] == "XLA_Args":  # TensorFlow's name for what it passes the program
        return f"{entry.op_name} (the program's arguments: weights, inputs)"
    if entry.op_name:
        name = entry.op_name if len(entry.op_name) <= 80 else entry.op_name[:77] + "..."
        return f"{name}" + (f" ({entry.op_type})" if entry.op_type else "")
    if entry.op_type:
        return entry.op_type
    if entry.xla_label:
        return entry.xla_label.split("=")[0].strip().lstrip("%")[:60]
    return f"allocation {entry.index}"


def _padding(report: OomReport, capacity: int | None, estimate: BatchEstimate) -> list[Suggestion]:
    """Precondition: as memory's (tpuprof.advice.padding.fixes): a dimension the user picks, a size that holds no
    more data, fewer bytes at that size; a one-hot is replaced by integer labels."""
    out: list[Suggestion] = []
    by_shape: dict[str, Suggestion] = {}  # buffers of one shape share the fix: one suggestion, savings summed
    listed = sum(a.size_bytes or 0 for a in report.allocations)
    threshold = 0.01 * capacity if capacity else 0.01 * listed  # smaller wastes are not worth the user's time
    batch = estimate.current_batch or estimate.batch_dim
    convolves = any(padding_advice.CONV.search(a.op_name or "") for a in report.allocations)
    for entry in report.allocations:
        exact = entry.recomputed_padded_bytes is not None and not entry.disagreements
        size = entry.recomputed_padded_bytes if exact else entry.size_bytes
        unpadded = entry.recomputed_unpadded_bytes if exact else entry.unpadded_bytes
        if not size or not unpadded or not entry.shape:
            continue
        waste = size - unpadded
        if waste < threshold or waste < 0.25 * size:
            continue
        if entry.shape in by_shape:
            item = by_shape[entry.shape]
            item.saving_bytes += item.extra["per_buffer"]
            item.extra["buffers"] += 1
            continue
        fix, saving, how = _padding_fix(entry, size, batch, convolves)
        if fix is None:
            continue  # padded only in dimensions the user does not choose
        one_hot = entry.op_type == "OneHot" or "one_hot" in (entry.op_name or "").lower()
        by_shape[entry.shape] = Suggestion(
            # A one-hot's padding is freed with the buffer: the log's own figure. A new size is another program.
            kind="padding", saving_bytes=saving, confidence="exact" if one_hot and exact else "estimated",
            message=f"{_op_label(entry)}: {fix}.",
            evidence=f"{entry.shape} takes {fmt(size)} for {fmt(unpadded)} of data ({size / unpadded:.1f}x): "
                     + ("; ".join(f"dim {d} is {n}, tiled to {p}" for d, n, p in entry.padded_dims)
                        or "the tiled dims") + (f"; {how}" if how else ""),
            source_line=entry.source or "", extra={"buffers": 1, "per_buffer": saving})
    for item in by_shape.values():
        more = item.extra["buffers"] - 1
        del item.extra["per_buffer"]
        if more:
            item.message += f" {more} more listed buffer{'s' if more > 1 else ''} of this shape: same fix."
        out.append(item)
    if report.padded_bytes and report.unpadded_bytes and not out \
            and report.padded_bytes - report.unpadded_bytes >= threshold \
            and report.unpadded_bytes < 0.75 * report.padded_bytes:
        waste = report.padded_bytes - report.unpadded_bytes
        out.append(Suggestion(kind="padding", severity="info", confidence="exact", message=(
            f"{fmt(waste)} of the temporaries is tile padding ({report.utilization}% utilisation: "
            f"{fmt(report.unpadded_bytes)} of data in {fmt(report.padded_bytes)}), spread over buffers the log does "
            "not list: run `tpuprof memory` on an XLA dump to see which dimension of which tensor to change."),
            evidence=f"HLO temp unpadded {fmt(report.unpadded_bytes)}, padded {fmt(report.padded_bytes)}"))
    return out


def _padding_fix(entry: OomAllocation, size: int, batch: int | None,
                 convolves: bool) -> tuple[str | None, int, str]:
    """(the fix, what it frees in this buffer, how that was found), or (None, 0, "") when there is none."""
    if entry.op_type == "OneHot" or "one_hot" in (entry.op_name or "").lower():
        return ((f"the one-hot of {entry.shape} takes {fmt(size)}: do not materialise it, pass integer labels "
                 "with a sparse loss (sparse_categorical_crossentropy, optax.softmax_cross_entropy_with_integer_labels)"
                 " or gather the logits at the label index"), size - (entry.recomputed_unpadded_bytes
                                                                 or entry.unpadded_bytes or size),
                "integer labels need no one-hot buffer: at least its padding is freed")
    if "constant" in (entry.op_name or entry.xla_label or "").lower():
        return None, 0, ""  # a constant's length is the program's, not a size the user picked
    try:
        shape = shapes.parse_shape(entry.shape)
    except Exception:  # a cut or foreign shape: the dims the log printed are all there is
        shape = None
    minor_to_major = shape.layout.minor_to_major if shape is not None and shape.layout else ()
    found = padding_advice.roles(entry.dims, entry.padded_dims, minor_to_major, entry.op_name or "", batch,
                                 convolutional=convolves)
    tiles = shape.layout.tiles if shape is not None and shape.layout else ()
    if tiles and len(tiles[0]) >= 2:
        tile = tiles[0][-2]  # the second-minor tile the layout prints: T(4,128) pads to 4
    else:
        tile = 16 if entry.dtype in ("bf16", "f16") else 32 if entry.dtype in ("s8", "u8", "pred") else 8
    fixes = padding_advice.fixes(found, lambda d: tile, size)
    if not fixes:
        return None, 0, ""
    return "; or ".join(f.text for f in fixes), fixes[0].saving_bytes, fixes[0].evidence


def _fragmentation(report: OomReport, missing: int | None) -> list[Suggestion]:
    frag = report.fragmentation_bytes
    if not frag or not report.hlo_temp_bytes:
        return []
    covers = bool(missing and frag >= missing)
    if not covers and frag < 0.05 * report.hlo_temp_bytes:
        return []
    share = 100.0 * frag / report.hlo_temp_bytes
    message = (f"{fmt(frag)} of the {fmt(report.hlo_temp_bytes)} of temporaries ({share:.1f}%) is fragmentation: "
               "gaps between buffers the compiler could not pack, not data.")
    if covers:
        message += (f" That is more than the {fmt(missing)} the program lacks: packing alone would make it fit. "
                    "Buffers of many different sizes alive at once fragment the heap;")
    else:
        message += " Buffers of many different sizes alive at once fragment the heap;"
    message += (" fewer distinct large temporaries (one layer body reused by a loop, one padded sequence length) "
                "pack better, and a slightly smaller batch often changes the packing.")
    # The fragmentation is the compiler's own figure; what a change frees is at most that (the changed program
    # packs anew): an estimate, not exact.
    return [Suggestion(kind="fragmentation", saving_bytes=frag, confidence="estimated", message=message,
                       evidence=f"HLO temp {fmt(report.hlo_temp_bytes)}, {share:.1f}% fragmentation ({fmt(frag)}, "
                                "the compiler's figure): the saving is at most that, as the changed program packs",
                       code=_code("fragmentation", report.framework))]


def _dtype(entry: OomAllocation) -> str:
    return entry.dtype or (entry.shape or "").split("[")[0]


# An argument of the program by its allocation type, or TensorFlow's name for the arguments it hands XLA.
_ARGUMENT = re.compile(r"^(?:parameter|argument|entry parameter|program argument)", re.I)
# Float32 a mixed-precision program keeps on purpose: the loss and its softmax (logits cast up for them).
_KEPT_F32 = re.compile(r"cross_entropy|softmax|logsumexp|(?:^|/)loss", re.I)


def program_16bit(listed: list[OomAllocation]) -> list[OomAllocation]:
    """The listed 16-bit buffers that show the program chose 16 bits: its arguments (weights, inputs: allocation type
    parameter, TensorFlow's XLA_Args) and the outputs of a cast it wrote (preconditions.CAST_OP). Any other 16-bit
    buffer may be the compiler's: XLA:TPU rounds float32 matmul and convolution operands to bfloat16 and keeps such
    copies, so a 16-bit fusion or dot output says nothing of the program's choice."""
    return [a for a in listed if _dtype(a) in preconditions.SIXTEEN_BIT
            and (_ARGUMENT.search(a.allocation_type or "") or (a.op_name or "").split("/")[-1] == "XLA_Args"
                 or preconditions.CAST_OP.search(a.op_name or ""))]


def _kept_f32(entry: OomAllocation) -> bool:
    """A float32 buffer the program made float32 itself: a cast it wrote (logits upcast for the loss) or its loss."""
    return bool(preconditions.CAST_OP.search(entry.op_name or "") or _KEPT_F32.search(entry.op_name or ""))


def _bf16(report: OomReport, listed: list[OomAllocation], estimate, capacity) -> Suggestion | None:
    """Precondition: float32 is the program's choice. The claim rests on the program's own buffers: a listed 16-bit
    argument or cast (program_16bit) makes it a 16-bit program, whose float32 is kept on purpose when 16 bits hold a
    quarter of the listed bytes; float32 it cast up itself or its loss is never offered for halving."""
    f32 = [a for a in listed if _dtype(a) == "f32" and not _kept_f32(a)]
    total = sum(_size(a) for a in listed)
    f32_bytes = sum(_size(a) for a in f32)
    if not total or f32_bytes < 0.4 * total or (capacity and f32_bytes < 0.05 * capacity):
        return None
    chosen = program_16bit(listed)
    sixteen = [a for a in listed if _dtype(a) in preconditions.SIXTEEN_BIT]
    sixteen_bytes = sum(_size(a) for a in sixteen)
    if chosen and preconditions.in_16_bits(sixteen_bytes, total):
        return None
    low = f32_bytes // 2
    # The listed buffers are the largest; the unlisted temporaries are f32 in the same share at most.
    high = max(low, int((report.hlo_temp_bytes or total) * f32_bytes / total) // 2)
    if chosen:
        whose = (f"; 16-bit listed {fmt(sixteen_bytes)} (the program's own: "
                 + ", ".join(_op_label(a) for a in chosen[:2]) + ")")
    elif sixteen:
        whose = (f"; the {fmt(sixteen_bytes)} of 16-bit listed buffers are no argument or cast of the program's "
                 f"(e.g. {_op_label(max(sixteen, key=_size))}): XLA:TPU makes such bfloat16 copies of float32 "
                 "matmul and convolution operands itself, so they do not show a 16-bit program")
    else:
        whose = "; no 16-bit buffer listed"
    return Suggestion(
        kind="bf16", saving_bytes=low, saving_bytes_range=(low, high), confidence="estimated",
        message=f"{len(f32)} of the {len(listed)} listed buffers are float32: bfloat16 halves them.",
        evidence=f"float32 is {fmt(f32_bytes)} of the {fmt(total)} listed{whose}; the saving is half of the float32, "
                 "up to half of the temporaries in the same share",
        code=_code("bf16", report.framework))


# What the remat precondition looks for in op names (preconditions.rematerialised): JAX's checkpoint marks them.
REMAT_SIGNS = {"jax": "jax.checkpoint (checkpoint, rematted_computation)",
               None: "activation checkpointing (jax.checkpoint's checkpoint, rematted_computation)"}
REMAT_CALLS = {"jax": "jax.checkpoint / nn.remat", None: "jax.checkpoint / nn.remat (or your framework's)"}
# Frameworks whose recomputation leaves the op names as they are (a TF2 step under tf.recompute_grad names its ops
# MatMul, Tanh, gradient_tape/... under TF 2.21): the log cannot tell, and the evidence says so.
REMAT_UNMARKED = {"tf1": "tf.recompute_grad", "tf2": "tf.recompute_grad"}


def _layers(report: OomReport) -> int | None:
    found = {int(m.group(1)) for a in report.allocations for m in _LAYER.finditer((a.op_name or "") + "/")}
    return max(found) + 1 if found else None


def _remat(report: OomReport, listed, estimate, capacity) -> Suggestion | None:
    used = report.used_bytes or report.program_bytes or report.hlo_temp_bytes
    temp = report.hlo_temp_bytes
    if report.training is False or report.kind != COMPILE or not temp or not used:
        return None
    # Precondition: the step does not rematerialise already (jax.checkpoint in the op names). XLA's ".remat" labels
    # are the compiler's own pass, which any program over its limit gets: they do not count (preconditions).
    if preconditions.rematerialised(name for a in report.allocations for name in (a.op_name, a.xla_label)):
        return None
    if report.memory_space != "hbm" or temp < 0.5 * used:
        return None
    code = _code("remat", report.framework)
    if not code:
        return None
    layers = _layers(report)
    # Without remat the forward activations of every layer are kept for the backward pass; with it, only each
    # layer's input plus one layer's activations while it is recomputed: about 2 of L layers' worth remain.
    # The log lists its largest buffers only, so the highest layer index named is a floor on L: the saving with
    # that L is the least of the model's.
    if layers and layers >= 4:
        keep = 2.0 / layers
        point, low, high = int(temp * (1 - keep) * 0.75), int(temp * (1 - keep) * 0.5), int(temp * (1 - keep))
        how = (f"layer indices up to {layers - 1} in the listed op names, so at least {layers} layers: about 2 of "
               f"{layers} layers' activations remain (a smaller share with more layers)")
    else:
        point, low, high = int(temp * 0.5), int(temp * 0.3), int(temp * 0.7)
        how = "layer count unknown: 30-70% of the temporaries, as for a model of a few repeated blocks"
    message = (f"Temporaries are {fmt(temp)} of {fmt(used)}: recompute activations in the backward pass instead "
               "of keeping them for every layer.")
    by_compiler = preconditions.compiler_rematerialised(a.xla_label for a in report.allocations)
    if report.framework in REMAT_UNMARKED:  # names that cannot show it: the step may recompute already
        how += (f"; {REMAT_UNMARKED[report.framework]} leaves no mark in the op names, so whether the step "
                "rematerialises already is not in the log: check before adding it")
    elif any(a.op_name or a.xla_label for a in report.allocations):
        how += f"; no op name or label shows {REMAT_SIGNS.get(report.framework, REMAT_SIGNS[None])}"
    else:  # nothing to check: the step may recompute already
        how += ("; the log lists no allocation with an op name or label, so whether the step rematerialises already "
                f"is not in it: check for {REMAT_CALLS.get(report.framework, REMAT_CALLS[None])} before adding it")
    if by_compiler:
        how += (f"; labels like {by_compiler} are XLA's own rematerialisation pass, which recomputes single "
                "instructions of any program over its memory limit: not the step keeping only each layer's input")
    return Suggestion(kind="remat", saving_bytes=point, saving_bytes_range=(low, high), confidence="rough",
                      message=message, evidence=how, code=code)


def _attention(report: OomReport, listed, estimate, capacity) -> Suggestion | None:
    # Precondition: no fused attention kernel in the program yet (splash/flash in the op names or labels).
    if preconditions.fused_attention(name for a in report.allocations for name in (a.op_name, a.xla_label)):
        return None
    scores = [a for a in listed if len(a.dims) >= 3 and a.dims[-1] == a.dims[-2] and a.dims[-1] >= 128
              and preconditions.ATTENTION_OP.search((a.op_name or "") + " " + (a.xla_label or ""))]
    if not scores:
        return None
    total = sum(_size(a) for a in scores)
    if capacity and total < 0.02 * capacity:
        return None
    sequence = scores[0].dims[-1]
    return Suggestion(
        kind="attention", saving_bytes=total, confidence="estimated",
        message=f"{len(scores)} listed buffers are attention scores (queries x keys = {sequence} x {sequence}), "
                f"{fmt(total)}: a fused attention kernel never stores them.",
        evidence="; ".join(f"{a.shape} ({fmt(_size(a))})" for a in scores[:3]) + (
            f" and {len(scores) - 3} more" if len(scores) > 3 else "") + ": at least these bytes are freed",
        code=_code("attention", report.framework), source_line=scores[0].source or "")


def _donation(report: OomReport, listed, estimate, capacity) -> Suggestion | None:
    if report.training is not True or not report.output_bytes or not report.arguments_bytes:
        return None
    if report.output_shared_bytes is None or report.output_shared_bytes >= 0.5 * report.output_bytes:
        return None
    saving = min(report.output_bytes, report.arguments_bytes) - report.output_shared_bytes
    if saving < 0.01 * (capacity or saving * 100):
        return None
    code = _code("donation", report.framework)
    if not code:
        return None
    return Suggestion(
        kind="donation", saving_bytes=saving, confidence="estimated",
        message=f"The step's outputs ({fmt(report.output_bytes)}) share {fmt(report.output_shared_bytes)} with its "
                f"arguments ({fmt(report.arguments_bytes)}): a train step returns the new state in the old state's "
                "shape, so donating the state lets the outputs reuse its buffers.",
        evidence=f"Output size {fmt(report.output_bytes)}; shares {fmt(report.output_shared_bytes)} with arguments",
        code=code)


def _sharding(report: OomReport, listed, estimate, capacity) -> Suggestion | None:
    arguments = report.arguments_bytes
    used = report.used_bytes
    fixed = estimate.fixed_bytes
    if arguments and used and arguments >= 0.4 * used:
        what, size = f"Arguments (parameters, optimizer state, inputs) take {fmt(arguments)} of {fmt(used)}", arguments
    elif estimate.scale is not None and estimate.scale <= 0 and fixed:
        what, size = (f"What does not shrink with the batch ({fmt(fixed)}: parameters, optimizer state) alone "
                      f"exceeds the {fmt(capacity)} available", fixed)
    else:
        return None
    saving = size - size // SHARDING_DEVICES
    return Suggestion(
        kind="sharding", saving_bytes=saving, saving_bytes_range=(size - size // 2, size - size // 32),
        confidence="estimated",
        message=f"{what}: sharded over N devices each holds 1/N of it ({fmt(saving)} freed per chip over "
                f"{SHARDING_DEVICES}, {fmt(size - size // 2)} over 2).",
        evidence=f"{fmt(size)} does not scale with the batch; replicated, every chip holds all of it",
        code=_code("sharding", report.framework))


def _batch(report: OomReport, estimate: BatchEstimate, missing: int | None) -> Suggestion | None:
    if report.kind == EARLY_ABORT or estimate.scale is None or estimate.scale >= 1 or estimate.scale <= 0:
        return None
    scaling = estimate.scaling_bytes or 0
    current = estimate.current_batch
    code = _code("batch_size", report.framework)
    if report.training is False and report.framework != "vllm":  # no gradients to accumulate when serving
        code = "fewer sequences (or shorter ones) per forward pass"
    elif report.training is None and report.framework is None:
        # Nothing says it is a model (a Julia/Reactant simulation's E1000 reads the same): no training words.
        code = ("less work per chip: a smaller batch or problem size in each chip's arrays (a training job keeps its "
                "global batch with gradient accumulation)")
    confidence = {"high": "estimated", "medium": "estimated"}.get(estimate.confidence, "rough")
    if current == 1:
        return Suggestion(kind="batch_size", confidence=confidence, code="", message=(
            "The batch cannot shrink further: the per-chip batch is already 1. Free memory another way (the other fixes "
            "listed), or spread one example over several chips (sequence or model sharding)."),
            evidence=estimate.reason)
    if current:
        fitting = estimate.fitting_batch or 0
        if fitting < 1:
            return Suggestion(kind="batch_size", confidence=confidence, message=(
                f"Even a per-chip batch of 1 (now {current}) does not fit: what does not scale with the batch must "
                "shrink first (sharding, bfloat16)."), evidence=estimate.reason)
        saving = int(scaling * (1 - fitting / current))
        what = f"a per-chip batch of {fitting} (now {current}) fits"
        extra = {"batch": fitting}
    else:
        saving = missing or int(scaling * (1 - estimate.scale))
        what = f"about {fmt_share(estimate.scale)} of the current per-chip batch fits (pass --batch N for a number)"
        extra = {}
        if estimate.batch_dim and 1 < estimate.batch_dim <= MAX_GUESSED_BATCH:
            from tpuprof.analyses.oom import fitting_batch

            guess = fitting_batch(estimate.batch_dim, estimate.scale)
            if guess >= 1:
                what += (f"; the listed buffers lead with a dimension of {estimate.batch_dim}: if that is the "
                         f"per-chip batch, {guess} fits")
    if estimate.confidence == "low":
        what = "at most " + what
    if estimate.fixed_bytes is None and saving:
        # Only the total is known: the saving is the shortfall because everything is assumed to scale with the
        # batch, which parameters and optimizer state do not. Nothing measured says it is enough, so no figure
        # to rank or call enough by.
        what += (f"; shrinking it that far frees at most {fmt(saving)}, less where what does not scale with the batch "
                 "(parameters, optimizer state, the program's code) holds part of it: the log does not say how much")
        saving = None
    return Suggestion(kind="batch_size", saving_bytes=saving, confidence=confidence,
                      message=f"{what[0].upper()}{what[1:]}.", evidence=f"confidence {estimate.confidence}: {estimate.reason}",
                      code=code, extra=extra)


def _largest_ops(listed: list[OomAllocation]) -> Suggestion | None:
    totals: dict[str, int] = {}
    for entry in listed:
        if entry.op_name or entry.op_type:
            label = _op_label(entry)
            totals[label] = totals.get(label, 0) + _size(entry)
    if not totals:
        return None
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:3]
    return Suggestion(kind="largest_ops", severity="info", confidence="exact", message=(
        "Largest framework ops in the list: " + "; ".join(f"{name}: {fmt(size)}" for name, size in top) + "."))


def _shape_bug(report: OomReport, missing: int | None) -> Suggestion:
    required = report.required_bytes or report.used_bytes
    return Suggestion(kind="shape_bug", saving_bytes=missing, confidence="rough", message=(
        f"The compiler estimated {fmt(required)} against {fmt(report.capacity_bytes)} and gave up before assigning "
        "buffers: a tensor is far larger than intended (a wrong reshape or broadcast, an accidental outer product, "
        "a static size used as a batch, a missing sharding annotation that replicates a huge array). Look for the "
        "largest shape in the program."),
        evidence=f"Requires {fmt(required)}, has {fmt(report.capacity_bytes)} available")


def _buffer_larger_than_memory(report: OomReport, missing: int | None) -> Suggestion:
    """E1001's form in HBM: "Allocation (size=N) would exceed memory (size=M)", one buffer alone too large."""
    entry = report.allocations[0] if report.allocations else None
    what = f"{entry.shape}" + (f" ({entry.xla_label})" if entry.xla_label else "") if entry else "one buffer"
    return Suggestion(kind="shape_bug", saving_bytes=missing, confidence="rough", message=(
        f"One allocation, {what}, needs {fmt(report.requested_bytes)}: more than the chip's whole "
        f"{fmt(report.capacity_bytes)}, so no smaller batch of the rest makes it fit. Shard that array over the "
        "devices, or shrink it; if it is not meant to exist at that size, look for an accidental outer product, "
        "broadcast or missing reshape."),
        evidence=f"Allocation (size={report.requested_bytes}) would exceed memory (size={report.capacity_bytes})")


def _scratch_memory(report: OomReport) -> Suggestion:
    space = report.memory_space
    spill = any("spill" in (a.xla_label or "") for a in report.allocations)
    here = f" ({fmt(report.capacity_bytes)} here)" if report.capacity_bytes and not report.scoped_limit else ""
    message = (f"{space} is the core's on-chip scratch memory{here}: one fused kernel needs more than it has, "
               "whatever the model's size. Shrink the block/tile sizes of custom (Pallas) kernels or the chunk size "
               "of blockwise attention, or break the fusion; if no custom kernel is involved, report it to XLA with "
               "an HLO dump.")
    if report.scoped_limit and report.used_bytes and report.capacity_bytes:
        message += (f" The {fmt(report.capacity_bytes)} it exceeded is the kernel's scoped limit, not the {space}'s "
                    f"size: a limit of at least {fmt(report.used_bytes)} may let it compile, where the chip has that "
                    f"much {space} (Pallas: pltpu.CompilerParams(vmem_limit_bytes=...); XLA's own fusions: "
                    "LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=...).")
    if report.kernel:
        message += f" The failing kernel: {report.kernel}."
    if spill:
        message += " Here the register allocator's spill slots take most of it: a kernel with too many live values."
    if report.allocations and not any(a.size_bytes for a in report.allocations):
        shapes_listed = ", ".join(dict.fromkeys(f"{a.xla_label or ''} {a.shape}".strip() for a in report.allocations))
        message += f" Listed: {shapes_listed}."
    return Suggestion(kind=space, severity="blocking", saving_bytes=report.exceeded_bytes, confidence="exact",
                      message=message, code=_code("scratch", report.framework))


def _live_buffers(report: OomReport, missing: int | None) -> Suggestion:
    want, free = report.requested_bytes, report.free_bytes
    with_free = f" with {fmt(free)} free" if free is not None else ""
    message = (f"At run time {fmt(want)} was requested{with_free} and could not be allocated: the memory is held by "
               "arrays still alive (parameters, old batches, copies kept by Python references, another program's "
               "buffers).")
    largest = report.largest_free_bytes
    if want is not None and largest is not None and free is not None and largest < want <= free:
        message += (f" Free memory exceeds the request but its largest contiguous region is {fmt(largest)}: it is "
                    "fragmented. Allocate the large arrays first, and keep long-lived arrays from interleaving "
                    "with per-step ones.")
    elif want is not None and report.reservable_bytes is not None and free is not None \
            and report.reservable_bytes < want <= free:
        message += (f" Free memory exceeds the request but only {fmt(report.reservable_bytes)} of it is reservable "
                    "at the bottom of memory, where programs are loaded: buffers allocated there block it. Load "
                    "(compile and run once) the large programs before allocating the large arrays.")
    elif want is not None and free is not None and free >= want:
        message += " Free memory exceeds the request, so it is fragmented: allocate the large arrays first."
    if report.kind == RESERVATION and report.currently_allocated_bytes is not None:
        message += f" {fmt(report.currently_allocated_bytes)} was allocated when the program was loaded."
    if missing:
        message += f" {fmt(missing)} more must be free for this allocation."
    code = _code("live_buffers", report.framework)
    if report.failed_in == "xm.mark_step" and report.framework == "pytorch_xla":
        code = _code("live_buffers", "pytorch_xla_in_mark_step")
    # The shortfall is what is missing, not a measured saving: no saving_bytes (and no "enough to fit").
    return Suggestion(kind="live_buffers", severity="blocking", confidence="exact",
                      message=message, evidence=f"requested {fmt(want)}" + (f", free {fmt(free)}" if free is not None else "")
                      + (f"; the traceback fails inside {report.failed_in}" if report.failed_in else ""),
                      code=code)


def _host_memory(report: OomReport, listed: list[OomAllocation]) -> Suggestion:
    """Memory space host: the host's DRAM, which a compile with host offload budgets per device as it does HBM."""
    here = (f" ({fmt(report.used_bytes)} of the {fmt(report.capacity_bytes)} the compiler allows each device)"
            if report.used_bytes and report.capacity_bytes else "")
    message = (f"This is the host's memory{here}, not HBM: what a remat policy offloads (memory space S(5): saved "
               "activations, stacked over the layers of a scanned model) and arrays placed in pinned host memory.")
    offloaded = [a for a in listed if "S(5)" in (a.shape or "")]
    if offloaded:
        message += " Largest here: " + ", ".join(
            f"{(a.shape or '').split('{')[0]} ({fmt(_size(a))})" for a in offloaded[:4]) + "."
    message += (" Offload fewer tensors (keep each layer's input on the host and recompute the rest; in MaxText, "
                "fewer of decoder_layer_input/query_proj/key_proj/value_proj set to 'offload'), or lower the "
                "per-device batch (the same global batch over more chips): the offloaded activations grow with it.")
    return Suggestion(kind="host_memory", severity="blocking", confidence="exact",
                      message=message, evidence=f"memory space host, exceeded by {fmt(report.exceeded_bytes)}"
                      if report.exceeded_bytes else "memory space host")


def _sparsecore(report: OomReport) -> Suggestion:
    heavier = "SparseCore" if report.sparsecore_bytes > report.tensorcore_bytes else "TensorCore"
    return Suggestion(kind="sparsecore", severity="info", message=(
        f"TensorCore uses {fmt(report.tensorcore_bytes)} and SparseCore {fmt(report.sparsecore_bytes)} of "
        f"{fmt(report.capacity_bytes)}; {heavier} dominates. SparseCore memory grows with embedding feature "
        "width, max_unique_nz_per_row and the replica count: shard or shrink the embedding tables."))


def _more_detail(report: OomReport) -> list[Suggestion]:
    out = []
    short = not report.allocations and report.kind in (COMPILE, EARLY_ABORT) \
        and report.memory_space not in ("vmem", "smem")
    if report.kind == EARLY_ABORT:
        out.append(Suggestion(kind="more_detail", severity="info", message=(
            f"The compiler stopped early. Set {FAST_EXIT_FLAG} (on a TPU VM: LIBTPU_INIT_ARGS="
            f"'{FAST_EXIT_FLAG}') to make it finish and print the full breakdown with the largest allocations.")))
    if short or report.kind == EARLY_ABORT:
        out.append(Suggestion(kind="more_detail", severity="info", message=(
            f"For every buffer with its padding and framework op, rerun with {DUMP_FLAGS} and run "
            "`tpuprof oom LOG --dump /tmp/xla_dump` (or `tpuprof memory /tmp/xla_dump`).")))
        out.append(Suggestion(kind="more_detail", severity="info", message=(
            "To find this before renting a TPU, compile the step for the target here with "
            "`tpuprof preflight` (libtpu compiles for TPUs on a CPU-only machine).")))
    return out
