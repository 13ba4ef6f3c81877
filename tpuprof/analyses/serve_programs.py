"""The programs a serving engine compiles at start-up, compiled by libtpu for one device of the slice (compile-only),
through an on-disk cache keyed by content; and what their figures say about the weights, the KV page and the
headroom the programs need.

Which programs (vLLM TPU): a backbone per token padding, attention metadata `max_num_seqs` wide, and the logits +
sampling step per request padding (tpuprof/sources/llm_serve.py builds them). Every backbone is compiled whole, all
decoder layers: scaling 1- and 2-layer compiles by the layer count is not safe, because the compiler sometimes
outlines identical layers into one body (Llama-3.1-8B at 2048 tokens: 10 MB of code for 32 layers, 11 MB for 2) and
sometimes does not (at 512 tokens on 4 devices: 161 MB for 32 layers, linear); bench/bench_serve_layers.py shows it.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from tpuprof.analyses import serve_memory
from tpuprof.models.serve import KvLayout, ProgramRecord, ProgramSet

CACHE_FORMAT = 1
KV_PAGES_COMPILED = 64  # pages per layer passed to the compiled programs: their bytes are exact, the count nominal
KV_TOKENS_PER_BLOCK = 512  # tokens of K/V the attention kernel streams per block (num_kv_pages_per_block x page)
QUERIES_PER_BLOCK = 32
# The kernel's scoped VMEM limit: three quarters of a core's VMEM, at most 64 MiB (jax tpu_info: v4 16 MiB,
# v5e/v6e 128 MiB, v5p/TPU7x 64 MiB per core).
VMEM_PER_CORE = {"v2": 16, "v3": 16, "v4": 16, "v5e": 128, "v5p": 64, "v6e": 128, "tpu7x": 64}
# Of bytes_limit, below the KV cache besides the largest temporaries and every compiled program's code: what tpuprof
# does not compile (the engine's helper programs: 33 of 44 for Llama-3.1-70B on v6e-8; arrays made after the cache)
# and fragmentation. Not fitted: public E0101 logs bound it (docs/serve.md): GPT-OSS on TPU7X failed in 64% of
# start-ups with 0.49 GiB (0.5% of the limit) beyond its one program, and with 2% every public failing
# utilization lies above tpuprof's rule (tests/test_serve.py).
MARGIN_FRACTION = 0.02


def cache_root() -> Path:
    from tpuprof.analyses.preflight import cache_root as preflight_cache

    return preflight_cache().parent / "serve"


def vmem_limit_bytes(generation: str) -> int:
    return min(64, VMEM_PER_CORE.get(generation, 16) * 3 // 4) << 20


def compiled_kv_layout(kv: KvLayout) -> tuple[int, int, bool]:
    """(combined heads per device, head_dim, K and V merged) of the cache as compiled. JAX's ragged paged attention
    kernel works on 128-lane heads; vLLM's head_dim-64 kernel stores a head's K and V side by side in 128 lanes
    (kernel_hd64), so a 64-wide model is compiled in that layout: half the slots, 128 wide, the engine's page bytes
    (the attention then pairs the lanes as the JAX kernel does: its temporaries are those of a 128-wide head)."""
    if kv.padded_head_dim == 64:
        return kv.cache_slots // 2, 128, True
    return kv.cache_slots, max(kv.padded_head_dim, 128), False


def programs(config, kv: KvLayout, *, tp: int, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int,
             quantization: str, expert_parallel: bool, generation: str):
    """(backbones by token padding, every decoder layer; logits programs by request padding) to compile."""
    from tpuprof.sources.llm_serve import ServeProgram

    tokens = serve_memory.token_paddings(max_num_batched_tokens)
    requests = serve_memory.request_paddings(max_num_seqs)
    page_size = serve_memory.compiled_page_size(kv)
    pages_per_request = -(-max_model_len // page_size)
    combined, head_dim, merged = compiled_kv_layout(kv)
    base = ServeProgram(
        kind="backbone", tokens=tokens[0], requests=max_num_seqs, layers=config.num_hidden_layers,
        pages_per_request=pages_per_request,
        page_size=page_size, kv_pages=KV_PAGES_COMPILED, combined_kv_heads=combined, head_dim=head_dim,
        kv_merged=merged, kv_dtype=kv.dtype, weight_dtype=quantization, tensor_parallel_size=tp,
        expert_parallel=expert_parallel,
        num_kv_pages_per_block=max(1, min(pages_per_request, KV_TOKENS_PER_BLOCK // page_size)),
        num_queries_per_block=QUERIES_PER_BLOCK, vmem_limit_bytes=vmem_limit_bytes(generation),
        kind_caches=tuple((k.attention, k.cache_slots, max(k.padded_head_dim, 128)) for k in kv.kinds))
    backbones = [replace(base, tokens=t, num_queries_per_block=min(QUERIES_PER_BLOCK, t)) for t in tokens]
    # The logits programs hold no experts: one compile serves with and without expert parallelism.
    logits = [replace(base, kind="logits", tokens=0, requests=r, layers=0, expert_parallel=False) for r in requests]
    return backbones, logits


def compile_cached(config, program, slice_, use_cache: bool = True, on_compile=None) -> dict:
    """The compiler's figures for PROGRAM on the tpuprof.slices.Slice (sources.llm_serve.compile_program), from the
    cache when it has them."""
    from tpuprof.analyses.preflight import _libtpu_version, _write_json_atomically

    key = program.key(config, slice_.compile_label + " " + _libtpu_version() + f" {CACHE_FORMAT}")
    entry = cache_root() / f"{key}.json"
    if use_cache and entry.is_file():
        try:
            return {**json.loads(entry.read_text()), "cached": True}
        except (ValueError, OSError):
            pass
    if on_compile:
        on_compile(program)
    from tpuprof.errors import UserError
    from tpuprof.sources import llm_serve, tpu_compile

    try:
        result = llm_serve.compile_program(config, program, slice_)
    except tpu_compile.CompileFailed as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"libtpu could not compile the {program.kind} program of {config.name} for {slice_.name} "
                        f"(tensor parallelism {program.tensor_parallel_size}): {first[:300]}") from None
    if os.environ.get("TPUPROF_NO_CACHE_WRITE") is None:
        _write_json_atomically(entry, result)
    return {**result, "cached": False}


def metadata_bytes(program) -> int:
    """The backbone's int32 step inputs (ids, positions, slots, kv_lens, page table, cu_q_lens, num_seqs): small
    arrays the compiler pads to 512-byte granules; subtracted from the arguments to leave the weights."""
    sizes = [program.tokens] * 3 + [program.requests, program.requests * program.pages_per_request,
                                    program.requests + 1, 1]
    return sum(-(-4 * n // 512) * 512 for n in sizes)


def fix_for(space: str | None, kv: KvLayout, max_num_seqs: int, max_model_len: int, padded: bool = True) -> str:
    """The settings that avoid a program's failure in SPACE. SMEM: fewer requests or larger pages, each only where
    it shrinks the page table below the SMEM share, counted as the compiled kernel holds it (PADDED) or flat as
    vLLM's rule counts it. A contiguous cache (JetStream) has no page size to set."""
    paged = kv.page_size > 1
    page_size = serve_memory.compiled_page_size(kv)
    if space == "smem":
        seqs = serve_memory.largest_max_num_seqs(max_model_len, page_size, padded)
        page = serve_memory.smallest_page_for(max_num_seqs, max_model_len, padded) if paged else None
        options = [f"--max-num-seqs {seqs}" if 0 < seqs < max_num_seqs else None,
                   f"--block-size {page}" if page and page > page_size else None]
        return " or ".join(o for o in options if o) or "a shorter --max-model-len"
    if space == "vmem":
        return ("a smaller --max-num-batched-tokens" + (" or --block-size" if paged else "")
                + " (the kernel's blocks hold fewer tokens)")
    return "a larger slice or --tensor-parallel-size"


