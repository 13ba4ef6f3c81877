"""preflight's options (tpuprof.models.preflight): one validation for the command line and the Python API, whose
errors name what the caller wrote: a keyword argument (`batch_per_chip=`) for `tpuprof.preflight()`, a flag
(`--batch-per-chip`) on the command line. No compile: every case fails before one.
"""

from __future__ import annotations

import pytest

import tpuprof
from conftest import run_cli
from tpuprof.models.preflight import FLAGS, PreflightOptionError, preflight_options

STEP = "sample_profiles/models/mlp.py:factory"
LLM = {"model": "llama3.1-8b", "tpu": "v6e-16"}

# (the option at fault, the API's keywords, the command line's arguments): each wrong in that option alone.
CASES = [
    ("tpu", dict(fn_or_model=STEP, tpu="v9z", batch=8), [STEP, "--tpu", "v5e,v9z", "--batch", "8"]),
    ("tpu", dict(fn_or_model=STEP, tpu=" , ", batch=8), [STEP, "--tpu", ",", "--batch", "8"]),
    ("batch", dict(fn_or_model=STEP, tpu="v5e", batch=0), [STEP, "--tpu", "v5e", "--batch", "0"]),
    ("batch", dict(fn_or_model=STEP, tpu="v5e"), [STEP, "--tpu", "v5e"]),
    ("batch", dict(fn_or_model=STEP, tpu="v5e", batch=8, max_batch=True),
     [STEP, "--tpu", "v5e", "--batch", "8", "--max-batch"]),
    ("top", dict(fn_or_model=STEP, tpu="v5e", batch=8, top=-1), None),  # the command line's --top has min=0
    ("tokens_per_example", dict(fn_or_model=STEP, tpu="v5e", batch=8, tokens_per_example=0),
     [STEP, "--tpu", "v5e", "--batch", "8", "--tokens-per-example", "0"]),
    ("price", dict(fn_or_model=STEP, tpu="v5e", batch=8, price="v6e=abc"),
     [STEP, "--tpu", "v5e", "--batch", "8", "--price", "v6e=abc"]),
    ("price", dict(fn_or_model=STEP, tpu="v5e", batch=8, price={"v6e": -1}),
     [STEP, "--tpu", "v5e", "--batch", "8", "--price", "v6e=-1"]),
    ("fn_or_model", dict(tpu="v5e", batch=8), ["--tpu", "v5e", "--batch", "8"]),
    ("weight_dtype", dict(fn_or_model=STEP, tpu="v5e", batch=8, weight_dtype="bfloat16"),
     [STEP, "--tpu", "v5e", "--batch", "8", "--weight-dtype", "bfloat16"]),
    ("mu_dtype", dict(fn_or_model=STEP, tpu="v5e", batch=8, mu_dtype="bfloat16"),
     [STEP, "--tpu", "v5e", "--batch", "8", "--mu-dtype", "bfloat16"]),
    ("grad_dtype", dict(fn_or_model=STEP, tpu="v5e", batch=8, grad_dtype="bfloat16"),
     [STEP, "--tpu", "v5e", "--batch", "8", "--grad-dtype", "bfloat16"]),
    ("shard_exp_on_fsdp", dict(fn_or_model=STEP, tpu="v5e", batch=8, shard_exp_on_fsdp=True),
     [STEP, "--tpu", "v5e", "--batch", "8", "--shard-exp-on-fsdp"]),
    ("full", dict(fn_or_model=STEP, tpu="v5e", batch=8, full=True), [STEP, "--tpu", "v5e", "--batch", "8", "--full"]),
    ("ray", dict(fn_or_model=STEP, tpu="v5e", batch=8, ray="auto"), [STEP, "--tpu", "v5e", "--batch", "8", "--ray", "auto"]),
    ("vocab_tiling", dict(fn_or_model=STEP, tpu="v5e", batch=8, vocab_tiling=4),
     [STEP, "--tpu", "v5e", "--batch", "8", "--vocab-tiling", "4"]),
    ("batch_per_chip", dict(fn_or_model=STEP, tpu="v5e", batch_per_chip=8),
     [STEP, "--tpu", "v5e", "--batch-per-chip", "8"]),
    ("global_batch", dict(fn_or_model=STEP, tpu="v5e", global_batch=8), [STEP, "--tpu", "v5e", "--global-batch", "8"]),
    ("model", dict(fn_or_model=STEP, batch=8, **LLM), [STEP, "--model", "llama3.1-8b", "--tpu", "v6e-16", "--batch", "8"]),
    ("model", dict(compare_bf16=True, batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--compare-bf16", "--batch-per-chip", "1"]),
    ("model", dict(tokens_per_example=8, batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--tokens-per-example", "8", "--batch-per-chip", "1"]),
    ("batch_per_chip", dict(**LLM), ["--model", "llama3.1-8b", "--tpu", "v6e-16"]),
    ("batch_per_chip", dict(batch_per_chip=0, **LLM), ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--batch-per-chip", "0"]),
    ("global_batch", dict(global_batch=0, **LLM), ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--global-batch", "0"]),
    ("seq", dict(seq=0, batch_per_chip=1, **LLM), ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--seq", "0",
                                                   "--batch-per-chip", "1"]),
    ("seq", dict(seq=1000, batch_per_chip=1, **LLM), ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--seq", "1000",
                                                      "--batch-per-chip", "1"]),  # not a multiple of 128
    ("remat", dict(remat="most", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--remat", "most", "--batch-per-chip", "1"]),
    ("remat", dict(remat="all", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--remat", "all", "--batch-per-chip", "1"]),
    ("remat", dict(remat="custom:attention=device", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--remat", "custom:attention=device", "--batch-per-chip", "1"]),
    ("remat", dict(remat="custom:context=host", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--remat", "custom:context=host", "--batch-per-chip", "1"]),
    ("dtype", dict(dtype="int4", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--dtype", "int4", "--batch-per-chip", "1"]),
    ("weight_dtype", dict(weight_dtype="int8", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--weight-dtype", "int8", "--batch-per-chip", "1"]),
    ("mu_dtype", dict(mu_dtype="float16", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--mu-dtype", "float16", "--batch-per-chip", "1"]),
    ("grad_dtype", dict(grad_dtype="float16", batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--grad-dtype", "float16", "--batch-per-chip", "1"]),
    ("vocab_tiling", dict(vocab_tiling=0, batch_per_chip=1, **LLM),
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--vocab-tiling", "0", "--batch-per-chip", "1"]),
    ("vocab_tiling", dict(vocab_tiling=3, batch_per_chip=1, **LLM),  # pieces of each sequence: 3 does not divide 2,048
     ["--model", "llama3.1-8b", "--tpu", "v6e-16", "--vocab-tiling", "3", "--batch-per-chip", "1"]),
]


def _keyword(option: str) -> str:
    return f"{option}="


@pytest.mark.parametrize("option,keywords,_", CASES)
def test_the_options_name_the_keyword_at_fault(option, keywords, _):
    with pytest.raises(PreflightOptionError) as raised:
        preflight_options(**keywords)
    assert raised.value.option == option
    message = str(raised.value)
    assert _keyword(option) in message, message
    assert not any(flag in message for flag in FLAGS.values() if flag.startswith("--")), message


@pytest.mark.parametrize("option,_,arguments", [case for case in CASES if case[2] is not None])
def test_the_command_line_names_the_flag_at_fault(option, _, arguments, tmp_path):
    result = run_cli("preflight", *arguments, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert FLAGS[option] in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert f"{option}=" not in result.stderr, result.stderr
    own = ("weight_dtype", "mu_dtype", "grad_dtype", "shard_exp_on_fsdp", "full", "ray", "vocab_tiling")
    if option in own:  # --model's own options: only the one given is named
        others = {FLAGS[name] for name in own} - {FLAGS[option]}
        assert not any(flag in result.stderr for flag in others), result.stderr


def test_errors_found_with_the_model_or_the_slice_name_the_keyword_too(tmp_path, monkeypatch):
    """What only the loaded model or the slice can tell (an unknown model, a mesh or a batch that does not divide
    the slice) is checked after the options and named as they are: keyword for the API, flag for the CLI."""
    pytest.importorskip("jax")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    unsupported = tmp_path / "config.json"  # Qwen3-Next's linear-attention layers are not the step's
    unsupported.write_text('{"model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, '
                           '"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2}')
    for keywords, option, flag_says in (
            (dict(model="llama9-1b", tpu="v6e-16", batch_per_chip=1), "model", "--model: unknown model"),
            (dict(model="llama3.1-8b", tpu="v6e-16", mesh="fsdp=3", batch_per_chip=1), "mesh", "--mesh 'fsdp=3'"),
            (dict(model="llama3.1-8b", tpu="v6e-16", global_batch=24), "global_batch", "--global-batch 24"),
            (dict(model="llama3.1-8b", tpu="tpu7x-8", batch_per_chip=1), "batch_per_chip", "--batch-per-chip 1"),
            # Beyond the 131,072 positions of its config; on v5e-4, where the state alone does not fit (no compile).
            (dict(model="llama3.1-8b", tpu="v5e-4", seq=262144, batch_per_chip=1), "seq", "--seq 262144 is beyond"),
            # Qwen3-30B-A3B has 4 key/value heads: tensor=8 cannot split them.
            (dict(model="qwen3-30b-a3b", tpu="v5e-8", mesh="fsdp=1,tensor=8", batch_per_chip=1), "mesh",
             "--mesh tensor=8 must divide"),
            (dict(model=str(unsupported), tpu="v5e-4", batch_per_chip=1), "model", "--model:")):
        with pytest.raises(tpuprof.UserError) as raised:
            tpuprof.preflight(**keywords)
        assert str(raised.value).startswith(f"{option}="), raised.value
        assert flag_says.split()[0] not in str(raised.value)
        arguments = [item for name, value in keywords.items()
                     for item in (FLAGS[name], str(value))]
        result = run_cli("preflight", *arguments)
        assert result.returncode == 2 and flag_says in result.stderr, result.stderr
    assert "names model_type 'qwen3_next', not a family tpuprof builds" in result.stderr


def test_tpu_is_parsed_once_into_slices():
    options = preflight_options(STEP, tpu="v5e, v6e-8,v5e", batch=8)
    assert [s.name for s in options.slices] == ["v5e", "v6e-8"]
    assert options.slices[1].devices == 8 and options.slices[0].explicit is False
    assert preflight_options(STEP, tpu=["v5p-8", "trillium"], batch=8).slices[1].generation == "v6e"
