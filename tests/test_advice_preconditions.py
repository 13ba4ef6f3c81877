"""Issue 30's wrong answers, each on the input that showed it: the user-made ones built here the way a user makes
them (a JAX script's multi-module CPU dump, a step jitted with donate_argnums, a PyTorch/XLA run-time OOM), the public
ones read as they are (tests/real_data.py). Compiles are few and small: the CPU dump's 8 tiny modules (then from the
recompile cache), two compiles of a donating step, conv18 at batch 64, the tiny LLM step (test_llm_preflight.py's, from
the session's cache).
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

from tpuprof import targets
from tpuprof.errors import UserError
from tpuprof.sources import tpu_compile

ROOT = Path(__file__).resolve().parent.parent
needs_libtpu = pytest.mark.skipif(not tpu_compile.jax_available(), reason="libtpu not installed")

# A user's JAX training script: RNG seeding and splitting, initialisers, a cast, the train step: 8 modules on XLA:CPU,
# the random initialiser's proto larger than the train step's.
SCRIPT = """
import jax, jax.numpy as jnp
k1, k2 = jax.random.split(jax.random.PRNGKey(0))
w = jax.random.normal(k1, (256, 512), jnp.float32)
x = jax.random.normal(k2, (64, 256)).astype(jnp.bfloat16)
def loss(w, x):
    return jnp.mean(jnp.tanh(x.astype(jnp.float32) @ w) @ w.T)
@jax.jit
def train_step(w, x):
    return w - 0.1 * jax.grad(loss)(w, x)
train_step(w, x).block_until_ready()
"""


@pytest.fixture(scope="session")
def cpu_dump(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jax-cpu-dump")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_dump_to={folder / 'dump'} --xla_dump_hlo_as_proto"}
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, env=env, timeout=300, capture_output=True)
    return folder / "dump"


# ------------------------------------------------------------------ 1. every module of a multi-module dump

@needs_libtpu
def test_memory_recompiles_every_module_largest_peak_first_and_caches(cpu_dump, tmp_path, monkeypatch):
    from tpuprof.commands import memory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    modules = memory.module_memories(cpu_dump, target="v5e")
    names = [m.name for m in modules]
    protos = list(cpu_dump.glob("*.before_optimizations.hlo.pb"))
    assert len(modules) == len(protos) == 8 and "jit_train_step" in names
    # Largest peak first: the train step (w, its gradient and the update) before the initialisers.
    assert names[0] == "jit_train_step"
    assert [m.peak_heap_bytes for m in modules] == sorted((m.peak_heap_bytes for m in modules), reverse=True)
    assert all(m.method == "recompiled" for m in modules)
    cached = memory.module_memories(cpu_dump, target="v5e")  # the same dump again: every module from the cache
    assert all("(cached compile)" in m.notes[-1] for m in cached)
    assert [m.peak_heap_bytes for m in cached] == [m.peak_heap_bytes for m in modules]
    entries = list((tmp_path / "cache" / "tpuprof" / "preflight" / "recompiled").iterdir())
    assert len(entries) == 8 and not [e for e in entries if e.name.startswith(".")]  # no staging folder left


def test_memory_without_compile_leads_with_the_step_and_without_target_names_every_generation(cpu_dump):
    from tpuprof.commands import memory

    modules = memory.module_memories(cpu_dump, target="v5e", compile_=False)
    assert len(modules) == 8
    # The train step first (the estimate of the random initialiser's peak is larger), then the helpers by peak.
    assert modules[0].name == "jit_train_step" and "the training step" in modules[0].notes[0]
    assert [m.peak_heap_bytes for m in modules[1:]] == sorted((m.peak_heap_bytes for m in modules[1:]), reverse=True)
    with pytest.raises(UserError) as error:
        memory.module_memories(cpu_dump)  # no --target: one sentence for the whole dump, every generation named
    assert "none of the 8 modules" in str(error.value)
    assert all(name in str(error.value) for name in targets.TARGETS) and "tpu7x" in str(error.value)


# ------------------------------------------------------------------ 2. donation

DONATING_STEP = """
import sys, jax, jax.numpy as jnp
from tpuprof.sources import tpu_compile
def step(state, x):
    w, m = state
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    m = 0.9 * m + g
    return (w - 0.01 * m, m), jnp.mean(g)
