"""The Python API: every command as a function that returns a typed result (tpuprof/results.py).

    import tpuprof
    result = tpuprof.memory("dump/")          # a MemoryResult
    result.peak_heap_bytes, result.suggestions, result.to_dict()

The CLI runs these same functions and renders their results, so `result.to_dict()` is exactly what
`--json` prints. Bad input raises `tpuprof.UserError`, whose text is the sentence the CLI prints. Nothing
here prints, exits or imports TensorFlow or JAX unless the function needs it (preflight, capture).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

from tpuprof.errors import UserError
from tpuprof.results import (
    AnalyzeResult, CaptureResult, DiffResult, MemoryResult, OomResult, PreflightResult, ReportResult, Result,
    ServeResult, TraceResult,
)

PathLike = Union[str, os.PathLike]


def memory(path: PathLike, target: Optional[str] = None, module: Optional[str] = None, *, top: int = 15,
           compile: Optional[bool] = None, verbose: bool = False) -> MemoryResult:
    """Where HBM goes in a compiled XLA program: padded vs unpadded bytes per buffer and per framework op, the
    peak (equal to the compiler's and XProf's to the byte for TPU dumps), and the fixes.

    path: an XLA dump folder (`--xla_dump_to`), an `*.hlo.pb` HloProto, `*-buffer-assignment.txt` or HLO text.
    target: TPU generation (v2 v3 v4 v5e v5p v6e tpu7x, or a name such as "v7x", "ironwood", "trillium",
        "v6e-8"): the HBM capacity of one device, and the tiling of HLO without TPU layouts (an estimate). Read
        from the dump's target_arguments.txt when there is one.
    module: only this module of a dump folder (name or part of it).
    top: rows of the buffer and op lists in `to_dict()` (0: all); the result itself holds every buffer.
    compile: recompile a CPU/GPU/TF module proto with libtpu for `target` (exact TPU figures); None (default):
        whenever libtpu is installed, `target` is given and the dump has no TPU buffer assignment; False: estimate.
    verbose: also show what JAX and libtpu print while recompiling (held back by default, as the CLI does).

        >>> result = tpuprof.memory("sample_profiles/dumps/conv18_f32_v5e")
        >>> result.peak_heap_bytes, result.module.padding_at_peak_bytes
        >>> [s.message for s in result.suggestions]
    """
    from tpuprof import library_output
    from tpuprof.commands import memory as command

    with library_output.held(verbose):
        return command.result(Path(path), module, target, top, compile)


def analyze(path: Union[PathLike, list], *, top: int = 10, workers: Optional[int] = None,
            ray: Optional[str] = None) -> AnalyzeResult:
    """Why a step is slow, from a saved profile: step time per chip and per category (compute, input, host
    transfers, collectives, host overhead, compilation), the verdict, the roofline, the tf.data stages and
    what to change.

    path: a logdir (its newest run), a run folder (plugins/profile/<run>), a `<host>.xplane.pb`, or a gs://
        (any fsspec) URL of one of these. Several hosts make one report.
        A list of such paths makes one pod (hosts from several run folders of the same capture).
    top: rows of the op and stage lists in `to_dict()` (0: all).
    workers: local processes for the hosts (default: one per core).
    ray: run one task per host on Ray: "auto", "ray://HEAD:10001" or "HEAD:6379" (default
        $TPUPROF_RAY_ADDRESS; without either, local processes). Needs `pip install 'tpuprof[ray]'`.

        >>> result = tpuprof.analyze("sample_profiles/captures/tf_slow_map")
        >>> result.verdict, result.median_ms, result.breakdown_percent["input"]
    """
    from tpuprof.commands import analyze as command

    paths = [str(p) for p in path] if isinstance(path, (list, tuple)) else str(path)
    return command.result(paths, top, workers=workers, ray=ray)


def oom(text_or_path: Union[str, bytes, os.PathLike], batch: Optional[int] = None,
        dump: Optional[PathLike] = None, *, target: Optional[str] = None) -> OomResult:
    """Explain a TPU out-of-memory error: the numbers, each listed buffer's padding recomputed, ranked fixes and
    the batch that fits.

    text_or_path: the error text (a string with the message, or bytes), or the path of a log holding it
        (gzipped or not; the most detailed OOM message in it is used). A Path, or a string naming an existing
        file, is read as a file.
    batch: the batch size that failed, to estimate the one that fits.
    dump: the XLA dump folder of the same program: the log's buffers are joined with its buffer assignment.
    target: TPU generation (as for memory: "v4", "tpu7x", "v7x", ...), for the capacity when the message
        gives none.

        >>> result = tpuprof.oom(open("train.log").read(), batch=128)
        >>> result.report.used_bytes, result.batch_estimate.fitting_batch
    """
    from tpuprof.commands import oom as command

    if target is not None:
        from tpuprof import targets

        targets.get(target)  # an unknown generation is one sentence
    if isinstance(text_or_path, str) and _looks_like_a_missing_path(text_or_path):
        raise UserError(f"{text_or_path} does not exist: give the path of a log, or the error text itself.")
    if isinstance(text_or_path, bytes) or (isinstance(text_or_path, str) and not _names_a_file(text_or_path)):
        path, text = "the text", text_or_path  # the label names it in messages
    elif isinstance(text_or_path, (str, os.PathLike)):
        path, text = str(text_or_path), None
    else:
        raise UserError(f"oom takes the error text or the path of a log, not a {type(text_or_path).__name__}.")
    return command.result(path, dump=Path(dump) if dump else None, batch=batch, target=target, text=text)


def _names_a_file(text: str) -> bool:
    """A string is a path when it is one line that names an existing file; an error message is text."""
    return "\n" not in text and len(text) < 4096 and os.path.isfile(text)


def _looks_like_a_missing_path(text: str) -> bool:
    """One word naming nothing (`train.log` mistyped) is a path that is not there, not an error message: every
    OOM message has spaces."""
    word = text.strip()
    return bool(word) and " " not in word and "\n" not in word and len(word) < 4096 and not os.path.exists(word)


def preflight(fn_or_model: Any = None, *example_args: Any, tpu: Union[str, Iterable[str]] = "v5e",
              batch: Optional[int] = None, max_batch: bool = False, compare_bf16: bool = False, top: int = 10,
              cache: bool = True, on_compile: Optional[Callable[[str, int], None]] = None,
              tokens_per_example: Optional[int] = None, price: Union[str, dict, None] = None,
              model: Optional[str] = None, seq: int = 2048, batch_per_chip: Optional[int] = None,
              global_batch: Optional[int] = None, remat: str = "full", dtype: str = "bf16",
              mesh: Optional[str] = None, weight_dtype: str = "float32", mu_dtype: Optional[str] = None,
              full: bool = False, ray: Optional[str] = None, vocab_tiling: Optional[int] = None,
              moe: str = "capacity", grad_dtype: str = "float32", shard_exp_on_fsdp: bool = False,
              verbose: bool = False) -> PreflightResult:
    """Will a training step fit in one TPU device's HBM, and the largest batch that does: compiled by libtpu
    for the target on this machine, no TPU needed (`pip install 'jax[tpu]'`).

    fn_or_model: one of
        - a JAX function (jitted or not) followed by its example arguments (arrays or jax.ShapeDtypeStructs):
          `tpuprof.preflight(train_step, params, x, y, tpu="v5e")`;
        - a compiled Keras model (TensorFlow backend) followed by example inputs and labels (arrays or
          tf.TensorSpecs): tpuprof builds its train step (forward, loss, gradients, optimizer update);
        - a factory `f(batch_size)` returning either of those, or a `"path/to/file.py:factory"` text (as the CLI).
    tpu: a generation ("v5e"; v2 v3 v4 v5e v5p v6e tpu7x, or a name such as "v7x", "ironwood", "trillium",
        "v6e-8"), a topology ("v5e:2x2"), or several (a list or "v5e,v6e") to compare them. The program is
        compiled for one device as jobs see it (`result.to_dict()["targets"][i]["device"]`): a chip on v4 (megacore), v5e,
        v5p and v6e, a TensorCore on v2, v3 and TPU7x.
    batch: the per-device batch to check. With example arguments it defaults to theirs; another batch size
        changes the leading dimension of the arguments every array of which has the batch as its leading
        dimension, like the last argument (inputs, labels), and keeps the others (parameters, optimizer state);
        where a parameter's leading dimension equals the batch, tracing the function tells which is which.
    max_batch: search the largest batch that fits (a multiple of 8, and the largest multiple of 128).
    compare_bf16: also compile in bfloat16 (a factory with a `dtype` parameter, or a file.py:factory).
    cache: reuse earlier compiles of the same program ($XDG_CACHE_HOME/tpuprof/preflight).
    on_compile: called with (label, batch) before each compile, e.g. to show progress.
    model: instead of fn_or_model, an LLM's full train step: a built-in name ("llama3.1-8b") or a Hugging Face
        config.json path, compiled sharded over every device of the slice (`tpu="v6e-256"`), with `seq`,
        `batch_per_chip` or `global_batch` (or max_batch), `remat` ("none", "full", "dots", "offload", or "all"
        with max_batch: a batch x remat table), `dtype` ("bf16", "fp8") and `mesh` ("fsdp=-1,tensor=4").
    mesh: also for a factory with a `mesh` parameter: the Mesh it receives has these axes over the slice.
    weight_dtype: with model: "float32" (12 bytes a parameter of weights and AdamW moments) or "bfloat16" (6).
    mu_dtype: with model: AdamW's first moment's dtype, "float32" or "bfloat16" (MaxText's mu_dtype; default: the
        weights'): fp32 weights with a bf16 first moment are 10 bytes a parameter.
    grad_dtype: with model: the gradients' dtype before the optimizer, "float32" or "bfloat16" (MaxText's grad_dtype:
        the fp32 gradients cast right after the backward pass).
    shard_exp_on_fsdp: with a mixture-of-experts model: store the experts' weights with their expert dimension over
        fsdp instead of the embedding (MaxText's shard_exp_on_fsdp); the experts must divide over fsdp.
    full: with model: always compile to the end (default: stop early when the compiler's memory layout alone cannot
        fit; `fast` in the result says so).
    ray: with model: run a sweep's compiles (several slices, remat="all") as tasks on this Ray cluster ("auto",
        "ray://HEAD:10001", "HEAD:6379"); the result is the same as on this machine.
    vocab_tiling: with model: the loss in this many pieces of each sequence (MaxText's num_vocab_tiling; default:
        the fewest whose fp32 logits stay within 512 MiB per device).
    moe: with a mixture-of-experts model: "capacity" (tokens beyond a capacity factor of 1.25 dropped, one-hot
        dispatch) or "dropless" (MaxText's sparse_matmul with megablox grouped matmuls; no expert parallelism).
    tokens_per_example: tokens in one example (sequence length), for tokens/s and the cost per 1M tokens.
    price: on-demand price per chip-hour overriding tpuprof's table: {"v6e": 2.70} or "v6e=2.70,v5e=1.2".
    verbose: also show what TensorFlow, JAX and libtpu print while compiling (warnings, log lines): held back by
        default, as the CLI does, and shown before an error that is not about the input.

        >>> result = tpuprof.preflight(jax.jit(step), params, x, y, tpu="v5e", max_batch=True)
        >>> result.fits, result.targets[0].compiled.search.max_batch_size   # tpuprof.models.preflight
    """
    from tpuprof import library_output

    with library_output.held(verbose):
        return _preflight(fn_or_model, example_args, on_compile, tpu=tpu, batch=batch, max_batch=max_batch,
                          compare_bf16=compare_bf16, top=top, cache=cache, tokens_per_example=tokens_per_example,
                          price=price, model=model, seq=seq, batch_per_chip=batch_per_chip, global_batch=global_batch,
                          remat=remat, dtype=dtype, mesh=mesh, weight_dtype=weight_dtype, mu_dtype=mu_dtype,
                          full=full, ray=ray, vocab_tiling=vocab_tiling, moe=moe, grad_dtype=grad_dtype,
                          shard_exp_on_fsdp=shard_exp_on_fsdp)


def _preflight(fn_or_model, example_args, on_compile, **keywords):
    from tpuprof.commands import preflight as command
    from tpuprof.models.preflight import preflight_options

    return command.result(preflight_options(fn_or_model, example_args, **keywords), on_compile)


def serve(model: str, tpu: Union[str, Iterable[str]], *, engine: str = "vllm", max_model_len: Optional[int] = None,
          max_num_seqs: Optional[int] = None, max_num_batched_tokens: Optional[int] = None,
          tensor_parallel_size: Optional[int] = None, enable_expert_parallel: bool = False,
          kv_cache_dtype: str = "auto", quantization: str = "bf16", gpu_memory_utilization: Optional[float] = None,
          block_size: Optional[int] = None, input_len: Optional[int] = None, output_len: Optional[int] = None,
          concurrency: Optional[int] = None, prices: Union[str, dict, None] = None, compile: bool = True,
          on_compile: Optional[Callable[[Any], None]] = None) -> ServeResult:
    """Will an LLM serve on each TPU slice with a serving engine's settings (vLLM TPU by default), how many requests
    at once, the largest safe gpu_memory_utilization, how fast and at what cost, and the command to launch it. The
    engine's programs are compiled by libtpu for the slice on this machine (`compile=False`: the KV arithmetic with
    weights from the shapes, no JAX). Keywords are the engine's option names; a bad value raises UserError naming
    the keyword.

        >>> result = tpuprof.serve("llama3.1-70b", "v6e-8", max_model_len=8192, concurrency=64)
        >>> result.targets[0].capacity.tokens, result.to_dict()["targets"][0]["safe_gpu_memory_utilization"]
    """
    from tpuprof.commands import serve as command

    options = command.options(model, tpu, engine=engine, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              tensor_parallel_size=tensor_parallel_size, enable_expert_parallel=enable_expert_parallel,
                              kv_cache_dtype=kv_cache_dtype, quantization=quantization,
                              gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                              input_len=input_len, output_len=output_len, concurrency=concurrency, prices=prices,
                              compile=compile)
    return command.result(options, on_compile=on_compile)


def capture(*, logdir: str = "logs", port: Optional[int] = None, service_addr: Optional[str] = None,
            tpu: Optional[str] = None, zone: Optional[str] = None, project: Optional[str] = None,
            duration: str = "3s", attempts: int = 3, delay: str = "0ms", host_tracer_level: int = 2,
            device_tracer_level: int = 1, python_tracer_level: int = 0, analyze: bool = False) -> CaptureResult:
    """Capture a profile from a running job into `logdir/plugins/profile/<run>/` (every worker in one run,
    never overwriting one), as `tpuprof capture` does.

    Where from, first match wins: service_addr ("host:port[,host:port...]"), tpu (a Cloud TPU name, with zone
    and project off a TPU VM), the TPU environment variables, a TPU VM's own workers, else localhost. port is
    the profiler port for all but service_addr (default 8466). The job runs a profiler server (JAX
    `jax.profiler.start_server(port)`, TF `tf.profiler.experimental.server.start(port)`).
    analyze: also analyse the new run (`result.analysis`, an AnalyzeResult).

        >>> result = tpuprof.capture(port=9012, duration="2s", analyze=True)
        >>> result.run_dir, result.analysis.verdict
    """
    from tpuprof.commands import capture as command

    options = command.trace_options(duration, attempts, delay, host_tracer_level, device_tracer_level,
                                    python_tracer_level, port)
    target = command.resolve(options, service_addr=service_addr, tpu=tpu, zone=zone, project=project, port=port)
    return command.result(target, logdir, options, analyze=analyze)


def diff(a: Union[PathLike, Result], b: Union[PathLike, Result], *, fail_if: Iterable[str] = (),
         batches: Union[str, tuple, None] = None, target: Optional[str] = None, top: int = 10) -> DiffResult:
    """What changed between two inputs of one kind: two dumps, two profiles, two preflight results, saved
    `--json` documents, or results of this API (`tpuprof.diff(tpuprof.memory(a), tpuprof.memory(b))`).

    fail_if: thresholds such as "peak_heap_bytes>+5%", "median_ms>+2", "input_bound_percent>20";
        `result.regression` is True when one trips (the CLI exits 1).
    batches: A's and B's batch sizes, (64, 128) or "64,128", for the growth per example (default: the samples'
        sample.json, else inferred from the shapes).

        >>> result = tpuprof.diff("before/", "after/", fail_if=["peak_heap_bytes>+5%"])
        >>> result.regression, result.to_dict()["groups"][0]["metrics"]
    """
    from tpuprof.commands import diff as command

    return command.result(a, b, list(fail_if), batches, target, top)


def report(inputs: Union[PathLike, Result, Iterable[Union[PathLike, Result]]],
           path: PathLike = "tpuprof-report.html", *, target: Optional[str] = None, top: int = 15,
           title: Optional[str] = None, force: bool = False) -> ReportResult:
    """One self-contained HTML page (opens offline) from any mix of dumps, profiles, OOM logs, tpuprof
    `--json` files and results of this API; written to `path` whole or not at all; an existing file is replaced
    only with force (as `trace`).

        >>> tpuprof.report(["dump/", tpuprof.analyze("logs/")], "report.html")
    """
    from tpuprof.commands import report as command

    if isinstance(inputs, (str, os.PathLike, Result)):
        inputs = [inputs]
    return command.result(list(inputs), Path(path), target, top, title, force)


def trace(path: PathLike, output: PathLike = "tpuprof-trace.pftrace", *, steps: Optional[str] = None,
          hosts: Optional[str] = None, force: bool = False) -> TraceResult:
    """Chosen steps of every host and TPU core of a saved profile as a Perfetto trace (open it in
    ui.perfetto.dev), written to `output` whole or not at all; an existing file is replaced only with force.
    steps="10:13" picks steps 10 to 12 as analyze numbers them (default: the median step and one either side);
    hosts="h1,h2" keeps those hosts.

        >>> tpuprof.trace("logs/", "steps.pftrace", steps="10:13").events
    """
    from tpuprof.commands import trace as command

    return command.export(os.fspath(path), Path(output), steps, hosts, force)
