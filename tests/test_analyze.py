"""`tpuprof analyze` on real captures of jobs with a built-in bottleneck, and on TPU-plane XSpaces.

The captures in sample_profiles/captures/ come from sample_profiles/make_captures.py: each is a real
profiler capture (loopback, the real client) of a job in sample_profiles/jobs/ whose bottleneck is
built into the job. XProf 2.24 is the oracle where it has an answer, and the tests show where it has
none ("No step time measured") or the wrong one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SAMPLES
from helpers.synthetic_xspace import Layout, tpu_xspace, write_run

from tpuprof import cli
from tpuprof.commands import analyze as command
from tpuprof import documents_analyze

CAPTURES = SAMPLES / "captures"


def capture(name: str):
    folder = CAPTURES / name
    if not any(folder.rglob("*.xplane.pb")):
        pytest.fail(f"sample capture {name} is missing: run `python sample_profiles/make_captures.py {name}`")
    return folder


@pytest.fixture(scope="module")
def reports():
    """Each committed capture analysed once."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = command.profile_summary(str(capture(name)))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def xprof(tmp_path_factory):
    """XProf's input_pipeline_analyzer summary (`input_conclusion`, `steptime_ms_average`...) on a copy of a
    capture (it writes cache files beside the file it reads)."""
    from xprof.convert import raw_to_tool_data

    scratch = tmp_path_factory.mktemp("xprof")
    cache: dict[str, dict] = {}

    def summary(name: str) -> dict:
        if name in cache:
            return cache[name]
        source = next(capture(name).rglob("*.xplane.pb"))
        copy = scratch / name / source.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], "input_pipeline_analyzer", {})
        tables = json.loads(data)
        summary = dict(next(t["p"] for t in tables if "input_conclusion" in t.get("p", {})))
        # XProf's input-op table: one row per tf.data iterator, with its count and self time.
        ops = next(t for t in tables if any(c.get("id") == "selfTimeInMs" for c in t.get("cols", [])))
        columns = [c["id"] for c in ops["cols"]]
        summary["stages"] = {row["c"][0]["v"]: dict(zip(columns, (c.get("v") for c in row["c"])))
                             for row in ops.get("rows", [])}
        cache[name] = summary
        return summary

    return summary


def kinds(report) -> list[str]:
    return [s["kind"] for s in report.suggestions]


# --- real captures -------------------------------------------------------------------------------------


def test_tf_slow_python_map_is_input_bound_where_xprof_measures_no_step(reports, xprof):
    report = reports("tf_slow_map")
    assert "No step time measured" in xprof("tf_slow_map")["input_conclusion"]
    assert report.step_count >= 3
    assert report.input_bound_percent >= 60
    assert report.verdict == "highly input-bound"
    stage = report.bottleneck_stage
    assert stage.kind == "Map" and stage.py_function_ps > 0.5 * stage.self_ps  # the job's py_function sleep
    first = report.suggestions[0]
    assert first["kind"] == "input_pipeline"
    assert "py_function" in first["message"] and "num_parallel_calls=tf.data.AUTOTUNE" in first["message"]
    assert "Map" in first["evidence"]


@pytest.mark.parametrize("name, several_epochs", [("tf_slow_map", False), ("tf_tiny_spe64", True)])
def test_tf_data_stage_self_times_equal_xprofs(reports, xprof, name, several_epochs):
    """Per-iterator counts and self times agree with XProf's input-op table (sequential and parallel maps)."""
    from tpuprof.analyses.input_pipeline import without_epochs

    theirs: dict[str, dict] = {}  # XProf lists a stage once per repeat() epoch; tpuprof once in all: sum XProf's
    for stage_name, row in xprof(name)["stages"].items():
        into = theirs.setdefault(without_epochs(stage_name), {"count": 0, "selfTimeInMs": 0.0, "epochs": 0})
        into["count"] += row["count"]
        into["selfTimeInMs"] += row["selfTimeInMs"]
        into["epochs"] += 1
    ours = {stage.name: stage for stage in reports(name).stages}
    assert len(theirs) >= 4 and set(ours) == set(theirs)
    assert any(row["epochs"] > 1 for row in theirs.values()) == several_epochs  # spe64 spans epochs: sums tested
    for stage_name, row in theirs.items():
        assert ours[stage_name].count == row["count"], stage_name
        assert ours[stage_name].self_ps / 1e9 == pytest.approx(row["selfTimeInMs"], abs=0.01 * row["epochs"]), stage_name


def test_tf_cached_data_is_not_input_bound(reports, xprof):
    report = reports("tf_cached")
    assert "No step time measured" in xprof("tf_cached")["input_conclusion"]
    assert report.step_count >= 10
    assert report.input_bound_percent <= 15
    assert "input-bound" not in report.verdict
    assert "input_pipeline" not in kinds(report)


def overhead_ms_per_batch(report) -> float:
    return report.breakdown_ms_per_step["host_overhead"] / report.batches_per_step


def test_tiny_keras_model_one_step_per_call_gets_steps_per_execution(reports, xprof):
    report = reports("tf_tiny_spe1")
    assert "No step time measured" in xprof("tf_tiny_spe1")["input_conclusion"]
    assert report.batches_per_step == 1
    # The model is a few hundred FLOPs: the per-call host overhead is most of the step.
    assert report.breakdown_percent["host_overhead"] >= 20
    assert report.breakdown_ms_per_step["host_overhead"] > 2 * report.breakdown_ms_per_step["compute"]
    advice = next(s for s in report.suggestions if s["kind"] == "steps_per_execution")
    assert advice["steps_per_execution"] >= 2  # as many as reach the input pipeline's pace (the test below)
    assert f"steps_per_execution={advice['steps_per_execution']}" in advice["message"]


