"""`tpuprof memory`'s advice checked against the program it is about: the batch fix of a program over HBM (what holds
the batch at the peak bounds what a smaller batch frees), the module a multi-module dump leads with, "room for a
larger per-chip batch" only where the program has a batch, and the bf16 evidence counting only 16-bit arrays the
program chose. Inputs: the public Llama 3 8B and Qwen3 8B step texts (tests/real_data.py), the samples, and a user's
JAX script compiled for a v5e chip (compile-only) with XLA's dump, as a TPU run of it dumps its modules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import real_data
from conftest import run_cli

from tpuprof.sources import tpu_compile
from tpuprof.units import fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
DUMPS = ROOT / "sample_profiles" / "dumps"
needs_libtpu = pytest.mark.skipif(not tpu_compile.jax_available(), reason="libtpu not installed")


def _dims(shape: str) -> tuple[int, ...]:
    match = re.match(r"\s*[a-z]\w*\[([\d,]*)\]", shape or "")
    return tuple(int(d) for d in match.group(1).split(",") if d) if match else ()


def _batch_fix(module):
    (fix,) = [s for s in module.suggestions if s.kind == "batch_size"]
    return fix


# ------------------------------------------------------------------ 1. the batch fix of a program over HBM

def test_a_smaller_batch_is_not_enough_to_fit_when_even_every_temporary_at_the_peak_is_less_than_the_shortfall(
        tmp_path):
    """The Llama 3 8B step (v6e-8, 4 sequences of 8,192 per chip) against a v5e chip: 10.20 GiB over, and the
    temporaries at the peak are 11.89 GiB; at a batch of 1 a quarter of them stays, so a smaller batch frees at most
    8.92 GiB. The fix said 'frees 10.20 GiB; enough to fit' (the shortfall, by construction)."""
    from tpuprof.commands import memory

    path = real_data.real_artefact(real_data.LLAMA3_8B_TRAIN_STEP_V6E_8_HLO, tmp_path)
    (module,) = memory.module_memories(path, target="v5e", compile_=False)
    shortfall = module.peak_heap_bytes - module.hbm_capacity_bytes
    temps = sum(b.size_bytes for b in module.buffers if b.live_at_peak and b.allocation_type == "temp")
    inputs = [b for b in module.buffers if b.allocation_type == "parameter" and _dims(b.shape)[:1] == (4,)]
    assert sorted(b.op_name for b in inputs) == ["input_ids", "labels"]
    at_most = (temps + sum(b.size_bytes for b in inputs)) * 3 // 4  # batch 4 -> 1
    assert at_most < shortfall
    fix = _batch_fix(module)
    assert fix.severity != "blocking" and fix.saving_bytes is None and not fix.extra
    assert "cannot make it fit on its own" in fix.message and "(now 4)" in fix.message
    assert not any(s.severity == "blocking" for s in module.suggestions)


def test_a_smaller_batch_is_enough_to_fit_when_what_holds_the_batch_covers_the_shortfall(tmp_path):
    """The Qwen3 8B step (4 sequences of 8,192 per device) on v6e: its temporaries at the peak hold the batch after the
    scan's 36 layers ([36, 4, 4096, 12288]), and three quarters of them cover the 26.48 GiB over."""
    from tpuprof.commands import memory

    path = real_data.real_artefact(real_data.QWEN3_8B_TRAIN_STEP_V6E_8_HLO, tmp_path)
    (module,) = memory.module_memories(path, target="v6e", compile_=False)
    shortfall = module.peak_heap_bytes - module.hbm_capacity_bytes
    held = sum(b.size_bytes for b in module.buffers if b.live_at_peak and b.allocation_type == "temp"
               and 4 in (_dims(b.shape)[1:] if _dims(b.shape)[:1] == (36,) else _dims(b.shape)))
    assert held * 3 // 4 >= shortfall
    fix = _batch_fix(module)
    assert fix.severity == "blocking" and fix.saving_bytes == shortfall
    assert "per-chip batch of 4" in fix.message and 1 <= fix.extra["batch"] < 4
    assert "per-chip batch 4 (leads input_ids, labels)" in fix.evidence


# ------------------------------------------------------------------ 2, 3. a user's script: its step and its helpers

