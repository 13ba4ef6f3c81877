"""Many hosts as one pod: synthetic pods built by bench/pod_capture.py from real captures (the ground truth is the
generator's parameters: clock shifts, the slowed host and by how much, the device steps lost), and the same JSON
whether local processes or Ray tasks analyse the hosts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import run_cli
from helpers.real_data import TPU_HOST_OFFLOAD_V6E_4, real_artefact
from test_schemas import validate
from tpuprof.analyses import pod as pod_view
from tpuprof.commands import analyze as command

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sample_profiles" / "captures" / "jax_compute"
HOSTS, SLOW_HOST, SLOW = 16, 5, 0.25
RAY_LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _generator():
    spec = importlib.util.spec_from_file_location("pod_capture", ROOT / "bench" / "pod_capture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def source_report():
    return command.profile_summary(str(SOURCE))


@pytest.fixture(scope="module")
def pod16(tmp_path_factory):
    out = tmp_path_factory.mktemp("pod16")
    return _generator().build(SOURCE, out, hosts=HOSTS, slow_host=SLOW_HOST, slow=SLOW, clock_spread_ms=40.0)


@pytest.fixture(scope="module")
def pod16_json(pod16):
    return command.result(pod16.folder).to_dict()


def test_the_slowed_host_is_named_and_every_host_steps_are_right(pod16, pod16_json, source_report):
    source = source_report.hosts[0]
    pod = pod16_json["pod"]
    assert [h["host"] for h in pod["hosts"]] == pod16.hosts
    assert [s["host"] for s in pod["stragglers"]] == [f"host_{SLOW_HOST:03d}"]
    for i, host in enumerate(pod["hosts"]):
        assert host["steps"] == len(source.steps)
        expected = source.median_step_ms() * (1 + SLOW if i == SLOW_HOST else 1)
        assert host["median_ms"] == pytest.approx(expected, rel=1e-3)
        if i != SLOW_HOST:  # an exact copy with a shifted clock: the offset is recovered to the picosecond
            assert host["clock_offset_ms"] == pytest.approx(pod16.offsets_ps[i] / 1e9, abs=1e-6)
            assert host["residual_ms"] == 0 and host["delay_ms"] == 0
    # The slowed host is last in every step, by SLOW of the others' step.
    slowed = pod["hosts"][SLOW_HOST]
    assert slowed["last_steps"] == len(source.steps)
    own = sum(s.duration_ps - s.collective_ps for s in source.steps) / 1e9
    assert slowed["delay_ms"] == pytest.approx(SLOW * own, rel=1e-3)
    assert pod["matched_steps"] == len(source.steps) and pod["compact"] is None
    assert validate(pod16_json) == "analyze"
    # The suggestion names it by how long the pod waits for it each step.
    straggler, = [s for s in pod16_json["suggestions"] if s["kind"] == "straggler"]
    assert f"host_{SLOW_HOST:03d}" in straggler["message"] and "holding the pod up" in straggler["evidence"]


def test_hosts_from_two_run_folders_named_together_make_one_pod(tmp_path, source_report):
    pod = _generator().build(SOURCE, tmp_path, hosts=4, slow_host=2, slow=0.5, runs=2)
    assert len(pod.runs) == 2
    report = command.profile_summary(pod.runs)  # two run folders, as a capture from several machines can land
    assert [h.host for h in report.hosts] == pod.hosts and report.run is None
    assert report.pod.stragglers[0].host == "host_002"
    # The same host file named twice (a folder and the file in it) is read once.
    assert len(command.profile_summary([pod.runs[0], pod.files[0]]).hosts) == 2
    # Hosts of the same name in two captures' run folders (of the same name too) are told apart by their folder.
    other = _generator().build(SOURCE, tmp_path / "other", hosts=2, slow_host=None)
    names = [h.host for h in command.profile_summary([pod.runs[0], other.runs[0]]).hosts]
    assert len(set(names)) == 4 and names[2] == f"{other.runs[0]}/host_000"


def test_64_hosts_give_the_compact_table(source_report):
    profile = source_report.hosts[0]
    hosts = []
    for i in range(64):
        slow = 1.5 if i == 17 else 1.0
        steps = [replace(s, duration_ps=round(s.duration_ps * slow)) for s in profile.steps]
        hosts.append(replace(profile, host=f"h{i:02d}", steps=steps))
    pod = pod_view.build(hosts)
    from tpuprof.analyses.summary import summarize
    from tpuprof.documents_analyze import document as to_json

    assert validate({"schema": "tpuprof.analyze/1", **to_json(summarize(hosts), 10)}) == "analyze"
    assert pod.compact["slowest"][0].host == "h17" and [r.host for r in pod.compact["outliers"]] == ["h17"]
    assert pod.compact["fastest"][0].median_ms == pod.compact["median"][0].median_ms == \
        pytest.approx(profile.median_step_ms(), abs=1e-3)


def test_device_data_lost_on_one_host_is_said(tmp_path):
    source = real_artefact(TPU_HOST_OFFLOAD_V6E_4, tmp_path / "real")  # a real v6e capture, 4 chips
    whole = command.profile_summary(str(source)).hosts[0]
    # The chips run ~25 s behind the host's calls in this capture (asynchronous dispatch): losing 40 of its 100
    # steps makes their events stop before the host's last call.
    lost = 40
    pod = _generator().build(source, tmp_path / "pod", hosts=2, slow_host=None, lose_host=1, lose_steps=lost)
    report = command.profile_summary(pod.folder)
    kept, cut = report.hosts
    assert kept.steps_without_device == 0 and not kept.device_stops_early_ps
    assert len(kept.steps) == len(whole.steps)
    assert cut.steps_without_device == lost and cut.device_stops_early_ps > 0
    assert len(cut.steps) == len(whole.steps) - lost
    assert any("40 step(s) have no device data" in note and "stop" in note for note in cut.notes)
    document = command.result(pod.folder).to_dict()
    assert document["pod"]["hosts"][1]["steps_without_device"] == lost


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster on loopback for this module, stopped at the end (its address for a second driver)."""
    # Ray turns a node address of 127.0.0.1 into the machine's own; this switch (its single-machine mode, read
    # when ray is imported) keeps the cluster and the drivers that inherit it on loopback.
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'tpuprof[ray]'; the Makefile installs it)")
    os.environ[RAY_LOOPBACK] = "0"
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        del os.environ[RAY_LOOPBACK]