def test_steps_per_execution_promises_no_batch_faster_than_the_input_pipeline_delivers(reports, xprof):
    """tf_tiny_spe1 and tf_tiny_spe64 are one Keras job at steps_per_execution 1 and 64. The advice on spe1 promised
    6.1x (1.05 -> 0.17 ms a batch) while its tf.data prefetch thread took 0.54 ms to produce each batch; spe64 made
    0.72 ms a batch, input-bound. The promise stops at the pipeline's pace, taken here from XProf's stage table."""
    report = reports("tf_tiny_spe1")
    stages = xprof("tf_tiny_spe1")["stages"]
    # The prefetch thread's time in the stage it fills its buffer from (XProf's total time of the batch stage),
    # per batch the training loop took (the Root's calls).
    pace = stages["Iterator::Root::Prefetch::BatchV2"]["timeInMs"] / stages["Iterator::Root"]["count"]
    advice = next(s for s in report.suggestions if s["kind"] == "steps_per_execution")
    promised = report.mean_ms - advice["saving_ms_per_step"]  # one batch a step now
    assert promised == pytest.approx(pace, rel=0.02) and f"{pace:.2f} ms" in advice["evidence"]
    applied = reports("tf_tiny_spe64")
    assert applied.mean_ms / applied.batches_per_step >= promised  # what 64 a call made: no faster than promised
    assert advice["steps_per_execution"] < 64 and "larger batch" not in advice["message"]


def test_tiny_keras_model_64_steps_per_call_gets_no_steps_per_execution(reports, xprof):
    report = reports("tf_tiny_spe64")
    assert "No step time measured" in xprof("tf_tiny_spe64")["input_conclusion"]
    assert report.batches_per_step == 64  # the GetNext calls inside each multi_step_on_iterator call
    assert "steps_per_execution" not in kinds(report)
    # The same per-call overhead, paid once for 64 batches.
    assert overhead_ms_per_batch(report) < overhead_ms_per_batch(reports("tf_tiny_spe1")) / 4
    # Its input wait is the parallel map (TF parallelised the job's map), over every repeat() epoch.
    stage = report.bottleneck_stage
    assert stage.name == "Iterator::Root::Prefetch::BatchV2::ForeverRepeat::ParallelMapV2"
    epochs = [row for name, row in xprof("tf_tiny_spe64")["stages"].items()
              if re.sub(r"\[\d+\]", "", name) == stage.name]
    assert len(epochs) >= 2 and stage.count == sum(row["count"] for row in epochs)
    assert "already runs in parallel" in report.suggestions[0]["message"]
    # Top ops carry the layer's name, not the `while/body/_1/...` scopes of the 64-step loop.
    assert report.top_ops[0].name == "sequential_1/dense_1/Relu"


def test_input_advice_on_three_steps_is_not_blocking_and_says_so(reports):
    """tf_tiny_spe64 holds 3 measured steps, and the output said both "Only 3 steps measured: ... too few steps to
    trust" and a blocking input suggestion. Each of the 3 steps waits for input about half its time (53-57%), so the
    advice stays, at 'improve', with the step count its share rests on; jax_slow_loader's 38 steps keep it blocking."""
    report = reports("tf_tiny_spe64")
    assert len(report.hosts[0].steps) == 3 and any("too few steps to trust" in w for w in report.warnings)
    assert all(s.input_ps > 0.5 * s.duration_ps for s in report.hosts[0].steps)
    advice = next(s for s in report.suggestions if s["kind"] == "input_pipeline")
    assert advice["severity"] == "improve" and "Measured over 3 steps only (fewer than 5)" in advice["evidence"]
    many = next(s for s in reports("jax_slow_loader").suggestions if s["kind"] == "input_pipeline")
    assert many["severity"] == "blocking" and "Measured over" not in many["evidence"]


def test_jax_slow_python_loader_is_input_bound(reports, xprof):
    report = reports("jax_slow_loader")
    assert report.step_count >= 10
    assert report.input_bound_percent >= 60  # a 20 ms sleep in the loader against a ~3 ms step
    assert report.verdict == "highly input-bound"
    assert report.suggestions[0]["kind"] == "input_pipeline"
    assert "POTENTIALLY input-bound" in xprof("jax_slow_loader")["input_conclusion"]
    # Same steps as XProf's (it rounds to 0.1 ms); XProf only cannot tell where the time goes.
    assert report.mean_ms == pytest.approx(float(xprof("jax_slow_loader")["steptime_ms_average"]), abs=0.1)


def test_jax_compute_bound_loop_is_compute_bound_where_xprof_says_input_bound(reports, xprof):
    report = reports("jax_compute")
    assert "POTENTIALLY input-bound" in xprof("jax_compute")["input_conclusion"]
    assert report.mean_ms == pytest.approx(float(xprof("jax_compute")["steptime_ms_average"]), abs=0.1)
    assert report.verdict == "compute-bound"
    assert report.input_bound_percent < 5
    assert report.breakdown_percent["compute"] >= 60
    assert "input_pipeline" not in kinds(report)
    # The MLP's matmuls are the top ops (XLA:CPU names on the executor threads).
    assert any(op.name.startswith("dot") for op in report.top_ops[:5])


