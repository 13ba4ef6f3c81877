"""One slice's serving answer from the validated options: the engine's settings resolved, the KV cache it allocates,
the programs it compiles (compiled), the largest safe utilization, what stops it and the launch command.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tpuprof.analyses import serve_estimate, serve_memory, serve_programs
from tpuprof.models.serve import OptionError, ServeAnswer, ServeOptions, ServeTarget

STATE_BYTES_PER_DEVICE = 0  # in use after the weights load besides them (see docs/serve.md: checked on public logs)
MAX_RECOMMENDED_UTILIZATION = 0.98

# Hugging Face ids of the built-in configs (tpuprof/llm_configs), for the command line to paste.
HF_IDS = {
    "llama3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "llama3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama3.1-405b": "meta-llama/Llama-3.1-405B-Instruct", "llama3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama3-70b": "meta-llama/Meta-Llama-3-70B-Instruct", "llama2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "llama2-13b": "meta-llama/Llama-2-13b-chat-hf", "llama2-70b": "meta-llama/Llama-2-70b-chat-hf",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3", "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1", "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct", "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B",
    "gemma2-9b": "google/gemma-2-9b-it", "gemma2-27b": "google/gemma-2-27b-it", "gemma3-12b": "google/gemma-3-12b-it",
    "gemma3-27b": "google/gemma-3-27b-it", "gpt-oss-20b": "openai/gpt-oss-20b", "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "llama4-maverick": "meta-llama/Llama-4-Maverick-17B-128E-Instruct", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "gemma4-31b": "google/gemma-4-31B-it", "gemma4-26b-a4b": "google/gemma-4-26B-A4B-it",
}


# MaxText's model_name of the built-in configs (src/maxtext/configs/models/*.yml @ serve_memory.MAXTEXT_COMMIT); the
# others have none there.
MAXTEXT_MODEL_NAMES = {name: name for name in (
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.1-405b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen3-8b", "qwen3-32b",
    "qwen3-30b-a3b", "qwen3-235b-a22b", "gemma2-9b", "gemma2-27b", "gemma3-12b", "gemma3-27b", "gpt-oss-20b",
    "gpt-oss-120b", "gpt3-175b")}
MAXTEXT_MODEL_NAMES.update({"llama4-scout": "llama4-17b-16e", "llama4-maverick": "llama4-17b-128e",
                            "deepseek-v3": "deepseek3-671b", "deepseek-v2-lite": "deepseek2-16b"})
MAXTEXT_HUB_MODELS = {"meta-llama/Llama-3.3-70B-Instruct": "llama3.3-70b"}


def tensor_parallel_size(options: ServeOptions, slice_) -> int:
    """The TP degree: the one given, else the most devices of the slice that the model's heads allow (vLLM needs TP
    to divide the attention heads, and the KV heads to divide TP or TP to divide them)."""
    config = options.model
    given = options.tensor_parallel_size
    candidates = [given] if given else [tp for tp in range(slice_.devices, 0, -1) if slice_.devices % tp == 0]
    for tp in candidates:
        heads = {config.num_key_value_heads, config.global_kv_heads or config.num_key_value_heads}
        if config.num_attention_heads % tp == 0 and all(kv % tp == 0 or tp % kv == 0 for kv in heads):
            return tp
    raise OptionError("tensor_parallel_size", f"{{option}} {given} does not divide {config.name}'s "
                                              f"{config.num_attention_heads} attention heads (or its "
                                              f"{config.num_key_value_heads} KV heads).")


def plan(options: ServeOptions, on_compile=None) -> ServeAnswer:
    if not quantizable_as_loaded(options, options.quantization):
        config = options.model
        raise OptionError("quantization", f"{{option}} {options.quantization}: tpu-inference runs "
                                          f"{options.architecture or config.model_type} with vLLM's model code, "
                                          "where the qwix rules that quantize a bf16 checkpoint as it loads do not "
                                          "apply (only its JAX models take them: models/common/model_loader.py "
                                          "_get_nnx_model), so it would hold the bf16 weights: give the config.json "
                                          f"of a checkpoint stored in {options.quantization} instead.")
    return ServeAnswer(options, [target(options, s, on_compile) for s in options.slices])


def quantizable_as_loaded(options: ServeOptions, quantization: str) -> bool:
    """Whether the engine can hold the bf16 checkpoint's weights in QUANTIZATION as it loads them. vLLM TPU applies
    the qwix rules of --additional-config to its JAX models only (tpu-inference b8692ff0 models/common/model_loader.py:
    qwix in _get_nnx_model, none in get_vllm_model); on vLLM's model code its fp8 method quantizes no bf16 experts
    (layers/vllm/quantization/fp8.py: "FP8OnelineMoEMethod is not supported")."""
    if quantization == "bf16" or options.quantized_checkpoint or options.engine != "vllm":
        return True
    return not serve_memory.runs_vllm_model_code(options.model, options.architecture)


def target(options: ServeOptions, slice_, on_compile=None) -> ServeTarget:
    config, engine = options.model, serve_memory.ENGINES[options.engine]
    tp = tensor_parallel_size(options, slice_)
    replicas = slice_.total_devices // tp
    max_model_len = options.max_model_len or config.max_position_embeddings
    # The concurrency asked for is the number of requests to schedule together when --max-num-seqs is not given.
    # Where the engine splits the requests over its devices (vLLM TPU's attention data parallelism for MLA), each
    # device schedules --max-num-seqs of its own.
    # The concurrency is the requests in flight on the slice (what a benchmark client's --max-concurrency caps):
    # with several engine replicas (vLLM's --data-parallel-size) the server spreads them, each replica's scheduler
    # holding its share under its own --max-num-seqs.
    shards = serve_memory.page_shards(config, options.engine, tp)
    per_engine = -(-options.concurrency // replicas) if options.concurrency else None
    max_num_seqs = options.max_num_seqs or (-(-per_engine // shards) if per_engine else
                                            serve_memory.DEFAULT_MAX_NUM_SEQS)
    requests = max_num_seqs * shards  # the engine's, over its devices
    batched = (options.max_num_batched_tokens
               or serve_memory.default_max_num_batched_tokens(options.engine))
    kv = serve_memory.kv_layout(config, options.engine, tp, options.kv_cache_dtype, max_model_len, options.block_size,
                               max_num_seqs, options.architecture)
    limit = slice_.target.compiler_hbm_bytes
    margin = int(limit * serve_programs.MARGIN_FRACTION)
    programs = None
    if options.compile:
        programs = serve_programs.compile_all(
            config, kv, slice_, tp=tp, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
            max_num_batched_tokens=batched, quantization=options.quantization,
            expert_parallel=options.enable_expert_parallel, on_compile=on_compile)
    weights = programs.weights_bytes_per_device if programs and programs.weights_bytes_per_device else \
        serve_memory.shape_weights_bytes_per_device(config, tp, options.quantization, options.enable_expert_parallel,
                                                    options.engine)
    largest = programs.largest if programs else None
    headroom = serve_memory.headroom_bytes(programs.largest_temp_bytes, programs.all_code_bytes, margin) \
        if largest else None
    safe = serve_memory.safe_utilization(limit, headroom) if largest else None
    utilization = options.gpu_memory_utilization or (
        min(safe, MAX_RECOMMENDED_UTILIZATION) if safe is not None else serve_memory.DEFAULT_UTILIZATION)
    wanted = per_engine or requests
    cap = serve_memory.capacity(kv, limit, utilization, weights, STATE_BYTES_PER_DEVICE, max_model_len, wanted,
                                options.engine, config.max_position_embeddings, batched)
    problems = []
    if cap.kv_budget_bytes_per_device <= 0:
        problems.append(f"the weights ({_gib(weights)} per device) leave no KV cache within {_gib(limit)} x "
                        f"{utilization:.2f}: use " + _weights_fixes(options, slice_, tp, weights, limit, utilization,
                                                                    max_model_len, max_num_seqs, batched))
    elif (cap.max_concurrency < 1 if kv.window and kv.window.kept else
          cap.tokens // kv.page_shards < max_model_len):  # a request's pages lie on one device
        longest = serve_memory.capacity(kv, limit, utilization, weights, STATE_BYTES_PER_DEVICE, max_model_len, 1,
                                        options.engine, 0, batched).largest_max_model_len \
            if kv.window and kv.window.kept else cap.tokens // kv.page_shards // kv.page_size * kv.page_size
        # fp8 only where it shrinks the cache: with one KV head per device it fills 2 of 4 packed slots.
        # and only where the fp8 cache then holds the request: a smaller cache that still falls short is no fix.
        fp8 = serve_memory.kv_layout(config, options.engine, tp, "fp8", max_model_len, options.block_size,
                                     max_num_seqs, options.architecture)
        smaller = fp8.kv_bytes_per_token_per_device < kv.kv_bytes_per_token_per_device and _holds_one(
            options, fp8, limit, utilization, weights, max_model_len, batched)
        held = f"{cap.tokens} tokens" if kv.page_shards == 1 else \
            f"{cap.tokens // kv.page_shards} tokens on each of the {kv.page_shards} devices a request's pages lie on"
        problems.append(f"the KV cache holds {held}, fewer than one request of --max-model-len "
                        f"{max_model_len} (the engine refuses to start): use --max-model-len {longest} or fewer, "
                        + ("--kv-cache-dtype fp8, " if smaller else "") + "or more devices.")
    if safe is not None and options.gpu_memory_utilization and options.gpu_memory_utilization > safe:
        problems.append(f"--gpu-memory-utilization {options.gpu_memory_utilization:g} leaves "
                        f"{_gib(limit * (1 - options.gpu_memory_utilization))} below the KV cache, less than the "
                        f"{_gib(headroom)} the programs need (the largest temporaries, "
                        f"{_gib(programs.largest_temp_bytes)}, the code of every program, "
                        f"{_gib(programs.all_code_bytes)}, and a {_gib(margin)} margin): loading them can fail (XLA error 0101, 'Attempting to reserve ... at the bottom of memory'): use {safe:.2f}.")
    table = serve_memory.smem_page_table_bytes(max_num_seqs, max_model_len, kv.page_size)
    if options.engine == "vllm" and table > serve_memory.smem_limit_bytes():
        fix = serve_programs.fix_for("smem", kv, max_num_seqs, max_model_len, padded=False)
        problems.append(f"the page table ({max_num_seqs} requests x {-(-max_model_len // kv.page_size)} pages x 4 B "
                        f"= {table // 1024} KiB) exceeds half of the 1 MiB SMEM the engine allows it: use {fix}.")
    for record in (programs.failures if programs else []):
        problems.append(f"the {record.tokens or record.requests}-{'token' if record.kind == 'backbone' else 'request'} "
                        f"{record.kind} program does not compile: out of {record.failure_space or 'memory'} "
                        f"({record.failure[:160]}): use {record.fix}." + _kernel_note(record, options, table))
    fits = not problems
    held = serve_memory.requests_held(kv, cap, options.input_len + options.output_len, options.engine)
    concurrency = serve_estimate.concurrency_for(per_engine, requests, held)
    estimate = None
    if concurrency > 0 and cap.kv_budget_bytes_per_device > 0:
        from tpuprof import prices

        read = serve_memory.kv_read_bytes_per_token(kv, options.input_len + options.output_len / 2)
        estimate = serve_estimate.estimate(config, slice_, tp, replicas, weights, read,
                                           concurrency, options.input_len, options.output_len, batched,
                                           prices.price_for(slice_.generation, dict(options.prices)),
                                           serve_memory.expert_weights_bytes_per_device(config, tp,
                                                                                        options.quantization),
                                           weights_compiled=bool(programs and programs.weights_bytes_per_device))
    lowered = _concurrency_note(options, replicas, per_engine, concurrency, requests, held)
    verdict = (f"serves: {cap.tokens:,} KV tokens per engine, {_requests(cap.max_concurrency)} requests of "
               f"{max_model_len} tokens at once" + (f"; {lowered}" if lowered else "")
               if fits else "does not serve as asked: " + problems[0])
    return ServeTarget(
        slice=slice_, engine=engine, tensor_parallel_size=tp, replicas=replicas, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=batched, kv=kv, capacity=cap,
        utilization_given=options.gpu_memory_utilization is not None, safe_gpu_memory_utilization=safe,
        margin_bytes=margin, programs=programs, fits=fits, verdict=verdict, problems=tuple(problems),
        estimate=estimate, concurrency_asked=per_engine, concurrency_planned=concurrency, requests_held=held,
        concurrency_note=lowered,
        command=launch_command(options, slice_, tp, replicas, max_model_len, max_num_seqs, utilization, kv),
        smem_page_table_bytes=table, smem_limit_bytes=serve_memory.smem_limit_bytes(), headroom_bytes=headroom,
        weights_how=(programs.weights_how if programs and programs.weights_bytes_per_device else
                     serve_memory.shape_weights_how(config, options.quantization, options.engine)))


# Hugging Face ids of checkpoints whose config.json has the shapes, positions and architecture of a built-in one
# (a base model and its instruct tuning differ in their weights and eos_token_id only; Llama 3.3 70B is Llama 3.1
# 70B's architecture; Meta-Llama-3.1-* are the hub's former names, which it redirects): taken as that built-in
# config, and launched by the id given.
SAME_CONFIG_IDS = {
    "meta-llama/Llama-3.1-8B": "llama3.1-8b", "meta-llama/Meta-Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b", "meta-llama/Meta-Llama-3.1-70B": "llama3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama3.1-70b", "meta-llama/Llama-3.3-70B-Instruct": "llama3.1-70b",
    "meta-llama/Llama-3.1-405B": "llama3.1-405b", "meta-llama/Meta-Llama-3.1-405B": "llama3.1-405b",
    "meta-llama/Meta-Llama-3.1-405B-Instruct": "llama3.1-405b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b", "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "meta-llama/Llama-2-7b-hf": "llama2-7b", "meta-llama/Llama-2-13b-hf": "llama2-13b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b", "mistralai/Mistral-7B-v0.3": "mistral-7b",
}


def checkpoint_name(model: str, source: str, hub_id: str | None = None) -> str:
    """What the engines load the model by: its Hugging Face id, or the folder of the config.json given. The engines
    read a checkpoint folder's config.json, so a config saved under another name (qwen.json) or a built-in config
    with no public checkpoint (GPT-3) gets a placeholder the engine would refuse, never the file's name or the
    "built-in:NAME" source, which read as model names and are not."""
    if source.startswith("built-in:"):
        return hub_id or HF_IDS.get(model, f"<{model} weights>")
    path = Path(source)
    if path.name != "config.json":
        return f"<the checkpoint folder {path.name} describes>"
    return str(path.parent)


def launch_command(options: ServeOptions, slice_, tp: int, replicas: int, max_model_len: int, max_num_seqs: int,
                   utilization: float, kv) -> str:
    config = options.model
    name = checkpoint_name(config.name, options.model_source, options.hub_id)
    if options.engine == "vllm":
        parts = ["vllm", "serve", name, "--tensor-parallel-size", str(tp), "--max-model-len", str(max_model_len),
                 "--max-num-seqs", str(max_num_seqs), "--gpu-memory-utilization", f"{utilization:.2f}"]
        if replicas > 1 and slice_.num_slices == 1:
            parts += ["--data-parallel-size", str(replicas)]
        if options.max_num_batched_tokens:
            parts += ["--max-num-batched-tokens", str(options.max_num_batched_tokens)]
        if options.kv_cache_dtype != "auto":
            parts += ["--kv-cache-dtype", options.kv_cache_dtype]
        if options.block_size:
            parts += ["--block-size", str(options.block_size)]
        extra = {}
        if options.quantization != "bf16" and not options.quantized_checkpoint:
            extra.update(json.loads(serve_memory.vllm_quantization(options.quantization)))
        if config.mla:  # tpu-inference refuses MLA without attention data parallelism and NEW_MODEL_DESIGN=1
            extra.update(serve_memory.VLLM_MLA_SHARDING)
            parts.insert(0, "NEW_MODEL_DESIGN=1")
        if extra:
            parts += ["--additional-config", json.dumps(extra)]
        if options.enable_expert_parallel:
            parts += ["--enable-expert-parallel"]
        if kv.window and kv.window.kept:  # the window's reservation counts the step async scheduling keeps in flight
            parts += ["--async-scheduling"]
        return shlex.join(parts)
    if options.engine == "sglang-jax":
        # SGLang-JAX meshes every device the host sees as [dp_size, tp_size / dp_size] (scheduler.py @ cddbf6f1):
        # --tp-size is all of them, the replicas its dp ranks, each with its share of --max-running-requests and
        # the dense weights over its tp_size / dp_size devices. A --tp-size short of the devices fails to start
        # (JAX: the number of devices must equal the product of the mesh shape).
        dp = replicas if replicas > 1 and slice_.num_slices == 1 else 1
        parts = ["python", "-m", "sgl_jax.launch_server", "--model-path", name, "--tp-size", str(tp * dp)]
        if dp > 1:
            parts += ["--dp-size", str(dp)]
        parts += ["--context-length", str(max_model_len), "--max-running-requests", str(max_num_seqs * dp),
                  "--mem-fraction-static", f"{utilization:.2f}", "--page-size", str(kv.page_size)]
        if options.max_num_batched_tokens:
            parts += ["--chunked-prefill-size", str(options.max_num_batched_tokens)]
        if options.kv_cache_dtype != "auto":  # SGLang-JAX names the format
            parts += ["--kv-cache-dtype", "fp8_e4m3" if options.kv_cache_dtype == "fp8" else options.kv_cache_dtype]
        # Weight-only, per channel: SGLang-JAX's built-in qwix configs.
        if options.quantization != "bf16" and not options.quantized_checkpoint:
            parts += ["--quantization-config-path", f"{options.quantization}.yaml"]
        return shlex.join(parts)
    # MaxText's batch is per_device_batch_size x every device, and its fsdp axis (-1 by default) takes the devices
    # the others leave: the replicas the figures assume are its data axis, with fsdp pinned to 1 (each replica holds
    # the weights over its TP devices and its own max_num_seqs requests). base.yml serves model_name "default" in
    # float32 weights from no checkpoint, with a sentencepiece tokenizer: the model, its converted (unscanned)
    # checkpoint, bf16 weights and the Hugging Face tokenizer are named, as tpu-recipes' JetStream recipes do.
    per_device = max_num_seqs / max(tp, 1)
    replicas_per_slice = max(replicas // max(slice_.num_slices, 1), 1)
    maxtext = MAXTEXT_MODEL_NAMES.get(config.name) if options.model_source.startswith("built-in:") else None
    if maxtext and options.hub_id in MAXTEXT_HUB_MODELS:
        maxtext = MAXTEXT_HUB_MODELS[options.hub_id]
    return shlex.join(["python", "-m", "maxtext.inference.maxengine.maxengine_server", "src/maxtext/configs/base.yml",
                       f"model_name={maxtext or f'<the MaxText model of {config.name}>'}",
                       f"load_parameters_path=<MaxText checkpoint of {config.name}, unscanned>", "scan_layers=false",
                       "weight_dtype=bfloat16", "tokenizer_type=huggingface", f"tokenizer_path={name}",
                       f"ici_tensor_parallelism={tp}", "ici_fsdp_parallelism=1"]
                      + ([f"ici_data_parallelism={replicas_per_slice}"] if replicas_per_slice > 1 else [])
                      + [f"max_target_length={max_model_len}", f"max_prefill_predict_length={options.input_len}",
                         f"per_device_batch_size={per_device:g}"]
                      + ([f"quantization={options.quantization}"] if options.quantization != "bf16" else [])
                      + (["quantize_kvcache=True", "kv_quant_dtype=fp8"] if options.kv_cache_dtype != "auto" else []))


def _holds_one(options: ServeOptions, kv, limit: int, utilization: float, weights: int, max_model_len: int,
               batched: int) -> bool:
    """Whether a plan of this layout and these weights holds one request of MAX_MODEL_LEN (what the engine needs to
    start), by the capacity rule the answer itself uses."""
    cap = serve_memory.capacity(kv, limit, utilization, weights, STATE_BYTES_PER_DEVICE, max_model_len, 1,
                                options.engine, 0, batched)
    if cap.kv_budget_bytes_per_device <= 0:
        return False
    return cap.max_concurrency >= 1 if kv.window and kv.window.kept else \
        cap.tokens // kv.page_shards >= max_model_len


def _weights_fixes(options: ServeOptions, slice_, tp: int, weights: int, limit: int, utilization: float,
                   max_model_len: int, max_num_seqs: int, batched: int) -> str:
    """The end of the no-KV-cache problem: each change named only where serve's own arithmetic says the changed plan
    holds a request of MAX_MODEL_LEN: the smallest larger TP within the slice, fp8 weights at this TP (bf16 weights
    only), fp4 experts (an fp8 MoE checkpoint on vLLM TPU); a larger slice always. The other plans' weights are
    the shapes' figure scaled as this plan's compiled one is to its shapes' (1 when not compiled)."""
    config = options.model
    shapes = serve_memory.shape_weights_bytes_per_device(config, tp, options.quantization,
                                                         options.enable_expert_parallel, options.engine)
    scale = weights / shapes if shapes else 1.0

    def holds(tp_: int, quantization: str) -> tuple[bool, int]:
        kv = serve_memory.kv_layout(config, options.engine, tp_, options.kv_cache_dtype, max_model_len,
                                    options.block_size, max_num_seqs, options.architecture)
        weights_ = int(scale * serve_memory.shape_weights_bytes_per_device(
            config, tp_, quantization, options.enable_expert_parallel, options.engine))
        return _holds_one(options, kv, limit, utilization, weights_, max_model_len, batched), weights_

    fixes = []
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for larger in range(tp + 1, slice_.devices + 1):
        if slice_.devices % larger or heads % larger or (kv_heads % larger and larger % kv_heads):
            continue
        ok, weights_ = holds(larger, options.quantization)
        if ok:
            fixes.append(f"--tensor-parallel-size {larger} ({_gib(weights_)} of weights per device)")
            break
    if options.quantization == "bf16":
        ok, weights_ = holds(tp, "fp8")
        if ok and quantizable_as_loaded(options, "fp8"):
            fixes.append(f"--quantization fp8 ({_gib(weights_)} of weights per device)")
        elif ok:  # vLLM's model code loads an fp8 checkpoint as stored, and quantizes no bf16 one
            fixes.append(f"the config.json of a checkpoint stored in fp8 ({_gib(weights_)} of weights per device)")
    fixes.append("a larger slice")
    return " or ".join(fixes) + _fp4_experts(options, tp, weights, limit, utilization)


