"""Suggestions from a memory analysis, where the bytes are: attention scores and activations kept across
layers (remat, a fused attention kernel), outputs that could reuse their inputs (donation), float32 temporaries
(bfloat16), tile padding in the user's terms (which tensor, which dimension, what size), capacity.

Each is a `tpuprof.models.suggestion.Suggestion` with its saving (exact arithmetic on the dump, or an estimate
with a range), the call in the job's framework (detected from the module and its op names,
tpuprof.analyses.framework) and the source line of the buffer it is about; `rank` orders them as every command
does: first what can make a program that does not fit fit, then by saving.
"""

from __future__ import annotations

import re
from functools import lru_cache

from tpuprof.advice import calls, padding as padding_advice, preconditions
from tpuprof.analyses import framework as frameworks
from tpuprof import targets
from tpuprof.models.memory import LAYOUT_FITS, Buffer, ModuleMemory
from tpuprof.models.suggestion import Suggestion, rank, say_per_device
from tpuprof.units import fmt_bytes, fmt_share

MiB = 1 << 20
# Wastes smaller than this (or than MIN_PADDING_SHARE of the peak) are not worth a user's time.
MIN_PADDING_BYTES = 1 * MiB
MIN_PADDING_SHARE = 0.005
MAX_PADDING_SUGGESTIONS = 5
# Layer indices in op names: Flax "layers_3", "layer_3", "h_3", ".../blocks/3/...", "block3".
_LAYER = re.compile(r"(?:layers?|blocks?|\bh)[_./]?(\d{1,6})\b")  # a layer index, not any run of digits
_FORWARD = re.compile(r"jvp\(")
_BACKWARD = re.compile(r"transpose\(")


def _tile_dim_for(buffer: Buffer, dim_index: int) -> int:
    if not buffer.tile or dim_index not in buffer.minor_to_major:
        return 0
    position = buffer.minor_to_major.index(dim_index)
    return buffer.tile[len(buffer.tile) - 1 - position] if position < len(buffer.tile) else 0


def _dims(buffer: Buffer) -> tuple[int, ...]:
    return _dims_of_text(buffer.shape) if buffer.shape else ()


@lru_cache(maxsize=4096)
def _dims_of_text(text: str) -> tuple[int, ...]:
    """The dims of a shape text. Cached: a model repeats a few shapes over its layers (48 layers: 861 buffers shown
    to the advice, 60 distinct shapes), and parsing each again was a fifth of `memory`'s time on large modules."""
    from tpuprof.models import shape as shapes

    try:
        return shapes.parse_shape(text).dims
    except Exception:  # a tuple element or a shape text the parser does not take: no role by position
        return ()


def batch_dimension(result: ModuleMemory) -> int | None:
    """The per-chip batch: the leading dimension of most of the temporaries' bytes at the peak (activations
    lead with the batch), when it carries at least 40% of them. A size that some described buffer has in another
    position is a feature size (a hidden or vocabulary size, heads, a sequence), never the batch. A scan over layers
    stacks its weights and its kept activations: [layers, batch, ...] is read past the layer count."""
    weights: dict[int, int] = {}
    total = 0
    features = {d for buffer in result.buffers if buffer.shape for d in _dims(buffer)[1:]}
    for buffer, dims in _peak_temporaries(result):
        total += buffer.size_bytes
        if len(dims) >= 2 and dims[0] > 1 and dims[0] not in features:
            weights[dims[0]] = weights.get(dims[0], 0) + buffer.size_bytes
    if not weights or not total:
        return None
    dim = max(weights, key=lambda d: weights[d])
    return dim if weights[dim] >= 0.4 * total else None


# Weights of one layer stacked for a scan (jax.lax.scan, nn.scan) lead with the layer count: this many parameters of
# distinct per-layer shapes (q, k, v, MLP up and down...) leading with one size. A batch leads a few inputs at most.
STACKED_WEIGHTS = 3


def stacked_layers(result: ModuleMemory) -> frozenset[int]:
    """The layer counts of scans over stacked weights: the leading size of STACKED_WEIGHTS or more parameters of
    rank 3 or more whose per-layer shapes differ."""
    per_layer: dict[int, set[tuple[int, ...]]] = {}
    for buffer in result.buffers:
        if buffer.allocation_type == "parameter" and buffer.shape:
            dims = _dims(buffer)
            if len(dims) >= 3 and dims[0] > 1:
                per_layer.setdefault(dims[0], set()).add(dims[1:])
    return frozenset(size for size, shapes in per_layer.items() if len(shapes) >= STACKED_WEIGHTS)


_SUBSHAPE = re.compile(r"\b[a-z]\w*\[([\d,]*)\]")


def class_counts(result: ModuleMemory, batch: int | None) -> frozenset[int]:
    """Sizes that are the model's class count: the minor dimension of a [batch, n] activation (the logits) that
    is also a parameter's minor dimension (the output layer), not a multiple of 8 (hidden sizes are). Logits are
    floating point and computed: an input (or its copy) and an integer matmul's product are not (int8_matmul's
    s8[1000, 300] argument and its s32[1000, 77] product were read as 300 and 77 classes)."""
    if not batch:
        return frozenset()
    logits, parameters = set(), set()
    for buffer in result.buffers:
        if not buffer.shape:  # not described: shapes are filled only for the buffers shown or advised on
            continue
        for dtype, dims in _typed_subshape_dims(buffer.shape):
            if len(dims) == 2 and dims[0] == batch and dims[1] % 8 and dtype in FLOATS \
                    and buffer.allocation_type != "parameter" and buffer.opcode not in ("copy", "copy-start"):
                logits.add(dims[1])
            if buffer.allocation_type == "parameter" and len(dims) >= 2:
                parameters.add(dims[-1])
    return frozenset(logits & parameters)


FLOATS = frozenset({"f32", "bf16", "f16", "f64"})
_TYPED_SUBSHAPE = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


