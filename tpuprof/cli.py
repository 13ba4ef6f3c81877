"""The `tpuprof` command line. Options and help only: each command hands its arguments to
`tpuprof.commands.<name>.run`, which does the work. Imports stay inside the commands so that
`tpuprof --help` starts instantly and no command pays for another's dependencies.

Each option is declared once, with typer's arguments (tpuprof/cli_lazy.py records them): a plain command line
is parsed from those records without importing typer; any other goes to typer and click in standalone mode,
whose usage errors are the usage line, one sentence, "Did you mean", exit code 2. `main` adds only what
they do not know: our `UserError` (one sentence, exit 2) and the last line of defence against an
internal error's traceback.
"""

from __future__ import annotations

import errno
import gc
import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

from tpuprof import library_output, targets
from tpuprof.cli_lazy import Argument, Commands, Option, UsageError
from tpuprof.errors import UserError
from tpuprof.renderers.csv import ANALYZE_TABLES, MEMORY_TABLES
from tpuprof.renderers.formats import FORMATS
from tpuprof.version import __version__

# Declarations only: typer is imported when a command line needs it (tpuprof/cli_lazy.py says when).
commands = Commands(
    name="tpuprof",
    version=__version__,
    help="Will my model fit in TPU HBM, why not, and why is my step slow?",
    # `tpuprof` alone prints the help and exits 0 (click's no_args_is_help would exit 2).
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # -h as well as --help; help as wide as the terminal up to 120 columns, so descriptions stay whole.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)

JSON_HELP = "Print one JSON document on stdout instead of tables (the same as --format json)."
FORMAT_HELP = "table (default), json, or markdown: GitHub-flavoured, for a PR comment or $GITHUB_STEP_SUMMARY."
OutputFormat = Enum("OutputFormat", {name: name for name in FORMATS}, type=str)
VERBOSE_HELP = "Also show what TensorFlow, JAX, libtpu and the profiler print on stderr."
# The generations come from tpuprof.targets, the one place that knows them: help and completion follow it.
GENERATIONS = " ".join(targets.TARGETS)
GENERATION_NAMES = "also v7x, ironwood, trillium, v5litepod, slice names like v6e-8"

# Closed sets are click choices: --help lists them, completion offers them, a wrong one is a usage error.
MemoryTable = Enum("MemoryTable", {name: name for name in MEMORY_TABLES}, type=str)
AnalyzeTable = Enum("AnalyzeTable", {name: name for name in ANALYZE_TABLES}, type=str)


def _complete_generation(incomplete: str) -> list[str]:
    """Canonical generation names; after a comma (preflight --tpu v5e,v6e) the list so far is kept."""
    done, _, last = incomplete.rpartition(",")
    prefix = f"{done}," if done else ""
    return [prefix + name for name in targets.TARGETS if name.startswith(last.lower())]


def _check_generations(value: Optional[str]) -> Optional[str]:
    """Any name `targets.get` accepts (aliases such as trillium, topologies such as v5e:2x2, comma lists)."""
    if value is not None:
        try:
            for part in value.split(","):
                if part.strip():
                    targets.get(part)
        except UserError as error:
            import typer  # a usage error: typer reports it (cli_lazy's quick parse hands such values over)

            raise typer.BadParameter(str(error)) from None
    return value


def _format_option():
    return Option(None, "--format", help=FORMAT_HELP)


def _target_option(help_text: str):
    # --tpu as preflight names it; --target, the older name, stays an alias.
    return Option(None, "--tpu", "--target", metavar="GENERATION",
                  help=f"{help_text} One of: {GENERATIONS} ({GENERATION_NAMES}).",
                  callback=_check_generations, autocompletion=_complete_generation)


def _examples(*lines: str) -> str:
    """A command's --help epilog: real invocations, printed as written (click's \\b: no rewrapping)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


@commands.command(epilog=_examples(
    "tpuprof memory sample_profiles/dumps/conv18_f32_v5e",
    "tpuprof memory DUMP_DIR --module train_step --top 30",
    "tpuprof memory model.txt --tpu v5e             # HLO without TPU layouts: an estimate",
    "tpuprof memory cpu_dump/ --tpu v5e --compile   # recompiled with libtpu: exact",
    "tpuprof memory DUMP_DIR --csv buffers > buffers.csv",
))
def memory(
    path: Path = Argument(..., metavar="PATH", help="XLA dump folder, *.hlo.pb (HloProto), *-buffer-assignment.txt or HLO text."),
    module: Optional[str] = Option(None, "--module", "-m", help="Analyse only this module of a dump folder (name or substring)."),
    target: Optional[str] = _target_option("TPU generation for HLO without TPU layouts, and for the HBM capacity."),
    compile_: Optional[bool] = Option(None, "--compile/--no-compile", help="Recompile the module proto (*.hlo.pb of a CPU/GPU/TF dump) with libtpu for --tpu: exact layouts and sizes. Default: recompile when libtpu is installed, --tpu is given and the dump has no TPU buffer assignment; --no-compile estimates instead."),
    top: int = Option(15, "--top", min=0, help="Rows in the buffer and op tables and JSON lists (0: all)."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    csv: Optional[MemoryTable] = Option(None, "--csv", help="Print one table as CSV, every row."),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Padded vs unpadded HBM per buffer and per framework op, the peak, and the fixes."""
    library_output.hold(verbose)
    from tpuprof.commands import memory as command

    command.run(path, module=module, target=target, compile_=compile_, top=top, as_json=as_json,
                csv=csv.value if csv else None, format_=format_.value if format_ else None)


@commands.command(epilog=_examples(
    "tpuprof oom error.txt",
    "tpuprof oom train.log.gz --batch 128      # the batch that failed: estimate the one that fits",
    "kubectl logs job/train | tpuprof oom      # stdin",
    "tpuprof oom train.log --dump /tmp/xla_dump --json",
))
def oom(
    log: Optional[str] = Argument(None, metavar="[LOG]", help="The error text or a whole training log; '-' or nothing reads stdin."),
    dump: Optional[Path] = Option(None, "--dump", help="XLA dump folder of the same program: join the log with its buffer assignment."),
    batch: Optional[int] = Option(None, "--batch", help="The batch size that failed, to estimate the one that fits."),
    target: Optional[str] = _target_option("TPU generation: the capacity when the message has none."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Explain a TPU out-of-memory error: the numbers, each buffer's padding, the fixes. Exit 2 if none is found."""
    library_output.hold(verbose)
    from tpuprof.commands import oom as command

    command.run(log, dump=dump, batch=batch, target=target, as_json=as_json, format_=format_.value if format_ else None)


@commands.command(epilog=_examples(
    "tpuprof analyze sample_profiles/captures/tf_slow_map",
    "tpuprof analyze LOGDIR/plugins/profile/RUN      # one run: every host's xplane.pb",
    "tpuprof analyze gs://bucket/logs --json",
    "tpuprof analyze LOGDIR --csv steps > steps.csv",
    "tpuprof analyze runA/host1.xplane.pb runB/host2.xplane.pb   # one pod from two run folders",
    "tpuprof analyze gs://bucket/logs --ray auto   # one Ray task per host",
))
def analyze(
    paths: List[str] = Argument(..., metavar="PROFILE...", help="Profile logdir (its newest run), run folder (plugins/profile/<run>), <host>.xplane.pb, or a gs:// path; several hosts (or several paths) make one report."),
    top: int = Option(10, "--top", min=0, help="Rows in the op and tf.data stage tables (0: all)."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    csv: Optional[AnalyzeTable] = Option(None, "--csv", help="Print one table as CSV, every row."),
    workers: Optional[int] = Option(None, "--workers", min=1, help="Local processes for the hosts (default: one per core)."),
    ray: Optional[str] = Option(None, "--ray", metavar="ADDRESS", help="One Ray task per host: auto, ray://HEAD:10001 or HEAD:6379 (default $TPUPROF_RAY_ADDRESS; needs tpuprof[ray])."),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Step time, input-pipeline stalls and host overhead from a saved profile, and what to change."""
    library_output.hold(verbose)
    from tpuprof.commands import analyze as command

    command.run(paths, top=top, as_json=as_json, csv=csv.value if csv else None,
                format_=format_.value if format_ else None, workers=workers, ray=ray)


@commands.command(epilog=_examples(
    "tpuprof capture --tpu my-tpu --zone us-central2-b --duration 5s",
    "tpuprof capture --service-addr localhost:9012 --logdir logs --analyze",
    "tpuprof capture --logdir gs://bucket/logs       # on a TPU VM: its own workers",
))
def capture(
    tpu: Optional[str] = Option(None, "--tpu", help="Cloud TPU name (resolved with TPUClusterResolver; every worker, profiler port 8466)."),
    zone: Optional[str] = Option(None, "--zone", help="Zone of --tpu (default: this VM's, from the metadata server)."),
    project: Optional[str] = Option(None, "--project", help="Project of --tpu (default: this VM's)."),
    service_addr: Optional[str] = Option(None, "--service-addr", help="Profiler server(s): host:port[,host:port...] or grpc://IP:8470 URLs."),
    port: Optional[int] = Option(None, "--port", help="Profiler port for --tpu, the TPU environment variables and localhost (default 8466)."),
    logdir: str = Option("logs", "--logdir", help="TensorBoard logdir, local or gs://; the run goes to LOGDIR/plugins/profile/<run>/."),
    duration: str = Option("3s", "--duration", help="How long to trace, e.g. 2s, 500ms."),
    attempts: int = Option(3, "--attempts", help="Tries when nothing answers or no trace event is collected."),
    delay: str = Option("0ms", "--delay", help="Start tracing this long after the request, e.g. 1s."),
    host_tracer_level: int = Option(2, "--host-tracer-level", help="0 off, 1 user annotations, 2 + framework ops, 3 verbose."),
    device_tracer_level: int = Option(1, "--device-tracer-level", help="0 off, 1 on."),
    python_tracer_level: int = Option(0, "--python-tracer-level", help="1 traces every Python call (large)."),
    analyze_: bool = Option(False, "--analyze", help="Run `tpuprof analyze` on the new run."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Capture a profile from a running job (TPU name, addresses or environment), from every worker."""
    library_output.hold(verbose)
    from tpuprof.commands import capture as command

    command.run(logdir=logdir, tpu=tpu, zone=zone, project=project, service_addr=service_addr, port=port,
                duration=duration, attempts=attempts, delay=delay, host_tracer_level=host_tracer_level,
                device_tracer_level=device_tracer_level, python_tracer_level=python_tracer_level,
                analyze=analyze_, as_json=as_json)


@commands.command(epilog=_examples(
    "tpuprof report sample_profiles/dumps/conv18_f32_v5e -o conv18.html",
    "tpuprof report DUMP_DIR LOGDIR oom.txt --title 'train step, batch 128'",
    "tpuprof report before.json after.json -o compare.html",
))
def report(
    inputs: List[str] = Argument(..., metavar="INPUT...", help="Any mix of XLA dump folders/files, profiles (logdir, run, *.xplane.pb), OOM logs and tpuprof --json files."),
    output: Path = Option(Path("tpuprof-report.html"), "--output", "-o", help="The HTML file to write (self-contained, opens offline)."),
    target: Optional[str] = _target_option("TPU generation for inputs that do not say."),
    top: int = Option(15, "--top", min=0, help="Rows in the buffer, op and allocation charts and tables."),
    title: Optional[str] = Option(None, "--title", help="Page title."),
    force: bool = Option(False, "--force", help="Replace the output file if it exists."),
    as_json: bool = Option(False, "--json", help="Print where the page went and what it was made from, as JSON."),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """One self-contained HTML page: memory over time, padding, step time, input pipeline and ranked fixes."""
    library_output.hold(verbose)
    from tpuprof.commands import report as command

    command.run(inputs, output=output, target=target, top=top, title=title, as_json=as_json, force=force)


@commands.command(epilog=_examples(
    "tpuprof diff sample_profiles/dumps/diff_b64 sample_profiles/dumps/diff_b128",
    "tpuprof diff main.json pr.json --fail-if 'peak_heap_bytes>+5%'",
    "tpuprof diff LOGDIR_A LOGDIR_B --fail-if 'median_ms>+2' --fail-if 'input_bound_percent>20'",
))
def diff(
    a: str = Argument(..., metavar="A", help="Before: an XLA dump, a profile, or a tpuprof --json file."),
    b: str = Argument(..., metavar="B", help="After: the same kind of input as A."),
    fail_if: Optional[List[str]] = Option(None, "--fail-if", help="Exit 1 when B regresses, e.g. 'peak_heap_bytes>+5%', 'median_ms>+2', 'input_bound_percent>20'; repeatable."),
    batches: Optional[str] = Option(None, "--batches", help="Batch sizes of A and B, e.g. 64,128, for the per-example growth (default: sample.json, else the shapes)."),
    target: Optional[str] = _target_option("TPU generation for inputs that do not say."),
    top: int = Option(10, "--top", min=0, help="Rows of buffers that appear, disappear or change."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """What changed between two runs (peak, padding, buffers, step time, input %); --fail-if for CI."""
    library_output.hold(verbose)
    from tpuprof.commands import diff as command

    command.run(a, b, fail_if=fail_if or [], batches=batches, target=target, top=top, as_json=as_json,
                format_=format_.value if format_ else None)


@commands.command(epilog=_examples(
    "tpuprof preflight sample_profiles/models/conv18.py:factory --tpu v5e --batch 64",
    "tpuprof preflight train.py:step --tpu v5e,v6e --max-batch      # compare generations",
    "tpuprof preflight train.py:step --tpu v5e,v6e,v5p --max-batch --tokens-per-example 2048 --price v6e=2.70",
    "tpuprof preflight sample_profiles/models/keras_mlp.py:factory --tpu v5e:2x2 --batch 32",
    "tpuprof preflight --model llama3.1-8b --tpu v6e-64 --seq 8192 --max-batch --remat all",
    "tpuprof preflight --model config.json --tpu v5p-128,v6e-256 --mesh fsdp=-1,tensor=4 --global-batch 512",
))
def preflight(
    spec: Optional[str] = Argument(None, metavar="[FILE.py:FACTORY]", help="path/to/file.py:factory; factory(batch_size) returns (jax fn, example args), "
                               "(tf.function, TensorSpecs) or (compiled Keras model, x spec, y spec). Not with --model."),
    tpu: str = Option(..., "--tpu", metavar="GENERATION[,...]", help=f"TPU generation ({GENERATIONS}; {GENERATION_NAMES}) or topology (v5e:2x2); "
                            "a comma list compares them.",
                            callback=_check_generations, autocompletion=_complete_generation),
    batch: Optional[int] = Option(None, "--batch", help="Batch size per device to check (a device is a chip on v4, v5e, v5p and v6e, a TensorCore on v2, v3 and TPU7x)."),
    max_batch: bool = Option(False, "--max-batch", help="Search the largest batch per device that fits."),
    compare_bf16: bool = Option(False, "--compare-bf16", help="Also compile in bfloat16 and compare."),
    top: int = Option(10, "--top", min=0, help="Rows in the memory breakdown tables."),
    tokens_per_example: Optional[int] = Option(None, "--tokens-per-example", metavar="N",
                                                     help="Tokens in one example (sequence length): adds tokens/s and cost per 1M tokens."),
    price: Optional[str] = Option(None, "--price", metavar="GEN=USD[,...]",
                                        help="On-demand price per chip-hour, overriding tpuprof's table (e.g. v6e=2.70)."),
    model: Optional[str] = Option(None, "--model", metavar="NAME|config.json",
                                        help="An LLM's full train step instead of a SPEC: a built-in name (llama3.1-8b, qwen2.5-7b, mixtral-8x7b, ...), a Hugging Face config.json or a model folder holding one."),
    seq: int = Option(2048, "--seq", help="--model: sequence length in tokens."),
    batch_per_chip: Optional[int] = Option(None, "--batch-per-chip", metavar="N", help="--model: sequences per chip."),
    global_batch: Optional[int] = Option(None, "--global-batch", metavar="N", help="--model: sequences per step over the whole slice (all slices)."),
    remat: str = Option("full", "--remat", metavar="POLICY", help="--model: none, full, dots (save matmul outputs), offload (to host memory), or all (with --max-batch: a batch x remat table)."),
    dtype: str = Option("bf16", "--dtype", metavar="bf16|fp8", help="--model: matmul operands in bf16 or fp8 (weights and optimizer state stay fp32)."),
    mesh: Optional[str] = Option(None, "--mesh", metavar="AXIS=N,...", help="--model or a factory with a `mesh` parameter: mesh axes data, fsdp, tensor, expert (-1: the rest of the devices). Default fsdp=-1."),
    weight_dtype: str = Option("float32", "--weight-dtype", metavar="float32|bfloat16", help="--model: the weights' and AdamW moments' dtype (MaxText's weight_dtype): 12 or 6 bytes per parameter."),
    mu_dtype: Optional[str] = Option(None, "--mu-dtype", metavar="float32|bfloat16", help="--model: AdamW's first moment's dtype (MaxText's mu_dtype; default: the weights'): bfloat16 with fp32 weights is 10 bytes per parameter, as the TPU7x recipes train."),
    grad_dtype: str = Option("float32", "--grad-dtype", metavar="float32|bfloat16", help="--model: the gradients' dtype before the optimizer (MaxText's grad_dtype): bfloat16 casts the fp32 gradients right after the backward pass, as the DeepSeek-V3 TPU7x recipes train."),
    shard_exp_on_fsdp: bool = Option(False, "--shard-exp-on-fsdp", help="--model, a mixture of experts: store the experts' weights with their expert dimension over fsdp instead of the embedding (MaxText's shard_exp_on_fsdp, fsdp_shard_on_exp before); the experts must divide over fsdp."),
    vocab_tiling: Optional[int] = Option(None, "--vocab-tiling", metavar="N", help="--model: the loss in N pieces of each sequence (MaxText's num_vocab_tiling; default: the fewest whose fp32 logits stay within 512 MiB per device)."),
    moe: str = Option("capacity", "--moe", metavar="capacity|dropless", help="--model, a mixture of experts: capacity (tokens beyond a capacity factor of 1.25 dropped) or dropless (MaxText's sparse_matmul with megablox grouped matmuls; no expert parallelism)."),
    full: bool = Option(False, "--full", help="--model: always compile to the end (default: stop early, and say so, when the compiler's memory layout alone cannot fit)."),
    ray: Optional[str] = Option(None, "--ray", metavar="ADDRESS", help="--model: a sweep's compiles (several --tpu, --remat all) as tasks on a Ray cluster: auto, ray://HEAD:10001 or HEAD:6379 (needs tpuprof[ray] and jax[tpu] on the workers)."),
    no_cache: bool = Option(False, "--no-cache", help="Recompile even if a cached result exists."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Will it fit on a TPU, the largest batch that does, and how fast and at what cost: compiled with libtpu, no TPU needed."""
    library_output.hold(verbose)
    from tpuprof.commands import preflight as command

    command.run(spec, tpu, as_json=as_json, format_=format_.value if format_ else None, batch=batch,
                max_batch=max_batch, compare_bf16=compare_bf16, top=top, cache=not no_cache,
                tokens_per_example=tokens_per_example, price=price, model=model, seq=seq,
                batch_per_chip=batch_per_chip, global_batch=global_batch, remat=remat, dtype=dtype, mesh=mesh,
                weight_dtype=weight_dtype, mu_dtype=mu_dtype, full=full, ray=ray, vocab_tiling=vocab_tiling, moe=moe,
                grad_dtype=grad_dtype, shard_exp_on_fsdp=shard_exp_on_fsdp)


# serve's closed sets, from the one place that knows them (tpuprof.models.serve).
ServeEngine = Enum("ServeEngine", {name: name for name in ("vllm", "sglang-jax", "jetstream")}, type=str)
KvCacheDtype = Enum("KvCacheDtype", {name: name for name in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")}, type=str)
Quantization = Enum("Quantization", {name: name for name in ("bf16", "fp8", "int8")}, type=str)


@commands.command(epilog=_examples(
    "tpuprof serve --model llama3.1-70b --tpu v6e-8 --max-model-len 8192 --concurrency 64",
    "tpuprof serve --model llama3.1-8b --tpu v5e-4,v6e-1,v6e-4 --input-len 1800 --output-len 256   # ranked",
    "tpuprof serve --model config.json --tpu tpu7x-8 --kv-cache-dtype fp8 --json",
    "tpuprof serve --model qwen3-30b-a3b --tpu v6e-8 --no-compile       # the KV arithmetic alone, no JAX",
))
def serve(
    model: str = Option(..., "--model", metavar="NAME|config.json", help="A built-in LLM (llama3.1-70b, qwen3-32b, ...) or a Hugging Face config.json."),
    tpu: str = Option(..., "--tpu", metavar="SLICE[,...]", help="TPU slice(s) such as v6e-8, v5p-16, tpu7x-8; a comma list ranks them.",
                      callback=_check_generations, autocompletion=_complete_generation),
    engine: ServeEngine = Option(ServeEngine("vllm"), "--engine", help="The serving engine whose rules apply: vllm (tpu-inference), sglang-jax, jetstream (MaxText)."),
    max_model_len: Optional[int] = Option(None, "--max-model-len", help="Longest request in tokens (default: the model's max_position_embeddings)."),
    max_num_seqs: Optional[int] = Option(None, "--max-num-seqs", help="Requests the engine schedules at once (default: --concurrency, else 256)."),
    max_num_batched_tokens: Optional[int] = Option(None, "--max-num-batched-tokens", help="Tokens per step (default: the engine's: vLLM on TPU 2048, SGLang-JAX 4096)."),
    tensor_parallel_size: Optional[int] = Option(None, "--tensor-parallel-size", help="Devices one engine spans (default: every device of the slice the heads allow)."),
    enable_expert_parallel: bool = Option(False, "--enable-expert-parallel", help="Shard a mixture of experts by expert instead of by width."),
    kv_cache_dtype: KvCacheDtype = Option(KvCacheDtype("auto"), "--kv-cache-dtype", help="auto (bf16) or fp8 (fp8_e4m3, fp8_e5m2)."),
    quantization: Quantization = Option(Quantization("bf16"), "--quantization", help="Weights: bf16, fp8 or int8."),
    gpu_memory_utilization: Optional[float] = Option(None, "--gpu-memory-utilization", help="Fraction of HBM the engine takes (default: the largest safe one tpuprof finds)."),
    block_size: Optional[int] = Option(None, "--block-size", help="Tokens per KV page (default: the engine's rule)."),
    input_len: Optional[int] = Option(None, "--input-len", help="Prompt tokens per request, for speed and cost (default 1024, at most half of --max-model-len)."),
    output_len: Optional[int] = Option(None, "--output-len", help="Generated tokens per request, for speed and cost (default 256)."),
    concurrency: Optional[int] = Option(None, "--concurrency", help="Requests in flight (default: --max-num-seqs, as far as the KV cache holds them)."),
    price: Optional[str] = Option(None, "--price", metavar="GEN=USD[,...]", help="On-demand price per chip-hour, overriding tpuprof's table (e.g. v6e=2.70)."),
    compile_: bool = Option(True, "--compile/--no-compile", help="Compile the engine's programs with libtpu (default); --no-compile: weights from shapes, no headroom."),
    as_json: bool = Option(False, "--json", help=JSON_HELP),
    format_: Optional[OutputFormat] = _format_option(),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Will an LLM serve on a TPU slice, how many requests at once, with which settings, how fast and at what cost: compiled, no TPU needed."""
    library_output.hold(verbose)
    from tpuprof.commands import serve as command

    command.run(model, tpu, as_json=as_json, format_=format_.value if format_ else None, compile_=compile_,
                engine=engine.value, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, tensor_parallel_size=tensor_parallel_size,
                enable_expert_parallel=enable_expert_parallel, kv_cache_dtype=kv_cache_dtype.value,
                quantization=quantization.value, gpu_memory_utilization=gpu_memory_utilization,
                block_size=block_size, input_len=input_len, output_len=output_len, concurrency=concurrency,
                prices=price)


@commands.command(epilog=_examples(
    "tpuprof trace sample_profiles/captures/jax_compute -o steps.pftrace",
    "tpuprof trace LOGDIR -o steps.pftrace --steps 10:13 --hosts worker0,worker1",
))
def trace(
    path: str = Argument(..., metavar="PROFILE", help="Profile logdir, run folder, <host>.xplane.pb or gs:// path, as for analyze."),
    output: Path = Option(..., "--output", "-o", help="The Perfetto trace to write (protobuf; open in ui.perfetto.dev)."),
    steps: Optional[str] = Option(None, "--steps", metavar="FIRST:END", help="Steps FIRST to END-1 as analyze numbers them (10:13: three steps). Default: the median step and one either side."),
    hosts: Optional[str] = Option(None, "--hosts", metavar="HOST[,...]", help="Only these hosts (file names without .xplane.pb). Default: every host."),
    force: bool = Option(False, "--force", help="Replace the output file if it exists."),
    as_json: bool = Option(False, "--json", help="Print what was written (path, size, hosts, steps, events) as JSON."),
    verbose: bool = Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Chosen steps of every host and TPU core as a Perfetto trace: ops, modules, steps, flows, memory counters."""
    library_output.hold(verbose)
    from tpuprof.commands import trace as command

    command.run(path, output, steps=steps, hosts=hosts, force=force, as_json=as_json)


@commands.command(epilog=_examples("tpuprof guide | less", "tpuprof guide > AGENTS-tpuprof.md      # beside the code an agent works on"))
def guide() -> None:
    """How to use tpuprof from an agent or a script: which command answers what, JSON fields, exit codes, chains."""
    from tpuprof.commands import guide as command

    command.run()


def __getattr__(name: str):
    """`tpuprof.cli.app`: the typer app, built when first asked for (the command line builds it only when needed)."""
    if name == "app":
        return commands.typer_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A full disk or quota (stdout redirected to a file, /dev/full, a temporary file): the environment, not a bug.
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

# Commands that read files and run no user code (preflight runs the user's model, capture a live job).
FILE_READING_COMMANDS = {"analyze", "memory", "oom", "diff", "report"}


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point. Typer, when the command line needs it, runs in standalone mode: usage errors, --help,
    --version and completion exit through SystemExit with click's own messages and codes (a pipe closed by
    `| head`: exit 0, see cli_lazy._closed_pipe_is_success). What reaches us is ours: a UserError (one sentence, exit 2), an interrupt, or a bug (one line,
    exit 1; TPUPROF_DEBUG=1 shows the traceback). What the libraries printed meanwhile is held back
    (tpuprof/library_output.py) and shown only before an internal error. With --json, an error is also the one
    JSON document on stdout ({"schema": "tpuprof.error/1", "error": {"kind", "message"}}): scripts never parse
    stderr. Standard output that cannot be written (a full disk) is one sentence and exit 2.
    """
    internal_error = False
    if sys.stdout is None:  # `tpuprof ... >&-`: Python has no stdout to print an answer or an error document on
        print("tpuprof: cannot write the output: stdout is closed.", file=sys.stderr)
        sys.exit(2)
    args = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in args if not a.startswith("-")), None)
    as_json = _asks_for_json(args)
    if command in FILE_READING_COMMANDS:
        # numpy's OpenBLAS starts a thread per core as it loads: about 0.07 s of a 0.3 s start on a busy 2-core
        # machine, for commands that do no BLAS work. Only this process; a value the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        commands.run(args, usage_errors_raise=as_json)
        sys.stdout.flush()  # a full disk or a closed descriptor is found here, not in the interpreter's exit
        if argv is None and command in FILE_READING_COMMANDS:
            _exit_now()
    except UsageError as error:  # only with --json: click has printed it; the document says it too
        _print_error_document("usage", str(error))
        sys.exit(error.exit_code)
    except SystemExit as done:
        if done.code in (0, None):
            return  # success returns, so that main() can also be called in-process
        if done.code == 130:  # typer turns Ctrl-C into exit code 130, silently
            print("tpuprof: interrupted.", file=sys.stderr)
        raise
    except UserError as error:
        print(f"tpuprof: {error}", file=sys.stderr)
        if as_json:
            _print_error_document("input", str(error))
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        print("tpuprof: interrupted.", file=sys.stderr)
        sys.exit(130)
    except OSError as error:
        if error.errno not in _DISK_FULL and not _stdout_failed():
            internal_error = True
            _internal_error(error, as_json)
        _silence_stdout()  # what is still buffered would fail again as the interpreter exits
        print(f"tpuprof: cannot write the output: {error.strerror or error}.", file=sys.stderr)
        sys.exit(UserError.exit_code)
    except Exception as error:  # noqa: BLE001 - the last line of defence against tracebacks
        internal_error = True
        _internal_error(error, as_json)
    finally:
        if not internal_error:
            library_output.release(replay=False)
        if argv is None:
            # The process ends now (console script, python -m tpuprof). Its last garbage collections at exit would
            # walk every object left (15 ms of the 0.2 s of `analyze --json` on a 1 MB capture) to free memory the
            # system takes back anyway; atexit handlers still run, and tpuprof closes its files itself.
            gc.freeze()

def _internal_error(error: Exception, as_json: bool) -> None:
    """A bug: one line and exit 1 (TPUPROF_DEBUG=1 re-raises for the traceback)."""
    library_output.release(replay=True)  # what the libraries printed may explain it
    if os.environ.get("TPUPROF_DEBUG"):
        raise error
    message = f"internal error: {type(error).__name__}: {error}"
    print(f"tpuprof: {message} (set TPUPROF_DEBUG=1 for the traceback).", file=sys.stderr)
    if as_json:
        _print_error_document("internal", message)
    sys.exit(1)


def _asks_for_json(args: list[str]) -> bool:
    """--json or --format json: stdout is for one JSON document, an error's included."""
    return "--json" in args or "--format=json" in args or any(
        a == "--format" and b == "json" for a, b in zip(args, args[1:]))


def _print_error_document(kind: str, message: str) -> None:
    """The error as the one JSON document of --json (tpuprof/schemas/error.schema.json); stdout may be gone."""
    from tpuprof import schemas
    from tpuprof.renderers.output import print_json

    try:
        print_json({"schema": schemas.name("error"), "error": {"kind": kind, "message": message}})
    except OSError:
        _silence_stdout()


def _stdout_failed() -> bool:
    """Whether standard output cannot take what is written to it (a closed or read-only descriptor): what is
    still buffered is written again."""
    try:
        sys.stdout.flush()
        return False
    except (OSError, ValueError):
        return True


def _silence_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit_now() -> None:
    """A file-reading command has printed its answer and closed its files: end the process without tearing down
    every module and object (about 14 ms of the 0.18 s of `memory --json` on a 9 MB HloProto) for memory the
    system takes back anyway. Only when nothing that registers exit work of its own was loaded (JAX and libtpu
    for a recompile, TensorFlow, Ray); otherwise the normal exit runs."""
    if any(name in sys.modules for name in ("jax", "tensorflow", "ray", "libtpu")):
        return
    library_output.release(replay=False)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # `| head` took what it wanted: success, as cli_lazy says
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
