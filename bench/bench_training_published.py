"""`preflight --model` against every published MaxText / tpu-recipes training run (not part of the test suite).

    XDG_CACHE_HOME=/tmp/x nice -n 19 .venv/bin/python bench/bench_training_published.py [--list] [--results F]
        [--table F] [NAME ...]

The runs and their settings are in bench/training_published.json (one entry per published run, with its source).
For each run (or the NAMEs given), `tpuprof preflight --model ... --tpu ... --seq ... --batch-per-chip ... --json`
is run at the recipe's slice, sequence length and per-chip batch, with the recipe's remat policy, weight dtype,
fp8 and mesh where tpuprof has an option for them (by default a step whose memory layout alone cannot fit is
stopped there, the others compile to the end; `--full` always compiles to the end), and the published step time
is set against the estimate's band and point. Printed per run: published step, band low-high, point, point/published, whether the band holds the
published step and whether the point is within 15% of it, and the recipe's settings tpuprof cannot express.
Runs of model families tpuprof cannot build, or whose settings were not collected, are listed with the reason.

MaxText's config READMEs (v5e, v5p) print TFLOP/s per chip of MaxText's 'default' model at a
global_parameter_scale: those rows are built from an equivalent Llama-format config.json (the dimensions of
bench_step_estimate.dims()) and their published step is MaxText's model FLOPs per device / the printed rate
(bench_step_estimate.model_flops_per_device), as that bench does.

`--layout` stops every run at its memory layout (libtpu's buffer assignment, before code generation), whether or
not it fits, in preflight's own wiring: the layout's bytes (a lower bound of the whole compile's: code generation
adds to them) and the roofline point of its HLO, in seconds per run where a whole compile of a large step takes
tens of minutes. Such rows say "layout only".

`--results F` appends each finished run as a JSON line to F and skips runs already in F, so a long sweep can stop
and resume; `--table F` prints the Markdown table of F's runs (every published run, "not run" where F has none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PUBLISHED = HERE / "training_published.json"
GOAL = 0.15  # the point within 15% of the published step (issue 33)

# What every `--model` compile sets (tpuprof/sources/llm.py COMPILER_OPTIONS, RECIPE_VMEM_LIMIT), by the names of
# MaxText's benchmarks/xla_flags_library.py.
TPUPROF_FLAG_SETS = {"LAYOUT_FOR_ALL_REDUCE_SCATTER", "DATA_PARALLEL_OVERLAP", "CF_FOR_ALL_GATHER",
                     "HOST_OFFLOAD_FLAGS", "DISABLE_COLLECTIVE_MATMUL"}
TPUPROF_VMEM_FLAG = {"v6e": "DENSE_VMEM_LIMIT_FLAG"}  # elsewhere libtpu's default scoped-VMEM limit
MESH_AXES = {"ici_fsdp_parallelism": "fsdp", "ici_tensor_parallelism": "tensor",
             "ici_expert_parallelism": "expert", "ici_data_parallelism": "data"}
# Recipe settings that change nothing tpuprof models, or that are the same as its step's.
NEUTRAL_SETTINGS = {"use_iota_embed", "allow_split_physical_axes", "reuse_example_batch", "use_custom_sort_vjp",
                    "use_random_routing", "float32_weight_sum", "gmm_tiles", "tile_batch_seq", "tile_embed_dim",
                    "tile_mlp_dim", "use_splash_scheduler", "use_max_logit_estimate", "dq_reduction_steps"}


def load_runs() -> list[dict]:
    return json.loads(PUBLISHED.read_text())["runs"]


def maxtext_default_config(scale: int) -> dict:
    """MaxText's 'default' model at global_parameter_scale as a Llama-format config.json (multi-head attention of
    head_dim 128, gated SiLU MLP, vocabulary 32,000: MaxText base.yml)."""
    sys.path.insert(0, str(HERE))
    import bench_step_estimate

    d = bench_step_estimate.dims(scale)
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d["emb"],
            "intermediate_size": d["mlp"], "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"],
            "num_key_value_heads": d["heads"], "head_dim": bench_step_estimate.HEAD_DIM,
            "vocab_size": bench_step_estimate.VOCAB, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "tie_word_embeddings": False, "rope_theta": 10000.0}


def published_step(run: dict) -> float | None:
    """The printed step time, or for MaxText's config READMEs (TFLOP/s per chip only) the model FLOPs per device
    over that rate."""
    published = run["published"]
    if not published.get("step_s_derived"):
        return published.get("step_s")
    sys.path.insert(0, str(HERE))
    import bench_step_estimate

    flops = bench_step_estimate.model_flops_per_device(run["maxtext_global_parameter_scale"], run["batch_per_device"],
                                                       run["seq"])
    return flops / (published["tflops_per_chip"] * 1e12)


def remat_option(run: dict) -> tuple[str | None, list[str]]:
    """tpuprof's --remat closest to the recipe's policy, and what differs."""
    remat = run.get("remat") or {}
    policy = remat.get("policy")
    if policy is None:
        return None, ["remat policy not given by the source"]
    if policy == "full":
        return "full", []
    if policy == "custom":  # tpuprof's --remat custom: takes the recipe's names as they are
        places = {**{name: "device" for name in remat.get("device") or ()},
                  **{name: "offload" for name in remat.get("offload") or ()}}
        if not places:
            return "full", []
        return "custom:" + ",".join(f"{name}={place}" for name, place in sorted(places.items())), []
    if policy == "qkv_proj_offloaded":
        return "custom:key_proj=offload,query_proj=offload,value_proj=offload", []
    if policy == "minimal_offloaded":
        return "offload", ["MaxText's minimal_offloaded (matmul outputs offloaded to the host) approximated by "
                           "tpuprof --remat offload (layer input and q/k/v)"]
    if policy in ("minimal", "save_dot_except_mlpwi", "save_dot_with_context_except_mlp"):
        return "dots", [f"MaxText's {policy} approximated by tpuprof --remat dots (every matmul output saved)"]
    return None, [f"remat policy {policy} has no tpuprof equivalent"]


def mesh_option(run: dict) -> tuple[str | None, list[str]]:
    """tpuprof's --mesh for the recipe's ici_* parallelism (None: its default, fsdp over every device), and the
    axes tpuprof's mesh does not have."""
    parallelism = run.get("parallelism") or {}
    notes, axes = [], {}
    for key, value in parallelism.items():
        if key in MESH_AXES:
            if value not in (1, None):
                axes[MESH_AXES[key]] = value
        elif key.startswith("dcn_"):
            # the slices: --tpu Nx..., each slice a data-parallel replica in tpuprof's step
            if key != "dcn_data_parallelism" and value not in (1, None):
                notes.append(f"{key}={value} (sharded across slices; tpuprof's slices are data-parallel replicas, "
                             "each holding the whole slice's share of the weights and optimizer state)")
        elif value not in (1, None):
            notes.append(f"{key}={value}" + (" (context parallelism)" if "context" in key else
                                             " (tpuprof's mesh has no fsdp_transpose axis: run as fsdp)"
                                             if "fsdp_transpose" in key else ""))
    if set(axes) <= {"fsdp"} and axes.get("fsdp", -1) in (-1, run["devices"]):
        return None, notes
    axes.setdefault("fsdp", -1)
    if axes["fsdp"] != -1 and "data" not in axes and axes["fsdp"] * max(1, axes.get("tensor", 1)) * max(
            1, axes.get("expert", 1)) != run["devices"]:
        axes["fsdp"] = -1
    return ",".join(f"{axis}={value}" for axis, value in axes.items()), notes