def test_jax_recompiling_every_step_is_compile_bound_where_xprof_sees_no_compile(reports, xprof):
    """The job grows its batch every step (jax_job.py --new-shape-every-step): every step traces and compiles."""
    report = reports("jax_recompile")
    theirs = xprof("jax_recompile")
    assert float(theirs["compile_time_ms_avg"]) == 0  # XProf sees no compilation at all
    assert report.verdict == "compile-bound" and report.breakdown_percent["compile"] >= 50
    advice = report.suggestions[0]
    assert advice["kind"] == "compile" and "backend_compile_and_load" in advice["evidence"]
    # At least one compilation per step (the last step, whose end the capture does not show, is left out).
    compiles = int(re.search(r"`backend_compile_and_load` x(\d+)", advice["evidence"]).group(1))
    assert compiles >= report.step_count >= 1


@pytest.mark.parametrize("name", ["tf_slow_map", "tf_tiny_spe64"])
def test_a_pipeline_that_prefetches_is_not_told_to(reports, xprof, name):
    """Both jobs' pipelines end with `prefetch` (XProf's stage table holds `Iterator::Root::Prefetch`); the input
    advice told them to 'end the pipeline with prefetch(tf.data.AUTOTUNE)'."""
    assert "Iterator::Root::Prefetch" in xprof(name)["stages"]
    advice = next(s for s in reports(name).suggestions if s["kind"] == "input_pipeline")
    assert "prefetch(" not in advice["message"], advice["message"]


