"""The Python API (`import tpuprof`) on the samples: every function returns the figures the CLI's --json prints
for the same input (the CLI renders these very results), errors carry the CLI's sentence, and importing the
package stays light. Only the public API is used here: `tpuprof.<function>` and the results' attributes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import DUMPS, ROOT, SAMPLES, run_cli

import tpuprof

CAPTURES = SAMPLES / "captures"
OOM_LOGS = SAMPLES / "oom"
MODELS = SAMPLES / "models"


def cli_json(*args: str, env: dict | None = None, exit_code: int = 0) -> dict:
    result = run_cli(*map(str, args), "--json", timeout=600, env=env)
    assert result.returncode == exit_code, result.stderr
    return json.loads(result.stdout)


def cli_error(*args: str) -> str:
    """The sentence the CLI prints for bad input (exit code 2), without its 'tpuprof: ' prefix."""
    result = run_cli(*map(str, args))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("tpuprof: ")
    return result.stderr.removeprefix("tpuprof: ").strip()


# ------------------------------------------------------------------------------------------------ import


def test_import_is_light_and_loads_no_framework():
    """`import tpuprof` in a fresh interpreter: under 0.2 s by -X importtime's own count (cumulative time of
    the package, interpreter start-up excluded), and no TensorFlow, JAX, numpy, rich, typer or plotly."""
    probe = ("import sys, tpuprof; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
             "{'tensorflow', 'jax', 'jaxlib', 'numpy', 'rich', 'typer', 'plotly', 'google'}); print(heavy)")
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"
    package = [line for line in result.stderr.splitlines() if line.rstrip().endswith("| tpuprof")]
    assert len(package) == 1, result.stderr[-2000:]
    cumulative_us = int(package[0].split("|")[1])
    assert cumulative_us < 200_000, f"import tpuprof took {cumulative_us / 1e3:.0f} ms"
    assert callable(tpuprof.memory) and tpuprof.__version__


# ------------------------------------------------------------------------------------------------ memory

DUMP_SAMPLES = sorted(p.name for p in DUMPS.iterdir() if p.is_dir())


def sample_target(name: str) -> str:
    """The generation a sample dump was made for (sample.json): HLO without TPU layouts needs it."""
    return json.loads((DUMPS / name / "sample.json").read_text())["target"]


@pytest.mark.parametrize("name", DUMP_SAMPLES)
def test_memory_result_is_the_cli_json(name):
    result = tpuprof.memory(DUMPS / name, target=sample_target(name))
    document = cli_json("memory", DUMPS / name, "--target", sample_target(name))
    assert result.to_dict() == document
    assert json.loads(result.to_json()) == document
    largest = max(document["modules"], key=lambda m: (m["peak_heap_bytes"] or 0, m["temp_bytes"] or 0))
    assert result.module.name == largest["name"]
    assert result.peak_heap_bytes == largest["peak_heap_bytes"]
    assert result.padding_at_peak_bytes == largest["padding_at_peak_bytes"]
    documented = [s for m in document["modules"] for s in m["suggestions"]]
    assert [(s.kind, s.message) for s in result.suggestions] == [(s["kind"], s["message"]) for s in documented]


def test_memory_options_match_the_cli_options():
    path = DUMPS / "transformer_bf16_v6e"
    result = tpuprof.memory(path, target="v5e", top=3)
    assert result.to_dict() == cli_json("memory", path, "--target", "v5e", "--top", "3")
    assert all(m.hbm_capacity_bytes == result.to_dict()["modules"][0]["hbm_capacity_bytes"] for m in result.modules)


def test_notebook_view_shows_the_peak_and_the_fixes():
    result = tpuprof.memory(DUMPS / "conv18_f32_v5e")
    page = result._repr_html_()
    from tpuprof.units import fmt_bytes

    assert fmt_bytes(result.peak_heap_bytes) in page
    assert result.module.name in page
    assert "What to change" in page and len(result.suggestions) >= 1


# ------------------------------------------------------------------------------------------------ analyze

CAPTURE_SAMPLES = sorted(p.name for p in CAPTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", CAPTURE_SAMPLES)
def test_analyze_result_is_the_cli_json(name):
    result = tpuprof.analyze(CAPTURES / name)
    document = cli_json("analyze", CAPTURES / name)
    assert result.to_dict() == document
    assert round(result.median_ms, 3) == document["steps"]["median_ms"]
    assert result.verdict == document["verdict"]
    assert [s.kind for s in result.suggestions] == [s["kind"] for s in document["suggestions"]]
    assert document["verdict"] in result._repr_html_()


# ------------------------------------------------------------------------------------------------ oom

OOM_SAMPLES = sorted(p.name for p in OOM_LOGS.glob("*.txt"))


@pytest.mark.parametrize("name", OOM_SAMPLES)
def test_oom_from_a_path_or_its_text_is_the_cli_json(name):
    log = OOM_LOGS / name
    document = cli_json("oom", log, "--batch", "128")
    from_path = tpuprof.oom(log, batch=128)
    from_text = tpuprof.oom(log.read_text(), batch=128)
    from_bytes = tpuprof.oom(log.read_bytes(), batch=128)
    assert from_path.to_dict() == document
    assert from_text.to_dict() == document == from_bytes.to_dict()
    for figure in ("used_bytes", "capacity_bytes", "hlo_temp_bytes"):  # a figure the message lacks is left out
        assert getattr(from_path.report, figure) == document.get(figure), figure
    assert from_path.report.capacity_bytes or from_path.report.hlo_temp_bytes
    assert from_path.batch_estimate.fitting_batch == document["batch_estimate"]["fitting_batch"]
    assert [s.kind for s in from_text.suggestions] == [s["kind"] for s in document["suggestions"]]


def test_oom_without_an_error_is_the_cli_sentence(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.3\nstep 2 loss 2.1\n")
    with pytest.raises(tpuprof.UserError) as raised:
        tpuprof.oom(log)
    assert str(raised.value) == cli_error("oom", log)
    with pytest.raises(tpuprof.UserError, match="no TPU out-of-memory error found in the text"):
        tpuprof.oom("step 1 loss 2.3\nstep 2 loss 2.1\n")
    with pytest.raises(tpuprof.UserError, match="does not exist"):  # a mistyped path is not taken for text
        tpuprof.oom(str(tmp_path / "trian.log"))


# ------------------------------------------------------------------------------------------------ errors


def test_errors_are_one_exception_carrying_the_cli_sentence():
    with pytest.raises(tpuprof.UserError) as raised:  # a profile given to memory
        tpuprof.memory(CAPTURES / "tf_slow_map")
    assert str(raised.value) == cli_error("memory", CAPTURES / "tf_slow_map")
    with pytest.raises(tpuprof.UserError) as raised:  # a dump given to analyze
        tpuprof.analyze(DUMPS / "conv18_f32_v5e")
    assert str(raised.value) == cli_error("analyze", DUMPS / "conv18_f32_v5e")
    with pytest.raises(tpuprof.UserError) as raised:  # two inputs of different kinds
        tpuprof.diff(DUMPS / "diff_b64", CAPTURES / "tf_slow_map")
    assert str(raised.value) == cli_error("diff", DUMPS / "diff_b64", CAPTURES / "tf_slow_map")


# ------------------------------------------------------------------------------------------------ diff and report


def test_diff_of_paths_and_of_results_is_the_cli_json():
    a, b = DUMPS / "diff_b64", DUMPS / "diff_b128"
    document = cli_json("diff", a, b, "--fail-if", "peak_heap_bytes>+5%", exit_code=1)  # 1: a regression
    compared = tpuprof.diff(a, b, fail_if=["peak_heap_bytes>+5%"])
    assert compared.to_dict() == document
    assert compared.regression is document["regression"] is True
    # Results of the API compare as their paths do (the batches come from sample.json only for paths).
    of_results = tpuprof.diff(tpuprof.memory(a), tpuprof.memory(b), batches=(64, 128),
                              fail_if=["peak_heap_bytes>+5%"]).to_dict()
    for group in (*of_results["groups"], *document["groups"]):  # where the batches came from differs, only
        group["per_example"].pop("evidence")
    assert of_results["groups"] == document["groups"]
    assert of_results["thresholds"] == document["thresholds"]


def test_report_of_paths_is_the_cli_json_and_takes_results(tmp_path):
    inputs = [DUMPS / "conv18_f32_v5e", CAPTURES / "tf_slow_map", OOM_LOGS / OOM_SAMPLES[0]]
    document = cli_json("report", *inputs, "-o", tmp_path / "cli.html")
    written = tpuprof.report(inputs, tmp_path / "api.html")
    assert {**written.to_dict(), "output": None, "bytes": None} == {**document, "output": None, "bytes": None}
    assert (tmp_path / "api.html").stat().st_size == written.bytes
    memory = tpuprof.memory(inputs[0])
    mixed = tpuprof.report([memory, tpuprof.analyze(inputs[1]), inputs[2]], tmp_path / "mixed.html")
    assert [i["kind"] for i in mixed.to_dict()["inputs"]] == [i["kind"] for i in document["inputs"]]
    page = (tmp_path / "mixed.html").read_text()
    assert memory.module.name in page
    # The report ranks every input's fixes in one order (the OOM's, which does not fit, first); each input's
    # own fixes keep their command's order within it.
    messages = [s.message for s in mixed.suggestions]
    own = [m for m in messages if m in {s.message for s in memory.suggestions}]
    assert own == [s.message for s in memory.suggestions]
    oom_messages = {s["message"] for s in cli_json("oom", inputs[2])["suggestions"]}
    assert messages[0] in oom_messages
    with pytest.raises(tpuprof.UserError, match="is a folder"):
        tpuprof.report(inputs[0], tmp_path)


def test_trace_is_the_cli_json_and_writes_the_same_trace(tmp_path):
    capture = CAPTURES / "jax_compute"
    document = cli_json("trace", capture, "-o", tmp_path / "cli.pftrace", "--steps", "450:453")
    written = tpuprof.trace(capture, tmp_path / "api.pftrace", steps="450:453")
    assert {**written.to_dict(), "output": None} == {**document, "output": None}
    assert written.steps == [450, 451, 452] and written.events > 0
    assert (tmp_path / "api.pftrace").read_bytes() == (tmp_path / "cli.pftrace").read_bytes()
    with pytest.raises(tpuprof.UserError, match="exists"):  # never an overwritten file without force
        tpuprof.trace(capture, tmp_path / "api.pftrace")
    assert tpuprof.trace(capture, tmp_path / "api.pftrace", force=True).steps != [450, 451, 452]


# ------------------------------------------------------------------------------------------------ preflight


@pytest.fixture(scope="module")
def api_compile_cache(compile_cache, monkeypatch_module):
    """The session's compile cache, for the API's compiles as for the CLI's."""
    monkeypatch_module.setenv("XDG_CACHE_HOME", str(compile_cache))
    return compile_cache


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _without_cache_paths(document: dict) -> dict:
    return {**document, "targets": [{k: v for k, v in t.items() if k not in ("cache", "dump_dir")}
                                    for t in document["targets"]]}