# A user's JAX script as a TPU run of it compiles it: a key, an f32 initialiser, a cast, and the train step on the
# weights cast to bfloat16 (mixed precision). The initialiser's peak (f32 weights) is twice the step's.
SCRIPT = """
import jax, jax.numpy as jnp
from jax.experimental import topologies

device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
on_chip = jax.sharding.SingleDeviceSharding(device)
BATCH, D, H, LAYERS = 16, 256, 1024, 2


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=on_chip)


def init(key):
    keys = jax.random.split(key, 2 * LAYERS)
    return [{"up": jax.random.normal(keys[2 * i], (D, H)), "down": jax.random.normal(keys[2 * i + 1], (H, D))}
            for i in range(LAYERS)]


def loss(params, x, y):
    for p in params:
        x = x + jnp.tanh(x @ p["up"]) @ p["down"]
    return jnp.mean((x - y) ** 2)


def train_step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


jax.jit(jax.random.PRNGKey).lower(jax.ShapeDtypeStruct((), jnp.int32, sharding=on_chip)).compile()
shapes = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
jax.jit(init).lower(spec((2,), jnp.uint32)).compile()
bf16 = jax.tree_util.tree_map(lambda a: spec(a.shape, jnp.bfloat16), shapes)
jax.jit(jax.lax.convert_element_type, static_argnums=1).lower(spec((D, H)), jnp.bfloat16).compile()
jax.jit(train_step, donate_argnums=0).lower(bf16, spec((BATCH, D), jnp.bfloat16),
                                            spec((BATCH, D), jnp.bfloat16)).compile()
"""
HELPERS = {"jit_init", "jit_convert_element_type", "jit_PRNGKey"}


def _dump(script: str, tmp_path_factory) -> Path:
    """SCRIPT run with XLA's dump flags: the folder of its modules, as a TPU run of it dumps them."""
    if not tpu_compile.jax_available():
        pytest.skip("libtpu not installed")
    folder = tmp_path_factory.mktemp("jax-tpu-dump") / "dump"
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={folder} --xla_dump_hlo_as_proto",
           # Compile-only touches no TPU: other processes may hold libtpu too (tpu_compile._quiet_libtpu).
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-4",
           "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def script_dump(tmp_path_factory):
    return _dump(SCRIPT, tmp_path_factory)


@pytest.fixture(scope="module")
def script_modules(script_dump):
    from tpuprof.commands import memory

    return memory.module_memories(script_dump, target="v5e")