args = ((jnp.zeros((1024, 2048)), jnp.zeros((1024, 2048))), jnp.zeros((256, 1024)))
donate = (0,) if sys.argv[1] == "donated" else ()
tpu_compile.compile_jax(jax.jit(step, donate_argnums=donate), args, "v5e", sys.argv[2])
"""


@needs_libtpu
@pytest.mark.parametrize("donate", ["donated", "not_donated"])
def test_donation_is_advised_only_where_the_outputs_alias_no_argument(donate, tmp_path):
    from tpuprof.commands import memory

    subprocess.run([sys.executable, "-c", DONATING_STEP, donate, str(tmp_path / "dump")], check=True,
                   timeout=600, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    (module,) = memory.module_memories(tmp_path / "dump", target="v5e")
    kinds = [s.kind for s in module.suggestions]
    # The HloProto's own input_output_alias: (w, m) given to the new (w, m) when donated, nothing otherwise.
    if donate == "donated":  # the new state is written over the old one: 16 MiB of outputs in argument buffers
        assert module.aliased_bytes == 16 << 20 and module.alias_pairs == 2 and "donation" not in kinds
    else:
        assert module.aliased_bytes == 0 and module.alias_pairs == 0 and "donation" in kinds
        hint = module.suggestions[kinds.index("donation")]
        assert "outputs in argument buffers 0 B" in hint.evidence and "donate_argnums" in hint.code
        assert "the module declares no input_output_alias" in hint.evidence
        assert "2 parameters have an output of their dtype and shape" in hint.evidence  # w and m, not x


def _program_shape_leaves(shape, index=()):
    """(shape index, (element type, dims)) of each array in a ShapeProto, read here from the proto itself."""
    if shape.tuple_shapes:
        for n, element in enumerate(shape.tuple_shapes):
            yield from _program_shape_leaves(element, (*index, n))
    else:
        yield index, (shape.element_type, tuple(shape.dimensions))


@pytest.mark.parametrize("dump", ["transformer_bf16_v6e", "keras_mlp_v5e"])
def test_donation_of_an_hlo_proto_reads_the_protos_own_input_output_alias(dump):
    """An HloProto carries the module's input_output_alias as the HLO text does: the advice says what it declares
    (never that the input does not carry it) and names the parameters an output of their shape could be written
    over, counted here from the proto's own program shape."""
    from conftest import DUMPS
    from tpuprof import protos
    from tpuprof.commands import memory

    (path,) = (DUMPS / dump).glob("*.hlo.pb")
    proto = protos.hlo_pb2().HloProto.FromString(path.read_bytes())
    assert proto.hlo_module.HasField("input_output_alias") and proto.buffer_assignment.logical_buffers
    declared = list(proto.hlo_module.input_output_alias.entries)
    (module,) = memory.module_memories(path)
    assert module.source_kind == "hlo_proto" and not module.estimated and module.alias_pairs == len(declared)
    hints = [s for s in module.suggestions if s.kind == "donation"]
    if dump == "keras_mlp_v5e":  # 19 declared pairs: TF updates its variables in place, nothing to donate
        assert len(declared) == 19 and not hints
        return
    program = proto.hlo_module.host_program_shape
    outputs = [key for _, key in _program_shape_leaves(program.result)]
    could = 0
    for parameter in program.parameters:
        for _, key in _program_shape_leaves(parameter):
            if key in outputs:
                outputs.remove(key)
                could += 1
    assert not declared and could == 6  # the layer's 6 weights; x and target have no output of their shape
    (hint,) = hints
    assert "the module declares no input_output_alias" in hint.evidence
    assert "does not carry" not in hint.evidence
    assert f"{could} parameters" in hint.evidence
    for op_name in ("params[0]['down']", "params[0]['up']", "params[0]['qkv']", "params[0]['out']"):
        assert op_name in hint.evidence, hint.evidence
    assert "'x'" not in hint.evidence and "target" not in hint.evidence