@pytest.mark.slow
def test_preflight_of_a_jax_function_and_its_arguments_matches_the_cli(api_compile_cache):
    """A notebook's jitted step and arguments compile to the same program as the CLI's file.py:factory: the
    same bytes at the arguments' batch, and at another batch (inputs resized, parameters kept)."""
    sys.path.insert(0, str(MODELS))
    try:
        import narrow_mlp
    finally:
        sys.path.remove(str(MODELS))
    spec = f"{MODELS / 'narrow_mlp.py'}:factory"
    # v3, where libtpu compiles fastest (this test is not about the generation); batch 256 there is also
    # test_preflight.py's side-by-side run's, so one compile serves both through the session's cache.
    env = {"XDG_CACHE_HOME": str(api_compile_cache)}
    at_256 = cli_json("preflight", spec, "--tpu", "v3", "--batch", "256", env=env)["targets"][0]
    at_8 = cli_json("preflight", spec, "--tpu", "v3", "--batch", "8", env=env)["targets"][0]

    step, (params, x, y) = narrow_mlp.factory(256)
    mine = tpuprof.preflight(step, params, x, y, tpu="v3")
    (target,) = mine.to_dict()["targets"]
    assert target["batch_size"] == 256
    for key in ("fits", "required_bytes", "argument_bytes", "temp_bytes", "peak_heap_bytes"):
        assert target[key] == at_256[key], key
    assert mine.fits is at_256["fits"] is True
    resized = tpuprof.preflight(step, params, x, y, tpu="v3", batch=8).to_dict()["targets"][0]
    for key in ("required_bytes", "argument_bytes", "temp_bytes"):
        assert resized[key] == at_8[key], key

    as_text = tpuprof.preflight(spec, tpu="v3", batch=256)
    assert _without_cache_paths(as_text.to_dict()) == _without_cache_paths(
        cli_json("preflight", spec, "--tpu", "v3", "--batch", "256", env=env))

    # Throughput and cost options (cached compile): the same estimate as --tokens-per-example and --price.
    priced = tpuprof.preflight(spec, tpu="v3", batch=256, tokens_per_example=512, price={"v3": 1.5})
    cli_priced = cli_json("preflight", spec, "--tpu", "v3", "--batch", "256", "--tokens-per-example", "512",
                          "--price", "v3=1.5", env=env)
    assert priced.to_dict()["targets"][0]["estimate"] == cli_priced["targets"][0]["estimate"]
    assert priced.to_dict()["targets"][0]["estimate"]["price_per_chip_hour"] == 1.5


