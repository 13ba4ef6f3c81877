"""`tpuprof preflight --model`: an LLM's full train step compiled with libtpu over every device of a slice.

Two real compiles in all, in one CLI run: a tiny Llama-shaped config on v6e-16 and v6e-64 (16 and 64 devices,
FSDP over all of them; a multi-slice 2xv6e-16 is the same program, served from the cache). The model that
cannot fit is judged from the arithmetic, without a compile; so is the config.json-equals-name check, which
also compares the two steps' compile cache keys.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import run_cli

from tpuprof.sources import llm
from tpuprof.units import fmt_bytes

# Two scanned layers, GQA (4 query heads, 2 key/value heads), a gated MLP: shapes that tile on the TPU.
TINY = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="session")
def llm_cache(compile_cache):
    return compile_cache


def preflight(cache, *args):
    result = run_cli("preflight", *args, "--json", timeout=900, env={"XDG_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    from test_schemas import validate

    validate(document)
    return document


@pytest.fixture(scope="session")
def tiny_document(tmp_path_factory, llm_cache):
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY))
    return preflight(llm_cache, "--model", str(folder / "config.json"), "--tpu", "v6e-16,v6e-64,2xv6e-16",
                     "--seq", "256", "--batch-per-chip", "2")


@pytest.fixture(scope="session")
def tiny(tiny_document):
    return {t["slice"]["name"] + ("x2" if t["slice"].get("num_slices") else ""): t for t in tiny_document["targets"]}


@pytest.mark.slow
def test_a_sharded_compile_over_64_devices(tiny):
    big = tiny["v6e-64"]
    assert big["slice"] == {"name": "v6e-64", "topology": "v6e:8x8", "chips": 64, "devices": 64}
    assert big["mesh"] == {"data": 1, "fsdp": 64, "tensor": 1, "expert": 1}
    assert (big["batch_per_chip"], big["global_batch"], big["seq_len"]) == (2, 128, 256)
    assert big["fits"] and big["required_bytes"] > 0
    assert big["model"]["parameters"] == llm.parse_config(TINY, "t", "t").parameter_count()
    # The compiler's own argument bytes per chip: the 64-way FSDP shard of the fp32 weights and two moments
    # (plus this chip's tokens), not the whole model's: the program really is sharded.
    whole = big["model"]["parameters"] * llm.ADAM_STATE_BYTES
    assert whole / 64 <= big["argument_bytes"] < whole / 64 + 64 * 1024


def test_memory_per_chip_falls_as_the_slice_grows(tiny):
    small, big = tiny["v6e-16"], tiny["v6e-64"]
    assert small["mesh"]["fsdp"] == 16 and small["global_batch"] == 32
    # Same batch per chip: the sharded state is 4x smaller per chip on 4x the chips, the activations the same.
    assert small["argument_bytes"] / big["argument_bytes"] == pytest.approx(4, rel=0.05)
    assert big["state_bytes_per_chip"] * 4 == pytest.approx(small["state_bytes_per_chip"], rel=0.05)  # norms are whole
    assert big["required_bytes"] < small["required_bytes"]


def test_multi_slice_is_one_slice_compiled_and_the_global_batch_over_all_slices(tiny):
    two = tiny["v6e-16x2"]
    assert two["slice"] == {"name": "v6e-16", "topology": "v6e:4x4", "chips": 16, "devices": 16, "num_slices": 2}
    assert two["global_batch"] == 2 * tiny["v6e-16"]["global_batch"]
    assert two["required_bytes"] == tiny["v6e-16"]["required_bytes"] and two["compiles"] == 0  # the same program


def test_a_sweep_in_parallel_answers_as_one_at_a_time(tiny_document, llm_cache, tmp_path, monkeypatch):
    """The three slices' first answers were compiled two at a time (child processes); one at a time, from the
    same compile cache, the document is the same, slice for slice and in the order asked."""
    from tpuprof.commands import preflight as command
    from tpuprof.models.preflight import preflight_options

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("XDG_CACHE_HOME", str(llm_cache))
    monkeypatch.setattr(command, "SWEEP_WORKERS", 1)
    options = preflight_options(model=str(tmp_path / "config.json"), tpu="v6e-16,v6e-64,2xv6e-16", seq=256,
                                batch_per_chip=2)
    serial = command.model_result(options).to_dict()

    def comparable(document):  # the model is named after its config's folder, which differs here
        return [{**{k: v for k, v in t.items() if k not in ("compiles", "memory", "dump_dir")},
                 "model": {k: v for k, v in t["model"].items() if k not in ("name", "source")}}
                for t in document["targets"]]

    assert [t["slice"]["name"] for t in serial["targets"]] == ["v6e-16", "v6e-64", "v6e-16"]
    assert comparable(serial) == comparable(tiny_document)


def test_the_report_compares_the_slices_per_chip(tiny_document, tiny, tmp_path):
    saved = tmp_path / "preflight.json"
    saved.write_text(json.dumps(tiny_document))
    page_file = tmp_path / "report.html"
    result = run_cli("report", saved, "-o", page_file)
    assert result.returncode == 0, result.stderr
    page = page_file.read_text()
    # The slices side by side: the preflight section's first table (a column per slice).
    comparison = next(table for table in re.findall(r"<table.*?</table>", page, re.S)
                      if "batch per chip / global" in table)
    assert "v6e-64" in comparison and "v6e:8x8" in comparison and "fsdp=64" in comparison and "x 2 slices" in comparison
    assert "2 / 128" in comparison  # batch per chip / global
    from tpuprof.units import fmt_bytes

    assert fmt_bytes(tiny["v6e-64"]["required_bytes"]) in comparison  # memory per chip (a v6e device is a chip)


@pytest.mark.slow
def test_offloaded_activations_are_the_hosts_memory_not_hbm(llm_cache, tiny, tmp_path):
    """--remat offload (each layer's input and q/k/v to host memory) compiled by libtpu: the host memory it
    reports is exactly those activations, bf16, for every layer of this device's sequences, and is checked
    against what a device may hold on the host; HBM's figures do not count it, and a step that offloads nothing has
    no host figure (the tiny model's full-remat compile, which the other tests here read). Four layers: with two,
    XLA keeps a second copy of the stack (1.5x). On v6e-4: the offloading step is tests/test_host_transfers.py's
    program, one compile for both in the session's cache."""
    config = dict(TINY, num_hidden_layers=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v6e-4", "--seq", "256", "--batch-per-chip", "2")
    offload = preflight(llm_cache, *args, "--remat", "offload")["targets"][0]
    layers, batch, seq, hidden = 4, 2, 256, TINY["hidden_size"]
    head_dim = hidden // TINY["num_attention_heads"]
    per_token = hidden + TINY["num_attention_heads"] * head_dim + 2 * TINY["num_key_value_heads"] * head_dim
    assert offload["host_bytes"] == layers * batch * seq * per_token * 2
    # libtpu's budget for one device's host memory (128 GiB) is below a v6e host's DRAM per chip (192 GiB).
    assert offload["host_capacity_bytes"] == 128 * 2**30 and offload["host_fits"] is True
    hbm = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")
    # Offloading, the compile runs to the end: code generation adds HBM for the transfers in flight.
    assert "fast" not in offload and offload["generated_code_bytes"] > 0
    assert offload["required_bytes"] == sum(offload[k] for k in hbm) - offload["alias_bytes"]  # HBM's sum only
    # Nothing offloaded, no host figure: the session's full-remat compile of the same tiny model (two layers, v6e-16).
    assert tiny["v6e-16"]["model"]["remat"] == "full" and "host_bytes" not in tiny["v6e-16"]
    table = run_cli("preflight", *args, "--remat", "offload", timeout=900,
                    env={"XDG_CACHE_HOME": str(llm_cache), "COLUMNS": "200"})
    assert re.search(r"host memory \(offloaded, not HBM\)\s+\S+ MiB of 128(\.00)? GiB a device may hold: fits", table.stdout), \
        table.stdout
    markdown = run_cli("preflight", *args, "--remat", "offload", "--format", "markdown", timeout=900,
                       env={"XDG_CACHE_HOME": str(llm_cache)})
    assert "| host memory (offloaded, not HBM) | 3.00 MiB of 128.00 GiB a device may hold: fits |" in markdown.stdout


@pytest.mark.slow
def test_a_custom_remat_policy_offloads_and_saves_what_it_names(llm_cache, tmp_path):
    """MaxText's `remat_policy: custom` by name: the layer input offloaded (and nothing else: the host holds exactly
    every layer's input, bf16), the attention context saved on the device, the rest recomputed."""
    config = dict(TINY, num_hidden_layers=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v6e-16", "--seq", "256", "--batch-per-chip", "2")
    custom = preflight(llm_cache, *args, "--remat", "custom:decoder_layer_input=offload,context=device")["targets"][0]
    assert custom["model"]["remat"] == "custom:decoder_layer_input=offload,context=device"
    assert custom["host_bytes"] == 4 * 2 * 256 * TINY["hidden_size"] * 2  # layers x sequences x tokens x d, bf16


@pytest.mark.slow
def test_max_batch_with_offload_is_bound_by_the_hosts_memory(llm_cache, tmp_path):
    """--remat offload --max-batch on v5e-8: each sequence offloads every layer's input and q/k/v in bf16, and a
    v5e device may hold 64 GiB of host memory (the host's 512 GiB DRAM over 8 chips; libtpu alone would allow 128).
    98,304 thin layers at 256 tokens offload 24 GiB per sequence: 2 sequences fit (48 GiB), 3 do not (72 GiB),
    while HBM, holding the bf16 weights and AdamW state, barely grows with the batch. The search used to answer
    libtpu's own budget, twice what the host holds. A host-bound search is 2 compiles: 1 and the jump to 2; 3
    sequences would hold 72 GiB, in the proportion both compiles show, and are not compiled. (Few
    tokens per compile: libtpu's compile time grows with them, 6 s at 512 tokens, 20 s at 5,120; twice the layers
    over twice the chips at half the tokens compile in three quarters of 49,152 layers at 512 tokens on v5e-4.)"""
    config = dict(TINY, num_hidden_layers=98304, hidden_size=128, intermediate_size=128, num_attention_heads=1,
                  num_key_value_heads=1)  # thin layers: HBM stays far from full
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v5e-8", "--seq", "256", "--remat", "offload",
            "--weight-dtype", "bfloat16", "--max-batch")
    document = preflight(llm_cache, *args)
    target = document["targets"][0]
    layers, seq, hidden = config["num_hidden_layers"], 256, config["hidden_size"]
    head_dim = hidden // config["num_attention_heads"]
    per_token = (hidden + config["num_attention_heads"] * head_dim + 2 * config["num_key_value_heads"] * head_dim) * 2
    assert per_token == 1024
    host_capacity = 64 * 2**30
    expected = host_capacity // (layers * seq * per_token)
    assert expected == 2
    assert target["host_capacity_bytes"] == host_capacity
    assert target["max_batch_size"] == expected, target["curve"]
    assert target["max_batch_bound"] == "host"
    assert target["batch_size"] == expected and target["host_fits"] is True
    assert target["host_bytes"] == expected * layers * seq * per_token
    assert target["fits"] and target["required_bytes"] < 0.8 * target["hbm_capacity_bytes"]  # HBM does not bind
    assert [p["batch_size"] for p in target["curve"]] == [1, expected] and target["compiles"] == 2
    assert (expected + 1) * layers * seq * per_token > host_capacity
    table = run_cli("preflight", *args, timeout=900, env={"XDG_CACHE_HOME": str(llm_cache), "COLUMNS": "200"})
    assert re.search(r"bound by\s+host memory \(64(\.00)? GiB a device may hold\)", table.stdout), table.stdout
    saved, page = tmp_path / "preflight.json", tmp_path / "report.html"
    saved.write_text(json.dumps(document))
    assert run_cli("report", saved, "-o", page).returncode == 0
    shown = page.read_text()  # the report's table says so too
    assert f"<td>max batch per chip</td><td>{expected}</td>" in shown
    assert "<td>host memory (64.00 GiB a device may hold)</td>" in shown


@pytest.mark.slow
def test_splash_tiles_follow_the_generation(llm_cache, tmp_path):
    """The published recipes' splash tiles (2,048-token blocks, fused backward kernel) are v6e's: on a v4 chip,
    with 16 MiB of VMEM, that kernel asks for 30.8 MiB and libtpu refuses every batch ("Ran out of memory in
    memory space vmem"; 28.75M of 16M for this model at 2,048 tokens). Elsewhere the step uses MaxText's default
    tiles, and a 2k-token step of the tiny model fits a v4 chip."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    target = preflight(llm_cache, "--model", str(tmp_path / "config.json"), "--tpu", "v4-8", "--seq", "2048",
                       "--batch-per-chip", "1")["targets"][0]
    assert target["fits"], (target.get("oom") or {}).get("message")
    assert llm.SPLASH_BLOCK.get("v4", llm.DEFAULT_SPLASH_BLOCK) == 512
    assert "xla_tpu_scoped_vmem_limit_kib" not in llm.compiler_options("v4")
    assert llm.compiler_options("v6e")["xla_tpu_scoped_vmem_limit_kib"] == 98304


def test_the_mfu_says_whose_flops_over_which_peak(tiny):
    """MFU: MaxText's model FLOPs for the family (the matmul parameters, the tokens per device, attention), a step
    on one device, over one v6e device's peak bf16 FLOP/s (918 TFLOP/s a chip, one device a chip)."""
    from tpuprof.analyses.preflight import model_flops_per_device

    target = tiny["v6e-16"]
    model, estimate = target["model"], target["estimate"]
    flops = model_flops_per_device(model, 256, 2)  # 2 sequences of 256 tokens per chip, one device a chip
    source = estimate["mfu_source"]
    assert source.startswith("model FLOPs (MaxText's calculate_tflops_training_per_device for llama: 6 x "
                             f"{model['active_parameters']:,} matmul parameters"), source
    assert "x 512 tokens per device + causal attention, 12 x tokens x 256 keys x 256 (heads x head_dim) / 2 in each " \
           "of 2 layers" in source
    assert f"{flops / 1e12:,.4g} TFLOP a step on one device" in source
    assert source.endswith("918 TFLOP/s bf16 a device (v6e's 918 a chip, tpuprof.targets))")
    assert estimate["mfu_percent"] == pytest.approx(100 * flops / (estimate["step_ms"] / 1e3 * 918e12), abs=0.051)


def test_the_tables_name_each_slice(tiny_document, llm_cache, tmp_path):
    """The same run as tables (the compiles are cached): every per-target line names the slice, not only the
    generation, and no figure reads in exponent notation."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    result = run_cli("preflight", "--model", str(config), "--tpu", "v6e-16,v6e-64,2xv6e-16", "--seq", "256",
                     "--batch-per-chip", "2", timeout=900, env={"XDG_CACHE_HOME": str(llm_cache), "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    for name in ("v6e-16", "v6e-64", "2xv6e-16"):
        assert f"{name} at batch 2: where the memory goes" in result.stdout
        assert f"{name} slowest ops:" in result.stdout
        assert re.search(rf"{name} MFU \d+%: model FLOPs \(MaxText's", result.stdout)  # the row's basis
    assert not re.search(r"(?<![\w.])\d+(\.\d+)?e[+-]\d\d", result.stdout)  # 1.14e+03, not v6e-16


def test_config_json_is_the_same_as_the_name(tmp_path):
    """The built-in config copied to a user's config.json: the same step (the same compile cache key, so one
    compile serves both) and the same answer. Llama 3.1 70B on v5e-8 is answered from the sharding arithmetic,
    so this costs no compile."""
    from importlib import resources

    from tpuprof.sources import llm

    folder = tmp_path / "Meta-Llama-3.1-70B"
    folder.mkdir()
    with resources.as_file(resources.files("tpuprof") / "llm_configs" / "llama3.1-70b.json") as builtin:
        shutil.copy(builtin, folder / "config.json")
    args = ("--tpu", "v5e-8", "--seq", "8192", "--batch-per-chip", "1", "--mesh", "fsdp=-1")
    by_name = preflight(tmp_path, "--model", "llama3.1-70b", *args)["targets"]
    by_file = preflight(tmp_path, "--model", str(folder / "config.json"), *args)["targets"]
    assert by_name[0]["model"]["source"] == "built-in:llama3.1-70b" and by_name[0]["model"]["name"] == "llama3.1-70b"
    assert by_file[0]["model"]["source"] == str(folder / "config.json")
    assert by_file[0]["model"]["name"] == "Meta-Llama-3.1-70B"
    assert {**by_name[0], "model": None} == {**by_file[0], "model": None}  # verdict, figures, slice, mesh
    steps = [llm.Step(llm.load_config(model)[0], "", 8192, "full", "bf16", llm.parse_mesh(None, 256))
             for model in ("llama3.1-70b", str(folder / "config.json"))]
    assert steps[0].key() == steps[1].key()  # the compile cache key: a compile of one serves the other


def test_a_model_that_cannot_fit_says_why_without_compiling(tmp_path):
    """Llama 3.1 70B on v5e-8: 70.6B parameters x 12 bytes (fp32 weights, AdamW's two moments) / 8 chips is
    about 99 GiB per chip, six times a v5e chip's 15.75 GiB."""
    document = preflight(tmp_path, "--model", "llama3.1-70b", "--tpu", "v5e-8", "--seq", "8192",
                         "--batch-per-chip", "1")
    target = document["targets"][0]
    assert target["fits"] is False and target["compiles"] == 0
    parameters = target["model"]["parameters"]
    assert parameters == pytest.approx(70.6e9, rel=0.005)  # Meta's published 70.6B
    assert target["state_bytes_per_chip"] == pytest.approx(parameters * 12 / 8, rel=0.001)
    assert target["state_bytes_per_chip"] > 6 * target["hbm_capacity_bytes"]
    assert "parameters and AdamW state alone need" in target["verdict"]
    assert "70.6B parameters x 12 bytes" in target["verdict"] and "more than the 15.75 GiB" in target["verdict"]
    # What would divide it, each with the same arithmetic: bf16 weights and moments halve it (still 6x too much);
    # 70.6B x 12 bytes over 15.75 GiB needs 51 devices: the smallest v5e slice Cloud TPU offers with as many is
    # v5litepod-64. fsdp already spans the slice, so no "more fsdp".
    verdict = target["verdict"]
    assert f"--weight-dtype bfloat16 (MaxText's weight_dtype): {fmt_bytes(target['state_bytes_per_chip'] // 2)}" \
        in verdict and "(still too much)" in verdict
    at_64 = re.search(r"with v5litepod-64 \(64 devices\), fsdp over them: ([\d.]+) GiB per device", verdict)
    assert at_64 and float(at_64.group(1)) * 2**30 == pytest.approx(parameters * 12 / 64, rel=0.005)
    assert "more fsdp" not in verdict and "--mesh" not in verdict
    # A bf16 first moment (MaxText's mu_dtype) is 10 bytes a parameter: still too much, so nothing is compiled.
    assert f"--mu-dtype bfloat16 (MaxText's mu_dtype): {fmt_bytes(target['state_bytes_per_chip'] * 10 // 12)} per " \
        "device (still too much)" in verdict


def test_the_state_sentence_says_which_weights_the_expert_axis_divides(tmp_path):
    """Mixtral 8x22B over fsdp=2 x expert=4: the experts' weights are divided 8 ways, the rest 2 ways; the sentence
    says so rather than '8 ways' for all 140.6B parameters (which would be 197.5 GiB, not the 218.84 given)."""
    document = preflight(tmp_path, "--model", "mixtral-8x22b", "--tpu", "v5e-8", "--mesh", "fsdp=2,expert=4",
                         "--seq", "4096", "--batch-per-chip", "1")
    target = document["targets"][0]
    assert target["compiles"] == 0 and target["state_bytes_per_chip"] > target["model"]["parameters"] * 12 / 8
    assert "sharded 2 ways over fsdp x tensor, the experts' weights 8 ways with expert" in target["verdict"]
    # The larger slice keeps the expert axis, and says with which mesh.
    assert "v5litepod-128 (128 devices), fsdp over them (--mesh fsdp=32,expert=4)" in target["verdict"]


def test_on_one_device_the_state_is_said_to_be_whole(tmp_path):
    """Llama 3.1 8B on v5litepod-1: nothing divides the state ("sharded 1 ways" read as a division), and no compile."""
    verdict = preflight(tmp_path, "--model", "llama3.1-8b", "--tpu", "v5litepod-1", "--seq", "2048",
                        "--batch-per-chip", "1")["targets"][0]["verdict"]
    assert "fp32 weights and two fp32 moments, whole on each device (fsdp x tensor: 1))" in verdict, verdict
    assert "1 ways" not in verdict


def test_the_larger_slice_is_named_as_cloud_tpu_names_it(tmp_path):
    """Llama 4 Scout on v5p-8 (4 chips): 107.8B x 12 bytes over v5p's 95.74 GiB needs 13 devices; a v5p name counts
    TensorCores, two a chip (https://cloud.google.com/tpu/docs/v5p), so the 16-device slice is v5p-32, not v5p-16."""
    document = preflight(tmp_path, "--model", "llama4-scout", "--tpu", "v5p-8", "--seq", "2048",
                         "--batch-per-chip", "1")
    verdict = document["targets"][0]["verdict"]
    assert document["targets"][0]["compiles"] == 0
    assert "with v5p-32 (16 devices), fsdp over them" in verdict, verdict


def test_a_bf16_first_moment_is_in_the_state_and_its_words(tmp_path):
    """--mu-dtype bfloat16 (MaxText's mu_dtype): fp32 weights and second moment, bf16 first moment, 10 bytes a
    parameter, in the figure and the sentence; bf16 weights then take the first moment with them (6 bytes)."""
    document = preflight(tmp_path, "--model", "llama3.1-70b", "--tpu", "v5e-8", "--seq", "8192",
                         "--batch-per-chip", "1", "--mu-dtype", "bfloat16")
    target = document["targets"][0]
    parameters = target["model"]["parameters"]
    assert target["model"]["mu_dtype"] == "bfloat16"
    assert target["state_bytes_per_chip"] == pytest.approx(parameters * 10 / 8, rel=0.001)
    assert (f"{parameters / 1e9:.1f}B parameters x 10 bytes: fp32 weights, a bf16 first moment and an fp32 second "
            "moment") in target["verdict"]
    assert f"--weight-dtype bfloat16 (MaxText's weight_dtype): {fmt_bytes(target['state_bytes_per_chip'] * 6 // 10)}" \
        in target["verdict"]


@pytest.mark.slow
def test_a_bf16_first_moment_is_offered_where_its_compile_fits(llm_cache, tmp_path):
    """1,650 of the tiny layers (975M parameters) at one 256-token sequence on v5litepod-1: the fp32 weights and
    AdamW state (10.9 GiB) fit the 15.75 GiB, the step does not (its layout alone, 16.5 GiB). With AdamW's first
    moment in bf16 (--mu-dtype bfloat16, the TPU7x recipes' setting) it does: preflight compiles that step at the same
    batch up to its memory layout and offers the change with what the two layouts measure; the run with --mu-dtype
    bfloat16 compiles it to the end, and it fits. (With --full the first compile runs to the end, and libtpu refuses
    it with no layout to weigh a change against.)"""
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, num_hidden_layers=1650)))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v5litepod-1", "--seq", "256", "--batch-per-chip", "1")
    target = preflight(llm_cache, *args)["targets"][0]
    assert target["fits"] is False and target["state_bytes_per_chip"] < target["hbm_capacity_bytes"]
    assert target["compiles"] == 2  # both stopped at their layouts
    fixes = target["memory"]["suggestions"]
    fix = fixes[0]
    assert fix["code"] == "--mu-dtype bfloat16" and fix["severity"] == "improve" and fix["confidence"] == "measured"
    layout = target["required_bytes"] - fix["saving_bytes"]  # the two layouts' difference
    assert (f"the step needs at least {fmt_bytes(layout)} of the 15.75 GiB of HBM: the layout fits, and code "
            "generation adds to it; `--full` compiles it to the end.") in fix["message"]
    assert f"{fmt_bytes(target['required_bytes'])} (its layout, a lower bound) as it is, " \
        f"{fmt_bytes(layout)} (its memory layout: a lower bound) with --mu-dtype bfloat16" in fix["evidence"]
    changed = preflight(llm_cache, *args, "--mu-dtype", "bfloat16")["targets"][0]
    assert changed["fits"] is True and changed["compiles"] == 1 and changed["required_bytes"] >= layout
    # Computed, the state shrinks by 2 bytes a parameter; the compile frees less (its temporaries grow).
    state_saved = target["state_bytes_per_chip"] - changed["state_bytes_per_chip"]
    assert state_saved == pytest.approx(target["model"]["parameters"] * 2, rel=0.001)
    assert fmt_bytes(state_saved) in fix["evidence"] and fix["saving_bytes"] != state_saved
    # At one sequence per device no smaller batch exists: the memory advice read the stacked per-layer norm scales
    # ([1650, 256]) as a batch of 1,650 and offered "a batch of about 1,584".
    assert not [f for f in fixes if f["kind"] == "batch_size"], fixes
    # --max-batch: none fits, and the verdict says which change makes one fit: the changed step's whole compile,
    # cached by the run above, answers its check (a whole compile answers a layout's question).
    searched = preflight(llm_cache, *args[:-2], "--max-batch")["targets"][0]
    assert searched["max_batch_size"] is None and searched["compiles"] == 0
    assert searched["verdict"] == (
        f"does not fit even at batch 1: the weights and AdamW state alone are {fmt_bytes(target['argument_bytes'])} "
        f"(the step needs {fmt_bytes(target['required_bytes'])} of 15.75 GiB). With --mu-dtype bfloat16 it fits: "
        f"compiled so at batch 1, the step needs {fmt_bytes(changed['required_bytes'])}.")