def _fp4_experts(options: ServeOptions, tp: int, weights: int, limit: int, utilization: float) -> str:
    """The end of the no-KV-cache problem for an fp8 MoE checkpoint on vLLM TPU: its routed experts requantized to
    fp4 as tpu-inference's moe_weights.process_quantized_moe_weights does under MOE_REQUANTIZE_WEIGHT_DTYPE=fp4 (its
    own DeepSeek-R1 benchmark on tpu7x-8 sets it, with blocks of 512), where that leaves a KV cache."""
    config = options.model
    if options.engine != "vllm" or options.quantization != "fp8" or not options.quantized_checkpoint or not config.moe:
        return "."
    fp4 = weights - serve_memory.expert_weights_bytes_per_device(config, tp, "fp8") \
        + serve_memory.expert_weights_bytes_per_device(config, tp, "mxfp4")
    left = int(limit * utilization) - fp4
    if left <= 0:
        return "."
    return (f", or requantize the routed experts to fp4 as tpu-inference does with MOE_REQUANTIZE_WEIGHT_DTYPE=fp4 "
            f"MOE_REQUANTIZE_BLOCK_SIZE={serve_memory.MXFP4_BLOCK} (fp4 with a float32 scale per "
            f"{serve_memory.MXFP4_BLOCK} values: {_gib(fp4)} of weights per device, {_gib(left)} left for the KV "
            "cache).")