def test_llama3_train_step_that_donates_40_pairs_gets_no_donation_advice(tmp_path):
    from tpuprof.commands import memory

    path = real_data.real_artefact(real_data.LLAMA3_8B_TRAIN_STEP_V6E_8_HLO, tmp_path)
    header = path.read_text().split("\n", 1)[0]
    assert len(re.findall(r"\{\d+\}: \(\d+, \{\}", header)) == 40  # the module's own input_output_alias
    (module,) = memory.module_memories(path)
    assert module.alias_pairs == 40 and module.aliased_bytes >= 0.99 * module.output_bytes
    assert "donation" not in [s.kind for s in module.suggestions]


# ------------------------------------------------------------------ 3. the batch is the log's, never a hidden size

def test_qwen3_log_batch_is_its_own_per_chip_batch_not_the_hidden_size(tmp_path):
    from tpuprof.commands import oom

    path = real_data.real_artefact(real_data.OOM_QWEN3_JOB_LOG, tmp_path)
    report, estimate, suggestions, _ = oom.explain(str(path))
    assert estimate.current_batch == 1 and estimate.batch_source == "the log: per_chip_batch=1"
    assert estimate.batch_dim != 4096  # f32[4096,151936] is the LM head: hidden x vocabulary
    batch = next(s for s in suggestions if s["kind"] == "batch_size")
    assert "4096" not in batch["message"] and "already 1" in batch["message"] and "saving_bytes" not in batch
    assert not any(s.get("severity") == "blocking" and s.get("saving_bytes") for s in suggestions)


def test_remat_evidence_does_not_claim_op_names_a_cut_log_does_not_hold(tmp_path):
    from tpuprof.commands import oom

    path = real_data.real_artefact(real_data.OOM_QWEN3_CUT_LIST, tmp_path)
    report, _, suggestions, _ = oom.explain(str(path))
    assert not report.allocations  # the list is cut off after its heading: not one op name or label
    remat = next(s for s in suggestions if s["kind"] == "remat")
    assert "no op name or label shows" not in remat["evidence"]
    assert "lists no allocation" in remat["evidence"]


@pytest.fixture(scope="module")
def qwen3_scan_v6e(tmp_path_factory):
    """The public Qwen3-8B train step (scan over 36 layers, splash attention), estimated against a v6e chip."""
    from tpuprof.commands import memory

    path = real_data.real_artefact(real_data.QWEN3_8B_TRAIN_STEP_V6E_8_HLO, tmp_path_factory.mktemp("qwen3"))
    (module,) = memory.module_memories(path, target="v6e", compile_=False)
    return module


def test_scanned_layers_are_not_the_batch(qwen3_scan_v6e):
    from tpuprof.advice.memory import batch_dimension

    # bf16[36,4,4096,12288]: the scan stacks each of its 36 layers' activations; the weights lead with 36 too
    assert any(b.shape.startswith("bf16[36,4,4096,12288]") and b.live_at_peak for b in qwen3_scan_v6e.buffers)
    assert any(b.shape.startswith("bf16[36,1024,6144]") and b.allocation_type == "parameter"
               for b in qwen3_scan_v6e.buffers)
    assert batch_dimension(qwen3_scan_v6e) != 36
    batch = next(s for s in qwen3_scan_v6e.suggestions if s.kind == "batch_size")
    assert "batch of 36" not in batch.message and batch.extra.get("batch", 0) < 36


def test_no_fused_attention_advice_for_a_step_that_runs_splash_attention(qwen3_scan_v6e):
    # The step calls splash attention (its kernels' instructions and op names say so); its [36,4,4096,4096] buffers
    # are layers x batch x sequence x hidden (Qwen3-8B's hidden size is 4096), not queries x keys.
    assert any("splash_mha" in b.instruction for b in qwen3_scan_v6e.buffers)
    assert "attention" not in [s.kind for s in qwen3_scan_v6e.suggestions]