def test_compile_evidence_names_each_compilation_once(reports):
    """One compilation shows on several threads at once: jax's `backend_compile_and_load` on the Python thread,
    XLA's `PjRtCpuClient::Compile` on its compiler pool inside it. The evidence named both (3,541 ms and 3,342 ms:
    6.9 s of compiling in a 4.3 s stretch of steps); the events it names add up to no more than the time some
    compile event ran, read here from the capture's own events."""
    from tpuprof.analyses.timeline import Spans
    from tpuprof.protos import xplane_pb2

    report = reports("jax_recompile")
    space = xplane_pb2().XSpace()
    space.ParseFromString(next(capture("jax_recompile").rglob("*.xplane.pb")).read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    spans = [(line.timestamp_ns * 1000 + e.offset_ps, line.timestamp_ns * 1000 + e.offset_ps + e.duration_ps)
             for line in plane.lines for e in line.events
             if re.search(r"(?i)compile|lower_sharding", plane.event_metadata[e.metadata_id].name)]
    union = Spans([a for a, _ in spans], [b for _, b in spans])
    compiling_ms = union.measure(np.array([union.starts[0]]), np.array([union.ends[-1]]))[0] / 1e9
    named = re.findall(r"`([^`]+)` x\d+ \((\d+) ms\)", report.suggestions[0]["evidence"])
    assert len(named) == 2 and "PjRtCpuClient::Compile" not in dict(named)
    assert sum(int(ms) for _, ms in named) <= compiling_ms + 1, (named, compiling_ms)


def test_compile_advice_counts_the_compilations_of_the_steps_it_names_in_jaxs_terms(reports):
    """jax_recompile: the evidence said "over 9 steps: `backend_compile_and_load` x76", a count over the whole capture
    (compilations before the first measured step and after the last); the advice told this JAX job about tf.data's
    `drop_remainder=True`. The count is of the outermost compile events that start in the measured steps (marker 0 to
    the last marker), read here from the capture's own events; the wording is JAX's only."""
    from tpuprof.analyses.timeline import top_level
    from tpuprof.protos import xplane_pb2

    report = reports("jax_recompile")
    space = xplane_pb2().XSpace()
    space.ParseFromString(next(capture("jax_recompile").rglob("*.xplane.pb")).read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    names = {k: m.name for k, m in plane.event_metadata.items()}
    events = [(names[e.metadata_id], line.timestamp_ns * 1000 + e.offset_ps, e.duration_ps)
              for line in plane.lines for e in line.events]
    markers = sorted(start for name, start, _ in events if name == "train")
    compiles = sorted((start, start + duration) for name, start, duration in events
                      if re.search(r"(?i)compile|lower_sharding", name) and not name.startswith("XlaCompile"))
    outer = top_level(np.array([a for a, _ in compiles]), np.array([b for _, b in compiles]))
    starts = np.array([a for a, _ in compiles])[outer]
    everywhere = [n for (n, start, _) in events if n == "backend_compile_and_load"]
    inside = sum(1 for name, start, _ in events if name == "backend_compile_and_load"
                 and markers[0] <= start < markers[-1] and start in set(starts.tolist()))
    assert inside == 63 and len(everywhere) == 76  # the capture compiles outside the measured steps too
    advice = next(s for s in report.suggestions if s["kind"] == "compile")
    assert f"over {report.step_count} steps; compile events in those steps: `backend_compile_and_load` x{inside} (" \
        in advice["evidence"]
    assert advice["framework"] == "jax" and "jax_explain_cache_misses" in advice["message"]
    assert "drop_remainder" not in advice["message"] and "tf." not in advice["message"]


def test_host_ops_per_step_hold_only_the_measured_steps(reports):
    """jax_recompile: 10 `train` markers, 9 measured steps (the last one's end is not captured), and parts of steps
    on either side: every kernel ran 11 times in the capture. An op's time per step is its time inside the measured
    steps, read here from the whole XSpace proto; dividing the capture's total by the 9 steps read 5.18 ms for
    ynn_fusion.2 (23% over), and `tpuprof diff` compared that."""
    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace()
    space.ParseFromString(next(capture("jax_recompile").rglob("*.xplane.pb")).read_bytes())
    (plane,) = [p for p in space.planes if p.name == "/host:CPU"]
    names = {k: m.name for k, m in plane.event_metadata.items()}
    events = [(names[e.metadata_id], line.timestamp_ns * 1000 + e.offset_ps, e.duration_ps, i)
              for i, line in enumerate(plane.lines) for e in line.events]
    markers = sorted(start for name, start, _, _ in events if name == "train")
    window = (markers[0], markers[-1])  # measured step i runs from marker i to marker i + 1
    report = reports("jax_recompile")
    assert report.step_count == len(markers) - 1
    rows = {o["name"]: o for o in documents_analyze.document(report, 10)["top_ops"] if o["where"] == "host"}
    checked = []
    for name, row in rows.items():
        runs = [(start, duration, line) for n, start, duration, line in events if n == name]
        inside = [duration for start, duration, _ in runs if window[0] <= start < window[1]]
        lines = {line for _, _, line in runs}
        # Inside a kernel the profiler records only its thread pool's bookkeeping, which is no op: self time is
        # the duration where nothing else is nested.
        nested = [1 for n, start, duration, line in events if line in lines and n != name
                  and not n.startswith(("ThreadpoolListener", "SlinkyThreadPool", "end: "))
                  for s, d, run_line in runs if run_line == line and s <= start and start + duration <= s + d]
        if nested:
            continue
        checked.append(name)
        assert row["self_ms"] == pytest.approx(sum(d for _, d, _ in runs) / 1e9, abs=1e-3), name
        assert row["self_ms_per_step"] == pytest.approx(sum(inside) / 1e9 / report.step_count, abs=1e-4), name
    assert "ynn_fusion.2" in checked and len(checked) >= 5, checked
    top = rows["ynn_fusion.2"]
    assert top["count"] > report.step_count + 1  # the capture's edges hold runs outside the measured steps
    assert top["self_ms_per_step"] < 0.9 * top["self_ms"] / report.step_count

    import tpuprof

    diff = tpuprof.diff(str(capture("jax_recompile")), str(capture("jax_compute"))).to_dict()
    ops = {(o["where"], o["name"]): o for g in diff["groups"] for o in g.get("ops", [])}
    assert ops[("host", "ynn_fusion.2")]["a_ms_per_step"] == pytest.approx(top["self_ms_per_step"], abs=1e-4)


def test_two_hosts_one_with_a_slower_loader_is_the_straggler(reports):
    """Two JAX jobs traced in one call (loaders sleeping 10 and 20 ms per batch): one report, both hosts
    analysed in worker processes, the 20 ms one named as the straggler."""
    report = reports("jax_two_hosts_straggler")
    assert len(report.hosts) == 2 and all(h.steps for h in report.hosts)
    assert report.verdict == "highly input-bound"
    (straggler, median_ms, _), = report.stragglers
    medians = {h.host: h.median_step_ms() for h in report.hosts}
    assert median_ms >= 20 > min(medians.values()) >= 10  # the loaders' sleeps bound each host's step
    assert medians[straggler] == max(medians.values())
    assert any(s["kind"] == "straggler" and straggler in s["message"] for s in report.suggestions)


def test_a_straggler_nothing_waits_for_is_not_said_to_hold_steps_up(reports):
    """The two "hosts" are two jobs traced in one call: no collective, no step number in common, 70 and 41 steps
    in the same window. The advice said every synchronous step waits for the slow one; the capture shows none
    did, and the suggestion says what it shows."""
    report = reports("jax_two_hosts_straggler")
    rows = {r.host: r for r in report.pod.hosts}
    assert report.pod.matched_steps == 0 and not any(r.collective_ms for r in rows.values())
    assert len({r.steps for r in rows.values()}) == 2  # not in lockstep
    advice = next(s for s in report.suggestions if s["kind"] == "straggler")
    assert "every synchronous step waits" not in advice["message"] and "none waited for it" in advice["message"]
    assert all(f"{host} {row.steps} steps" in advice["evidence"] for host, row in rows.items())


def test_json_contract_from_the_cli(capsys):
    cli.main(["analyze", str(capture("tf_slow_map")), "--json", "--top", "5"])
    document = json.loads(capsys.readouterr().out)
    assert set(document) >= {"hosts", "steps", "breakdown_percent", "input_bound_percent", "verdict",
                             "suggestions", "top_ops"}
    assert set(document["steps"]) >= {"count", "mean_ms", "median_ms", "p90_ms"}
    assert set(document["breakdown_percent"]) == {"compute", "input", "host_transfer", "collective", "host_overhead",
                                                  "compile", "other"}
    assert abs(sum(document["breakdown_percent"].values()) - 100) < 0.5
    assert all(set(s) >= {"kind", "message", "evidence"} for s in document["suggestions"])
    assert len(document["top_ops"]) <= 5 and document["top_ops"][0]["name"] == "EagerPyFunc"
    assert document["hosts"][0]["platform"] == "cpu"
    steps = document["hosts"][0]["step_list"]
    assert len(steps) == document["steps"]["count"]
    assert all(abs(sum(s[f"{c}_ms"] for c in document["breakdown_percent"])
                   - s["duration_ms"]) < 0.01 for s in steps)


def test_tables_render(capsys):
    cli.main(["analyze", str(capture("tf_slow_map"))])
    out = capsys.readouterr().out
    assert "highly input-bound" in out and "Input pipeline: " in out and "tf.data stages" in out
    assert "Host ops by self time" in out and "EagerPyFunc" in out


def test_fsspec_url_is_read(tmp_path):
    """gs:// goes through fsspec; the in-memory file system takes the same path without a bucket."""
    import fsspec

    source = next(capture("jax_slow_loader").rglob("*.xplane.pb"))
    fs = fsspec.filesystem("memory")
    run = "/bucket/logs/plugins/profile/2026_01_01_00_00_00"
    fs.pipe(f"{run}/{source.name}", source.read_bytes())
    report = command.profile_summary("memory://bucket/logs")
    assert report.hosts[0].path.startswith("memory://") and report.verdict == "highly input-bound"


def test_analyze_imports_neither_tensorflow_nor_jax():
    code = ("import sys; from tpuprof import cli\n"
            "try: cli.main(['analyze', sys.argv[1], '--json'])\n"
            "except SystemExit: pass\n"
            "assert 'tensorflow' not in sys.modules and 'jax' not in sys.modules, "
            "[m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'jax')][:5]\n")
    done = subprocess.run([sys.executable, "-c", code, str(capture("jax_compute"))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --- TPU device planes (synthetic, from the XPlane schema) -------------------------------------------


def analyze_layout(tmp_path, layout: Layout, **hosts_layouts):
    spaces = {"tpu-vm-0": tpu_xspace(layout)}
    spaces.update({name: tpu_xspace(other, name) for name, other in hosts_layouts.items()})
    return command.profile_summary(str(write_run(tmp_path, spaces)))


def test_tpu_infeed_is_input(tmp_path):
    layout = Layout(idle_ms=0.5, infeed_ms=4.0, matmul_ms=4.0, other_ms=1.5)
    report = analyze_layout(tmp_path, layout)
    assert report.hosts[0].platform == "tpu" and "Steps" in report.hosts[0].step_source
    assert report.step_count == layout.steps
    assert report.mean_ms == pytest.approx(layout.step_ms, abs=0.01)
    assert report.input_bound_percent == pytest.approx(100 * 4.0 / layout.step_ms, abs=0.2)
    assert report.breakdown_percent["compute"] == pytest.approx(100 * 5.5 / layout.step_ms, abs=0.2)
    assert report.verdict == "highly input-bound"


def test_tpu_device_only_capture(tmp_path):
    report = analyze_layout(tmp_path, Layout(idle_ms=0.5, infeed_ms=3.0, matmul_ms=4.0, other_ms=2.5,
                                             with_host=False))
    assert report.step_count == 20 and report.input_bound_percent == pytest.approx(30.0, abs=0.2)


def test_tpu_idle_between_programs_is_host_overhead_with_a_steps_per_execution_n(tmp_path):
    layout = Layout(idle_ms=3.0, matmul_ms=1.0, other_ms=1.0, matmul_dtype="bf16")
    report = analyze_layout(tmp_path, layout)
    assert report.breakdown_percent["host_overhead"] == pytest.approx(60.0, abs=0.2)
    assert report.verdict == "host-overhead-bound"
    advice = next(s for s in report.suggestions if s["kind"] == "steps_per_execution")
    # overhead 3 ms per step against 2 ms of work: 5 % overhead needs N >= 19 * 3 / 2 = 28.5 -> 32.
    assert advice["steps_per_execution"] == 32
    # The host plane does not say which framework: the advice gives the Keras and the JAX way.
    assert "steps_per_execution=32" in advice["message"] and "lax.scan" in advice["message"]
    assert "bf16" not in kinds(report)


def test_tpu_idle_while_the_host_waits_for_data_is_input(tmp_path):
    layout = Layout(idle_ms=3.0, matmul_ms=1.0, other_ms=1.0, host_waits_in_idle=True)
    report = analyze_layout(tmp_path, layout)
    assert report.input_bound_percent == pytest.approx(60.0, abs=0.2)
    assert report.breakdown_percent["host_overhead"] < 1


def test_tpu_idle_while_jax_host_runs_its_loader_is_input(tmp_path):
    """No tf.data: the untraced Python on the training thread during the device's idle gap is the loader;
    the traced dispatch just before the program is host overhead."""
    layout = Layout(idle_ms=3.0, matmul_ms=1.0, other_ms=1.0, host_loader_in_idle=True, dispatch_ms=0.5)
    report = analyze_layout(tmp_path, layout)
    assert report.input_bound_percent == pytest.approx(100 * 2.5 / 5.0, abs=0.2)
    assert report.breakdown_percent["host_overhead"] == pytest.approx(100 * 0.5 / 5.0, abs=0.2)
    assert report.suggestions[0]["kind"] == "input_pipeline"


def test_tpu_f32_matmuls_get_bf16_advice(tmp_path):
    report = analyze_layout(tmp_path, Layout(idle_ms=0.1, matmul_ms=8.0, other_ms=1.0, matmul_dtype="f32"))
    assert report.verdict == "compute-bound"
    bf16 = next(s for s in report.suggestions if s["kind"] == "bf16")
    assert "mixed_bfloat16" in bf16["message"] or "bfloat16" in bf16["message"]
    device_ops = [op for op in report.top_ops if op.where == "device"]
    assert device_ops[0].name == "model/dense/MatMul" and device_ops[0].kind == "convolution"
    precision = documents_analyze.document(report, 5)["precision"]
    assert precision["f32_matmul_percent_of_compute"] == pytest.approx(100 * 8 / 9, abs=0.2)


def test_tpu_cores_and_hosts_straggler(tmp_path):
    """Two hosts of two cores each, in one run folder: analysed in two processes, the slow one named."""
    fast = Layout(idle_ms=0.2, matmul_ms=4.0, other_ms=1.0, cores=2, matmul_dtype="bf16")
    slow = Layout(idle_ms=2.2, matmul_ms=4.0, other_ms=1.0, cores=2, matmul_dtype="bf16")
    report = analyze_layout(tmp_path, fast, **{"tpu-vm-1": fast, "tpu-vm-2": slow})
    assert len(report.hosts) == 3 and "2 TPU chip(s)" in report.hosts[0].step_source
    assert [host for host, *_ in report.stragglers] == ["tpu-vm-2"]
    assert any(s["kind"] == "straggler" and "tpu-vm-2" in s["message"] for s in report.suggestions)


def test_tpu_collectives_bound_names_the_collective(tmp_path):
    """No public capture here has a step dominated by collectives: an all-reduce takes 5 of a 8.2 ms step."""
    layout = Layout(idle_ms=0.2, matmul_ms=2.0, other_ms=1.0, collective_ms=5.0, matmul_dtype="bf16")
    report = analyze_layout(tmp_path, layout)
    assert report.breakdown_percent["collective"] == pytest.approx(100 * 5 / layout.step_ms, abs=0.2)
    assert report.verdict == "collective-bound"
    assert "all-reduce.2 f32[1024,1024] (5.00 ms)" in report.verdict_reason
    assert [o.hlo_op for o in report.verdict_ops] == ["all-reduce.2"]
    first = report.suggestions[0]
    assert first["kind"] == "collective" and first["saving_ms_per_step"] == pytest.approx(5.0, abs=0.01)


def test_tpu_slowest_chip_is_named_and_op_times_are_per_chip(tmp_path):
    """Two chips in lock step: chip 1's matmul takes 1.5 ms more, chip 0 waits for it in the all-reduce."""
    layout = Layout(idle_ms=0.2, matmul_ms=4.0, other_ms=1.0, collective_ms=0.5, cores=2, slow_core=1,
                    slow_core_ms=1.5, matmul_dtype="bf16")
    report = analyze_layout(tmp_path, layout)
    devices = documents_analyze.document(report, 5)["devices"]
    assert [(d["id"], d["steps"], d["median_ms"]) for d in devices] == [
        ("TPU:0", 20, pytest.approx(layout.step_ms, abs=0.01)), ("TPU:1", 20, pytest.approx(layout.step_ms, abs=0.01))]
    assert devices[0]["breakdown_percent"]["collective"] > devices[1]["breakdown_percent"]["collective"]
    (slow,) = report.slow_chips
    assert slow.chip == "TPU:1" and slow.work_ms == pytest.approx(6.5) and slow.fastest_ms == pytest.approx(5.0)
    assert any(s["kind"] == "slow_chip" and "TPU:1" in s["message"] for s in report.suggestions)
    # Per chip per step: the mean of 4.0 and 5.5 ms, not their sum.
    matmul = next(o for o in report.device_ops if o.hlo_op == "convolution.7")
    assert report.ms_per_step(matmul) == pytest.approx((4.0 + 5.5) / 2)


def test_tpu_memory_bound_vector_work_gets_fusion_and_bf16_advice(tmp_path):
    """A v5e step whose elementwise fusion (0.25 FLOP/byte) takes 6 of its 8 ms of compute."""
    layout = Layout(idle_ms=0.1, matmul_ms=2.0, other_ms=6.0, matmul_dtype="bf16", device_type="TPU v5 Lite",
                    matmul_flops=200 * 10**9, matmul_bytes=400 * 10**6, other_flops=10**9, other_bytes=4 * 10**9)
    report = analyze_layout(tmp_path, layout)
    assert report.roof.device_kind == "v5e" and report.roof.ridge == pytest.approx(197e12 / 819e9)
    fusion = next(o for o in report.device_ops if o.hlo_op == "fusion.3")
    matmul = next(o for o in report.device_ops if o.hlo_op == "convolution.7")
    assert report.rates(fusion).bound == "HBM" and report.rates(fusion).bytes_per_s == pytest.approx(4e9 / 6e-3)
    assert report.rates(fusion).percent_of_roof == pytest.approx(100 * (4e9 / 6e-3) / 819e9)
    assert report.rates(matmul).bound == "compute" and report.rates(matmul).flops_per_s == pytest.approx(200e9 / 2e-3)
    assert report.verdict == "memory-bound" and "fusion.3" in report.verdict_reason
    advice = next(s for s in report.suggestions if s["kind"] == "memory_bound")
    assert "fuse" in advice["message"] and "bf16" in advice["message"]
    # MFU: 201 GFLOP per 8.1 ms step against 197 TFLOP/s.
    assert report.roofline.mfu_percent == pytest.approx(100 * 201e9 / 8.1e-3 / 197e12, rel=1e-3)


def test_tpu_outfeed_is_a_host_transfer_and_idle_while_compiling_is_compile(tmp_path):
    layout = Layout(idle_ms=2.0, matmul_ms=3.0, other_ms=1.0, outfeed_ms=1.0, host_compiles_in_idle=True,
                    matmul_dtype="bf16")
    report = analyze_layout(tmp_path, layout)
    assert report.breakdown_ms_per_step["host_transfer"] == pytest.approx(1.0, abs=0.01)
    assert report.breakdown_ms_per_step["compile"] == pytest.approx(2.0, abs=0.01)
    assert report.breakdown_ms_per_step["host_overhead"] == pytest.approx(0.0, abs=0.01)
    assert next(o for o in report.device_ops if o.hlo_op == "outfeed.4").category == "host_transfer"


# --- bad input ---------------------------------------------------------------------------------------


def run_main(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["analyze", *map(str, args)])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_truncated_capture_is_a_clear_error(tmp_path, capsys):
    source = next(capture("tf_slow_map").rglob("*.xplane.pb"))
    cut = tmp_path / "host.xplane.pb"
    cut.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    code, out, err = run_main(capsys, cut)
    assert code == 2 and out == ""
    assert "not a readable xplane.pb (truncated" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_folder_without_runs_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "plugins" / "profile").mkdir(parents=True)
    code, out, err = run_main(capsys, tmp_path)
    assert code == 2 and out == "" and "no profile runs under" in err


def test_folder_of_logdirs_names_them(capsys):
    code, out, err = run_main(capsys, CAPTURES)
    assert code == 2 and "it holds the logdirs jax_compute, jax_recompile" in err and "pass one" in err


def test_hlo_proto_passed_by_mistake_is_named(capsys):
    hlo = next((SAMPLES / "dumps").rglob("*.after_optimizations.hlo.pb"))
    code, out, err = run_main(capsys, hlo)
    assert code == 2 and "is an HloProto" in err and "tpuprof memory" in err


def test_missing_path_is_a_clear_error(tmp_path, capsys):
    code, _, err = run_main(capsys, tmp_path / "nope")
    assert code == 2 and "does not exist" in err


def test_json_renderer_keeps_no_steps_honest(tmp_path):
    """A capture with a host plane but no steps: verdict unknown with the reason, no suggestions."""
    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].name = "SomethingElse"
    line = plane.lines.add(id=1, name="python")
    line.events.add(metadata_id=1, offset_ps=0, duration_ps=1000)
    report = command.profile_summary(str(write_run(tmp_path, {"h": space})))
    document = documents_analyze.document(report, 5)
    assert document["verdict"] == "unknown" and document["steps"]["count"] == 0
    assert "no step markers" in document["verdict_reason"] and document["suggestions"] == []


# --- fresh captures of the running jobs (shared with test_capture.py through the session fixture) -------


@pytest.mark.parametrize("script,args,input_ms", [("tf_keras_job.py", ("--slow-map-ms", "2"), None),
                                                  ("jax_job.py", ("--slow-loader-ms", "20"), 20.0)])
def test_fresh_capture_of_an_input_bound_job(profiler_job, tmp_path, script, args, input_ms):
    """The job's own delay is the ground truth: the share of input time depends on how busy the machine is
    (compute slows down under load), the loader's sleep per batch does not."""
    from tpuprof.sources.capture import TraceOptions
    from tpuprof.sources.capture import capture as capture_run

    job = profiler_job(script, *args)
    result = capture_run([job.address], str(tmp_path), TraceOptions(duration_ms=1500))
    report = command.profile_summary(result.run_dir)
    assert report.step_count >= 5
    assert report.verdict == "highly input-bound" and report.input_bound_percent >= 20
    if input_ms is not None:  # a sleep is never shorter than asked; 10% for where a step's edge falls
        assert report.breakdown_ms_per_step["input"] >= 0.9 * input_ms * report.batches_per_step
    assert report.suggestions[0]["kind"] == "input_pipeline"


def test_python_tracer_keeps_the_jax_loader_as_input(profiler_job, tmp_path):
    """`capture --python-tracer-level 1` traces the user's Python too: jax_job's loader sleeps 20 ms a batch, now as
    a `$time sleep` event. That is still the step waiting for input; it read 0.0% input, the sleep counted as host
    overhead and the verdict compute-bound, with no input advice."""
    from tpuprof.sources.capture import TraceOptions
    from tpuprof.sources.capture import capture as capture_run

    job = profiler_job("jax_job.py", "--slow-loader-ms", "20")
    result = capture_run([job.address], str(tmp_path), TraceOptions(duration_ms=1500, python_tracer_level=1))
    report = command.profile_summary(result.run_dir)
    assert report.step_count >= 5
    names = {m.name for m in _host_plane(result.run_dir).event_metadata.values()}
    assert "$time sleep" in names  # the Python tracer was on, and traced the loader's sleep
    assert report.breakdown_ms_per_step["input"] >= 0.9 * 20.0, report.breakdown_ms_per_step
    assert report.verdict == "highly input-bound" and report.suggestions[0]["kind"] == "input_pipeline"
    assert "the host ran its own Python" in report.suggestions[0]["evidence"]


def _host_plane(run_dir: str):
    from pathlib import Path

    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace()
    space.ParseFromString(next(Path(run_dir).glob("*.xplane.pb")).read_bytes())
    return next(p for p in space.planes if p.name == "/host:CPU")


def test_fresh_capture_of_a_compute_bound_jax_job_without_step_annotations(profiler_job, tmp_path):
    """jax_job's loader is free: the jitted step fills the step. Without StepTraceAnnotation the steps are its
    calls, which return at once (dispatch is asynchronous); XLA:CPU runs the program on its thread pool, where a
    matmul shows only as the executor's `ThunkExecutor::Execute (wait for completion)`. That time is the CPU
    computing the step: counted as untraced host time, this job read 'highly input-bound, 25.5% waiting for
    input' with the input-pipeline advice (and a slower one 'host-overhead-bound' with steps per call)."""
    from tpuprof.sources.capture import TraceOptions
    from tpuprof.sources.capture import capture as capture_run

    job = profiler_job("jax_job.py", "--no-step-annotation")
    result = capture_run([job.address], str(tmp_path), TraceOptions(duration_ms=1500))
    report = command.profile_summary(result.run_dir)
    assert report.step_count >= 20 and "jitted function" in report.hosts[0].step_source
    assert report.verdict == "compute-bound", (report.verdict, report.breakdown_percent)
    assert report.input_bound_percent < 5 and report.breakdown_percent["compute"] >= 80, report.breakdown_percent
    assert not {s["kind"] for s in report.suggestions} & {"input_pipeline", "steps_per_execution"}


@pytest.mark.parametrize("name", ["jax_compute", "jax_slow_loader"])
def test_a_jax_loop_without_step_annotations_reads_as_with_them(reports, tmp_path, name):
    """A committed JAX capture with its `train` step annotations taken out, as many loops run: the steps are then
    the jitted step's calls, which return before the device is done, and the thread blocks in block_until_ready
    (PjRt traces `CommonPjRtBuffer::Await` as the wait starts and once it returns). That wait read as the
    loader's: jax_compute's free loader waited 0.17 ms a step for input against 0.05 with the annotations (a live
    capture on a loaded machine: 9.8%, 'moderately input-bound', with the input-pipeline advice). A loader that
    sleeps 20 ms stays input."""
    from tpuprof.protos import xplane_pb2

    annotated = reports(name)
    space = xplane_pb2().XSpace()
    space.ParseFromString(next(capture(name).rglob("*.xplane.pb")).read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    markers = {k for k, m in plane.event_metadata.items() if m.name == "train"}
    for line in plane.lines:
        kept = [e for e in line.events if e.metadata_id not in markers]
        del line.events[:]
        line.events.extend(kept)
    stripped = command.profile_summary(str(write_run(tmp_path, {"host": space})))
    assert "jitted function" in stripped.hosts[0].step_source and stripped.verdict == annotated.verdict
    for category in ("input", "host_overhead"):
        assert stripped.breakdown_ms_per_step[category] == pytest.approx(
            annotated.breakdown_ms_per_step[category], abs=0.03), (category, stripped.breakdown_ms_per_step)


def test_one_bad_host_file_among_several_is_named(tmp_path, capsys):
    """Hosts are read in worker processes: the error still reaches the user as one sentence."""
    source = next(capture("jax_compute").rglob("*.xplane.pb")).read_bytes()
    run = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    (run / "host-a.xplane.pb").write_bytes(source)
    (run / "host-b.xplane.pb").write_bytes(source[: len(source) // 3])
    code, out, err = run_main(capsys, tmp_path)
    assert code == 2 and out == "" and "host-b.xplane.pb is not a readable xplane.pb" in err


def test_a_single_step_longer_than_the_capture_is_still_measured(tmp_path):
    """Keep one `multi_step_on_iterator` call of the slow-map capture, as when a step outlasts the trace."""
    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace()
    space.ParseFromString(next(capture("tf_slow_map").rglob("*.xplane.pb")).read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    step_id = next(k for k, m in plane.event_metadata.items() if m.name == "multi_step_on_iterator")
    line = next(line for line in plane.lines if any(e.metadata_id == step_id for e in line.events))
    kept = [e for e in line.events if e.metadata_id == step_id][1:2]
    others = [e for e in line.events if e.metadata_id != step_id]
    del line.events[:]
    line.events.extend(sorted(kept + others, key=lambda e: e.offset_ps))
    report = command.profile_summary(str(write_run(tmp_path, {"host": space})))
    assert report.step_count == 1 and report.verdict == "highly input-bound"
    assert report.mean_ms == pytest.approx(kept[0].duration_ps / 1e9, rel=1e-6)


def test_the_run_folder_is_named_as_the_user_typed_it():
    """A logdir given relative to the working directory is named relatively; the JSON keeps the absolute path."""
    from conftest import run_cli

    result = run_cli("analyze", "sample_profiles/captures/jax_compute")
    assert result.returncode == 0, result.stderr
    run_name = next((SAMPLES / "captures" / "jax_compute" / "plugins" / "profile").iterdir()).name
    title, first = result.stdout.splitlines()[:2]
    assert title == "tpuprof analyze"
    assert first == f"Run {run_name}, the only run in sample_profiles/captures/jax_compute/plugins/profile."
    document = json.loads(run_cli("analyze", "sample_profiles/captures/jax_compute", "--json").stdout)
    assert document["run"]["folder"] == str(SAMPLES / "captures" / "jax_compute" / "plugins" / "profile")


def test_tf_data_stages_are_one_per_stage_over_repeat_epochs_in_json_as_in_the_terminal():
    """tf_cached repeats a cached dataset: its capture holds the cache stage under three epochs ([22], [23], [24]).
    The JSON lists each stage once with every epoch's calls, like the terminal table."""
    from conftest import run_cli

    document = json.loads(run_cli("analyze", str(SAMPLES / "captures" / "tf_cached"), "--json").stdout)
    stages = document["input_pipeline"]["stages"]
    names = [stage["stage"] for stage in stages]
    assert len(names) == len(set(names)) and not any(re.search(r"\[\d+\]", name) for name in names)
    cache = next(stage for stage in stages if stage["stage"].endswith("::ForeverRepeat::MemoryCacheImpl"))
    assert cache["count"] == 4097 + 2176 + 1345  # the calls of every epoch in the capture
