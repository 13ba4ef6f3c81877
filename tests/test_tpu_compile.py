"""tpuprof.sources.tpu_compile against the real XLA:TPU compiler (libtpu, compile-only), and the
committed sample dumps it produced."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from conftest import DUMPS, SAMPLES, sample_dump

pytestmark = pytest.mark.compile  # libtpu compiles in this process

sys.path.insert(0, str(SAMPLES / "models"))

V5E_HBM = "15.75G"  # what libtpu 0.0.42.1 states as available HBM for one v5e chip


@pytest.fixture(scope="module")
def tpu_compile():
    from tpuprof.sources import tpu_compile

    return tpu_compile


@pytest.mark.slow
def test_jax_compile_dumps_only_the_main_module_and_matches_the_committed_sample(tpu_compile, tmp_path):
    """Recompiling the conv18 sample gives the compiler's same figures as the committed memory_analysis.json
    (the sample is reproducible), and the dump folder keeps just the files tpuprof reads."""
    import conv18

    sample = json.loads((sample_dump("conv18_f32_v5e") / "sample.json").read_text())
    fn, args = conv18.factory(sample["batch_size"], dtype=sample["dtype"])
    result = tpu_compile.compile_jax(fn, args, "v5e", tmp_path / "dump")

    committed = json.loads((DUMPS / "conv18_f32_v5e" / "memory_analysis.json").read_text())
    assert result.memory_analysis() == {k: v for k, v in committed.items() if k != "required_bytes"}
    assert result.required_bytes == committed["required_bytes"]
    names = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert len(names) == len(tpu_compile.KEPT_SUFFIXES) and names == sorted(p.rsplit("/", 1)[-1] for p in result.files)
    assert {n.split(".cl_")[1].split(".", 1)[1] for n in names} == {s[1:] for s in tpu_compile.KEPT_SUFFIXES}
    # The 18 channels show up in the TPU layouts of the activations.
    text = next((tmp_path / "dump").glob("*.after_optimizations.txt")).read_text()
    assert "f32[256,64,64,18]{" in text


def test_each_compile_dumps_into_its_own_folder(tpu_compile, tmp_path):
    import int8_matmul

    fn, args = int8_matmul.factory(1000)
    first = tpu_compile.compile_jax(fn, args, "v5e", tmp_path / "a")
    fn, args = int8_matmul.factory(2000)
    second = tpu_compile.compile_jax(fn, args, "v5e", tmp_path / "b")
    assert all(f.startswith(str(tmp_path / "a")) for f in first.files)
    assert all(f.startswith(str(tmp_path / "b")) for f in second.files)
    assert "s8[1000,300]" in open(next(p for p in first.files if p.endswith(".after_optimizations.txt"))).read()
    assert "s8[2000,300]" in open(next(p for p in second.files if p.endswith(".after_optimizations.txt"))).read()
    assert second.argument_bytes > first.argument_bytes
    with pytest.raises(ValueError):  # a used folder would mix two modules' files
        tpu_compile.compile_jax(fn, args, "v5e", tmp_path / "b")


def test_resource_exhausted_is_its_own_exception_with_the_compiler_text(tpu_compile):
    import transformer

    fn, args = transformer.factory(4096)
    with pytest.raises(tpu_compile.CompileResourceExhausted) as caught:
        tpu_compile.compile_jax(fn, args, "v5e")
    assert caught.value.target == "v5e"
    assert "RESOURCE_EXHAUSTED" in caught.value.message
    assert f"exceeds available HBM ({V5E_HBM})" in caught.value.message
    # The committed OOM text is this same compile's message (generate.py --only oom_transformer_v5e).
    committed = (SAMPLES / "oom" / "libtpu_transformer_v5e.txt").read_text().splitlines()
    assert committed[0].startswith("# Real compiler output: libtpu")
    assert committed[1] == caught.value.message.strip()


@pytest.mark.slow
def test_tf_function_compiles_through_hlo_to_libtpu(tpu_compile, tmp_path):
    """TF -> HloModuleProto -> StableHLO -> libtpu: the 18-channel TF conv net gets real TPU layouts,
    while the committed tf_hlo_cpu sample (TF's own HLO text) has none."""
    import tf_conv18

    fn, specs = tf_conv18.factory(128)
    result = tpu_compile.compile_tf(fn, specs, "v5e", tmp_path / "dump")
    text = open(next(p for p in result.files if p.endswith(".after_optimizations.txt"))).read()
    assert "f32[128,64,64,18]{" in text and ":T(" in text  # TPU tiles
    assert result.argument_bytes >= 128 * 64 * 64 * 3 * 4  # the images at least
    cpu_text = (sample_dump("tf_hlo_cpu") / "tf_conv18.hlo.txt").read_text()
    assert "f32[128,64,64,18]" in cpu_text and ":T(" not in cpu_text


def test_samples_are_real_libtpu_dumps_under_one_megabyte():
    from tpuprof.protos import hlo_pb2

    names = ["conv18_f32_v5e", "onehot10_v5e", "transformer_bf16_v6e", "int8_matmul_v5e", "keras_mlp_v5e"]
    for name in names:
        folder = sample_dump(name)
        assert sum(p.stat().st_size for p in folder.iterdir()) < 1 << 20, name
        sample = json.loads((folder / "sample.json").read_text())
        proto = hlo_pb2().HloProto.FromString(next(folder.glob("*.after_optimizations.hlo.pb")).read_bytes())
        assert proto.buffer_assignment.logical_buffers, name
        assert proto.hlo_module.entry_computation_name
        stats = json.loads((folder / "memory_analysis.json").read_text())
        assert stats["required_bytes"] == (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
                                           - stats["alias_size_in_bytes"] + stats["temp_size_in_bytes"]
                                           + stats["generated_code_size_in_bytes"])
        assert sample["target"] in name and sample["libtpu"]
    # The Keras train step's variables are updated in place: outputs alias the arguments.
    keras = json.loads((DUMPS / "keras_mlp_v5e" / "memory_analysis.json").read_text())
    assert keras["alias_size_in_bytes"] > 0


def test_import_costs_nothing():
    """Importing the compile library must not import JAX or TensorFlow (memory/oom stay fast)."""
    import subprocess

    code = ("import sys, tpuprof.sources.tpu_compile, tpuprof.analyses.preflight, "
            "tpuprof.analyses.preflight_step, tpuprof.commands.preflight;"
            "print([m for m in ('jax', 'tensorflow', 'keras') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_compiler_options_reach_libtpu(tpu_compile):
    """The LLM step's splash attention on v6e (blocks of llm.SPLASH_BLOCK["v6e"], fused backward kernel) at
    8,192 tokens and Llama 3.1 8B's heads needs more scoped VMEM than libtpu's default limit (32 MiB): libtpu
    refuses the fused backward kernel, and the published recipes' limit (llm.compiler_options("v6e")) compiles
    it. (One sequence: the batch does not change the kernel's VMEM, only the compile's time.)"""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    from tpuprof.sources import llm

    seq, block = 8192, llm.SPLASH_BLOCK["v6e"]
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_q_dkv=block, block_kv_dkv=block,
                              use_fused_bwd_kernel=True)
    kernel = splash.make_splash_mha(masks.MultiHeadMask([masks.CausalMask((seq, seq))] * 32), block_sizes=sizes,
                                    head_shards=1, q_seq_shards=1)

    def loss(q, k, v):
        return jnp.sum(jax.vmap(kernel)(q, k, v).astype(jnp.float32))

    q = jax.ShapeDtypeStruct((1, 32, seq, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 8, seq, 128), jnp.bfloat16)
    step = jax.grad(loss, argnums=(0, 1, 2))
    with pytest.raises(tpu_compile.CompileResourceExhausted, match="vmem"):
        tpu_compile.compile_jax(step, [q, kv, kv], "v6e")
    assert tpu_compile.compile_jax(step, [q, kv, kv], "v6e", options=llm.compiler_options("v6e")).required_bytes > 0


def _compiles() -> set[int]:
    """Compile processes of this one (from /proc: no process library is installed): the processes the compile
    server it started forked (tpuprof.sources.compile_child), not the server itself."""
    from pathlib import Path

    parents, servers = {}, set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if parents[int(stat.parent.name)] == os.getpid() and b"tpuprof.sources.compile_child" in command:
            servers.add(int(stat.parent.name))
    return {pid for pid, parent in parents.items() if parent in servers}


def test_each_compile_is_forked_from_one_server_with_the_parents_environment_of_the_moment(tpu_compile, tmp_path,
                                                                                             monkeypatch):
    """The compile server (imported JAX once) forks every compile of this process: each in a process of its own, with
    the environment the parent has when it asks (libtpu reads LIBTPU_INIT_ARGS as the compile starts); a JAX setting
    JAX reads on import, changed, starts a new server."""
    import re

    from tests.helpers.layout_specs import SaysItsSettings

    def said(folder: str) -> tuple[str, str, int, int]:
        with pytest.raises(tpu_compile.UserError) as refused:
            tpu_compile.compile_until_layout(SaysItsSettings(), 1, None, "v5e", tmp_path / folder, stop_above=0)
        mark, precision, pid, server = re.match(r"mark (\S+), precision (\S+), compiled in (\d+) of (\d+)",
                                                str(refused.value)).groups()
        return mark, precision, int(pid), int(server)

    monkeypatch.setenv("TPUPROF_TEST_MARK", "first")
    monkeypatch.delenv("JAX_DEFAULT_MATMUL_PRECISION", raising=False)
    first = said("a")
    monkeypatch.setenv("TPUPROF_TEST_MARK", "second")
    second = said("b")
    assert first[:2] == ("first", "None") and second[:2] == ("second", "None")
    assert second[3] == first[3] != os.getpid() and second[2] != first[2]  # one server, a process per compile
    monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    third = said("c")
    assert third[:2] == ("second", "highest") and third[3] != first[3]
    assert not _compiles()


def test_a_flag_libtpu_refuses_set_between_two_compiles_is_one_sentence(tpu_compile, tmp_path, monkeypatch):
    """In one process (a notebook, the bench), the slice's devices are known from an earlier step; LIBTPU_INIT_ARGS
    then names a flag this libtpu does not know (the Llama 3.1 70B fp8 TPU7x recipe's xla_tpu_fp8_emission_mode
    with libtpu 0.0.42): the next compile says so in one sentence, as the first compile of a process does, not
    "the compile process ended with code 1" and a traceback's last line."""
    from tpuprof import slices
    from tpuprof.sources import llm

    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    config = llm.parse_config({"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}, "tiny", "t")
    chosen = slices.resolve("v5e-4")
    spec = llm.Spec(llm.Step(config, "t", 128, "full", "bf16", llm.parse_mesh(None, 4)), chosen)  # devices known
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_no_such_flag=1")
    with pytest.raises(tpu_compile.UserError, match=r"^libtpu refuses LIBTPU_INIT_ARGS \(Unknown command line flag "
                                                    r"'xla_tpu_no_such_flag'"):
        tpu_compile.compile_until_layout(spec, 1, None, chosen, tmp_path / "layout", stop_above=0)


def test_a_compile_whose_server_is_killed_ends_in_one_sentence(tpu_compile, tmp_path):
    """The compile server killed outright (the kernel's OOM killer, a user's kill -9) takes its compile with it: the
    wait ends with the compile, in one sentence, and the next compile starts a new server."""
    import signal
    import threading

    from tests.helpers.layout_specs import Doubled, SortedProducts

    def kill_the_server_once_compiling():
        deadline = time.monotonic() + 60
        while not _compiles() and time.monotonic() < deadline:
            time.sleep(0.05)
        (compile_pid,) = _compiles()
        os.kill(int(Path(f"/proc/{compile_pid}/stat").read_text().rsplit(")", 1)[1].split()[1]), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server_once_compiling)
    killer.start()
    started = time.monotonic()
    with pytest.raises(tpu_compile.CompileFailed, match="signal 9|ended with code"):
        tpu_compile.compile_until_layout(SortedProducts(), 1024, None, "v5e", tmp_path / "killed", stop_above=None)
    killer.join()
    assert time.monotonic() - started < 60 and not _compiles()
    again = tpu_compile.compile_until_layout(Doubled(), 256, None, "v5e", tmp_path / "again", stop_above=None)
    assert again.stage == "code"


def test_the_layout_counts_what_the_whole_compile_counts(tpu_compile, tmp_path):
    """layout_figures over a whole compile's own dump: arguments, outputs, the donated alias and host memory are
    the compiler's memory_analysis() to the byte (temporaries differ: code generation changes them)."""
    from tests.helpers.layout_specs import Doubled

    whole = Doubled().program(256).compile("v5e", tmp_path / "whole")
    figures = tpu_compile.layout_figures(whole.hlo_proto)
    for name in ("argument_bytes", "output_bytes", "alias_bytes", "host_argument_bytes", "host_temp_bytes"):
        assert figures[name] == getattr(whole, name), name
    assert figures["alias_bytes"] == 256 * 1024 * 4


def test_a_compile_is_stopped_at_its_memory_layout(tpu_compile, tmp_path):
    """Asked to stop above 0 bytes, compile_until_layout stops its child once the buffer assignment is dumped
    (a sort of a [1024, 1024] product: laid out in seconds, code generated in about a minute): the figures are
    the layout's, no code is counted, and the child is gone."""
    from tests.helpers.layout_specs import SortedProducts

    layout = tpu_compile.compile_until_layout(SortedProducts(), 1024, None, "v5e", tmp_path / "layout", stop_above=0)
    assert not _compiles()
    assert layout.stage == "buffer_assignment" and layout.generated_code_bytes == 0
    assert layout.memory_analysis()["argument_size_in_bytes"] == 1024 * 128 * 4
    assert tpu_compile.layout_figures(layout.hlo_proto)["temp_bytes"] == layout.temp_bytes >= 1024 * 1024 * 4
    assert any(f.endswith("-buffer-assignment.txt") for f in layout.files)


def test_a_layout_beyond_hbm_is_the_answer_even_when_the_compilers_refusal_comes_first(tpu_compile, tmp_path):
    """A [80000, 80000] float32 temporary (23.8 GiB) on a 16 GiB v5e chip: libtpu dumps the layout, then refuses the
    program. Polled once a minute, the child has refused before the layout is seen (as on a loaded machine): the
    answer is still the layout's figures, not the refusal, so the document does not depend on the machine's load."""
    from tests.helpers.layout_specs import SortedProducts

    started = time.monotonic()
    layout = tpu_compile.compile_until_layout(SortedProducts(), 80000, None, "v5e", tmp_path / "layout",
                                              stop_above=16 * 2**30, poll_s=60)
    assert layout.stage == "buffer_assignment" and layout.temp_bytes >= 80000 * 80000 * 4 > 16 * 2**30
    assert time.monotonic() - started < 55  # the wait ends with the child, not at the next poll


def test_a_layout_that_may_fit_is_compiled_to_the_end(tpu_compile, tmp_path):
    """Below the bound the child is not stopped: the answer is the whole compile's (its code counted)."""
    from tests.helpers.layout_specs import Doubled

    whole = tpu_compile.compile_until_layout(Doubled(), 256, None, "v5e", tmp_path / "whole", stop_above=16 * 2**30)
    assert whole.stage == "code" and whole.generated_code_bytes > 0


def test_a_spec_that_refuses_in_the_child_is_the_same_sentence(tpu_compile, tmp_path):
    from tests.helpers.layout_specs import Refuses

    with pytest.raises(tpu_compile.UserError, match="the factory takes no batch of 3"):
        tpu_compile.compile_until_layout(Refuses(), 3, None, "v5e", tmp_path / "layout", stop_above=0)
    assert not any((tmp_path / "layout").iterdir())