@pytest.mark.compile
def test_a_dump_leads_with_its_training_step_not_the_larger_initialiser(script_dump, script_modules):
    names = [m.name for m in script_modules]
    assert sorted(names) == sorted(HELPERS | {"jit_train_step"})
    peaks = {m.name: m.peak_heap_bytes for m in script_modules}
    assert peaks["jit_init"] > peaks["jit_train_step"]  # by peak, the initialiser would come first
    assert names[0] == "jit_train_step"
    lead = script_modules[0].notes[0]
    assert lead.startswith("4 modules in this dump; jit_train_step comes first: the training step")
    assert "though jit_init's peak" in lead and "jit_PRNGKey" in lead
    # The helpers follow by peak.
    assert [peaks[n] for n in names[1:]] == sorted((peaks[n] for n in names[1:]), reverse=True)
    result = run_cli("memory", str(script_dump), "--target", "v5e", "--top", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.index("jit_train_step (hlo_proto") < result.stdout.index("jit_init (hlo_proto")


@pytest.mark.compile
def test_what_the_dump_left_out_is_said_on_the_module_shown_first(script_dump, tmp_path):
    import shutil

    from tpuprof.commands import memory

    folder = tmp_path / "dump"
    shutil.copytree(script_dump, folder)
    (folder / "module_0099.jit_cut.cl_1.after_optimizations.hlo.pb").write_bytes(b"\x0a\xff\xff")  # cut short
    modules = memory.module_memories(folder, target="v5e")
    assert modules[0].name == "jit_train_step"
    assert any(n.startswith("Left out (1 of 5 modules)") for n in modules[0].notes), modules[0].notes
    assert not any(n.startswith("Left out") for m in modules[1:] for n in m.notes)


@pytest.mark.compile
def test_room_for_a_larger_batch_only_in_the_module_that_has_one(script_modules):
    for module in script_modules:
        kinds = [s.kind for s in module.suggestions]
        if module.name in HELPERS:
            assert "batch_size" not in kinds, module.name
        else:
            fix = _batch_fix(module)
            assert "room for a larger per-chip batch" in fix.message
            assert fix.evidence.startswith("per-chip batch 16: the leading size of x bf16[16,256], y bf16[16,256]")


@pytest.mark.compile
def test_a_dump_of_protos_alone_names_its_tpu_and_one_without_target_arguments_says_so(script_dump, tmp_path):
    """XLA_FLAGS=--xla_dump_hlo_as_proto alone writes *.target_arguments.pb, no .txt: it is read (the script compiled
    for v5e:2x2, one host of 2x2 chips), so the dump gets its fit verdict and room line without --target. Without
    either file there is no HBM to judge by: no fit verdict, no room line, and a note says why and what to pass."""
    import shutil

    from tpuprof.commands import memory
    from tpuprof.sources import hlo_dump

    assert not list(script_dump.glob("*.target_arguments.txt")) and list(script_dump.glob("*.target_arguments.pb"))
    (step,) = script_dump.glob("*jit_train_step*.after_optimizations.hlo.pb")
    arguments = hlo_dump.read_target_arguments(step)
    assert (arguments.generation, arguments.chips_per_host_bounds, arguments.host_bounds) == ("v5e", (2, 2, 1),
                                                                                            (1, 1, 1))
    modules = memory.module_memories(script_dump)
    assert {m.target for m in modules} == {"v5e"} and all(m.hbm_capacity_bytes for m in modules)
    assert "room for a larger per-chip batch" in _batch_fix(modules[0]).message
    bare = tmp_path / "dump"
    shutil.copytree(script_dump, bare, ignore=shutil.ignore_patterns("*.target_arguments.pb"))
    for module in memory.module_memories(bare):
        assert module.hbm_capacity_bytes is None and "batch_size" not in [s.kind for s in module.suggestions]
        assert any("give --target GEN for whether it fits" in note for note in module.notes), module.notes


@pytest.mark.parametrize("sample", sorted(p.name for p in DUMPS.iterdir() if (p / "sample.json").exists()))
def test_the_batch_the_room_line_rests_on_is_the_samples_own(sample):
    """Every sample's batch (sample.json) is the one the 'room for a larger per-chip batch' evidence names: the
    one-hot sample's 65,536 examples too, the transformer's 8 though its 8 heads lead its scores."""
    from tpuprof.commands import memory

    meta = json.loads((DUMPS / sample / "sample.json").read_text())
    modules = memory.module_memories(DUMPS / sample, target=meta.get("target"), compile_=False)
    for module in modules:
        room = [s for s in module.suggestions if s.kind == "batch_size" and "room for a larger" in s.message]
        if module.estimated:
            assert not room  # an estimate says nothing exact about room
            continue
        assert room, (sample, [s.kind for s in module.suggestions])
        assert room[0].evidence.startswith(f"per-chip batch {meta['batch_size']}: "), room[0].evidence


# ------------------------------------------------------------- 4. bf16: the program's 16-bit arrays, not the compiler's

# A float32 MLP training step at batch 4,096: XLA:TPU keeps bfloat16 copies of some of its activations (the operands
# of float32 matmuls, which the MXU takes in bfloat16 at default precision). The program chose no 16 bits. A model
# width of 128 (512 compiled twice as long) still gets the bf16[4096,4096] copy; batch 1,024 with 1,024-wide hidden
# layers gets none, nor does one layer.
F32_STEP = """
import jax, jax.numpy as jnp
from jax.experimental import topologies

device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
on_chip = jax.sharding.SingleDeviceSharding(device)
BATCH, D, H, LAYERS = 4096, 128, 4096, 2


def spec(shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=on_chip)


def loss(params, x, y):
    for p in params:
        x = x + jnp.tanh(x @ p["up"]) @ p["down"]
    return jnp.mean((x - y) ** 2)


def train_step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


params = [{"up": spec((D, H)), "down": spec((H, D))} for _ in range(LAYERS)]
jax.jit(train_step, donate_argnums=0).lower(params, spec((BATCH, D)), spec((BATCH, D))).compile()
"""


@pytest.fixture(scope="module")
def f32_step(tmp_path_factory):
    from tpuprof.commands import memory

    (module,) = memory.module_memories(_dump(F32_STEP, tmp_path_factory), target="v5e")
    return module


@pytest.mark.compile
def test_bf16_evidence_does_not_count_the_compilers_own_bf16_as_the_programs(f32_step):
    sixteen = [b for b in f32_step.buffers if b.dtype == "bf16"]
    assert sum(b.size_bytes for b in sixteen) >= 32 << 20  # the compiler's copies: at least one bf16[4096,4096]
    assert not any(b.opcode == "parameter" or "convert_element_type" in b.op_name for b in sixteen)
    (fix,) = [s for s in f32_step.suggestions if s.kind == "bf16"]
    assert "16-bit arrays in the whole program" not in fix.evidence  # it said 36.00 MiB of them
    assert "no 16-bit input, weight or cast in the program" in fix.evidence

    from tpuprof.advice.memory import program_16bit

    assert program_16bit(f32_step) == (False, sixteen)


@pytest.mark.compile
def test_a_bf16_program_is_one_by_its_own_weights_inputs_and_casts(script_modules):
    from tpuprof.advice.memory import program_16bit
    from tpuprof.commands import memory

    (step,) = [m for m in script_modules if m.name == "jit_train_step"]  # bf16 weights and inputs
    assert program_16bit(step)[0]
    (transformer,) = memory.module_memories(DUMPS / "transformer_bf16_v6e")
    chosen, sixteen = program_16bit(transformer)
    assert chosen and sum(b.size_bytes for b in sixteen) > 0.9 * sum(b.size_bytes for b in transformer.buffers)
    assert "bf16" not in [s.kind for s in transformer.suggestions]
    for sample in ("conv18_f32_v5e", "onehot10_v5e"):  # float32 samples: no 16-bit array at all
        (module,) = memory.module_memories(DUMPS / sample)
        assert program_16bit(module) == (False, [])
        (fix,) = [s for s in module.suggestions if s.kind == "bf16"]
        assert "16-bit arrays in the whole program 0 B" in fix.evidence


# ------------------------------------------------------------------ 5. what the program reserves, and its batch

# A decoder a user scans over its layers: token ids [4, 256] (4 sequences per chip), 4 attention heads (a weight's
# size equal to the batch), and per-layer norm scales stacked to [6, 512] (rank 2, leading with the layer count).
SCANNED = """
import jax, jax.numpy as jnp
from jax.experimental import topologies

device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
on_chip = jax.sharding.SingleDeviceSharding(device)
BATCH, SEQ, D, HEADS, LAYERS, VOCAB = 4, 256, 512, 4, 6, 1000


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=on_chip)


def layer(x, p):
    h = x * p["norm"]
    q = jnp.einsum("bsd,dhk->bshk", h, p["q"])
    k = jnp.einsum("bsd,dhk->bshk", h, p["k"])
    scores = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k), axis=-1)
    attended = jnp.einsum("bhqs,bshk->bqhk", scores, q)
    return x + jnp.einsum("bshk,hkd->bsd", attended, p["o"]), None


def loss(params, tokens, labels):
    x = params["embed"][tokens]
    x, _ = jax.lax.scan(layer, x, params["layers"])
    logits = x @ params["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1))


def train_step(params, tokens, labels):
    grads = jax.grad(loss)(params, tokens, labels)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


params = {"embed": spec((VOCAB, D)),
          "layers": {"norm": spec((LAYERS, D)), "q": spec((LAYERS, D, HEADS, D // HEADS)),
                     "k": spec((LAYERS, D, HEADS, D // HEADS)), "o": spec((LAYERS, HEADS, D // HEADS, D))}}
jax.jit(train_step, donate_argnums=0).lower(params, spec((BATCH, SEQ), jnp.int32),
                                            spec((BATCH, SEQ), jnp.int32)).compile()


# A narrower step with an MLP in each layer (three per-layer weight shapes: stacked weights as tpuprof knows them), at
# 6 sequences, as many as its layers: a module of its own.
def with_mlp(x, p):
    return x + jax.nn.relu((x @ p["mix"]) @ p["up"]) @ p["down"] * p["norm"], None


def at_layer_count(params, tokens, labels):
    def loss_(params):
        x, _ = jax.lax.scan(with_mlp, params["embed"][tokens], params["layers"])
        logits = x @ params["embed"].T
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1))

    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, jax.grad(loss_)(params))


narrow = {"embed": spec((256, 128)), "layers": {"norm": spec((LAYERS, 128)), "up": spec((LAYERS, 128, 256)),
                                                "down": spec((LAYERS, 256, 128)), "mix": spec((LAYERS, 128, 128))}}
jax.jit(at_layer_count, donate_argnums=0).lower(narrow, spec((LAYERS, 64), jnp.int32),
                                                spec((LAYERS, 64), jnp.int32)).compile()
"""


@pytest.fixture(scope="module")
def scanned_step(tmp_path_factory):
    from tpuprof.commands import memory

    folder = _dump(SCANNED, tmp_path_factory)
    modules = {m.name.split(".")[0]: m for m in memory.module_memories(folder, target="v5e")}
    return folder, modules["jit_train_step"], modules["jit_at_layer_count"]


@pytest.mark.compile
def test_the_batch_is_the_token_ids_leading_size_not_the_layer_count(scanned_step):
    """The DeepSeek-V3 step (v5p-512, 6 sequences per chip) was advised for 'per-chip batch 58': its 58 MoE layers
    lead rank-2 stacked scales, and 6 was also a weight's size, so the token ids were passed over. Integer inputs are
    data, never weights: their leading size is the batch."""
    from tpuprof.advice import memory as advice

    _, module, _ = scanned_step
    stacked = [b for b in module.buffers if b.allocation_type == "parameter" and _dims(b.shape) == (6, 512)]
    assert stacked and any(4 in _dims(b.shape)[1:] for b in module.buffers if b.allocation_type == "parameter")
    assert advice.input_batch(module) == 4
    assert sorted(b.dtype for b in advice.batch_inputs(module, 4)) == ["s32", "s32"]


@pytest.mark.compile
def test_the_inputs_holding_a_batch_equal_to_the_layer_count_are_the_token_ids_not_the_stacked_weights(
        scanned_step):
    """A scanned step at as many sequences as it has layers (6): its stacked weights ([6, ...]: the weights of the
    Llama 3.1 8B step at 32 sequences per chip, 19.5 GiB with its moments) lead with the batch too. They were
    counted among the inputs a smaller batch shrinks, and the batch fix's saving with them; the inputs holding the
    batch are data: the token ids and labels."""
    from tpuprof.advice import memory as advice

    _, _, module = scanned_step
    assert advice.input_batch(module) == 6 and 6 in advice.stacked_layers(module)
    assert [b for b in module.buffers if b.allocation_type == "parameter" and _dims(b.shape)[:1] == (6,)
            and b.dtype != "s32"]  # the stacked weights lead with the batch
    inputs = advice.batch_inputs(module, 6)
    assert sorted((b.dtype, _dims(b.shape)) for b in inputs) == [("s32", (6, 64)), ("s32", (6, 64))]
    # Over HBM, the batch fix counts the token ids as the inputs that hold the batch, not the weights.
    module.hbm_capacity_bytes = module.required_bytes - 1024
    module.suggestions = advice.suggest(module)
    fix = _batch_fix(module)
    held = sum(b.size_bytes for b in inputs)  # two s32[6,64], padded to 8 x 128 tiles
    assert held == 2 * 8 * 128 * 4 and f"inputs holding it {fmt_bytes(held)}," in fix.evidence, fix.evidence


@pytest.mark.compile
def test_the_fit_verdict_is_what_the_program_reserves_not_its_live_peak(scanned_step):
    """The compiler packs a program's temporaries into one preallocated block that the runtime reserves whole (libtpu's
    own OOM message counts 'HLO temp' with its fragmentation); the live peak XProf shows can be below it. The DeepSeek-V3
    v5p-512 layout at 6 per chip peaks at 94.50 GiB of 95.74 (memory said 'fits') and its allocations need 102.67 GiB
    (libtpu refused the step). required_bytes is preflight's count of the same allocations (tpu_compile.layout_figures:
    arguments + outputs - aliased + temporaries), and a capacity between the two figures is 'does not fit'."""
    from tpuprof import documents_memory
    from tpuprof.advice import memory as advice
    from tpuprof.presentation.memory import module_section
    from tpuprof.presentation.model import Verdict

    folder, module, _ = scanned_step
    (proto,) = folder.glob("*jit_train_step*.after_optimizations.hlo.pb")
    figures = tpu_compile.layout_figures(proto)
    layout = figures["argument_bytes"] + figures["output_bytes"] - figures["alias_bytes"] + figures["temp_bytes"]
    assert module.allocated_bytes == layout
    assert module.required_bytes == layout > module.peak_heap_bytes  # this program's block is larger than its peak
    module.hbm_capacity_bytes = (module.peak_heap_bytes + layout) // 2
    module.suggestions = advice.suggest(module)
    document = documents_memory.document([module], top=5)["modules"][0]
    (verdict,) = [b for b in module_section(document).blocks if isinstance(b, Verdict)]
    assert verdict.fits is False and verdict.text.startswith("does not fit")
    fix = _batch_fix(module)
    assert fix.message.startswith("The program's HBM allocations need")
    assert "of the temporaries' block not live at the peak" in fix.evidence


# libtpu 0.0.42.1's refusal of tpuprof's own step (a 6-layer GPT-3 style model of width 256, seq 128, --remat full,
# 134,320 sequences a chip on tpu7x-8: 67,160 a device), compiled on this machine on 7 Dec 2026.
BUILTIN_REFUSAL = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
                   "(94.75G) exceeds available HBM (94.75G).")