def test_parameters_a_mesh_axis_cannot_divide_are_said_with_the_mesh_that_does(tmp_path):
    """A 49B model of hidden size 7,168 (7 x 1,024) on v5p-4096 (2,048 devices): JAX shards a dimension only evenly,
    so fsdp=2048 divides none of its weights and each device would hold them whole. preflight says so without
    compiling, names the parameters, and gives the mesh that divides them all (fsdp=1024, the rest data)."""
    config = {"model_type": "qwen2", "hidden_size": 7168, "intermediate_size": 28672, "num_hidden_layers": 64,
              "num_attention_heads": 56, "num_key_value_heads": 8, "vocab_size": 151936, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    document = preflight(tmp_path, "--model", str(tmp_path / "config.json"), "--tpu", "v5p-4096", "--seq", "2048",
                         "--batch-per-chip", "1")
    target = document["targets"][0]
    assert target["fits"] is False and target["compiles"] == 0
    unsharded = target["unsharded"]
    assert unsharded["parameters"] == ["embed", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head"]
    assert unsharded["dimensions"] == {"fsdp": [7168]} and unsharded["mesh"] == "data=2,fsdp=1024"
    # Every weight but the norms and Qwen2's q/k/v biases (kept whole by design) has the hidden dimension on the
    # fsdp axis: an even split would keep 4 of its 7,168 rows (ceil(7168 / 2048)) per device; each device keeps
    # them all.
    parsed = llm.parse_config(config, "c", "c")
    whole_by_design = (2 * 64 + 1) * 7168 + 64 * (7168 + 2 * 1024)
    weights = parsed.parameter_count() - whole_by_design
    assert unsharded["state_bytes_per_chip"] == (weights - weights * 4 // 7168) * 12
    assert target["state_bytes_per_chip"] == parsed.parameter_count() * 12
    assert "sharded 2048 ways" not in target["verdict"]
    assert target["verdict"].endswith("--mesh data=2,fsdp=1024 divides them.")
    assert llm.unsharded(parsed, llm.parse_mesh("data=2,fsdp=1024", 2048)) is None
    # The report says how much stays whole per chip, and the mesh that divides it, in the slice's verdict.
    saved = tmp_path / "preflight.json"
    saved.write_text(json.dumps(document))
    page = run_cli("report", saved, "-o", tmp_path / "report.html")
    assert page.returncode == 0, page.stderr
    html = (tmp_path / "report.html").read_text()
    assert "549.04 GiB" in html and "--mesh data=2,fsdp=1024 divides them." in html
    # Nothing to say where the mesh divides every weight (Llama 3.1 8B on the same slice).
    eight = llm.load_config("llama3.1-8b")[0]
    assert llm.unsharded(eight, llm.parse_mesh(None, 2048)) is None
    # An expert axis larger than the experts: the experts' weights stay whole along it.
    mixtral = llm.load_config("mixtral-8x7b")[0]
    found = llm.unsharded(mixtral, llm.parse_mesh("fsdp=16,expert=16", 256))
    assert found.parameters == ["we_gate", "we_up", "we_down"] and found.dimensions == {"expert": [8]}
    assert found.mesh == "data=2,fsdp=16,expert=8"


@pytest.mark.parametrize("args,says", [
    (["--model", "llama3.1-8b", "--tpu", "v6e-16", "--mesh", "fsdp=3", "--batch-per-chip", "1"],
     "--mesh 'fsdp=3' has 3 devices, the slice has 16"),
    (["--model", "llama3.1-8b", "--tpu", "v6e-16", "--mesh", "fsdp=-1,tensor=3", "--batch-per-chip", "1"],
     "the other axes (3) do not divide the slice's 16 devices"),
    (["--model", "llama3.1-8b", "--tpu", "v6e-16", "--mesh", "model=4", "--batch-per-chip", "1"],
     "axes data, fsdp, tensor, expert"),
    (["--model", "llama9-1b", "--tpu", "v6e-16", "--batch-per-chip", "1"], "unknown model 'llama9-1b'"),
    (["--model", "llama3.1-8b", "--tpu", "v6e-16"], "give one of --batch-per-chip N, --global-batch N or --max-batch"),
    (["--model", "llama3.1-8b", "--tpu", "v6e-16", "--global-batch", "24"], "not a multiple of the 16 devices"),
    (["--model", "llama3.1-8b", "--tpu", "v6e-16", "--batch-per-chip", "1", "--remat", "all"],
     "--remat all searches the largest batch of each policy"),
    (["--model", "llama3.1-8b", "--tpu", "tpu7x-8", "--batch-per-chip", "1"], "must be a multiple of 2"),
])
def test_bad_model_options_are_one_sentence_and_exit_2(tmp_path, args, says):
    result = run_cli("preflight", *args, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir()) or not any((tmp_path / "tpuprof" / "preflight").glob("*.json"))


def test_the_built_in_configs_have_their_published_sizes():
    """Parameter counts of this definition against the model cards (billions)."""
    published = {"llama2-7b": 6.74, "llama2-70b": 68.98, "llama3.1-8b": 8.03, "llama3.1-405b": 405.85,
                 "mistral-7b": 7.25, "qwen2.5-7b": 7.62, "qwen3-8b": 8.19, "gemma2-9b": 9.24, "gemma2-27b": 27.23,
                 "mixtral-8x7b": 46.70, "mixtral-8x22b": 140.6, "qwen3-30b-a3b": 30.53}
    for name, billions in published.items():
        config, _ = llm.load_config(name)
        assert config.parameter_count() / 1e9 == pytest.approx(billions, rel=0.005), name


def test_mesh_parsing():
    assert llm.parse_mesh("fsdp=-1,tensor=4", 256) == {"data": 1, "fsdp": 64, "tensor": 4, "expert": 1}
    assert llm.parse_mesh(None, 8) == {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    assert llm.parse_mesh("data=2,fsdp=2,expert=2", 8) == {"data": 2, "fsdp": 2, "tensor": 1, "expert": 2}


def test_a_factory_taking_mesh_gets_the_named_axes_over_the_whole_slice(tmp_path):
    """`--tpu v5e-16 --mesh fsdp=-1,tensor=4`: the factory's Mesh is 16 devices with MaxText's axis names; a
    weight sharded over fsdp x tensor puts 1/16 on each device, the batch over fsdp a quarter."""
    spec = tmp_path / "sharded.py"
    spec.write_text(
        "def factory(batch_size, mesh):\n"
        "    import jax, jax.numpy as jnp\n"
        "    from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "    assert mesh.axis_names == ('data', 'fsdp', 'tensor', 'expert') and mesh.devices.size == 16\n"
        "    def step(w, x):\n"
        "        return jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)\n"
        "    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P('fsdp', 'tensor')))\n"
        "    x = jax.ShapeDtypeStruct((4 * batch_size, 1024), jnp.float32, sharding=NamedSharding(mesh, P('fsdp')))\n"
        "    return step, (w, x)\n")
    document = preflight(tmp_path / "cache", f"{spec}:factory", "--tpu", "v5e-16", "--mesh", "fsdp=-1,tensor=4",
                         "--batch", "256")
    target = document["targets"][0]
    assert target["slice"] == {"name": "v5litepod-16", "topology": "v5e:4x4", "chips": 16, "devices": 16}
    assert target["argument_bytes"] == 1024 * 1024 * 4 // 16 + 256 * 1024 * 4
    assert (target["batch_per_chip"], target["global_batch"]) == (256, 256 * 16)
    bad = run_cli("preflight", f"{spec}:factory", "--tpu", "v5e-16", "--mesh", "fsdp=5", "--batch", "8",
                  env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert bad.returncode == 2 and "has 5 devices, the slice has 16" in bad.stderr and "Traceback" not in bad.stderr


def test_the_python_api_takes_the_same_options(tmp_path, monkeypatch):
    import tpuprof

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = tpuprof.preflight(model="llama3.1-70b", tpu="v5e-8", seq=8192, batch_per_chip=1)
    cli = preflight(tmp_path, "--model", "llama3.1-70b", "--tpu", "v5e-8", "--seq", "8192", "--batch-per-chip", "1")
    assert result.to_dict()["targets"] == cli["targets"] and not result.fits
    with pytest.raises(tpuprof.UserError, match="model="):
        tpuprof.preflight(lambda x: x, tpu="v5e", model="llama3.1-8b", batch_per_chip=1)


def test_the_api_and_the_cli_give_one_document_for_the_same_options(tiny_document, llm_cache, monkeypatch):
    """The same question by keyword and by flag is one PreflightOptions, so one document (the API's compiles are
    the CLI run's, from the session's cache); the API's answer is typed: slices, compiles, estimates."""
    import tpuprof

    monkeypatch.setenv("XDG_CACHE_HOME", str(llm_cache))
    source = tiny_document["targets"][0]["model"]["source"]
    result = tpuprof.preflight(model=source, tpu=["v6e-16", "v6e-64", "2xv6e-16"], seq=256, batch_per_chip=2)
    document = result.to_dict()

    def without_compiles(doc: dict) -> dict:
        return {**doc, "targets": [{k: v for k, v in t.items() if k != "compiles"} for t in doc["targets"]]}

    assert without_compiles(document) == without_compiles(tiny_document)
    assert [t.compiles for t in result.targets] == [0, 0, 0]
    for target, entry in zip(result.targets, document["targets"]):
        assert target.slice.to_json() == entry["slice"] and target.global_batch == entry["global_batch"]
        assert target.compiled.required_bytes == entry["required_bytes"] > 0
        assert target.compiled.figures.temp_bytes == entry["temp_bytes"]
        assert round(target.estimate.step.point_s * 1e3, 4) == entry["estimate"]["step_ms"]
        assert target.estimate.tokens_per_s == pytest.approx(entry["estimate"]["tokens_per_s"], abs=0.5)


def test_the_layer_inputs_remat_keeps_are_divided_over_the_tensor_axis(llm_cache, tmp_path):
    """MaxText shards the residual stream's embedding over `tensor` (base.yml: activation_embed -> tensor), so with
    --remat full each device keeps 1/tensor of every layer's input. Kept whole, every device of a tensor group
    held the same full-width copy: the published GPT-3 175B run on v5p-1024 (fsdp 64 x tensor 8, 4 sequences of
    2,048 per chip) was laid out in 160.4 GiB per device, 144 GiB of it the 96 layers' inputs, and said not to
    fit the 95.7 GiB it trains in (34.0 GiB with them divided). Here a small GPT-3 on v5e-4 over fsdp 2 x tensor 2
    at a batch whose layout cannot fit (the compile stops there): the stack of saved layer inputs, the largest
    buffer, is [layers, sequences per device, seq, hidden / 2]."""
    config = {"model_type": "gpt2", "vocab_size": 512, "n_embd": 256, "n_layer": 6, "n_head": 2, "n_positions": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    target = preflight(tmp_path / "cache", "--model", str(tmp_path / "config.json"), "--tpu", "v5e-4", "--mesh",
                       "fsdp=2,tensor=2", "--seq", "128", "--batch-per-chip", "16384")["targets"][0]
    assert target["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 1}
    assert not target["fits"] and target["fast"]["stage"] == "buffer_assignment"
    sequences = 16384 * 4 // 2  # the global batch over fsdp; the tensor axis' devices share theirs
    stack = f"bf16[6,{sequences},128,{256 // 2}]"
    largest = target["memory"]["buffers"][0]
    assert largest["shape"].startswith(stack), largest["shape"]
    assert largest["size_bytes"] == 6 * sequences * 128 * 128 * 2
    whole = f"bf16[6,{sequences},128,256]"
    assert not any(b["shape"].startswith(whole) for b in target["memory"]["buffers"])


def test_a_step_that_does_not_fit_has_no_step_time_mfu_or_cost(llm_cache, tmp_path):
    """A step that does not fit cannot run: it has no step time, throughput, MFU or cost (MaxText stops at the out of
    memory error). Llama 3.1 8B on v5litepod-8 at one 8k sequence per chip (a layout of 19.75 GiB for 15.75 GiB)
    was given a 3.66 s step, 58.5% MFU and $0.15 per 1M tokens. The small GPT-3 step of the test above, whose layout
    cannot fit: no estimate in the JSON, the table or Markdown; a document of an earlier tpuprof that holds one for
    such a step is read back without it."""
    from tpuprof.presentation.preflight import ESTIMATE_TITLE, section
    from tpuprof.presentation.model import Fact, Table
    from tpuprof.renderers.printers import markdown

    config = {"model_type": "gpt2", "vocab_size": 512, "n_embd": 256, "n_layer": 6, "n_head": 2, "n_positions": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    document = preflight(llm_cache, "--model", str(tmp_path / "config.json"), "--tpu", "v5e-4", "--mesh",
                         "fsdp=2,tensor=2", "--seq", "128", "--batch-per-chip", "16384")
    target = document["targets"][0]
    assert target["fits"] is False and target["dump_dir"]  # the compile's dump is there to time
    assert "estimate" not in target

    def shown(document_):
        page = section(document_)
        text = "\n".join(markdown(page))
        tables = [b for b in page.blocks if isinstance(b, Table) and b.title == ESTIMATE_TITLE]
        facts = [b for b in page.blocks if isinstance(b, Fact) and "MFU" in b.label]
        return text, tables, facts

    text, tables, facts = shown(document)
    assert not tables and not facts and "MFU" not in text and "step time" not in text
    # No change of its state makes room for the activations of 16,384 sequences per device, nor does a larger slice:
    # the fixes say so (they were silent), with the arithmetic.
    (larger,) = [f for f in target["memory"]["suggestions"] if f["kind"] == "sharding"]
    assert larger["message"].startswith("No larger v5e slice makes room for this step at batch 16384 per device by "
                                        "the state arithmetic: even on the largest, v5litepod-256 (256 devices)")
    assert "(its memory layout: a lower bound)" in larger["evidence"] and larger["severity"] == "info"
    # An earlier tpuprof's document, with an estimate for this step, beside a slice that fits.
    fitting = {**target, "fits": True, "verdict": None, "slice": {**target["slice"], "name": "v5e-8"}}
    earlier = {"targets": [{**target, "estimate": _AN_ESTIMATE}, {**fitting, "estimate": _AN_ESTIMATE}]}
    text, tables, facts = shown(earlier)
    (table,) = tables
    step = next(row for row in table.rows if row[0] == "step time (band)")
    assert step[1] == "none: it does not fit" and step[2] != step[1]
    mfu = next(row for row in table.rows if row[0] == "MFU")
    assert mfu[1] == "-" and mfu[2] == "58%"
    assert [f.label for f in facts] == ["v5e-8 MFU 58%"]


@pytest.mark.compile
def test_the_batch_fix_counts_the_sequences_the_tensor_axis_repeats(tmp_path):
    """The small GPT-3 above over fsdp 2 x tensor 2 at 16,384 sequences per device: each device's program holds
    32,768 (the tensor axis' devices share theirs). The memory advice read 32,768 from the token ids, the step's own
    batch said 16,384, and the fix was replaced by '--max-batch finds ...', its arithmetic dropped. It is kept, in
    sequences per device."""
    config = {"model_type": "gpt2", "vocab_size": 512, "n_embd": 256, "n_layer": 6, "n_head": 2, "n_positions": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    target = preflight(tmp_path / "cache", "--model", str(tmp_path / "config.json"), "--tpu", "v5e-4", "--mesh",
                       "fsdp=2,tensor=2", "--seq", "128", "--batch-per-chip", "16384")["targets"][0]
    (fix,) = [f for f in target["memory"]["suggestions"] if f["kind"] == "batch_size"]
    assert "read as a batch of 32768" not in fix["evidence"], fix
    assert "the 32,768 sequences each device's program holds (16,384 per device, repeated over tensor=2)" \
        in fix["message"], fix["message"]
    per_device = int(re.search(r"about ([\d,]+) sequences per device fit", fix["message"]).group(1).replace(",", ""))
    in_program = int(re.search(r"\(([\d,]+) in each device's program\)", fix["message"]).group(1).replace(",", ""))
    assert per_device == in_program // 2 and 1 <= per_device < 16384
    # The batch the fix names is compiled (a layout compile), as the user's step's is: the arithmetic said it fits,
    # its layout alone is over the HBM.
    assert fix["confidence"] == "measured" and fix["severity"] == "improve", fix
    assert f"Compiled at batch {per_device}, the step needs at least " in fix["message"]
    assert fix["message"].endswith("it still does not fit; `--max-batch` finds one that does.")
    assert fix["evidence"].startswith("measured: compiled at batch 16384 the step needs ")
    assert fix["evidence"].count("(its memory layout: a lower bound)") == 2
    assert target["compiles"] == 2  # the step's and the fix's check (a cache of its own: both compiled here)


def test_a_step_no_state_change_makes_fit_is_given_the_smallest_larger_slice_that_does():
    """A step whose weights and AdamW state fit, and whose shortfall no change of that state covers, had no fix at all.
    Its fix is the smallest larger slice of the generation whose devices divide the state enough, by the state
    arithmetic. The figures of a compile: 4,250 of the tiny layers (2.51B parameters) in bf16 weights and moments at
    one 256-token sequence on v5litepod-1 laid out in 20.25 GiB, 14.02 GiB of it the state, for 15.75 GiB. v5e has no
    2-chip slice: on v5litepod-4 the state is 3.51 GiB a chip and the step 9.75 GiB (compiled so, it fits in 5.74 GiB:
    the arithmetic keeps the gradients and temporaries whole, an upper bound of the rest)."""
    from tpuprof import slices
    from tpuprof.advice import llm_step
    from tpuprof.analyses import preflight_step
    from tpuprof.models.preflight import TrainingState

    config = llm.parse_config(dict(TINY, num_hidden_layers=4250), "deep", "deep")
    state, chosen, needed = TrainingState("bfloat16"), slices.parse("v5litepod-1"), 21748511744
    sizes = {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}
    here = llm.state_bytes_per_device(config, sizes, state)
    assert here == config.parameter_count() * 6 < chosen.target.compiler_hbm_bytes < needed
    found, largest = preflight_step.larger_slices(config, sizes, state, chosen, needed)
    assert found[0].name == "v5litepod-4" and found[1] == llm.state_bytes_per_device(config, {**sizes, "fsdp": 4},
                                                                                       state)
    assert largest[0].name == "v5litepod-256"
    fix = llm_step.larger_slice(chosen, 1, needed, True, here, found, largest, chosen.target.compiler_hbm_bytes)
    assert fix.code == "--tpu v5litepod-4" and fix.severity == "blocking" and fix.confidence == "estimated"
    assert fix.saving_bytes == here - found[1]
    assert (f"so the step at batch 1 per device needs {fmt_bytes(here - found[1])} less: "
            f"{fmt_bytes(needed - here + found[1])} of the 15.75 GiB of HBM by the state arithmetic") in fix.message
    assert fix.message.endswith("(not compiled: `tpuprof preflight --tpu v5litepod-4` checks it).")
    # The arithmetic keeps the gradients (bf16, one per parameter) whole, and fsdp divides them: the fix says by how
    # much it errs high (9.75 GiB said, 5.74 compiled): 3.50 GiB of gradients less, about 6.24 GiB.
    gradients = config.parameter_count() * 2
    fix = llm_step.larger_slice(chosen, 1, needed, True, here, found, largest, chosen.target.compiler_hbm_bytes,
                                gradients_here=gradients,
                                divided=preflight_step.larger_slices(config, sizes, state, chosen, needed, True)[0])
    overcounted = gradients - gradients * found[1] // here
    assert fmt_bytes(overcounted) == "3.50 GiB" and fmt_bytes(needed - here + found[1] - overcounted) == "6.24 GiB"
    assert fix.message.endswith(f"The arithmetic errs high: it keeps the gradients whole ({fmt_bytes(gradients)} per "
                                "device here), which fsdp divides as it does the weights, 3.50 GiB less on "
                                "v5litepod-4: about 6.24 GiB with them divided, less where temporaries shrink too.")
    # Twice the need: not even the largest slice makes room, and the fix says so.
    found, largest = preflight_step.larger_slices(config, sizes, state, chosen, 2 * needed)
    assert found is None and largest[0].name == "v5litepod-256"
    # Just beyond what any slice makes room for by the arithmetic: with the gradients divided too, one does.
    over = here + chosen.target.compiler_hbm_bytes + (2 << 30)
    found, largest = preflight_step.larger_slices(config, sizes, state, chosen, over)
    divided, _ = preflight_step.larger_slices(config, sizes, state, chosen, over, gradients=True)
    assert found is None and divided[0].name == "v5litepod-8"
    fix = llm_step.larger_slice(chosen, 1, over, True, here, found, largest, chosen.target.compiler_hbm_bytes,
                                gradients_here=gradients, divided=divided)
    assert fix.message.startswith("No larger v5e slice makes room") and fix.message.endswith(
        f"With the gradients ({fmt_bytes(gradients)} per device here) divided too, as fsdp divides them, v5litepod-8 "
        "(8 devices) would: `tpuprof preflight --tpu v5litepod-8` checks it.")


# What an earlier tpuprof wrote for Llama 3.1 8B on v5litepod-8 at one 8k sequence per chip, which does not fit.
_AN_ESTIMATE = {"step_ms": 3660.0298, "step_ms_low": 3000.0, "step_ms_high": 4000.0, "examples_per_s": 0.27,
                "tokens_per_s": 2238, "tokens_per_s_per_chip": 2238, "mfu_percent": 58.5,
                "mfu_source": "model FLOPs (MaxText's count)", "cost_per_million_tokens": 0.1489,
                "price_per_chip_hour": 1.2, "price_verified": True}


@pytest.mark.subprocess
@pytest.mark.compile
def test_a_terminal_sees_the_layout_before_the_code_is_generated(tmp_path):
    """On a terminal, a --model compile whose memory layout may fit prints that layout while libtpu goes on to
    generate code (minutes on a large step); the verdict follows. The figure is the layout's, read from the
    compile's dump. A fresh cache: a cached step has no layout to show."""
    import os
    import pty
    import subprocess
    import sys

    from conftest import ROOT

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    primary, secondary = pty.openpty()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "200", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", "preflight", "--model", str(tmp_path / "config.json"),
                                "--tpu", "v5e-4", "--seq", "128", "--batch-per-chip", "1"],
                               cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal's other side closed: the process ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert process.wait(timeout=600) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    from tpuprof.sources import tpu_compile
    from tpuprof.units import fmt_bytes

    (proto,) = (tmp_path / "cache").glob("tpuprof/preflight/*-layout/*.after_optimizations.hlo.pb")
    layout = fmt_bytes(tpu_compile.layout_hbm_bytes(tpu_compile.layout_figures(proto)))
    assert (f"batch 1: memory laid out at {layout} of 15.75 GiB per device before code generation (which changes "
            f"it, most often upward); compiling to the end for the verdict") in " ".join(screen.split()), screen[-3000:]
    assert screen.index("memory laid out at") < screen.index("fits (")


@pytest.mark.subprocess
@pytest.mark.compile
def test_libtpu_aborting_a_whole_compile_is_one_sentence(tmp_path):
    """libtpu aborts the process on a failed check (here: no scoped HBM for the FSDP reduce-scatter, a flag a job may
    set). --full compiles in a child process too, so the user reads libtpu's fatal line, exit 2, never Python's
    "Fatal Python error: Aborted" with a stack, and no half-written dump is left in the cache."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    cache = tmp_path / "cache"
    result = run_cli("preflight", "--model", tmp_path / "config.json", "--tpu", "v5e-4", "--seq", "128",
                     "--batch-per-chip", "1", "--full", timeout=600,
                     env={"XDG_CACHE_HOME": str(cache), "LIBTPU_INIT_ARGS": "--xla_tpu_scoped_hbm_for_all_reduce=0"})
    assert result.returncode == 2, result.stderr
    assert "libtpu stopped (signal 6): Check failed: all_buffers_chunks <= max_hbm_usage_in_chunks_" in result.stderr
    assert "Fatal Python error" not in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert not [p for p in (cache / "tpuprof" / "preflight").glob("*") if p.is_dir()]


def _loop_carried(dump_dir: str) -> list[tuple[str, tuple]]:
    """(dtype, dimensions) of every array the compiled step's while loops (the scanned layers, forward and
    backward) carry from one iteration to the next, read from the program the compile kept."""
    from pathlib import Path

    from tpuprof import protos
    from tpuprof.sources import hlo_dump

    proto = hlo_dump.read_hlo_proto(next(Path(dump_dir).glob("*.after_codegen.hlo.pb")))
    name = protos.xla_data_pb2().PrimitiveType.Name
    return [(name(part.element_type), tuple(part.dimensions)) for computation in proto.hlo_module.computations
            for instruction in computation.instructions if instruction.opcode == "while"
            for part in instruction.shape.tuple_shapes]


@pytest.mark.slow
def test_bf16_gradients_are_cast_before_the_optimizer_as_maxtexts_grad_dtype(llm_cache, tmp_path):
    """--grad-dtype bfloat16 (MaxText's grad_dtype: train.py casts the fp32 gradients right after value_and_grad,
    before the optimizer). 8 scanned 512-wide layers on one v5e chip, fp32 weights: with fp32 gradients the
    backward loop carries each stacked matmul weight's gradient in fp32; cast, libtpu moves the cast into that loop
    and it carries them in bf16, and the compiler's temporaries shrink by at least those 2 bytes a parameter
    (measured 8 Dec with the loss in two rematerialised pieces: 148.2 -> 66.7 MiB). The weights and AdamW state,
    the arguments, stay as they were. The loss is pinned to two pieces: in one (MaxText's untiled loss, which
    tpuprof builds for one piece since 7 Dec) libtpu packs both tighter, 103.0 -> 58.0 MiB, 45 MiB apart where
    the gradients' 2 bytes a parameter are 60 MiB, though the loop carries them in bf16 all the same."""
    config = dict(TINY, hidden_size=512, intermediate_size=2048, num_hidden_layers=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v5litepod-1", "--seq", "256", "--batch-per-chip", "1",
            "--vocab-tiling", "2")
    fp32, bf16 = (preflight(llm_cache, *args, *more)["targets"][0] for more in ((), ("--grad-dtype", "bfloat16")))
    assert "grad_dtype" not in fp32["model"] and bf16["model"]["grad_dtype"] == "bfloat16"
    assert fp32["argument_bytes"] == bf16["argument_bytes"]
    layers, d, f = 8, 512, 2048
    stacked = {(layers, d, f), (layers, f, d)}  # w_gate, w_up and w_down, stacked over the scanned layers
    carried = {name: [dtype for dtype, dims in _loop_carried(target["dump_dir"]) if dims in stacked]
               for name, target in (("fp32", fp32), ("bf16", bf16))}
    assert carried["fp32"].count("F32") >= 3, carried  # the three gradients
    assert "F32" not in carried["bf16"] and carried["bf16"].count("BF16") >= carried["fp32"].count("BF16") + 3, carried
    scanned = layers * (3 * d * f + 2 * d * d + 2 * d * d // 2)  # the MLP; wq and wo; wk and wv (2 of 4 heads)
    assert fp32["temp_bytes"] - bf16["temp_bytes"] >= 2 * scanned, (fp32["temp_bytes"], bf16["temp_bytes"])


@pytest.mark.slow
def test_bf16_gradients_are_offered_where_the_first_moment_is_bf16_already_and_the_compile_fits(llm_cache, tmp_path):
    """1,850 of the tiny layers (1.09B parameters) at one 256-token sequence on v5litepod-1 with AdamW's first
    moment in bf16 already (--mu-dtype bfloat16): the state (10.18 GiB) fits the 15.75 GiB, the step does not (its
    layout, 16.51 GiB). The next smaller change is MaxText's grad_dtype: the gradients are not state, so the state
    arithmetic is unchanged, and their own arithmetic (2 bytes a parameter less) covers the shortfall. preflight
    compiles the step so changed up to its memory layout, which fits (14.70 GiB whole): the fix says what the two
    layouts measure, and that code generation adds to the second. Two compiles, both stopped at their layouts (the
    changed step's code generation is what --full pays for): the run with --grad-dtype bfloat16 lays out the same."""
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, num_hidden_layers=1850)))
    args = ("--model", str(tmp_path / "config.json"), "--tpu", "v5litepod-1", "--seq", "256", "--batch-per-chip", "1",
            "--mu-dtype", "bfloat16")
    target = preflight(llm_cache, *args)["targets"][0]
    assert target["fits"] is False and target["state_bytes_per_chip"] < target["hbm_capacity_bytes"]
    assert target["compiles"] == 2
    fix = target["memory"]["suggestions"][0]
    assert fix["code"] == "--grad-dtype bfloat16" and fix["severity"] == "improve" and fix["confidence"] == "measured"
    layout = target["required_bytes"] - fix["saving_bytes"]  # the two layouts' difference
    assert 0 < layout < target["hbm_capacity_bytes"]
    assert (f"Compiled so up to its memory layout at batch 1 per device, the step needs at least {fmt_bytes(layout)} "
            "of the 15.75 GiB of HBM: the layout fits, and code generation adds to it; `--full` compiles it to the "
            "end.") in fix["message"]
    gradients = target["model"]["parameters"] * 2  # one chip: every parameter's gradient, 4 bytes -> 2
    assert f"{fmt_bytes(target['required_bytes'])} (its layout, a lower bound) as it is, " \
        f"{fmt_bytes(layout)} (its memory layout: a lower bound) with --grad-dtype bfloat16; the gradients' " \
        f"arithmetic (2 bytes a parameter instead of 4): {fmt_bytes(gradients)} less per device" in fix["evidence"]
    # No larger slice is offered for a change whose layout fits: only the whole compile could say it is not enough.
    assert not [f for f in target["memory"]["suggestions"] if f["kind"] == "sharding"]


def test_the_jobs_libtpu_flags_win_over_tpuprofs_defaults(monkeypatch):
    """A compile's own options override LIBTPU_INIT_ARGS, so the TPU7x recipes' scheduler memory limit of 150% gave
    way to tpuprof's default of 100%: a flag the job's variable names is left to it. (The Gemma 4 26B-A4B tpu7x-128
    recipe's step lays out in 120.6 GiB with tpuprof's flags alone, in 89.06 GiB with the recipe's three scheduler
    flags in LIBTPU_INIT_ARGS, 7 Dec 2026.)"""
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    assert llm.compiler_options("v6e")["xla_tpu_scheduler_percent_shared_memory_limit"] == 100
    monkeypatch.setenv("LIBTPU_INIT_ARGS", " --xla_tpu_scheduler_percent_shared_memory_limit=150  --xla_foo=1")
    options = llm.compiler_options("v6e")
    assert "xla_tpu_scheduler_percent_shared_memory_limit" not in options
    assert options["xla_tpu_scoped_vmem_limit_kib"] == 98304 and options["xla_enable_async_all_gather"] is True
