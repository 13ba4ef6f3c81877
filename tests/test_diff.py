"""`tpuprof diff` on real libtpu dumps of one transformer block at batch 64 and 128 (sample_profiles/dumps/
diff_b64, diff_b128) and on real captures of jobs with a known bottleneck."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import DUMPS, SAMPLES, run_cli

from tpuprof.analyses import diff as analysis

B64, B128 = DUMPS / "diff_b64", DUMPS / "diff_b128"
CAPTURES = SAMPLES / "captures"


def metric(document: dict, name: str, group: int = 0) -> dict:
    return next(m for m in document["groups"][group]["metrics"] if m["name"] == name)


@pytest.fixture(scope="module")
def batch_diff():
    result = run_cli("diff", B64, B128, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_batch_64_to_128_reports_growth_per_example(batch_diff):
    a = json.loads(run_cli("memory", B64, "--json").stdout)["modules"][0]
    b = json.loads(run_cli("memory", B128, "--json").stdout)["modules"][0]
    peak = metric(batch_diff, "peak_heap_bytes")
    assert (peak["a"], peak["b"]) == (a["peak_heap_bytes"], b["peak_heap_bytes"])
    assert peak["change"] == b["peak_heap_bytes"] - a["peak_heap_bytes"] > 0
    assert peak["percent"] == pytest.approx(100 * peak["change"] / peak["a"], abs=0.01)
    # The arguments change exactly as the compiler's own memory_analysis() says (the batch of inputs and targets).
    compiled = [json.loads((d / "memory_analysis.json").read_text())["argument_size_in_bytes"] for d in (B64, B128)]
    assert metric(batch_diff, "argument_bytes")["change"] == compiled[1] - compiled[0]
    growth = batch_diff["groups"][0]["per_example"]
    assert (growth["batch_a"], growth["batch_b"]) == (64, 128)  # the samples' sample.json
    assert growth["per_example_bytes"] == round(peak["change"] / 64)
    assert growth["fixed_bytes"] + 64 * growth["per_example_bytes"] == pytest.approx(peak["a"], abs=64)
    # Fits v5e's 15.75 GiB up to the linear estimate; 64 examples more than it would not.
    assert growth["fixed_bytes"] + growth["largest_batch_if_linear"] * growth["per_example_bytes"] \
        <= growth["hbm_capacity_bytes"] < growth["fixed_bytes"] + (growth["largest_batch_if_linear"] + 64) \
        * growth["per_example_bytes"]
    # The attention scores f32[B,8,512,512] are the largest buffer that grows: 512 MiB -> 1 GiB.
    biggest = batch_diff["groups"][0]["buffers"]["changed"][0]
    assert biggest["a_shape"].startswith("f32[64,8,512,512]") and biggest["b_shape"].startswith("f32[128,8,512,512]")
    assert biggest["change"] == 512 * 2**20


def test_batch_is_inferred_from_shapes_without_sample_json(tmp_path, batch_diff):
    for source in (B64, B128):
        shutil.copytree(source, tmp_path / source.name, ignore=shutil.ignore_patterns("sample.json"))
    result = run_cli("diff", tmp_path / B64.name, tmp_path / B128.name, "--json")
    growth = json.loads(result.stdout)["groups"][0]["per_example"]
    assert (growth["batch_a"], growth["batch_b"]) == (64, 128) and "inferred from the shapes" in growth["evidence"]
    assert growth["per_example_bytes"] == batch_diff["groups"][0]["per_example"]["per_example_bytes"]
    given = json.loads(run_cli("diff", tmp_path / B64.name, tmp_path / B128.name, "--json",
                               "--batches", "32,64").stdout)["groups"][0]["per_example"]
    assert given["batch_a"] == 32 and given["per_example_bytes"] == 2 * growth["per_example_bytes"]


def test_threshold_trips_exit_1():
    result = run_cli("diff", B64, B128, "--fail-if", "peak_heap_bytes>+5%")
    assert result.returncode == 1, result.stderr
    assert "FAIL --fail-if peak_heap_bytes>+5%" in result.stdout and "regression" in result.stdout
    assert "per example" in result.stdout.lower()
    # Thresholds the growth (+99 %) stays within pass; a shrink from 128 back to 64 passes a growth limit.
    result = run_cli("diff", B64, B128, "--fail-if", "peak_heap_bytes>+150%", "--fail-if", "padding_at_peak_bytes>+1M")
    assert result.returncode == 0, result.stdout
    assert run_cli("diff", B128, B64, "--fail-if", "peak_heap_bytes>+0%").returncode == 0
    # An absolute limit on B's value: 2 GiB is below batch 128's peak (2.32 GiB), above batch 64's.
    assert run_cli("diff", B64, B128, "--fail-if", "peak_heap_bytes>2G").returncode == 1
    assert run_cli("diff", B128, B64, "--fail-if", "peak_heap_bytes>2G").returncode == 0


def test_identical_inputs_mean_no_change(tmp_path):
    result = run_cli("diff", B64, B64, "--fail-if", "peak_heap_bytes>+0%")
    assert result.returncode == 0 and "no change" in result.stdout
    # A saved --json result against the dump it came from: the same kind, and identical.
    saved = tmp_path / "b64.json"
    saved.write_text(run_cli("memory", B64, "--json", "--top", "0").stdout)
    document = json.loads(run_cli("diff", saved, B64, "--json").stdout)
    assert document["identical"] and document["summary"] == "no change" and not document["regression"]
    capture = CAPTURES / "tf_cached"
    same = run_cli("diff", capture, capture, "--fail-if", "median_ms>+0")
    assert same.returncode == 0 and "no change" in same.stdout


def test_profiles_diff_input_share():
    slow, cached = CAPTURES / "tf_slow_map", CAPTURES / "tf_cached"
    if not slow.is_dir() or not cached.is_dir():
        pytest.fail("captures are missing: run sample_profiles/make_captures.py")
    # The slow-map job sleeps in its tf.data map (input-bound); the cached one is fed from memory.
    result = run_cli("diff", slow, cached, "--json", "--fail-if", "input_bound_percent>+0")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    share = metric(document, "input_bound_percent")
    assert share["a"] >= 20 > share["b"] and share["change"] < 0
    assert document["groups"][0]["verdict"]["a"] == "highly input-bound"
    # The Python map (EagerPyFunc) runs in every step of the slow job and in none of the cached one's top ops.
    ops = {r["name"]: r for r in document["groups"][0]["ops"]}
    assert ops["EagerPyFunc"]["a_ms_per_step"] > 100 and ops["EagerPyFunc"]["b_ms_per_step"] is None
    assert run_cli("diff", cached, slow, "--fail-if", "input_bound_percent>+0").returncode == 1


@pytest.mark.parametrize("args, message", [
    ([B64, CAPTURES / "tf_cached"], "give two inputs of the same kind"),
    ([B64, B128, "--fail-if", "peak_heap_bytes bigger"], "cannot read --fail-if"),
    ([B64, B128, "--fail-if", "median_ms>+5%"], "no metric 'median_ms' in a memory diff"),
    ([B64, B128, "--batches", "64"], "--batches takes two batch sizes"),
])
def test_bad_input_exit_2(args, message):
    result = run_cli("diff", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("expression, on, limit", [
    ("peak_heap_bytes>+5%", "percent", 5.0),
    ("temp_bytes >= +100M", "change", 100 * 2**20),
    ("median_ms>+2", "change", 2.0),
    ("median_ms>0.5s", "value", 500.0),
    ("input_bound_percent>20", "value", 20.0),
    ("peak_heap_bytes<-1.5GiB", "change", -1.5 * 2**30),
])
def test_threshold_syntax(expression, on, limit):
    threshold = analysis.parse_threshold(expression)
    assert (threshold.on, threshold.limit) == (on, limit)


# ---- presentation (issue #10): what a diff of two profiles compares, and how --fail-if reads it

def test_profiles_diff_compares_shares_in_points_and_nothing_window_dependent():
    slow, cached = CAPTURES / "tf_slow_map", CAPTURES / "tf_cached"
    document = json.loads(run_cli("diff", slow, cached, "--json").stdout)
    group = document["groups"][0]
    names = [m["name"] for m in group["metrics"]]
    assert len(names) == len(set(names)) and "input_percent" not in names  # input: one row, XProf's name
    assert "step_count" not in names  # it grows with the capture's length
    assert group["steps_measured"]["a"] >= 5 and group["steps_measured"]["b"] > group["steps_measured"]["a"]
    for m in group["metrics"]:
        if m["unit"] == "percent":  # a share: its change is in points, never a relative %
            assert m["percent"] is None and m["change"] == pytest.approx(m["b"] - m["a"])
    text = run_cli("diff", slow, cached, env={"COLUMNS": "120"}).stdout
    assert "steps: steps" not in text and "Step time" in text
    assert "+2809" not in text and " pts" in text
    # Ops in only one report's top list say so: EagerPyFunc (the Python map) is gone with the cache.
    eager = next(line for line in text.splitlines() if line.startswith("EagerPyFunc"))
    assert eager.split()[-1] == "gone"


def test_fail_if_on_a_share_takes_points_and_either_name():
    slow, cached = CAPTURES / "tf_slow_map", CAPTURES / "tf_cached"
    relative = run_cli("diff", cached, slow, "--fail-if", "input_bound_percent>+5%")
    assert relative.returncode == 2 and "compared in percentage points" in relative.stderr
    for name in ("input_bound_percent", "input_percent"):  # the same figure under XProf's and the breakdown's name
        tripped = run_cli("diff", cached, slow, "--fail-if", f"{name}>+50")
        assert tripped.returncode == 1 and "input_bound_percent +" in tripped.stdout


def test_fail_if_compares_the_figure_it_prints():
    """b64 -> b128: the peak grows by 98.99...%, printed +99.0%: `>=+99%` trips, as the table suggests."""
    document = json.loads(run_cli("diff", B64, B128, "--json").stdout)
    peak = metric(document, "peak_heap_bytes")
    exact = 100 * (peak["b"] - peak["a"]) / peak["a"]
    assert 98.95 <= exact < 99
    result = run_cli("diff", B64, B128, "--fail-if", "peak_heap_bytes>=+99%")
    assert result.returncode == 1 and "+99.0%" in result.stdout
    assert "FAIL --fail-if peak_heap_bytes>=+99% (jit_train_step): peak_heap_bytes +99.0%." in result.stdout
    assert run_cli("diff", B64, B128, "--fail-if", "peak_heap_bytes>+99%").returncode == 0  # 99.0 is not > 99


def test_an_exact_dump_against_its_own_estimated_text_says_the_methods_differ():
    """The same program read twice: the HloProto's buffer assignment (exact) and the HLO text (a liveness estimate).
    The estimate counts its temporaries and buffers otherwise, so the diff shows changes no program made; it says so."""
    text = next((DUMPS / "diff_b64").glob("*.after_optimizations.txt"))
    result = run_cli("diff", DUMPS / "diff_b64", text, "--json")
    assert result.returncode == 0, result.stderr
    (group,) = json.loads(result.stdout)["groups"]
    temp = next(m for m in group["metrics"] if m["name"] == "temp_bytes")
    assert temp["change"] != 0  # the same program, counted two ways
    assert group["methods"] == {"a": "buffer_assignment", "b": "hlo_liveness"}
    for form in ("table", "markdown"):
        shown = run_cli("diff", DUMPS / "diff_b64", text, "--format", form).stdout
        assert "B's figures are an estimate" in " ".join(shown.split()) and "not the program's" in shown, shown
    same = run_cli("diff", DUMPS / "diff_b64", DUMPS / "diff_b128")
    assert same.returncode == 0 and "figures are an estimate" not in same.stdout


def test_steps_of_different_batch_counts_compare_per_batch():
    """tf_tiny_spe1 -> tf_tiny_spe64 is one Keras job at steps_per_execution 1 and 64: a step call of B runs 64
    batches. Its step time is +4,720% while each batch got faster: the diff compares per batch as each capture's
    own analysis divides it, says why, and --fail-if can hold the per-batch figure."""
    spe1, spe64 = CAPTURES / "tf_tiny_spe1", CAPTURES / "tf_tiny_spe64"
    analyses = [json.loads(run_cli("analyze", c, "--json").stdout)["steps"] for c in (spe1, spe64)]
    assert [s["batches_per_step"] for s in analyses] == [1, 64]
    document = json.loads(run_cli("diff", spe1, spe64, "--json").stdout)
    group = document["groups"][0]
    assert group["batches_per_step"] == {"a": 1, "b": 64}
    for name in ("mean_ms", "median_ms"):
        row = metric(document, f"{name}_per_batch")
        assert (row["a"], row["b"]) == tuple(pytest.approx(s[name] / s["batches_per_step"], abs=1e-3)
                                             for s in analyses)
    assert metric(document, "mean_ms")["change"] > 0 > metric(document, "mean_ms_per_batch")["change"]
    assert any("count different work" in c for c in group["caveats"])
    text = run_cli("diff", spe1, spe64, env={"COLUMNS": "120"}).stdout
    assert "A step runs 1 batch in A and 64 in B" in " ".join(text.split())
    assert run_cli("diff", spe1, spe64, "--fail-if", "mean_ms_per_batch>+0").returncode == 0
    assert run_cli("diff", spe64, spe1, "--fail-if", "mean_ms_per_batch>+0").returncode == 1
    same = json.loads(run_cli("diff", CAPTURES / "jax_compute", CAPTURES / "jax_slow_loader", "--json").stdout)
    assert not any(m["name"].endswith("_per_batch") for m in same["groups"][0]["metrics"])  # one batch a step each


def test_steps_of_different_programs_say_so(tmp_path):
    """The public v6e captures: a Pallas matmul on 1 chip against a host-offload `jit_f` on 4. The diff read
    +294,722% step time with no word that the steps are different programs; it names each side's steps (without
    the programs' fingerprints, which change with every recompile of one function)."""
    from helpers.real_data import TPU_HOST_OFFLOAD_V6E_4, TPU_PALLAS_MATMUL_V6E_1, real_artefact

    pallas = real_artefact(TPU_PALLAS_MATMUL_V6E_1, tmp_path / "pallas")
    offload = real_artefact(TPU_HOST_OFFLOAD_V6E_4, tmp_path / "offload")
    document = json.loads(run_cli("diff", pallas, offload, "--json").stdout)
    assert document["groups"][0]["step_sources"] == {
        "a": ["executions of program `jit_matmul_optimized` of 1 TPU chip(s)"],
        "b": ["executions of program `jit_f` of 4 TPU chip(s)"]}
    text = " ".join(run_cli("diff", pallas, offload, env={"COLUMNS": "120"}).stdout.split())
    assert "A's steps are executions of program `jit_matmul_optimized` of 1 TPU chip(s), B's are" in text
    alike = run_cli("diff", CAPTURES / "jax_compute", CAPTURES / "jax_slow_loader").stdout
    assert "A's steps are" not in alike  # one job's loop, `train` markers in both