def compile_all(config, kv: KvLayout, slice_, *, tp: int, max_num_seqs: int, max_model_len: int,
                max_num_batched_tokens: int, quantization: str, expert_parallel: bool, use_cache: bool = True,
                on_compile=None) -> ProgramSet:
    """Every backbone compiled whole (all decoder layers) and every logits program: exact figures per device."""
    backbones, logits = programs(
        config, kv, tp=tp, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, quantization=quantization, expert_parallel=expert_parallel,
        generation=slice_.generation)
    run = {p: compile_cached(config, p, slice_, use_cache, on_compile)
           for p in [*reversed(backbones), *logits]}
    layers = config.num_hidden_layers
    records = []
    for program in [*backbones, *logits]:
        figures = run[program]
        kind, tokens = program.kind, program.tokens if program.kind == "backbone" else 0
        if "failure" in figures:
            records.append(ProgramRecord(kind, tokens, program.requests, None, None, "refused by the compiler",
                                         figures["space"], figures["failure"][:400],
                                         fix_for(figures["space"], kv, max_num_seqs, max_model_len),
                                         (program.layers,), figures.get("seconds", 0.0), figures.get("cached", False)))
            continue
        how = f"compiled whole ({layers} layers)" if kind == "backbone" else "compiled"
        records.append(ProgramRecord(kind, tokens, program.requests, figures["temp_bytes"], figures["code_bytes"], how,
                                     compiled_layers=(program.layers,), seconds=figures.get("seconds", 0.0),
                                     cached=figures.get("cached", False)))
    weights, page_bytes, how = None, None, "not compiled"
    body = next((run[p] for p in reversed(backbones) if "failure" not in run[p]), None)
    head = run[logits[0]]
    if body is not None and "failure" not in head:
        program = next(p for p in reversed(backbones) if run[p] is body)
        head_bytes = head["argument_bytes"] - logits[0].requests * config.hidden_size * 2
        if config.tie_word_embeddings:
            head_bytes -= config.vocab_size * config.hidden_size * 2 // tp  # the LM head is the embedding
        weights = body["argument_bytes"] - body["alias_bytes"] - metadata_bytes(program) + head_bytes
        page_bytes = body["alias_bytes"] // (KV_PAGES_COMPILED * layers)  # the mean where the layers' pages differ
        how = ("compiled argument bytes of the backbone (all layers) and of the logits program (LM head), the KV "
               "pages (aliased arguments) and the step's inputs taken out")
    tokens = tuple(p.tokens for p in backbones)
    requests = tuple(p.requests for p in logits)
    count, rule = serve_memory.engine_program_count(tokens, requests)
    return ProgramSet(tokens, requests, count, rule, tuple(records), weights, how, page_bytes)