@lru_cache(maxsize=4096)
def _typed_subshape_dims(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(dtype, dims) of each array in a shape text, a tuple's elements too."""
    return tuple((match.group(1), tuple(int(d) for d in match.group(2).split(",") if d))
                 for match in _TYPED_SUBSHAPE.finditer(text))


@lru_cache(maxsize=4096)
def _subshape_dims(text: str) -> tuple[tuple[int, ...], ...]:
    """The dims of each array in a shape text (a tuple's elements too); cached like _dims_of_text."""
    return tuple(tuple(int(d) for d in match.group(1).split(",") if d) for match in _SUBSHAPE.finditer(text))


def convolutional(result: ModuleMemory) -> bool:
    """Whether the module convolves: its rank-4 arrays are then images, activations (NHWC) and kernels (HWIO)."""
    return any(b.opcode == "convolution" or padding_advice.CONV.search(b.op_name or "") for b in result.buffers)


def _one_hot(buffer: Buffer) -> bool:
    return any(word in (buffer.op_name or "").lower() for word in ("one_hot", "onehot"))


def padding_fixes(buffer: Buffer, batch: int | None = None, classes: frozenset[int] = frozenset(),
                  convolutional: bool = False, layers: frozenset[int] = frozenset()) -> list[padding_advice.Fix]:
    """The sizes the user can choose for BUFFER's padded dimensions, largest saving first (tpuprof.advice.padding)."""
    if not buffer.padded_dims or buffer.opcode == "constant":
        return []  # a constant's length is the program's, not a size the user picked
    found = padding_advice.roles(_dims(buffer) or tuple(range(len(buffer.minor_to_major))), buffer.padded_dims,
                                 buffer.minor_to_major, buffer.op_name, batch, classes, convolutional, layers)
    return padding_advice.fixes(found, lambda d: _tile_dim_for(buffer, d.index) or 8, buffer.size_bytes)


def buffer_fixes(result: ModuleMemory) -> dict[str, str]:
    """Each padded buffer's fix (padding_fix) by instruction, with the sizes read as memory's own padding advice
    reads them: the page shows these beside the buffers."""
    batch = step_batch(result)
    classes, convolves, layers = class_counts(result, batch), convolutional(result), stacked_layers(result)
    return {b.instruction: padding_fix(b, batch, classes, convolves, layers)
            for b in result.buffers if b.padding_bytes > 0}


def padding_fix(buffer: Buffer, batch: int | None = None, classes: frozenset[int] = frozenset(),
                convolutional: bool = False, layers: frozenset[int] = frozenset()) -> str:
    """Which tensor and dimension is padded from what to what, and what to choose, in the user's terms."""
    head = f"{buffer.instruction} {buffer.shape}: "
    if not buffer.padded_dims:
        return head + f"{fmt_bytes(buffer.padding_bytes)} of padding."
    if _one_hot(buffer):
        dims = _dims(buffer)
        _, classes, padded = next((d for d in buffer.padded_dims if d[1] > 1), buffer.padded_dims[0])
        return head + (f"the one-hot of {classes} classes is padded {classes} -> {padded} "
                       f"({padded / classes:.1f}x), {fmt_bytes(buffer.padding_bytes)} of padding: pass integer labels with a sparse loss (sparse_categorical_crossentropy, "
                       "optax.softmax_cross_entropy_with_integer_labels) instead of materialising the one-hot"
                       + (f" ({'x'.join(map(str, dims))})" if dims else "") + ".")
    found = padding_fixes(buffer, batch, classes, convolutional, layers)
    if found:
        return head + "; or ".join(f.text for f in found) + "."
    dims = padding_advice.roles(_dims(buffer) or tuple(range(len(buffer.minor_to_major))), buffer.padded_dims,
                                buffer.minor_to_major, buffer.op_name, batch, classes, convolutional, layers)
    return head + "; ".join(padding_advice.describe(d) for d in dims) + ": no size to change."


def suggest(result: ModuleMemory, compiled_bytes: int | None = None) -> list[Suggestion]:
    """RESULT's suggestions, ranked. COMPILED_BYTES: what the whole compile needs (preflight: arguments + outputs -
    aliased + temporaries + code), which decides the shortfall when it exceeds the buffer assignment's peak (code
    generation adds temporaries after the assignment is dumped)."""
    job = frameworks.from_module(result.name, (b.op_name for b in result.buffers),
                                 (b.source_line for b in result.buffers))
    framework = job.framework
    peak = max(result.required_bytes or 0, compiled_bytes or 0)
    capacity = result.hbm_capacity_bytes
    shortfall = peak - capacity if capacity and peak > capacity else None
    found: list[Suggestion] = []
    found += _padding(result, peak)
    for make in (_attention, _remat, _donation, _bf16):
        item = make(result, job)
        if item is not None:
            found.append(item)
    found += _capacity(result, framework, shortfall, compiled_bytes)
    for item in found:
        if item.code:
            item.framework = framework
        counted = item.saving_bytes_range[0] if item.saving_bytes_range else item.saving_bytes
        if shortfall and counted is not None and counted >= shortfall:
            item.severity = "blocking"
    say_per_device(found, targets.get(result.target).devices_per_chip if result.target else 1)
    return rank(found, shortfall_bytes=shortfall)


def _padding(result: ModuleMemory, peak: int) -> list[Suggestion]:
    """Precondition: a dimension the user picks (features, channels, heads, sequence, a size-1 dimension), a size
    that holds no more data than now, and fewer bytes recomputed at that size (tpuprof.advice.padding.fixes)."""
    # The biggest wasters first; prefer buffers live at the peak (they decide fitting).
    floor = max(MIN_PADDING_BYTES, MIN_PADDING_SHARE * peak)
    candidates = sorted((b for b in result.buffers if b.padding_bytes >= floor),
                        key=lambda b: (not b.live_at_peak, -b.padding_bytes))
    batch = step_batch(result)
    classes, convolves, layers = class_counts(result, batch), convolutional(result), stacked_layers(result)
    out: list[Suggestion] = []
    seen_ops: set[str] = set()
    for buffer in candidates:
        key = buffer.op_name or buffer.instruction
        if key in seen_ops:
            continue
        seen_ops.add(key)
        where = " live at the peak" if buffer.live_at_peak else ""
        head = (f"{fmt_bytes(buffer.padding_bytes)} of padding{where} ({buffer.expansion:.1f}x)"
                + (f" from {buffer.op_name}" if buffer.op_name else "") + ": ")
        data = f"{buffer.instruction} {buffer.shape}: {fmt_bytes(buffer.size_bytes)} for " \
               f"{fmt_bytes(buffer.unpadded_bytes)} of data"
        not_at_peak = "" if buffer.live_at_peak else "; not live at the peak, so the peak does not shrink"
        if _one_hot(buffer):
            out.append(Suggestion(
                kind="one_hot", saving_bytes=buffer.padding_bytes if buffer.live_at_peak else None,
                confidence="estimated", message=head + padding_fix(buffer, batch, classes, convolves, layers),
                evidence=data + "; integer labels need no one-hot buffer: at least its padding is freed" + not_at_peak,
                source_line=buffer.source_line))
        else:
            found = padding_fixes(buffer, batch, classes, convolves, layers)
            if not found:
                continue  # padded in a dimension the user does not choose (batch, classes, image size, constant)
            out.append(Suggestion(
                kind="padding", saving_bytes=found[0].saving_bytes if buffer.live_at_peak else None,
                confidence="estimated",
                message=head + f"{buffer.instruction} {buffer.shape}: " + "; or ".join(f.text for f in found) + ".",
                evidence=data + "; " + found[0].evidence + not_at_peak, source_line=buffer.source_line))
        if len(out) >= MAX_PADDING_SUGGESTIONS:
            break
    return out


def _layer_count(buffers) -> int | None:
    found = {int(m.group(1)) for b in buffers for m in _LAYER.finditer(b.op_name or "")}
    return max(found) + 1 if len(found) >= 2 else None


def _attention(result: ModuleMemory, job) -> Suggestion | None:
    """Precondition: score tensors, by shape (queries x keys) and by name where the shape alone could be an image, in
    a program that runs no fused attention kernel yet."""
    if preconditions.fused_attention(name for b in result.buffers for name in (b.op_name, b.instruction)):
        return None
    convolves = convolutional(result)
    scores = [b for b in result.buffers if b.live_at_peak and b.allocation_type == "temp"
              and _scores_shape(b, convolves)]
    total = sum(b.size_bytes for b in scores)
    peak = result.peak_heap_bytes or 0
    if not scores or total < max(MIN_PADDING_BYTES, 0.1 * peak):
        return None
    code = calls.call("attention", job.framework)
    if not code:
        return None
    sequence = _dims(scores[0])[-1]
    layers = _layer_count(scores)
    kept = f", kept for each of {layers} layers" if layers else ""
    return Suggestion(
        kind="attention", saving_bytes=total, saving_bytes_range=(int(total * 0.8), total), confidence="estimated",
        message=(f"Attention scores (queries x keys, {sequence} x {sequence}) take {fmt_bytes(total)} of the "
                 f"{fmt_bytes(peak)} peak{kept}: a fused attention kernel computes softmax(QK^T)V block by block "
                 "and never stores them"
                 + (" (in training it recomputes them in the backward pass)" if job.training else "") + "."),
        evidence=f"{len(scores)} buffers live at the peak, e.g. {scores[0].instruction} {scores[0].shape}; the "
                 "kernel's own blocks take some memory, hence the range",
        code=code, source_line=scores[0].source_line)


def _repeats(buffers) -> int | None:
    """How many times one layer body repeats: buffers of one shape made by one source line (an unrolled loop
    over layers calls the same code once per layer)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for b in buffers:
        if b.source_line:
            groups.setdefault((b.source_line, b.shape.split("{")[0]), []).append(b.size_bytes)
    # The group holding the most bytes is the layer's main activation: one buffer per layer.
    return len(max(groups.values(), key=sum)) if groups else None


def _scores_shape(buffer: Buffer, convolves: bool = False) -> bool:
    """Attention scores or probabilities: [batch, heads, queries, keys] with as many keys as queries (self
    attention), or [batch*heads, queries, keys] from an op named for attention. Their op names are often
    only the softmax's pieces (sub, exp, convert), so the shape decides, except in a program that convolves: there
    a rank-4 array with two equal minor sizes is as likely an image, and the op name must say attention."""
    dims = _dims(buffer)
    if len(dims) < 3 or dims[-1] != dims[-2] or dims[-1] < 128:
        return False
    named = bool(preconditions.ATTENTION_OP.search(buffer.op_name or ""))
    return named or (len(dims) == 4 and not convolves)


def _remat(result: ModuleMemory, job) -> Suggestion | None:
    """Forward activations kept for the backward pass (JAX: op names under jvp(...) but not transpose(...)),
    live at the peak. With remat each layer keeps only its input; one layer's activations are recomputed at a
    time."""
    if job.training is not True:
        return None  # inference keeps no activations for a backward pass
    already = preconditions.rematerialised(b.op_name for b in result.buffers)
    if already:
        return None  # jax.checkpoint / nn.remat recomputes already
    kept = [b for b in result.buffers if b.live_at_peak and b.allocation_type == "temp"
            and _FORWARD.search(b.op_name or "") and not _BACKWARD.search(b.op_name or "")]
    total = sum(b.size_bytes for b in kept)
    peak = result.peak_heap_bytes or 0
    if not kept or total < max(MIN_PADDING_BYTES, 0.2 * peak):
        return None
    code = calls.call("remat", job.framework)
    if not code:
        return None
    layers = _layer_count(kept) or _repeats(kept)
    if not layers or layers < 2:
        return None  # one block: its activations are needed once, recomputing them saves nothing
    # With remat each layer keeps its input and one layer's activations exist while it is recomputed; what a
    # policy saves (matmul outputs) stays too: hence the range down to (1 - 4/L).
    point = int(total * (1 - 1.0 / layers))
    low, high = max(int(total * (1 - 4.0 / layers)), total // 4), point
    how = (f"{layers} repeats of one layer (buffers of one shape from one source line): about one layer's "
           f"activations ({fmt_bytes(total // layers)}) remain, plus each layer's input")
    return Suggestion(
        kind="remat", saving_bytes=point, saving_bytes_range=(low, high), confidence="estimated",
        message=(f"{fmt_bytes(total)} of the {fmt_bytes(peak)} peak are forward activations kept for the backward "
                 "pass: recompute them instead (rematerialisation)."),
        evidence=f"{len(kept)} temporaries of the forward pass live at the peak; {how}; no op name shows "
                 "rematerialisation (checkpoint, rematted_computation, .remat)",
        code=code, source_line=max(kept, key=lambda b: b.size_bytes).source_line)


DONATION_NAMES = 8  # parameters named in the evidence; the rest counted


def donation(argument_bytes: int, output_bytes: int, alias_bytes: int, job, peak: int = 0,
             alias_pairs: int | None = None, where: str = "the buffer assignment",
             candidates: list[str] | None = None) -> Suggestion | None:
    """A train step's new state has the old state's shapes: when its outputs reuse none of its arguments'
    buffers, donating the state frees up to the smaller of the two.

    Precondition: a training step whose outputs alias (almost) no argument: ALIAS_BYTES (outputs held in argument
    buffers, from WHERE) under half the outputs, and ALIAS_PAIRS (the module's input_output_alias) none. A step
    jitted with donate_argnums has both. CANDIDATES (the parameters an output of their shape could be written over,
    None when unknown) are named; with none, donating frees nothing."""
    if job.training is not True or not output_bytes or not argument_bytes:
        return None
    if alias_pairs or alias_bytes >= 0.5 * output_bytes:
        return None  # already donated: the outputs are written over the arguments
    if candidates is not None and not candidates:
        return None  # no output has a parameter's shape: none could be written over one
    saving = min(output_bytes, argument_bytes) - alias_bytes
    code = calls.call("donation", job.framework)
    if saving <= max(MIN_PADDING_BYTES, 0.01 * peak) or not code:
        return None
    pairs = ("the module declares no input_output_alias" if alias_pairs == 0
             else "the input does not carry the module's input_output_alias")
    if candidates:
        shown = ", ".join(candidates[:DONATION_NAMES]) + (
            f" and {len(candidates) - DONATION_NAMES} more" if len(candidates) > DONATION_NAMES else "")
        which = (f"{len(candidates)} parameters have an output of their dtype and shape that could be written over "
                 f"them: {shown}")
    else:
        which = "the saving is exact when every output has an argument of its shape"
    return Suggestion(
        kind="donation", saving_bytes=saving, confidence="estimated", framework=job.framework, code=code,
        message=(f"Outputs ({fmt_bytes(output_bytes)}) reuse {fmt_bytes(alias_bytes)} of the arguments' "
                 f"{fmt_bytes(argument_bytes)}: donate the step's state so the new state is written over the old "
                 f"one; up to {fmt_bytes(saving)} less HBM."),
        evidence=f"{where}: arguments {fmt_bytes(argument_bytes)}, outputs {fmt_bytes(output_bytes)}, outputs in "
                 f"argument buffers {fmt_bytes(alias_bytes)}; {pairs}; {which}")


def _compiled_total(stats: dict) -> int:
    """What the whole compile needs: arguments + outputs - aliased + temporaries + code."""
    return (int(stats.get("argument_size_in_bytes") or 0) + int(stats.get("output_size_in_bytes") or 0)
            - int(stats.get("alias_size_in_bytes") or 0) + int(stats.get("temp_size_in_bytes") or 0)
            + int(stats.get("generated_code_size_in_bytes") or 0))


def add_compiled_total(module: ModuleMemory, stats: dict) -> None:
    """preflight's hook: the compile's own total (compiled.memory_analysis()) decides whether the step fits, and a
    step over HBM whose buffer assignment's peak is not is advised by that total's shortfall."""
    needed = _compiled_total(stats)
    capacity = module.hbm_capacity_bytes
    if capacity and needed > capacity >= (module.required_bytes or 0):
        module.suggestions = suggest(module, compiled_bytes=needed)


def add_donation(module: ModuleMemory, stats: dict) -> None:
    """preflight's hook: its compile knows the aliased bytes (compiled.memory_analysis())."""
    job = frameworks.from_module(module.name, (b.op_name for b in module.buffers),
                                 (b.source_line for b in module.buffers))
    hint = donation(int(stats.get("argument_size_in_bytes") or 0), int(stats.get("output_size_in_bytes") or 0),
                    int(stats.get("alias_size_in_bytes") or 0), job, module.peak_heap_bytes or 0,
                    module.alias_pairs, "the compile's memory_analysis()", module.donation_candidates)
    # The compile's own aliasing replaces the buffer assignment's guess, also when it finds nothing to donate.
    module.suggestions = rank([*(s for s in module.suggestions if s.kind != "donation"), *([hint] if hint else [])],
                              shortfall_bytes=_shortfall(module, _compiled_total(stats)))


def _shortfall(module: ModuleMemory, compiled_bytes: int = 0) -> int | None:
    """How far MODULE is over its HBM: what it needs (required_bytes) or, when larger, what the whole compile
    needs."""
    needed = max(module.required_bytes or 0, compiled_bytes)
    capacity = module.hbm_capacity_bytes
    return needed - capacity if capacity and needed > capacity else None


def _donation(result: ModuleMemory, job) -> Suggestion | None:
    # A buffer assignment counts an output written into a parameter's buffer in both the arguments and the
    # outputs (aliased_bytes); the HLO's input_output_alias says what the program declared.
    return donation(result.argument_bytes, result.output_bytes, result.aliased_bytes, job,
                    result.peak_heap_bytes or 0, result.alias_pairs,
                    "the buffer assignment" if not result.estimated else "the liveness estimate",
                    result.donation_candidates)


def program_16bit(result: ModuleMemory) -> tuple[bool, list[Buffer]]:
    """Whether 16 bits are the program's choice, and its 16-bit buffers. The program chose them when an entry
    parameter (weights, inputs) is 16-bit or a 16-bit array comes from a cast the program wrote (CAST_OP). Without
    either, its 16-bit arrays are the compiler's own: XLA:TPU rounds a float32 matmul's operands to bfloat16 for the
    MXU (default precision) and may keep them for the backward pass (a float32 MLP step at batch 4,096: 36 MiB of
    bf16 `multiply_add_fusion` outputs of its float32 dot_general)."""
    sixteen = [b for b in result.buffers if b.dtype in preconditions.SIXTEEN_BIT]
    chosen = any(b.opcode == "parameter" or preconditions.CAST_OP.search(b.op_name or "") for b in sixteen)
    return chosen, sixteen


def _bf16(result: ModuleMemory, job) -> Suggestion | None:
    # Precision: f32 arrays at the peak could be halved with bfloat16.
    """Precondition: float32 is the program's choice. A program with 16-bit arrays of its own (program_16bit: weights,
    activations, inputs, a quarter of its bytes or more) computes in 16 bits and keeps its f32 on purpose (loss cast,
    softmax, optimizer state); an XLA:CPU/GPU module upcasts bf16 arithmetic to f32, so its f32 says nothing."""
    chosen, sixteen = program_16bit(result)
    at_peak = [b for b in result.buffers if b.live_at_peak]
    peak_f32 = sum(b.size_bytes for b in at_peak if b.dtype == "f32" and b.allocation_type == "temp")
    all_16bit = sum(b.size_bytes for b in sixteen)
    peak_16bit = sum(b.size_bytes for b in sixteen if b.live_at_peak) if chosen else 0
    if not result.peak_heap_bytes or peak_16bit >= peak_f32 \
            or peak_f32 < max(MIN_PADDING_BYTES, 0.25 * result.peak_heap_bytes):
        return None
    if chosen and (preconditions.in_16_bits(all_16bit, sum(b.size_bytes for b in result.buffers))
                   or all_16bit >= peak_f32):
        return None
    if chosen:
        sixteen_words = f"16-bit arrays in the whole program {fmt_bytes(all_16bit)}"
    elif sixteen:
        largest = max(sixteen, key=lambda b: b.size_bytes)
        sixteen_words = (f"no 16-bit input, weight or cast in the program; the {fmt_bytes(all_16bit)} of 16-bit "
                         f"arrays are the compiler's own (e.g. {largest.instruction} {largest.shape.split('{')[0]}"
                         + (f" of {largest.op_name.rsplit('/', 1)[-1]}" if largest.op_name else "")
                         + ": a float32 matmul's operands rounded for the MXU)")
    else:
        sixteen_words = "16-bit arrays in the whole program 0 B"
    return Suggestion(
        kind="bf16", saving_bytes=peak_f32 // 2, saving_bytes_range=(peak_f32 // 4, peak_f32 // 2),
        confidence="estimated",
        message=f"{fmt_bytes(peak_f32)} of the peak is float32 temporaries (activations, gradients): computing in "
                "bfloat16 roughly halves them.",
        evidence=f"float32 temporaries live at the peak ({fmt_bytes(peak_f32)}), {sixteen_words}: float32 is the "
                 "program's choice; some (softmax, loss, optimizer) stay float32, hence the range",
        code=calls.call("bf16", job.framework) or "")


# Signed integer arrays of rank 2 or more among a program's inputs are token ids, labels, positions or segment ids:
# data. (8- and 4-bit integers can be quantized weights; unsigned 32-bit ones are PRNG keys, u32[n, 2].)
INDEX_DTYPES = frozenset({"s16", "s32", "s64"})


def input_batch(result: ModuleMemory) -> int | None:
    """The per-chip batch as the program's inputs carry it: the leading size of entry parameters of rank 2 or more
    (x, images, token ids) that is no other size of any parameter (a weight's hidden, vocabulary or head size), beside
    a parameter of rank 2 or more that does not lead with it (a weight: a batch is what the weights are applied to).
    Weights stacked for a scan lead with the layer count and are no input (a batch can equal the layer count: 2
    sequences through 2 layers, taken only when no other size is a candidate). Of several, the one leading the most temporaries live at the peak, then the most
    input bytes. Helper modules have none: a key (u32[2]) or a seed has no rank 2, and a lone cast or copy of one
    array has no weight beside it."""
    parameters = [(b, _dims(b)) for b in result.buffers if b.allocation_type == "parameter" and b.shape]
    parameters = [(b, dims) for b, dims in parameters if len(dims) >= 2]
    features = {d for _, dims in parameters for d in dims[1:]}
    layers = stacked_layers(result)
    leading: dict[int, int] = {}
    ids: dict[int, int] = {}  # integer inputs (token ids, labels, positions) are data, never a weight
    for buffer, dims in parameters:
        if dims[0] > 1 and buffer.dtype in INDEX_DTYPES:
            ids[dims[0]] = ids.get(dims[0], 0) + buffer.size_bytes
        elif dims[0] > 1 and dims[0] not in features and not (len(dims) >= 3 and dims[0] in layers):
            leading[dims[0]] = leading.get(dims[0], 0) + buffer.size_bytes
    # A batch is what weights are applied to: beside a parameter that does not lead with it.
    ids = {size: held for size, held in ids.items() if any(dims[0] != size for _, dims in parameters)}
    if ids:  # a weight's size can equal the batch (6 sequences beside a [58, 6, 24576] weight)
        return max(ids, key=lambda size: (sum(b.size_bytes for b in _batch_temporaries(result, size)), ids[size]))
    leading = {size: held for size, held in leading.items() if any(dims[0] != size for _, dims in parameters)}
    # A layer count leads stacked norm scales and biases of rank 2 too ([58, 7168]): the batch only when no other
    # size is a candidate.
    leading = {size: held for size, held in leading.items() if size not in layers} or leading
    if not leading:
        return None
    held = {size: sum(b.size_bytes for b in _batch_temporaries(result, size)) for size in leading}
    return max(leading, key=lambda size: (held[size], leading[size]))


def step_batch(result: ModuleMemory) -> int | None:
    """The per-chip batch the memory advice rests on, read in this one place: the inputs' (input_batch: data inputs,
    integer ids first, stacked weights excluded), else the leading size of the temporaries at the peak
    (batch_dimension), for a program whose inputs say none."""
    return input_batch(result) or batch_dimension(result)


def batch_inputs(result: ModuleMemory, batch: int) -> list[Buffer]:
    """The entry parameters of rank 2 or more that lead with BATCH and are data (input_batch's inputs): integer ids,
    or arrays that do not lead with a scan's layer count. A batch equal to the layer count leads the stacked weights
    too ([layers, ...]: a step's weights and moments, GiB that no smaller batch frees); a float input of that size is
    not told from them and is left out."""
    layers = stacked_layers(result)
    return [b for b in result.buffers if b.allocation_type == "parameter" and b.shape
            and len(_dims(b)) >= 2 and _dims(b)[0] == batch and (b.dtype in INDEX_DTYPES or batch not in layers)]


def _batch_temporaries(result: ModuleMemory, batch: int) -> list[Buffer]:
    """Temporaries live at the peak with BATCH among their sizes (past a scan's layer count)."""
    return [buffer for buffer, dims in _peak_temporaries(result) if batch in dims]


def _peak_temporaries(result: ModuleMemory):
    """(buffer, dims) of each temporary live at the peak, its dims read past a scan's leading layer count (a scan
    over layers stacks its kept activations: [layers, batch, ...])."""
    layers = stacked_layers(result)
    for buffer in result.buffers:
        if buffer.allocation_type != "temp" or not buffer.live_at_peak or not buffer.shape:
            continue
        dims = _dims(buffer)
        yield buffer, dims[1:] if len(dims) >= 3 and dims[0] in layers else dims


def _capacity(result: ModuleMemory, framework: str | None, shortfall: int | None,
              compiled_bytes: int | None = None) -> list[Suggestion]:
    if not result.hbm_capacity_bytes or result.required_bytes is None:
        return []
    use = result.required_bytes / result.hbm_capacity_bytes
    if shortfall:
        return [_smaller_batch(result, framework, shortfall, compiled_bytes)]
    batch = input_batch(result)
    if use < 0.5 and not result.estimated and batch:
        inputs = batch_inputs(result, batch)
        return [Suggestion(kind="batch_size", severity="info", confidence="exact", message=(
            f"The program needs {fmt_share(use)} of HBM: there is room for a larger per-chip batch (better MXU "
            "utilisation); `tpuprof preflight --max-batch` finds the largest that fits."),
            evidence=f"per-chip batch {batch}: the leading size of "
                     + ", ".join(f"{b.op_name or b.instruction} {b.shape.split('{')[0]}" for b in inputs[:3])
                     + ", which no weight's size is")]
    return []


def _smaller_batch(result: ModuleMemory, framework: str | None, shortfall: int,
                   compiled_bytes: int | None) -> Suggestion:
    """The batch fix of a program over HBM. A smaller batch frees at most what holds the batch at the peak: the
    temporaries and inputs with the batch among their sizes (LOW), and no more than every temporary there plus those
    inputs plus what code generation added (HIGH: arguments, outputs and code do not shrink with the batch). It is
    'enough to fit' only when LOW, shrunk to a batch of 1, covers the shortfall."""
    capacity, peak, required = result.hbm_capacity_bytes or 0, result.peak_heap_bytes or 0, result.required_bytes or 0
    if compiled_bytes and compiled_bytes > required:
        message = (f"The compiled step needs {fmt_bytes(compiled_bytes)} (its buffer assignment, dumped before "
                   f"code generation added temporaries and code, peaks at {fmt_bytes(peak)}): "
                   f"over the {fmt_bytes(capacity)} of HBM by {fmt_bytes(shortfall)}.")
        beyond = "added by code generation"
    elif required > peak:
        message = (f"The program's HBM allocations need {fmt_bytes(required)}: the compiler packed its temporaries "
                   f"into one block {fmt_bytes(required - peak)} larger than what is live at its peak "
                   f"({fmt_bytes(peak)}), and the block is reserved whole; over the {fmt_bytes(capacity)} of HBM by "
                   f"{fmt_bytes(shortfall)}.")
        beyond = "of the temporaries' block not live at the peak"
    else:
        message = (f"The peak ({fmt_bytes(peak)}) exceeds the "
                   f"{fmt_bytes(capacity)} of HBM by {fmt_bytes(shortfall)}.")
        beyond = ""
    search = " `tpuprof preflight --max-batch` finds the largest batch that fits by compiling."
    code = calls.call("batch_size", framework) or ""
    batch = step_batch(result)
    temps = sum(b.size_bytes for b in result.buffers if b.live_at_peak and b.allocation_type == "temp")
    added = max(0, max(compiled_bytes or 0, required) - peak)
    if not batch:
        bound = temps + added
        if bound < shortfall:
            return Suggestion(
                kind="batch_size", confidence="estimated", code=code,
                message=message + f" A smaller batch cannot make it fit on its own: it frees at most the "
                f"{fmt_bytes(bound)} of temporaries at the peak; arguments and outputs do not shrink with it." + search,
                evidence=f"temporaries live at the peak {fmt_bytes(temps)}"
                         + (f", {fmt_bytes(added)} {beyond}" if added else "")
                         + f", shortfall {fmt_bytes(shortfall)}; no input size reads as the batch")
        return Suggestion(
            kind="batch_size", confidence="estimated", code=code,
            message=message + f" A smaller batch frees at most the {fmt_bytes(bound)} of temporaries at the peak; "
            "no input size reads as the batch, so how many of them scale with it is not known." + search,
            evidence=f"temporaries live at the peak {fmt_bytes(temps)}"
                     + (f", {fmt_bytes(added)} {beyond}" if added else "")
                     + "; no entry parameter of rank 2 or more leads with a size that is no weight's")
    inputs = batch_inputs(result, batch)
    held = _batch_temporaries(result, batch)
    low = sum(b.size_bytes for b in held) + sum(b.size_bytes for b in inputs)
    high = temps + added + sum(b.size_bytes for b in inputs)
    # At a batch of 1 what scales keeps 1/batch of itself.
    low_free, high_free = low - low // batch, high - high // batch
    led = ", ".join(b.op_name or b.instruction for b in inputs[:3]) or "the temporaries"
    input_bytes = sum(b.size_bytes for b in inputs)
    facts = (f"per-chip batch {batch} (leads {led}); temporaries at the peak holding it "
             f"{fmt_bytes(low - input_bytes)} of {fmt_bytes(temps)}, inputs holding it {fmt_bytes(input_bytes)}"
             + (f", {fmt_bytes(added)} {beyond}" if added else "")
             + f"; shortfall {fmt_bytes(shortfall)}")
    if batch > 1 and low_free >= shortfall:
        from tpuprof.analyses.oom import fitting_batch

        fitting = fitting_batch(batch, 1 - shortfall / low)
        message += (f" The temporaries and inputs at the peak that hold the per-chip batch of {batch} "
                    f"({fmt_bytes(low)}) scale with it: a batch of about {fitting} fits." + search)
        return Suggestion(kind="batch_size", severity="blocking", saving_bytes=shortfall, confidence="estimated",
                          message=message, code=code, extra={"batch": fitting},
                          evidence=facts + "; arguments and outputs do not scale with the batch")
    if high_free < shortfall:
        message += (f" A smaller per-chip batch (now {batch}) cannot make it fit on its own: even a batch of 1 frees "
                    f"at most {fmt_bytes(high_free)} (every temporary at the peak and the inputs that hold the batch); "
                    "arguments and outputs do not shrink with it." + search)
        return Suggestion(kind="batch_size", confidence="estimated", code=code, message=message, evidence=facts)
    message += (f" A smaller per-chip batch (now {batch}) frees at most {fmt_bytes(high_free)}, at least "
                f"{fmt_bytes(low_free)} (what shows the batch in its shape): enough to fit only if temporaries whose "
                "shape does not show it (a flattened batch x sequence) scale with it too." + search)
    return Suggestion(kind="batch_size", confidence="estimated", code=code, message=message, evidence=facts)


# tpuprof's built-in LLM step (preflight --model): its code is tpuprof's, so a fix is one of the options that build
# it. Padding, attention and one-hot fixes would edit that code; donation is done (the step donates its state).
BUILTIN_LEVERS = ("--remat, --dtype, --weight-dtype, --mu-dtype, --grad-dtype, --mesh, --vocab-tiling, --moe (a mixture "
                  "of experts) and the batch (--batch-per-chip / --global-batch)")


def for_builtin_step(module: ModuleMemory, remat: str, dtype: str, batch: int | None, replicas: int = 1,
                     devices_per_chip: int = 1) -> None:
    """Precondition of framework code: the user wrote the program. For tpuprof's own step the suggestions become its
    options: remat only when the step runs without it (--remat none), bf16 never (its matmuls already take bf16 or
    fp8; the weights and optimizer state are --weight-dtype's), the batch and the capacity as they are, but for a
    batch fix the step's own BATCH contradicts (_drop_misread_batch). REPLICAS: how many times each device's program
    holds the step's batch per device (its tensor axis repeats the batch: fsdp=2,tensor=2 at 16,384 sequences per
    device compiles a program of 32,768). DEVICES_PER_CHIP: the option counts sequences per chip, the fix per device
    (TPU7x, v2 and v3 have two devices a chip)."""
    kept = []
    for item in module.suggestions:
        if item.kind == "remat" and remat == "none":
            item.code, item.framework = "--remat full (or --remat dots: keeps the matmul outputs)", None
        elif item.kind == "batch_size":
            item.framework = None
        else:
            continue
        item.evidence = (item.evidence + "; " if item.evidence else "") + \
            f"tpuprof's built-in step (remat={remat}, dtype={dtype}): the levers are {BUILTIN_LEVERS}"
        kept.append(item)
    module.suggestions = kept
    _drop_misread_batch(module, batch, replicas)
    for item in module.suggestions:
        if item.kind == "batch_size" and item.code != "--max-batch":
            item.code = _batch_option(item.extra.get("batch"), devices_per_chip)
    say_per_device(module.suggestions, devices_per_chip)


def for_builtin_oom(suggestions: tuple[dict, ...], remat: str, devices_per_chip: int = 1) -> tuple[dict, ...]:
    """The compiler's refusal of tpuprof's own step, triaged as a log (advice.oom), in the step's options: a log
    cannot tell whether the program rematerialises, the step can (remat is offered only at --remat none); its
    batch estimate is read from the message's figures, so --max-batch, which compiles, names the batch; fixes that
    edit the program's code (padding, attention, donation, bf16, sharding annotations) are not the user's to make.
    DEVICES_PER_CHIP: the log's program is one device's, and TPU7x, v2 and v3 have two a chip."""
    kept = []
    for item in suggestions:
        item = dict(item)
        if item["kind"] == "remat" and remat == "none":
            item["code"], item["framework"] = "--remat full (or --remat dots: keeps the matmul outputs)", None
            item["evidence"] = "the step runs with --remat none: it keeps every layer's activations for the backward"
        elif item["kind"] == "batch_size":
            item["code"], item["framework"] = "--max-batch", None
            if devices_per_chip > 1:
                item["message"] = item["message"].replace("per-chip batch", "per-device batch")
        elif item.get("severity") != "info" or item["kind"] == "more_detail":
            continue
        kept.append(item)
    return tuple(kept)


def _batch_option(per_device: int | None, devices_per_chip: int) -> str:
    """The option that sets the batch a fix names per device: --batch-per-chip counts the sequences of a chip."""
    search = "--max-batch finds the largest that fits"
    if not per_device:
        return f"--batch-per-chip N ({search})"
    if devices_per_chip > 1:
        return (f"--batch-per-chip {per_device * devices_per_chip} ({per_device} per device x {devices_per_chip} "
                f"devices a chip; {search})")
    return f"--batch-per-chip {per_device} ({search})"


def _drop_misread_batch(memory: ModuleMemory, batch: int | None, replicas: int = 1) -> None:
    """The memory advice reads the batch from the shapes of the program's inputs; tpuprof's step knows its own. A
    batch fix about another size is dropped (a scan's per-layer norm scales, [layers, hidden], lead with the layer
    count: at one sequence per device that was read as the batch, and "a batch of about 1,584 fits" offered for a
    step compiled at 1), and so is one at a batch of 1, which has no smaller batch. (A batch equal to the layer count
    is read from the token ids, and the stacked weights are not among the inputs that scale with it:
    batch_inputs.)"""
    if not any(s.kind == "batch_size" for s in memory.suggestions):
        return
    read = input_batch(memory)
    if batch and batch > 1 and read == batch * replicas:
        if replicas > 1:
            for item in memory.suggestions:
                if item.kind == "batch_size":
                    _in_step_terms(item, read, batch, replicas)
        return
    kept = [s for s in memory.suggestions if s.kind != "batch_size"]
    if batch and batch > 1:
        why = f"its inputs' shapes read as a batch of {read}"
        kept.append(Suggestion(kind="batch_size", confidence="estimated", code="--max-batch",
                               message=f"Fewer sequences per device than {batch} hold fewer activations: --max-batch "
                                       "finds the largest batch that fits by compiling.",
                               evidence=f"the step compiled at {batch} sequences per device; {why}"))
    memory.suggestions = kept


def _in_step_terms(item: Suggestion, read: int, batch: int, replicas: int) -> None:
    """A batch fix read from a program whose inputs hold REPLICAS x the step's BATCH per device, in the step's terms:
    sequences per device, the option's unit."""
    held = f"the {read:,} sequences each device's program holds ({batch:,} per device, repeated over tensor={replicas})"
    for unit in ("per-chip", "per-device"):  # per-device where a chip holds two devices (say_per_device)
        item.message = item.message.replace(f"the {unit} batch of {read}", held)
        item.evidence = item.evidence.replace(f"{unit} batch {read} ", f"{read:,} sequences in each device's "
                                              f"program ({batch:,} per device x tensor={replicas}) ", 1)
    item.message = item.message.replace(f"(now {read})", f"(now {batch:,} per device)")
    fitting = item.extra.get("batch")
    if fitting:
        per_device = max(1, fitting // replicas)
        item.message = item.message.replace(f"a batch of about {fitting} fits",
                                            f"about {per_device:,} sequences per device fit ({fitting:,} in each "
                                            "device's program)")
        item.extra["batch"] = per_device


def batch_to_measure(module: ModuleMemory) -> int | None:
    """The smaller batch the blocking batch fix names ('a batch of about N fits'), for preflight to compile."""
    return next((s.extra.get("batch") for s in module.suggestions
                 if s.kind == "batch_size" and s.severity == "blocking" and s.extra.get("batch")), None)


def measure_batch(module: ModuleMemory, batch: int, needed: int | None, smaller: int, smaller_needed: int | None,
                  smaller_fits: bool, needed_is_bound: bool = False, smaller_is_bound: bool = False,
                  smaller_refused: bool = False, smaller_layout_fits: bool = False) -> None:
    """preflight compiled the same step at the batch the fix names (SMALLER): the fix's saving is then the two
    compiles' totals' difference, measured, and 'enough to fit' only when the compile at SMALLER fits. *_IS_BOUND: a
    compile stopped at its memory layout (preflight --model's layout-only compiles), whose total is a lower bound:
    the saving is then 'at least' (the larger batch's layout against a whole compile) or the layouts' difference.
    SMALLER_REFUSED: the compile at SMALLER ran out of memory (libtpu's RESOURCE_EXHAUSTED): it does not fit.
    SMALLER_LAYOUT_FITS: the compile at SMALLER was stopped at a layout within HBM, which code generation adds to."""
    for item in module.suggestions:
        if item.kind != "batch_size" or item.extra.get("batch") != smaller:
            continue
        if smaller_needed is None or needed is None:
            item.severity, item.saving_bytes = "improve", None
            refused = "the compiler refused it for memory" if smaller_refused else "the step did not compile"
            item.message += f" Compiled at batch {smaller}, {refused}: the estimate is not borne out."
            item.evidence += f"; measured: the compile at batch {smaller} " + \
                ("ran out of memory" if smaller_refused else "failed")
            if item.code and item.code.startswith("--batch-per-chip"):  # the number did not fit
                item.code = "--max-batch"
            continue
        saving = needed - smaller_needed
        at_least = needed_is_bound and not smaller_is_bound
        item.saving_bytes = saving if saving > 0 and (at_least or needed_is_bound == smaller_is_bound) else None
        item.saving_bytes_range, item.confidence = None, "measured"
        item.severity = "blocking" if smaller_fits else "improve"
        if not (smaller_fits or smaller_layout_fits) and item.code and item.code.startswith("--batch-per-chip"):
            item.code = "--max-batch"
        bound = " at least" if smaller_is_bound else ""
        if smaller_layout_fits:
            item.message += (f" Compiled up to its memory layout at batch {smaller}, the step needs at least "
                             f"{fmt_bytes(smaller_needed)}: {LAYOUT_FITS}; `--full` compiles it to the end.")
        else:
            item.message += (f" Compiled at batch {smaller}, the step needs{bound} {fmt_bytes(smaller_needed)}: "
                             + ("it fits." if smaller_fits
                                else "it still does not fit; `--max-batch` finds one that does."))
        layout = " (its memory layout: a lower bound)"
        item.evidence = (f"measured: compiled at batch {batch} the step needs {fmt_bytes(needed)}"
                         f"{layout if needed_is_bound else ''}, at batch {smaller} {fmt_bytes(smaller_needed)}"
                         f"{layout if smaller_is_bound else ''}"
                         + (f", so it frees at least {fmt_bytes(saving)}" if at_least and saving > 0 else "")
                         + "; the estimate: " + item.evidence)
    module.suggestions = rank(module.suggestions, shortfall_bytes=_shortfall(module, needed or 0))


def measure_bf16(module: ModuleMemory, bf16_peak: int | None, batch: int) -> None:
    """preflight --bf16 compiled the same step in bfloat16 at the same batch: the bf16 suggestion's saving is then
    the two peaks' difference, measured, not the estimate; dropped when bfloat16 frees nothing."""
    if bf16_peak is None or module.peak_heap_bytes is None:
        return
    saving = module.peak_heap_bytes - bf16_peak
    kept = []
    for item in module.suggestions:
        if item.kind == "bf16":
            if saving <= 0:
                continue
            item.saving_bytes, item.saving_bytes_range, item.confidence = saving, None, "measured"
            item.evidence = (f"measured: compiled in bfloat16 at batch {batch}, the peak goes "
                             f"{fmt_bytes(module.peak_heap_bytes)} -> {fmt_bytes(bf16_peak)}")
        kept.append(item)
    module.suggestions = rank(kept, shortfall_bytes=_shortfall(module))


def answer_first(modules: list[ModuleMemory]) -> list[ModuleMemory]:
    """The modules of one dump in the order a reader wants them: first what does not fit its HBM, then the training
    steps, then programs with a batch (input_batch), then the rest (key seeding, initialisers, casts: helpers a
    script jits beside its step); largest peak first within each. The first says why it leads, in a note."""
    if len(modules) < 2:
        return modules

    def job(module: ModuleMemory):
        return frameworks.from_module(module.name, (b.op_name for b in module.buffers),
                                      (b.source_line for b in module.buffers))

    def why(module: ModuleMemory) -> tuple[int, str]:
        capacity, needed = module.hbm_capacity_bytes, module.required_bytes or 0
        if capacity and needed > capacity:
            return 0, f"it needs {fmt_bytes(needed)}, more than the {fmt_bytes(capacity)} of HBM"
        found = job(module)
        if found.training:
            said = next((e for e in found.evidence if e.startswith("training: ")), "")
            return 1, "the training step" + (f" ({said.removeprefix('training: ')} in its name or op names)"
                                             if said else "")
        batch = input_batch(module)
        if batch:
            return 2, f"a program with a per-chip batch ({batch}, the leading size of its inputs)"
        return 3, ""

    reasons = {id(m): why(m) for m in modules}
    ordered = sorted(modules, key=lambda m: (reasons[id(m)][0], -(m.peak_heap_bytes or 0)))
    lead = ordered[0]
    group, reason = reasons[id(lead)]
    largest = max(modules, key=lambda m: m.peak_heap_bytes or 0)
    others = [m for m in ordered[1:] if reasons[id(m)][0] == 3]
    note = f"{len(modules)} modules in this dump; {lead.name} comes first"
    note += f": {reason}" if reason else ": the largest peak"
    if largest is not lead and (largest.peak_heap_bytes or 0) > (lead.peak_heap_bytes or 0):
        note += f", though {largest.name}'s peak ({fmt_bytes(largest.peak_heap_bytes)}) is larger"
    if others and group < 3:
        note += (". Helpers without a training step or a batch come last: "
                 + ", ".join(m.name for m in others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else ""))
    lead.notes.insert(0, note + ".")
    for module in ordered[1:]:  # what the dump's reading left out is said once, on the first module shown
        moved = [n for n in module.notes if n.startswith("Left out (")]
        module.notes = [n for n in module.notes if n not in moved]
        lead.notes += moved
    return ordered