@pytest.mark.parametrize("remat", ["full", "none"])
def test_the_builtin_steps_refusal_is_advised_through_its_options(remat):
    """The compiler's refusal of `preflight --model`'s step went through the OOM triage of a log, which cannot tell
    whether a program rematerialises: a step compiled with --remat full was told to add 'activation checkpointing
    around the repeated blocks', and its batch fix called one device's 67,160 sequences 'per-chip'. The step's own
    options now carry the fixes: remat only at --remat none, the batch through --max-batch, per device."""
    from tpuprof.advice import oom as advice
    from tpuprof.advice.memory import for_builtin_oom
    from tpuprof.analyses.preflight_step import oom_at_batch

    refused = oom_at_batch(BUILTIN_REFUSAL, 67160, 101737037824, 7618560)
    triaged = advice.suggest(refused.report, refused.batch_estimate)
    assert {s["kind"] for s in triaged} >= {"remat", "batch_size"}  # what a log's reader is told
    fixes = {s["kind"]: s for s in for_builtin_oom(tuple(triaged), remat, devices_per_chip=2)}
    assert set(fixes) == ({"remat", "batch_size"} if remat == "none" else {"batch_size"})
    assert fixes["batch_size"]["code"] == "--max-batch"
    assert "per-device batch of 67152 (now 67160)" in fixes["batch_size"]["message"]
    if remat == "none":
        assert fixes["remat"]["code"].startswith("--remat full") and "jax.checkpoint" not in fixes["remat"]["evidence"]