def plan(run: dict) -> dict:
    """The preflight command for a run, or why it is not run; and the recipe's settings tpuprof cannot express."""
    out: dict = {"name": run["name"], "cannot_express": []}
    cannot = out["cannot_express"]
    if not run["buildable"]:
        out["skip"] = f"not buildable: {run['not_buildable_reason']}"
        return out
    batch_per_device = run.get("batch_per_device_of_log") or run.get("batch_per_device")
    if batch_per_device is None or run.get("seq") is None:
        out["skip"] = "not run: the per-device batch or sequence length was not collected from the source"
        return out
    per_chip = batch_per_device * run["devices"] // run["chips"]
    if batch_per_device != int(batch_per_device) or per_chip != int(per_chip):
        out["skip"] = (f"not run: per-device batch {batch_per_device} (a sequence split over devices by context "
                       "parallelism, which tpuprof does not model)")
        return out
    tpu = run["slice"] if run["num_slices"] == 1 else f"{run['num_slices']}x{run['slice']}"
    model = run.get("model")
    if model is None and run.get("maxtext_global_parameter_scale"):
        model = f"@maxtext-default-{run['maxtext_global_parameter_scale']}"
        cannot.append("MaxText's 'default' model built as an equivalent Llama-format config (tpuprof's layer, not "
                      "MaxText's code)")
    command = ["--model", model, "--tpu", tpu, "--seq", str(run["seq"]), "--batch-per-chip", str(int(per_chip))]
    remat, notes = remat_option(run)
    if remat:
        command += ["--remat", remat]
    cannot += notes
    mesh, notes = mesh_option(run)
    if mesh:
        command += ["--mesh", mesh]
    cannot += notes
    if run.get("weight_dtype") == "bfloat16":
        command += ["--weight-dtype", "bfloat16"]
    if run.get("mu_dtype") in ("bfloat16", "float32"):
        command += ["--mu-dtype", run["mu_dtype"]]
    precision = run.get("precision")
    if precision == "fp8_full":
        command += ["--dtype", "fp8"]
        cannot.append("fp8_full through qwix (fp8 in forward and backward with fixed calibration) approximated by "
                      "tpuprof --dtype fp8 (e4m3 casts of each matmul's operands)")
    elif precision == "int8":
        cannot.append("quantization=int8 (AQT): tpuprof has no int8 training (run in bf16)")
    moe = run.get("moe") or {}
    if moe.get("sparse_matmul"):
        command += ["--moe", "dropless"]
        if not moe.get("megablox"):
            cannot.append("sparse_matmul through jax.lax.ragged_dot (megablox=False) run as megablox grouped matmuls")
    elif moe.get("capacity_factor") not in (None, 1.25):
        cannot.append(f"capacity_factor {moe['capacity_factor']} (tpuprof: 1.25)")
    flag_sets = set(run.get("xla_flag_sets") or ())
    raw_flags = run.get("xla_flags") or ""
    ours = TPUPROF_FLAG_SETS | ({TPUPROF_VMEM_FLAG[run["generation"]]} if run["generation"] in TPUPROF_VMEM_FLAG
                                else set())
    if any("SPARSECORE" in f for f in flag_sets) or "SparseCore" in raw_flags:
        cannot.append("collectives offloaded to the SparseCores (tpuprof counts them on the TensorCore's ICI "
                      "schedule)")
    extra = sorted(f for f in flag_sets - ours if "SPARSECORE" not in f)
    if extra:
        cannot.append(f"XLA flag sets {', '.join(extra)}")
    if flag_sets and "DISABLE_COLLECTIVE_MATMUL" not in flag_sets:
        cannot.append("collective matmuls kept (tpuprof turns them off)")
    if run.get("libtpu_init_args"):  # passed as the recipe passes them: tpuprof's own give way to them
        out["libtpu_init_args"] = run["libtpu_init_args"]
    elif raw_flags:
        cannot.append(f"the recipe's own LIBTPU flags ({raw_flags}); tpuprof compiles with its fixed flag sets")
    blocks = run.get("splash_blocks") or {}
    ours_block = 2048 if run["generation"] == "v6e" else 512
    sizes = {v for k, v in blocks.items() if k.startswith("sa_block")}
    if sizes and sizes != {ours_block}:
        cannot.append(f"splash blocks {sorted(sizes)} (tpuprof: {ours_block} on {run['generation']})")
    settings = run.get("other_settings") or {}
    if settings.get("num_vocab_tiling"):
        command += ["--vocab-tiling", str(settings["num_vocab_tiling"])]
    if settings.get("grad_dtype") not in (None, "float32"):
        command += ["--grad-dtype", settings["grad_dtype"]]
    # MaxText's shard_exp_on_fsdp, named fsdp_shard_on_exp in the earlier MaxText some recipes run; false is the default
    experts_on_fsdp = ("shard_exp_on_fsdp", "fsdp_shard_on_exp")
    if any(settings.get(key) is True for key in experts_on_fsdp):
        transpose = (run.get("parallelism") or {}).get("ici_fsdp_transpose_parallelism")
        if transpose in (None, 1):
            command += ["--shard-exp-on-fsdp"]
        else:  # tpuprof's fsdp spans fsdp_transpose too: the experts would not divide it as they do MaxText's fsdp
            cannot.append("shard_exp_on_fsdp=True with fsdp_transpose (run with the embedding over fsdp)")
    other = {k: v for k, v in settings.items()
             if k not in NEUTRAL_SETTINGS | {"num_vocab_tiling", "grad_dtype", *experts_on_fsdp}}
    if other:
        cannot.append("other settings: " + ", ".join(f"{k}={v}" for k, v in other.items()))
    out["command"] = command
    out["batch_per_chip"] = int(per_chip)
    return out