def test_another_batch_keeps_parameters_whose_leading_dimension_equals_the_batch():
    """narrow_mlp.py's layers are 256 wide and its example batch is 256: every parameter leads with the batch
    too. Batch 8 resizes the inputs and labels only (tracing tells them apart; no compile)."""
    sys.path.insert(0, str(MODELS))
    try:
        import narrow_mlp
    finally:
        sys.path.remove(str(MODELS))
    from tpuprof.sources import python_step

    step, (params, x, y) = narrow_mlp.factory(256)
    assert all(p.shape[0] == 256 for p in params)
    spec, example_batch = python_step.spec_from_objects(step, (params, x, y))
    _, (params_8, x_8, y_8) = spec.factory(8)
    assert example_batch == 256 and [p.shape for p in params_8] == [p.shape for p in params]
    assert (x_8.shape, y_8.shape) == ((8, 1024, 256), (8, 1024, 1))


def test_preflight_of_a_keras_model_matches_the_cli(api_compile_cache):
    sys.path.insert(0, str(MODELS))
    try:
        import keras_mlp
    finally:
        sys.path.remove(str(MODELS))
    cli_target = cli_json("preflight", f"{MODELS / 'keras_mlp.py'}:factory", "--tpu", "v3", "--batch", "64",
                          env={"XDG_CACHE_HOME": str(api_compile_cache)})["targets"][0]
    model, x_spec, y_spec = keras_mlp.factory(64)
    mine = tpuprof.preflight(model, x_spec, y_spec, tpu="v3").to_dict()["targets"][0]
    for key in ("batch_size", "fits", "required_bytes", "argument_bytes", "temp_bytes", "peak_heap_bytes"):
        assert mine[key] == cli_target[key], key