# ------------------------------------------------------------------ 4. padding: dimensions the user chooses

@pytest.mark.slow
@pytest.mark.compile
@needs_libtpu
def test_conv18_preflight_gives_no_padding_fix_on_the_image_width(tmp_path):
    result = run_cli("preflight", "sample_profiles/models/conv18.py:factory", "--tpu", "v5e", "--batch", "64",
                     "--json", timeout=900, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    memory = json.loads(result.stdout)["targets"][0]["memory"]
    padding = [s for s in memory["suggestions"] if s["kind"] == "padding"]
    # images f32[64,64,64,3]{2,1,3,0}: the width (NHWC dim 2) on the lanes, 64 -> 128: not the user's to choose
    assert not any("images" in s["message"] or "use 128" in s["message"] for s in padding)


def test_one_buffer_gets_one_consistent_fix_and_no_size_that_grows_it():
    from tpuprof.advice.memory import batch_dimension, class_counts, convolutional, padding_fix
    from tpuprof.commands import memory

    (module,) = memory.module_memories(ROOT / "sample_profiles" / "dumps" / "conv18_f32_v5e", top=0)
    batch, classes, convolves = batch_dimension(module), class_counts(module, None), convolutional(module)
    kernels = [b for b in module.buffers if b.shape.startswith("f32[3,3,18,18]") and b.padded_dims]
    assert kernels
    for buffer in module.buffers:
        if not buffer.padded_dims:
            continue
        fix = padding_fix(buffer, batch, classes, convolves)
        chosen = [(int(size), int(use)) for size, use in re.findall(r"(\d+) \w+ (?:is|are) padded to \d+: use (\d+)",
                                                                     fix)]
        assert all(use < size for size, use in chosen), fix  # never "use 128" for 18 channels, never "24"
        assert "use 128 channels" not in fix and " or 24" not in fix


def test_padding_fixes_read_the_batch_where_the_batch_advice_does(qwen3_scan_v6e):
    """The padding fixes read the per-chip batch from the inputs (advice.memory.step_batch), as the batch advice
    does, and know a scan's layer count. keras_mlp (Dense 1000 -> Dense 10 classes, batch 256): the temporaries gave
    no batch, the logits no class count, and the output layer's [1000, 10] weight was told 'a feature size of 10 ...
    use 8' (the task's classes). The Qwen3 step's stacked norm scales [36, 1024] were 'the per-chip batch of 36'
    (no batch read), or 'a feature size of 36 ... use 32' (the batch 4 read): 36 is its layer count."""
    from tpuprof.commands import memory
    from tpuprof.commands.report import memory_input

    (keras,) = memory.module_memories(ROOT / "sample_profiles" / "dumps" / "keras_mlp_v5e", top=0)
    rows = {row["instruction"]: row for row in memory_input("keras", [keras]).document["modules"][0]["buffers"]}
    weights = [row for row in rows.values() if row["shape"].startswith("f32[1000,10]") and "fix" in row]
    assert weights
    for row in weights:
        assert "a feature size of 1000 is padded to 1024: use 896" in row["fix"], row["fix"]
        assert "size of 10 " not in row["fix"] and "use 8;" not in row["fix"]
    qwen = memory_input("qwen3", [qwen3_scan_v6e]).document["modules"][0]["buffers"]
    norms = [row for row in qwen if row["shape"].startswith("bf16[36,1024]") and "fix" in row]
    assert norms
    for row in norms:
        assert "the 36 layers stacked for a scan are padded to 40" in row["fix"] and "no size to change" in row["fix"]
        assert "batch of 36" not in row["fix"] and "use 32" not in row["fix"]


def test_a_matmuls_sizes_are_not_a_class_count():
    """int8_matmul (s8[1000, 300] x s8[300, 77] -> s32[1000, 77]) has no classes: with its batch read from its input
    (1000), its argument and its integer product were taken for [batch, classes] logits, and 300 and 77 were
    'the class count is the task's'. Logits are computed floating point; the one-hot sample's 10 classes stay."""
    from tpuprof.advice.memory import buffer_fixes, class_counts, step_batch
    from tpuprof.analyses.memory import describe
    from tpuprof.commands import memory

    (matmul,) = memory.module_memories(ROOT / "sample_profiles" / "dumps" / "int8_matmul_v5e", top=0)
    describe(matmul, matmul.buffers)
    assert step_batch(matmul) == 1000 and class_counts(matmul, 1000) == frozenset()
    fixes = buffer_fixes(matmul)
    assert not any("classes" in fix for fix in fixes.values()), fixes
    assert "a feature size of 300 is padded to 304: use 296" in fixes["a.1"]
    (onehot,) = memory.module_memories(ROOT / "sample_profiles" / "dumps" / "onehot10_v5e", top=0)
    describe(onehot, onehot.buffers)
    assert class_counts(onehot, step_batch(onehot)) == frozenset({10})


# ------------------------------------------------------------------ 5. a PyTorch/XLA run-time OOM

# The form of pytorch/xla#7827 ("xm.mark_step() RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED"): the step's
# graph runs inside xm.mark_step() and its allocation fails there; the RuntimeError line as PyTorch/XLA prints it
# (tests/fixtures/oom/pytorch_xla_8020_runtime_alloc_replica.txt is a real one).
MARK_STEP_OOM = """\
| Training Device=xla:0/0 Step=0 Loss=6.91406 Rate=0.00 GlobalRate=0.00
Traceback (most recent call last):
  File "/home/user/train.py", line 212, in <module>
    train_loop_fn(model, train_loader, optimizer)
  File "/home/user/train.py", line 171, in train_loop_fn
    xm.mark_step()
  File "/usr/local/lib/python3.10/site-packages/torch_xla/core/xla_model.py", line 1056, in mark_step
    torch_xla._XLAC._xla_step_marker(
RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 3.00G. \
That was not possible. There are 1.73G free.; (0x0x0_HBM0)
"""


def test_pytorch_xla_run_time_oom_in_mark_step(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(MARK_STEP_OOM)
    result = run_cli("oom", log, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    (live,) = [s for s in document["suggestions"] if s["kind"] == "live_buffers"]
    assert "saving_bytes" not in live and "1.27G more must be free" in live["message"]  # the shortfall, not a saving
    assert document["framework"] == "pytorch_xla" and "call xm.mark_step()" not in live["code"]
    assert "fails inside xm.mark_step" in live["evidence"]
    human = run_cli("oom", log)
    assert "enough to fit" not in human.stdout and "frees" not in human.stdout
    refused = run_cli("oom", log, "--batch", "128")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--batch is not used" in refused.stderr


def test_real_pytorch_xla_run_time_oom_is_no_saving():
    from tpuprof.commands import oom

    _, _, suggestions, _ = oom.explain(str(ROOT / "tests" / "fixtures" / "oom" /
                                          "pytorch_xla_8020_runtime_alloc_replica.txt"))
    live = next(s for s in suggestions if s["kind"] == "live_buffers")
    assert "saving_bytes" not in live and "61.56M more must be free" in live["message"]


# ------------------------------------------------------------------ 6. tpuprof's own LLM step: its options only

@pytest.mark.compile
@needs_libtpu
def test_builtin_model_is_advised_through_its_options(tmp_path, compile_cache):
    # tests/test_llm_preflight.py's tiny Llama on v6e-16 with its options: in the suite, its compile from the session's
    # cache (so not marked slow: it then takes about a second).
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
                                  "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2}))
    result = run_cli("preflight", "--model", str(config), "--tpu", "v6e-16", "--seq", "256", "--batch-per-chip", "2",
                     "--json", timeout=900, env={"XDG_CACHE_HOME": str(compile_cache)})
    assert result.returncode == 0, result.stderr
    suggestions = json.loads(result.stdout)["targets"][0]["memory"]["suggestions"]
    assert suggestions
    for s in suggestions:  # no Flax/JAX edits of tpuprof's code (a fused attention kernel, dtype=jnp.bfloat16)
        assert s.get("code", "").startswith("--") and "framework" not in s, s
        assert "jnp." not in s.get("code", "") and "splash_attention" not in s.get("code", "")
    # The evidence names the options that build the step, every one of them (those that change the compiled
    # program: tpuprof.models.preflight.FLAGS of the LLM step) and only options preflight has.
    import re

    from tpuprof.models.preflight import FLAGS

    named = set(re.findall(r"--[a-z-]+", suggestions[0]["evidence"].split("the levers are", 1)[1]))
    builds_the_step = {FLAGS[k] for k in ("remat", "dtype", "weight_dtype", "mu_dtype", "grad_dtype", "mesh",
                                         "vocab_tiling", "moe")}
    assert builds_the_step <= named <= set(FLAGS.values()) | {"--batch-per-chip", "--global-batch"}, named
    # `report` on the document reads the compile's dump again: the advice stays the document's (no donation for
    # the step that donates, no framework code).
    from tpuprof.commands import report

    saved = tmp_path / "preflight.json"
    saved.write_text(result.stdout)
    reloaded = report._load_json(saved).document["targets"][0]["memory"]
    assert "timeline" in reloaded and reloaded["suggestions"] == suggestions


@pytest.mark.compile
@needs_libtpu
def test_a_compile_over_hbm_whose_buffer_assignment_is_not_gets_the_batch_fix(tmp_path):
    """preflight's memory breakdown is the buffer assignment libtpu dumps before code generation, which then adds
    temporaries and code: a step can be over HBM by the compile's total while the breakdown's peak is under it.
    The fix is then judged by the compile's total (a 4-layer llama at 264 sequences of 2,048 on v5e-4 was 16.11
    GiB against 15.75 with a breakdown of 12.07 GiB, and no fix was offered). The device here is the v3 step's
    own, offered the HBM between the breakdown's peak and the compile's total."""
    from conftest import SAMPLES

    sys.path.insert(0, str(SAMPLES / "models"))
    try:
        import narrow_mlp
    finally:
        sys.path.remove(str(SAMPLES / "models"))

    from tpuprof.advice.memory import add_compiled_total
    from tpuprof.commands.preflight import _memory
    from tpuprof.sources import tpu_compile

    compiled = tpu_compile.compile_jax(*narrow_mlp.factory(64), "v3", dump_dir=tmp_path / "dump")
    memory = _memory(str(tmp_path / "dump"), "v3", 10)
    peak, needed = memory.peak_heap_bytes, compiled.required_bytes
    assert peak < needed  # code generation added to what the buffer assignment laid out
    memory.hbm_capacity_bytes = (peak + needed) // 2
    assert not any(s.severity == "blocking" for s in memory.suggestions)  # judged by the breakdown: it fits
    add_compiled_total(memory, compiled.memory_analysis())
    blocking = [s for s in memory.suggestions if s.kind == "batch_size" and s.severity == "blocking"]
    assert blocking and blocking[0].saving_bytes == needed - memory.hbm_capacity_bytes
    assert "The compiled step needs" in blocking[0].message and "before code generation" in blocking[0].message
    # preflight compiles the batch the fix names (commands/preflight._target): its saving is then measured.
    from tpuprof.advice.memory import batch_to_measure, measure_batch

    smaller = batch_to_measure(memory)
    assert smaller == blocking[0].extra["batch"] and 8 <= smaller < 64
    at = tpu_compile.compile_jax(*narrow_mlp.factory(smaller), "v3")
    fits = at.required_bytes <= memory.hbm_capacity_bytes
    measure_batch(memory, 64, needed, smaller, at.required_bytes, fits)
    (fix,) = [s for s in memory.suggestions if s.kind == "batch_size"]
    assert fix.confidence == "measured" and fix.saving_bytes == needed - at.required_bytes
    assert (fix.severity == "blocking") == fits and f"Compiled at batch {smaller}" in fix.message
    assert fix.evidence.startswith("measured: compiled at batch 64 the step needs")