@pytest.mark.subprocess
def test_ray_tasks_give_the_same_json_as_local_processes(ray_cluster, pod16, pod16_json):
    # The CLI in its own process connects to the cluster as a second driver, through TPUPROF_RAY_ADDRESS (with
    # the token authentication that ray.init put in this process's environment).
    env = dict(os.environ, TPUPROF_RAY_ADDRESS=ray_cluster, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tpuprof", "analyze", pod16.folder, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == pod16_json


@pytest.mark.subprocess
@pytest.mark.compile
def test_a_preflight_sweep_on_ray_is_the_local_sweep(ray_cluster, tmp_path):
    """`preflight --model` over two slices with --ray: each slice's compiles are a task on the cluster (its own
    cache), and the document is the one this machine gives with another cache (the driver a process of its own, as
    Ray needs; the local run in this process, as `run_cli` runs it: its compiles are child processes either way)."""
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 768, "hidden_size": 256,
                                  "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2}))
    args = ["preflight", "--model", str(config), "--tpu", "v6e-16,v5e-16", "--seq", "128", "--batch-per-chip", "1",
            "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "ray-driver"))
    done = subprocess.run([sys.executable, "-m", "tpuprof", *args, "--ray", ray_cluster], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    here = run_cli(*args, timeout=900, env={"XDG_CACHE_HOME": str(tmp_path / "local")})
    assert here.returncode == 0, here.stderr[-2000:]
    documents = [json.loads(done.stdout), json.loads(here.stdout)]
    on_ray, local = ([{k: v for k, v in t.items() if k not in ("cache", "dump_dir", "memory", "compiles")}
                      for t in document["targets"]] for document in documents)
    assert [t["slice"]["name"] for t in local] == ["v6e-16", "v5litepod-16"]
    assert on_ray == local
    assert not (tmp_path / "ray-driver").exists()  # the driver compiled nothing: the tasks did


@pytest.mark.subprocess
def test_the_local_path_does_not_import_ray(pod16):
    code = ("import sys; from tpuprof import cli\n"
            "try: cli.main(['analyze', sys.argv[1], '--json'])\n"
            "except SystemExit: pass\n"
            "assert 'ray' not in sys.modules\n")
    env = {k: v for k, v in os.environ.items() if k != "TPUPROF_RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", code, pod16.runs[0]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_report_draws_a_host_by_step_heat_map(pod16, tmp_path, source_report):
    from test_report import plots, title

    from tpuprof.commands.report import steps_input
    from tpuprof.renderers import html

    page = html.render([steps_input(pod16.folder, command.profile_summary(pod16.folder), 10)])
    (data, layout), = [p for p in plots(page).values() if p[0][0]["type"] == "heatmap"]
    heat = data[0]
    assert heat["y"] == pod16.hosts and len(heat["z"]) == HOSTS
    assert "host and step" in title(layout)
    # One column per step; the slowed host's row is the hot one.
    rows = [sum(v for v in row if v is not None) for row in heat["z"]]
    assert len(heat["z"][0]) == len(source_report.hosts[0].steps) and rows.index(max(rows)) == SLOW_HOST
    assert "Holds up the pod" in page and f"host_{SLOW_HOST:03d}" in page


@pytest.mark.subprocess
def test_a_damaged_host_file_on_ray_is_the_same_one_sentence(ray_cluster, pod16, tmp_path):
    run = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    good = Path(pod16.files[0]).read_bytes()
    (run / "host_000.xplane.pb").write_bytes(good)
    (run / "host_001.xplane.pb").write_bytes(good[: len(good) // 3])  # a copy cut short
    outs = []
    for address in (None, ray_cluster):
        env = {k: v for k, v in os.environ.items() if k != "TPUPROF_RAY_ADDRESS"}
        env["PYTHONPATH"] = str(ROOT)
        args = ["--ray", address] if address else []
        done = subprocess.run([sys.executable, "-m", "tpuprof", "analyze", str(run), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        outs.append(done.stderr.strip())
    assert outs[0] == outs[1] and outs[0].count("\n") == 0 and "host_001.xplane.pb" in outs[0]


@pytest.mark.parametrize("scheme", ["", "ray://"])  # a cluster's GCS port, and the Ray client's
def test_an_address_where_nothing_listens_is_said_at_once(pod16, scheme):
    import socket

    with socket.socket() as unused:  # a port nothing listens on: bound, never listening
        unused.bind(("127.0.0.1", 0))
        address = f"{scheme}127.0.0.1:{unused.getsockname()[1]}"
        started = time.monotonic()
        done = run_cli("analyze", pod16.runs[0], "--ray", address)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (f"tpuprof: cannot reach the Ray cluster at {address}: nothing accepts "
                                   "connections there (connection refused); is the cluster up (`ray status` on "
                                   "its head node)?")
    assert time.monotonic() - started < 15  # not Ray's 20 s to 2 min of retries


@pytest.mark.subprocess
def test_a_loopback_cluster_reached_without_loopback_mode_is_one_sentence_that_says_so(ray_cluster, pod16):
    """The cluster listens on loopback only; a driver without Ray's loopback switch turns 127.0.0.1 into this
    machine's address, where nothing listens: said at once, not after Ray's 35 s to 2 min of retries."""
    env = {k: v for k, v in os.environ.items() if k not in (RAY_LOOPBACK, "TPUPROF_RAY_ADDRESS")}
    env.update(PYTHONPATH=str(ROOT))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tpuprof", "analyze", pod16.runs[0], "--ray", ray_cluster],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert time.monotonic() - started < 15
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    sentence = done.stderr.strip()
    assert sentence.startswith(f"tpuprof: cannot reach the Ray cluster at {ray_cluster}: ")
    assert "\n" not in sentence and "Traceback" not in sentence and "File " not in sentence
    assert f"{RAY_LOOPBACK}=0 listens on loopback only and needs it set here too" in sentence


@pytest.mark.subprocess
def test_ray_asked_for_but_not_installed_is_one_sentence(pod16):
    code = ("import sys; sys.modules['ray'] = None  # as if Ray were not installed\n"
            "from tpuprof import cli\n"
            "cli.main(['analyze', sys.argv[1], '--ray', 'auto'])\n")
    done = subprocess.run([sys.executable, "-c", code, pod16.runs[0]], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "tpuprof: --ray needs Ray installed here and on the cluster: pip install " \
                                  "'tpuprof[ray]'."


def test_the_host_the_all_reduce_waits_for_is_ranked_by_its_delay(tmp_path):
    """Lock-step TPU hosts (schema-built XSpaces): every host's step takes as long, the slow host's matmul is longer
    and the others wait for it in the all-reduce; its delay per step is the matmul's extra time."""
    from helpers.synthetic_xspace import Layout, tpu_xspace, write_run

    extra, shifts_ns = 1.5, [0, 3_000_000, -2_000_000, 7_000_000]  # clocks 3 ms ahead, 2 ms behind...
    spaces = {}
    for i, shift in enumerate(shifts_ns):
        slow = i == 2
        layout = Layout(steps=12, matmul_ms=6.0 + (extra if slow else 0.0), collective_ms=1.0 + (0.0 if slow else extra),
                        start_ns=1_000_000 + shift)
        spaces[f"tpu-vm-{i}"] = tpu_xspace(layout, f"tpu-vm-{i}")
    report = command.profile_summary(str(write_run(tmp_path, spaces)))
    pod = report.pod
    medians = {r.median_ms for r in pod.hosts}
    assert len(medians) == 1  # lock step: the same step time everywhere
    assert [r.host for r in pod.stragglers] == ["tpu-vm-2"]
    slowed = pod.host("tpu-vm-2")
    assert slowed.delay_ms / pod.matched_steps == pytest.approx(extra, abs=1e-3)
    assert slowed.last_steps == pod.matched_steps == len(report.hosts[0].steps)
    for r, shift in zip(pod.hosts, shifts_ns):
        assert r.clock_offset_ms == pytest.approx(shift / 1e6, abs=1e-6) and r.residual_ms == pytest.approx(0, abs=1e-6)
    # The median step says nothing here (every host's is the same): the delay names it.
    assert report.stragglers == []
    assert any(s["kind"] == "straggler" and "tpu-vm-2" in s["message"] for s in report.suggestions)