def _concurrency_note(options: ServeOptions, replicas: int, asked: int | None, planned: int, requests: int,
                      held: int) -> str | None:
    """The sentence saying that the requests decoded together, the figure the speed and cost are for, are fewer than
    --concurrency asked (per engine, ASKED), and what holds them back: the KV cache (HELD requests of input + output
    tokens each) or the engine's --max-num-seqs (REQUESTS over its devices). None when the plan is at the asked."""
    if not asked or planned >= asked:
        return None
    each = options.input_len + options.output_len
    share = f" ({asked:,} per engine of {replicas})" if replicas > 1 else ""
    if held < min(asked, requests):
        why = (f"the KV cache holds {held:,} requests of {each:,} tokens ({options.input_len:,} in + "
               f"{options.output_len:,} out) at once")
    else:
        shards = requests // (options.max_num_seqs or requests)  # vLLM TPU's MLA: each device schedules its own
        why = f"--max-num-seqs {options.max_num_seqs}{f' on each of its {shards} devices' if shards > 1 else ''} " \
              "schedules no more"
    return (f"--concurrency {options.concurrency:,}{share} is planned at {planned:,} requests"
            f"{' per engine' if replicas > 1 else ''}: {why}")


def _requests(concurrency: float) -> str:
    """Whole requests of max_model_len held at once, to a tenth, rounded down as the table rounds the document's
    figure (6.2525 read 6.3 in the verdict and 6.2 in the table)."""
    from tpuprof.units import tenths_down

    return tenths_down(round(concurrency, 2))