def with_flags(flags: str | None) -> dict:
    """The environment a run compiles in: the recipe's LIBTPU_INIT_ARGS where it has its own, else none."""
    env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
    return {**env, "LIBTPU_INIT_ARGS": flags} if flags else env


def run_preflight(command: list[str], workdir: Path, full: bool = False,
                  flags: str | None = None) -> tuple[dict | None, str, float]:
    model = command[1]
    if model.startswith("@maxtext-default-"):
        path = workdir / f"{model[1:]}.json"
        path.write_text(json.dumps(maxtext_default_config(int(model.rsplit("-", 1)[1]))))
        command = [command[0], str(path), *command[2:]]
    line = [sys.executable, "-m", "tpuprof", "preflight", *command, "--json", *(["--full"] if full else [])]
    started = time.perf_counter()
    result = subprocess.run(line, capture_output=True, text=True, cwd=ROOT,
                            env={**with_flags(flags), "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - started
    if result.returncode not in (0, 1):  # 1: does not fit
        last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        return None, last, seconds
    return json.loads(result.stdout)["targets"][0], "", seconds


def run_layout(command: list[str], workdir: Path, flags: str | None = None) -> tuple[dict | None, str, float]:
    """The run's step compiled up to its memory layout only, as `tpuprof preflight` builds it
    (tpuprof.commands.preflight), with the recipe's LIBTPU flags (FLAGS) in this process's environment as a run of
    tpuprof would have them: its slice's entry of the preflight document, "how" saying so."""
    os.environ.clear()
    os.environ.update(with_flags(flags))
    sys.path.insert(0, str(ROOT))
    from tpuprof.analyses import preflight_step
    from tpuprof.commands.preflight import llm_spec
    from tpuprof.models.preflight import Compiled, CompilerFigures, PreflightTarget, preflight_options
    from tpuprof.results import PreflightResult
    from tpuprof.sources import llm, tpu_compile

    keywords, words = {}, list(command)
    while words:  # --option value, or a flag alone (True)
        key = words.pop(0)[2:].replace("-", "_")
        keywords[key] = words.pop(0) if words and not words[0].startswith("--") else True
    if keywords["model"].startswith("@maxtext-default-"):
        path = workdir / f"{keywords['model'][1:]}.json"
        path.write_text(json.dumps(maxtext_default_config(int(keywords["model"].rsplit("-", 1)[1]))))
        keywords["model"] = str(path)
    keywords["seq"], keywords["batch_per_chip"] = int(keywords["seq"]), int(keywords["batch_per_chip"])
    if "vocab_tiling" in keywords:
        keywords["vocab_tiling"] = int(keywords["vocab_tiling"])
    started = time.perf_counter()
    options = preflight_options(**keywords)
    chosen = options.slices[0]
    config, source = llm.load_config(options.model)
    spec = llm_spec(config, source, chosen, options.remat, options)
    batch = preflight_step.llm_batch_per_device(chosen, options.batch_per_chip, None)
    dump = workdir / f"layout-{len(list(workdir.iterdir()))}"
    try:
        result = tpu_compile.compile_until_layout(spec, batch, None, chosen.topology, dump, stop_above=0)
    except (tpu_compile.CompileResourceExhausted, tpu_compile.CompileFailed) as error:
        return None, str(error).strip().splitlines()[0], time.perf_counter() - started
    required = result.required_bytes
    figures = CompilerFigures(result.argument_bytes, result.output_bytes, result.alias_bytes, result.temp_bytes,
                              result.generated_code_bytes)
    compiled = Compiled(batch, required <= chosen.target.compiler_hbm_bytes, required, 1, figures=figures,
                        dump_dir=str(dump), stage=result.stage)
    model = spec.model_info()
    batches = preflight_step.slice_batches(chosen, batch, whole_slice=True)
    estimate = preflight_step.estimate(chosen, compiled, options, tokens=options.seq, model=model,
                                       seq_len=options.seq, batch_per_chip=batches.get("batch_per_chip"),
                                       whole_job="global_batch" in batches)
    answer = PreflightTarget(chosen, compiled, "", estimate=estimate, model=model, mesh=spec.step.mesh_sizes,
                             seq_len=options.seq, **batches)
    target = PreflightResult(f"--model {config.name}", [answer]).to_dict()["targets"][0]
    target["how"] = ("layout only (roofline)" if result.stage == "buffer_assignment"
                     else "whole compile (it ended before the layout was read)")
    return target, "", time.perf_counter() - started


def compare(run: dict, target: dict | None, error: str, seconds: float) -> dict:
    published = published_step(run)
    out = {"name": run["name"], "published_s": published, "compile_s": round(seconds), "error": error or None}
    if target is None:
        return out
    estimate = target.get("estimate") or {}
    out["fits"] = target.get("fits")
    out["required_bytes"], out["hbm_capacity_bytes"] = target.get("required_bytes"), target.get("hbm_capacity_bytes")
    out["how"] = target.get("how") or ("layout (does not fit; roofline)" if target.get("fast") else "whole compile")
    if not estimate:
        out["error"] = "does not fit at the recipe's batch" if not target.get("fits") else "no estimate"
        return out
    low, high, point = (estimate.get(k) / 1e3 for k in ("step_ms_low", "step_ms_high", "step_ms"))
    out.update({"low_s": low, "high_s": high, "point_s": point, "mfu_percent": estimate.get("mfu_percent"),
                "collective_s": (estimate.get("collective_ms") or 0) / 1e3,
                "exposed_collective_s": (estimate.get("exposed_collective_ms") or 0) / 1e3,
                "dcn_s": (estimate.get("dcn_ms") or 0) / 1e3, "not_modelled": estimate.get("not_modelled")})
    if published:
        out.update({"ratio": point / published, "inside_band": low <= published <= high,
                    "within_goal": abs(point / published - 1) <= GOAL})
    return out


def short(note: str) -> str:
    """A table cell's words for a --list note."""
    import re

    rules = [(r"^offloads (.*) too .*", r"+offload \1"), (r"^does not offload (.*) \(.*", r"no offload of \1"),
             (r"^keeps (.*) on the device .*", r"saves \1"), (r"^saves only (.*) on the device .*", r"saves only \1"),
             (r"^offloads q/k/v only.*", "offloads q/k/v only"),
             (r"^MaxText's (\w+) .*approximated by tpuprof (--remat \w+).*", r"\1 as \2"),
             (r"^collectives offloaded to the SparseCores.*", "SparseCore collectives"),
             (r"^collective matmuls kept.*", "collective matmuls on"),
             (r"^sparse_matmul through.*", "ragged_dot as megablox"),
             (r"^XLA flag sets (.*)", r"flags \1"), (r"^the recipe's own LIBTPU flags.*", "own LIBTPU flags"),
             (r"^splash blocks (\[.*\]) .*", r"splash blocks \1"), (r"^other settings: (.*)", r"\1"),
             (r"^fp8_full through qwix.*", "qwix fp8_full"),
             (r"^quantization=int8.*", "int8 (run bf16)"), (r"^(ici_fsdp_transpose_parallelism=\S+) .*", r"\1"),
             (r"^(dcn_\w+=\S+) \(sharded across slices.*", r"\1 (tpuprof: slices as replicas)"),
             (r"^MaxText's 'default' model.*", "MaxText default model"), (r"^remat policy (.*)", r"remat \1")]
    for pattern, replacement in rules:
        if re.match(pattern, note):
            return re.sub(pattern, replacement, note)
    return note


def row_text(run: dict, p: dict, r: dict | None) -> str:
    name = run["name"]
    published = published_step(run)
    pub = f"{published:.3f} s" if published else "-"
    if "skip" in p:
        return f"| {name} | {pub} | | | | | {p['skip']} | |"
    if r is None:
        return f"| {name} | {pub} | | | | | not run (time) | {'; '.join(map(short, p['cannot_express'])) or '-'} |"
    memory = (f"{r['required_bytes'] / 2**30:.1f} of {r['hbm_capacity_bytes'] / 2**30:.1f} GiB"
              if r.get("required_bytes") is not None else "refused")
    cannot = '; '.join(map(short, p['cannot_express'])) or '-'
    if r.get("error") and r.get("required_bytes") is None:  # libtpu refused the step before its layout was read
        return (f"| {name} | {pub} | | | | | batch {p['batch_per_chip']}/chip: refused by the compiler, "
                f"{r['error']} ({r['compile_s']} s) | {cannot} |")
    if r.get("error"):
        return (f"| {name} | {pub} | | | | | {r['error']} ({memory}; {r.get('how', 'whole compile')}, "
                f"{r['compile_s']} s) | {cannot} |")
    if r.get("how", "").startswith("layout only"):  # the table's text says so once
        how = (f"batch {p['batch_per_chip']}/chip: layout {'fits' if r.get('fits') else 'DOES NOT FIT'}, {memory} "
               f"({r['compile_s']} s)")
    else:
        how = (f"batch {p['batch_per_chip']}/chip {'fits' if r.get('fits') else 'DOES NOT FIT'} ({memory}); "
               f"{r.get('how', 'whole compile')}, {r['compile_s']} s")
    return (f"| {name} | {pub} | {r['low_s']:.2f} - {r['high_s']:.2f} s | {r['point_s']:.2f} s | {r['ratio']:.2f} | "
            f"{'yes' if r['inside_band'] else 'no'} / {'yes' if r['within_goal'] else 'no'} | {how} | {cannot} |")


def table(runs: list[dict], results: dict[str, dict]) -> str:
    lines = ["| run | published step | band | point | point / published | in band / within 15% | "
             "memory at the recipe's batch | recipe settings tpuprof cannot express |", "|---|---:|---:|---:|---:|---|---|---|"]
    for run in runs:
        lines.append(row_text(run, plan(run), results.get(run["name"])))
    return "\n".join(lines)


def read_results(path: Path | None) -> dict[str, dict]:
    if not path or not path.is_file():
        return {}
    return {r["name"]: r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())}


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="runs by name (bench/training_published.json), run in the order "
                        "given; all by default")
    parser.add_argument("--list", action="store_true", help="print each run's command or why it is not run")
    parser.add_argument("--results", type=Path, help="append results as JSON lines here; skip runs already in it")
    parser.add_argument("--table", type=Path, help="print the Markdown table of the results in this file")
    parser.add_argument("--layout", action="store_true", help="stop every run at its memory layout (seconds; the "
                        "layout's bytes, a lower bound, and the roofline point), whether or not it fits")
    parser.add_argument("--full", action="store_true", help="compile to the end (the compiler's cycle estimates "
                        "in the band); default: tpuprof's first answer")
    options = parser.parse_args(arguments)
    runs = load_runs()
    unknown = set(options.names) - {r["name"] for r in runs}
    if unknown:
        raise SystemExit(f"no published run named {', '.join(sorted(unknown))}")
    by_name = {r["name"]: r for r in runs}
    chosen = [by_name[n] for n in options.names] if options.names else runs  # in the order given
    if options.table:
        print(table(chosen, read_results(options.table)))
        return 0
    if options.list:
        for run in chosen:
            p = plan(run)
            flags = f"LIBTPU_INIT_ARGS='{p['libtpu_init_args']}' " if p.get("libtpu_init_args") else ""
            print(f"{run['name']}: {p.get('skip') or flags + 'tpuprof preflight ' + ' '.join(p['command'])}")
            for note in p["cannot_express"]:
                print(f"    cannot express: {note}")
        return 0
    done = read_results(options.results)
    print(f"{'run':34} {'published':>9} {'low':>8} {'high':>8} {'point':>8} {'pt/pub':>6}  band  15%")
    with tempfile.TemporaryDirectory() as workdir:
        for run in chosen:
            p = plan(run)
            if "skip" in p or run["name"] in done:
                print(f"{run['name']:34} {p.get('skip') or 'done before (' + str(options.results) + ')'}")
                continue
            if options.layout:
                target, error, seconds = run_layout(p["command"], Path(workdir), p.get("libtpu_init_args"))
            else:
                target, error, seconds = run_preflight(p["command"], Path(workdir), options.full,
                                                       p.get("libtpu_init_args"))
            r = compare(run, target, error, seconds)
            if options.results:
                with options.results.open("a") as f:
                    f.write(json.dumps(r) + "\n")
            if "point_s" not in r or not r.get("published_s"):
                print(f"{run['name']:34} {r.get('error')} ({seconds:.0f} s)", flush=True)
                continue
            print(f"{run['name']:34} {r['published_s']:8.3f}s {r['low_s']:7.3f}s {r['high_s']:7.3f}s "
                  f"{r['point_s']:7.3f}s {r['ratio']:6.2f}  {'yes' if r['inside_band'] else 'no ':4} "
                  f"{'yes' if r['within_goal'] else 'no'}  ({seconds:.0f} s; cannot express: "
                  f"{'; '.join(p['cannot_express']) or 'nothing'})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