def test_the_builtin_steps_batch_fix_names_the_option_in_sequences_a_chip():
    """--batch-per-chip counts a chip's sequences, the fix a device's: on TPU7x (two devices a chip) a fix of 67,160
    per device was offered as '--batch-per-chip N' beside 'about 67160 fits', half of what the option needs."""
    from tpuprof.advice.memory import _batch_option

    assert _batch_option(67160, 2).startswith("--batch-per-chip 134320 (67160 per device x 2 devices a chip; ")
    assert _batch_option(9840, 1).startswith("--batch-per-chip 9840 (")
    assert _batch_option(None, 2).startswith("--batch-per-chip N (")


@pytest.mark.parametrize("generation, unit", [("v5e", "per-chip"), ("tpu7x", "per-device"), ("v3", "per-device")])
def test_the_batch_is_the_devices_where_a_chip_holds_two(generation, unit):
    """A program is one device's: on TPU7x, v2 and v3 a chip holds two (a TensorCore each), so the batch the memory
    advice reads is the device's, not the chip's. conv18 (batch 256) needs 0.1% of a TPU7x device's HBM: said so,
    not "0%"."""
    from tpuprof.commands import memory

    (module,) = memory.module_memories(DUMPS / "conv18_f32_v5e", target=generation, compile_=False)
    fix = _batch_fix(module)
    assert f"room for a larger {unit} batch" in fix.message and fix.evidence.startswith(f"{unit} batch 256: ")
    assert "needs 0% of HBM" not in fix.message
    if generation == "tpu7x":
        assert module.required_bytes / module.hbm_capacity_bytes < 0.01
        assert "The program needs 0.1% of HBM" in fix.message