def _gib(value: float) -> str:
    from tpuprof.units import fmt_bytes

    return fmt_bytes(int(value))


def _kernel_note(record, options: ServeOptions, flat_table: int) -> str:
    """Where the compiled kernel's SMEM refusal is not vLLM's: its page table rows are padded (SMEM_ROW_ENTRIES),
    vLLM's own kernel keeps the table flat, within the share vLLM's rule allows."""
    if record.failure_space != "smem" or options.engine != "vllm" or flat_table > serve_memory.smem_limit_bytes():
        return ""
    return (f" (JAX's ragged paged attention kernel, which tpuprof compiles, pads each request's pages to "
            f"{serve_memory.SMEM_ROW_ENTRIES} entries in SMEM; vLLM's tpu-inference kernel keeps the table flat, "
            f"{flat_table // 1024} KiB within the {serve_memory.smem_limit_bytes() // 1024} KiB its rule allows, so "
            "vLLM itself may start with these settings)")


def built_in_for_hub_id(model: str) -> tuple[str, str] | None:
    """(the built-in config, the Hugging Face id as the hub spells it) of an id the launch commands name
    (meta-llama/Llama-3.1-8B-Instruct -> llama3.1-8b) or of one with the same config.json (meta-llama/Llama-3.1-8B);
    None for any other name."""
    ids = {hub_id.lower(): (name, hub_id) for name, hub_id in HF_IDS.items()}
    ids.update((hub_id.lower(), (name, hub_id)) for hub_id, name in SAME_CONFIG_IDS.items())
    return ids.get(model.lower())


def hub_id_runs_vllm_model_code(model: str) -> bool | None:
    """Whether tpu-inference runs the hub id's model with vLLM's model code (serve_memory.runs_vllm_model_code) by its
    built-in config; None for an id of no built-in."""
    from tpuprof.sources.llm import load_config
    from tpuprof.sources.llm_serve import checkpoint_architecture

    found = built_in_for_hub_id(model)
    if found is None:
        return None
    config, source = load_config(found[0])
    return serve_memory.runs_vllm_model_code(config, checkpoint_architecture(source))