def test_preflight_bad_calls_are_one_sentence():
    with pytest.raises(tpuprof.UserError, match="either batch=N or max_batch=, not both"):
        tpuprof.preflight(lambda x: x, tpu="v5e", batch=8, max_batch=True)
    with pytest.raises(tpuprof.UserError) as raised:
        tpuprof.preflight("nope.py:factory", tpu="v9z", batch=8)
    assert "v9z" in str(raised.value)


# ------------------------------------------------------------------------------------------------ capture


def test_capture_with_analysis_is_what_analyze_reads(profiler_job, tmp_path):
    job = profiler_job("jax_job.py", "--slow-loader-ms", "20")
    captured = tpuprof.capture(service_addr=job.address, logdir=str(tmp_path / "logs"), duration="1s",
                               analyze=True)
    document = captured.to_dict()
    assert document["run_dir"] == captured.run_dir
    assert captured.analysis is not None, captured.analysis_error
    assert document["analysis"] == cli_json("analyze", captured.run_dir)
    assert captured.analysis.report.step_count >= 5


def test_a_functions_batch_is_said_to_be_its_arguments_leading_dimension(api_compile_cache):
    """A time-major input ([T, B, D]) leads with its sequence, which tpuprof cannot tell from a batch: the answer
    says which dimension of which arguments it took as the batch, so a throughput per 'example' is not taken on
    trust."""
    import jax
    import jax.numpy as jnp

    from tpuprof.presentation import preflight as shown

    def step(w, x, y):
        return w - 0.1 * jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)

    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    x = y = jax.ShapeDtypeStruct((256, 32, 64), jnp.float32)
    document = tpuprof.preflight(step, w, x, y, tpu="v3").to_dict()
    (target,) = document["targets"]
    assert target["batch_size"] == 256
    assert target["batch_from"].startswith("the leading dimension of example argument(s) 2 (256x32x64), "
                                           "3 (256x32x64), taken as the batch")
    facts = {b.label: b.value for b in shown.section(document).blocks if hasattr(b, "label")}
    assert facts["v3 batch"].startswith("256: the leading dimension")
