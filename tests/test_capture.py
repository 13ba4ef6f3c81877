"""`tpuprof capture` against real training jobs on loopback (sample_profiles/jobs), a real GCS emulator,
and the real address rules. Ground truth comes from the jobs: the Keras job's map sleeps SLOW_MAP_MS per
example (64 per batch), the JAX job's loader sleeps SLOW_LOADER_MS per batch, so their captured steps
cannot be shorter than that."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from helpers.jobs import free_port
from tpuprof.errors import UserError
from tpuprof.protos import xplane_pb2
from tpuprof.sources import addresses

SLOW_MAP_MS = 2  # tf_keras_job: per example, batch 64 -> >= 128 ms per step
KERAS_BATCH = 64
SLOW_LOADER_MS = 20  # jax_job: per batch -> >= 20 ms per step


@pytest.fixture(scope="module")
def keras_job(profiler_job):
    return profiler_job("tf_keras_job.py", "--slow-map-ms", str(SLOW_MAP_MS))


@pytest.fixture(scope="module")
def jax_job(profiler_job):
    return profiler_job("jax_job.py", "--slow-loader-ms", str(SLOW_LOADER_MS))


def capture_json(*args: str, env: dict | None = None) -> dict:
    result = run_cli("capture", "--json", *args, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # stdout is exactly one JSON document


def events_named(path: str, name: str) -> list:
    """(duration_ms, {stat name: value}) of every event called `name`, read with the full XPlane proto."""
    space = xplane_pb2().XSpace()
    space.ParseFromString(Path(path).read_bytes())
    found = []
    for plane in space.planes:
        ids = {k for k, meta in plane.event_metadata.items() if meta.name == name}
        stat_names = {k: meta.name for k, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if event.metadata_id in ids:
                    stats = {stat_names.get(s.metadata_id): s.int64_value or s.uint64_value for s in event.stats}
                    found.append((event.duration_ps / 1e9, stats))
    return found


def run_dirs(logdir: Path) -> list[Path]:
    root = logdir / "plugins" / "profile"
    return sorted(p for p in root.iterdir()) if root.exists() else []


# ------------------------------------------------------------------------------------------------
# Real captures


def test_keras_job_capture_holds_its_slow_steps(keras_job, tmp_path):
    doc = capture_json("--service-addr", keras_job.address, "--logdir", str(tmp_path), "--duration", "1500ms")
    (host,) = doc["hosts"]
    assert host["host"] == f"localhost_{keras_job.port}"
    assert Path(host["path"]).parent == tmp_path / "plugins" / "profile" / doc["run"]
    assert host["size_bytes"] == Path(host["path"]).stat().st_size and host["events"] > 100
    whole = xplane_pb2().XSpace()  # the counts (streamed) equal a full parse's
    whole.ParseFromString(Path(host["path"]).read_bytes())
    assert host["events"] == sum(len(line.events) for plane in whole.planes for line in plane.lines)
    assert host["planes"] == len(whole.planes)
    assert doc["address_source"] == "The address was given with --service-addr"
    steps = events_named(host["path"], "multi_step_on_iterator")  # Keras 3's compiled train step
    assert len(steps) >= 3
    # Every step waits for 64 examples through a map that sleeps SLOW_MAP_MS each.
    assert statistics.median(d for d, _ in steps) >= 0.9 * SLOW_MAP_MS * KERAS_BATCH
    assert events_named(host["path"], "EagerPyFunc:EagerPyFunc")  # the sleeping tf.py_function itself


@pytest.fixture(scope="module")
def jax_capture(jax_job, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("jax_logdir")
    doc = capture_json("--service-addr", jax_job.address, "--logdir", str(logdir), "--duration", "1s",
                       "--analyze")
    return logdir, doc


def test_jax_job_capture_holds_annotated_steps(jax_capture, jax_job):
    logdir, doc = jax_capture
    (host,) = doc["hosts"]
    steps = events_named(host["path"], "train")  # jax.profiler.StepTraceAnnotation("train", step_num=i)
    assert len(steps) >= 5
    numbers = sorted(stats["step_num"] for _, stats in steps)
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # consecutive steps, none lost
    assert statistics.median(d for d, _ in steps) >= 0.9 * SLOW_LOADER_MS
    # one second of a >= 20 ms step cannot hold more than ~50 steps
    assert len(steps) <= 1000 / SLOW_LOADER_MS + 2
    # --analyze chained into `tpuprof analyze` on the new run, inside the same JSON document
    assert doc["analysis"]["steps"]["count"] >= 5


def test_short_capture_warns_and_the_duration_it_names_gives_20_steps(jax_job, tmp_path):
    """A 100 ms capture of the >= 20 ms steps holds at most 4 whole steps: analyze warns and names a
    --duration; capturing that long does give at least 20 steps."""
    import math
    import re

    short = capture_json("--service-addr", jax_job.address, "--logdir", str(tmp_path / "short"),
                         "--duration", "100ms", "--analyze")
    analysis = short["analysis"]
    assert 1 <= analysis["steps"]["count"] < 5, analysis["steps"]
    (warning,) = analysis["warnings"]
    assert warning.startswith(f"Only {analysis['steps']['count']} step")
    seconds = int(re.search(r"--duration (\d+)s", warning).group(1))
    assert seconds == math.ceil(21 * analysis["steps"]["mean_ms"] / 1000)
    long = capture_json("--service-addr", jax_job.address, "--logdir", str(tmp_path / "long"),
                        "--duration", f"{seconds}s", "--analyze")
    assert long["analysis"]["steps"]["count"] >= 20 and long["analysis"]["warnings"] == []


def test_analyze_names_the_run_it_reads_among_several(jax_capture, jax_job, tmp_path):
    logdir, first = jax_capture
    result = run_cli("analyze", logdir)
    assert result.returncode == 0, result.stderr
    runs = run_dirs(logdir)
    newest, others = runs[-1], len(runs) - 1
    expected = (f"Run {newest.name}, the newest in {logdir}/plugins/profile; {others} older run"
                if others else f"Run {newest.name}, the only run in {logdir}/plugins/profile.")
    title, said = result.stdout.split("\n", 1)
    assert title == "tpuprof analyze" and " ".join(said.split()).startswith(expected), result.stdout[:300]
    document = json.loads(run_cli("analyze", logdir, "--json").stdout)
    assert document["run"] == {"name": newest.name, "folder": f"{logdir}/plugins/profile", "other_runs": others}
    assert json.loads(run_cli("analyze", newest, "--json").stdout)["run"] is None  # a run folder: nothing chosen


def test_second_capture_is_a_new_run_and_leaves_the_first_untouched(jax_capture, jax_job):
    logdir, first = jax_capture
    first_file = Path(first["hosts"][0]["path"])
    before = (hashlib.sha256(first_file.read_bytes()).hexdigest(), first_file.stat().st_mtime_ns)
    second = capture_json("--service-addr", jax_job.address, "--logdir", str(logdir), "--duration", "500ms")
    assert second["run"] != first["run"]
    assert [p.name for p in run_dirs(logdir)] == sorted([first["run"], second["run"]])
    assert (hashlib.sha256(first_file.read_bytes()).hexdigest(), first_file.stat().st_mtime_ns) == before
    assert not [p for p in logdir.iterdir() if p.name.startswith(".tpuprof")]  # scratch removed


def test_human_summary_is_sentences_and_names_a_viewer_the_install_provides(jax_job, tmp_path):
    result = run_cli("capture", "--service-addr", jax_job.address, "--logdir", str(tmp_path), "--duration", "500ms")
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"tpuprof: capturing {jax_job.address}. The address was given with --service-addr.\n")
    lines = result.stdout.splitlines()
    (run_dir,) = run_dirs(tmp_path)
    assert lines[0] == f"Captured run {run_dir.name} in {run_dir}."
    assert lines[1].startswith("Traced 0.5 s on ") and lines[1].endswith(" s in all).")
    assert "address was given" not in result.stdout  # said once, on stderr, while the trace ran
    assert lines[-2] == f"To analyse the run: tpuprof analyze {run_dir}"
    assert lines[-1] == (f"To browse it in XProf's viewer: xprof --logdir {tmp_path} --port 8791, "
                         "then open http://localhost:8791/")
    assert "tensorboard" not in result.stdout


def test_the_viewer_named_in_the_hint_serves_the_logdir(tmp_path):
    """`xprof --logdir LOGDIR --port P` (the hint, on a free port) is installed and answers over HTTP."""
    import shutil
    import urllib.request

    xprof = shutil.which("xprof", path=str(Path(sys.executable).parent))
    assert xprof, "the xprof command is not installed beside this Python"
    port = free_port()
    server = subprocess.Popen([xprof, "--logdir", str(ROOT / "sample_profiles" / "captures" / "jax_compute"),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/", timeout=2) as page:
                    assert page.status == 200
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "xprof did not start serving"
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_two_jobs_one_command_give_two_hosts_in_one_run(keras_job, jax_job, tmp_path):
    doc = capture_json("--service-addr", f"{keras_job.address},grpc://{jax_job.address}",
                       "--logdir", str(tmp_path), "--duration", "1s")
    (run,) = run_dirs(tmp_path)
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [f"localhost_{keras_job.port}.xplane.pb", f"localhost_{jax_job.port}.xplane.pb"])
    assert doc["hosts_without_events"] == []
    assert {h["host"]: h["events"] > 0 for h in doc["hosts"]} == {
        f"localhost_{keras_job.port}": True, f"localhost_{jax_job.port}": True}
    assert events_named(str(run / f"localhost_{jax_job.port}.xplane.pb"), "train")
    assert events_named(str(run / f"localhost_{keras_job.port}.xplane.pb"), "multi_step_on_iterator")


def test_tpu_node_session_falls_back_to_tracing_each_worker(keras_job, jax_job, tmp_path):
    """--tpu gives a master and a worker list: a TPU Node's profiler runs one session over all workers;
    servers started by a job (TPU VMs, here) answer UNIMPLEMENTED, and each worker is traced directly."""
    from tpuprof.sources import capture

    workers = [keras_job.address, jax_job.address]
    result = capture.capture(workers, str(tmp_path), capture.TraceOptions(duration_ms=500, attempts=1),
                             tpu_master=jax_job.address)
    assert sorted(h.host for h in result.hosts) == sorted(a.replace(":", "_") for a in workers)
    assert all(Path(h.path).is_file() for h in result.hosts)


def _as_from_a_shell() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_interrupted_capture_leaves_no_run(profiler_job, tmp_path):
    # In full test runs started in the background from a fresh clone the interrupt was lost (exit 0) in 4 of 4
    # runs, never in this file alone; the pytest process there had SIGINT ignored, which children inherit. The
    # child starts the way an interactive shell starts a command: SIGINT unblocked and default.
    job = profiler_job("jax_job.py", "--slow-loader-ms", str(SLOW_LOADER_MS), "--seconds", "300")
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", "capture", "--service-addr", job.address,
                                "--logdir", str(tmp_path / "logs"), "--duration", "3s"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_as_from_a_shell)
    time.sleep(2.0)  # inside the trace window
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # no run, no scratch, and no logdir: it did not exist before


def test_interrupting_the_analysis_names_the_saved_run(jax_job, tmp_path):
    """Ctrl-C once the run is in place (its folder appears), while --analyze reads it: the run is complete and
    kept, and the user is told where it is. With --json a line on stderr says so; without it the summary is now
    printed before the analysis starts (when the interrupt lands against the summary's printing is a race, so
    that form is not asserted here). Both used to print only 'interrupted.' beside a run they never named."""
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", "capture", "--service-addr", jax_job.address,
                                "--logdir", str(tmp_path), "--duration", "2s", "--analyze", "--json"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_as_from_a_shell)
    deadline = time.monotonic() + 60
    while not run_dirs(tmp_path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.03)  # past the few statements between the rename and the analysis, far short of the analysis
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, (stdout, stderr)
    (run,) = run_dirs(tmp_path)
    whole = xplane_pb2().XSpace()
    whole.ParseFromString(next(run.glob("*.xplane.pb")).read_bytes())  # the file is whole
    assert f"tpuprof: the run is saved in {run}; its analysis was interrupted." in stderr.splitlines(), stderr


# ------------------------------------------------------------------------------------------------
# gs:// against a real GCS emulator on loopback


@pytest.fixture(scope="module")
def gcs_emulator():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
         "--in-memory", "--default-bucket", "tpuprof-test"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail("gcp-storage-emulator did not start")
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def test_gs_logdir_uploads_runs_without_overwriting(jax_job, gcs_emulator):
    import fsspec

    env = {"STORAGE_EMULATOR_HOST": gcs_emulator}
    first = capture_json("--service-addr", jax_job.address, "--logdir", "gs://tpuprof-test/logs",
                         "--duration", "500ms", env=env)
    second = capture_json("--service-addr", jax_job.address, "--logdir", "gs://tpuprof-test/logs",
                          "--duration", "500ms", env=env)
    assert first["run_dir"] == f"gs://tpuprof-test/logs/plugins/profile/{first['run']}"
    assert second["run"] != first["run"]
    os.environ["STORAGE_EMULATOR_HOST"] = gcs_emulator
    try:
        fs = fsspec.filesystem("gs", skip_instance_cache=True)
        names = sorted(fs.find("tpuprof-test/logs"))
        data = fs.cat_file(first["hosts"][0]["path"].removeprefix("gs://"))
    finally:
        del os.environ["STORAGE_EMULATOR_HOST"]
    assert names == sorted(h["path"].removeprefix("gs://") for h in first["hosts"] + second["hosts"])
    assert len(data) == first["hosts"][0]["size_bytes"]
    space = xplane_pb2().XSpace()
    space.ParseFromString(data)
    assert any(plane.name == "/host:CPU" for plane in space.planes)


# ------------------------------------------------------------------------------------------------
# Failures: one or two sentences, exit 2, nothing written


def test_dead_port_is_a_clear_error_within_the_attempts(tmp_path):
    port = free_port()
    started = time.monotonic()
    result = run_cli("capture", "--service-addr", f"localhost:{port}", "--attempts", "2",
                     "--logdir", str(tmp_path / "logs"))
    elapsed = time.monotonic() - started
    assert result.returncode == 2
    (message,) = result.stderr.strip().splitlines()  # one line: cause, attempts, fix
    assert message.startswith(f"tpuprof: Nothing is listening at localhost:{port} (connection refused, "
                              "2 attempt(s))")
    assert message.endswith(" The address was given with --service-addr.")
    for start_line in (f"tf.profiler.experimental.server.start({port})", f"jax.profiler.start_server({port})",
                       f"torch_xla.debug.profiler.start_server({port})"):
        assert start_line in message
    assert elapsed < 15  # 2 attempts, 1 s apart, plus start-up
    assert not (tmp_path / "logs").exists() or run_dirs(tmp_path / "logs") == []
    assert result.stdout == ""


@pytest.fixture
def web_server():
    """A real HTTP server on loopback: what answers on TensorBoard's or XProf's viewer port."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def other_grpc_server():
    """A real gRPC server without the profiler service (as the TPU runtime's port 8470 or a job's coordinator)."""
    from concurrent import futures

    grpc = pytest.importorskip("grpc")  # installed with the tf extra, as `make setup` does
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_insecure_port(f"localhost:{port}")
    server.start()
    yield f"localhost:{port}"
    server.stop(grace=None)


@pytest.mark.parametrize("server, cause", [
    ("web_server", "answers HTTP, not the profiler's gRPC: it is a web server"),
    ("other_grpc_server", "does not offer the profiler service"),
])
def test_a_port_that_is_not_a_profiler_server_is_named_so(server, cause, request, tmp_path):
    """The client's exception says "no trace event" for any server that answers; what each one answered is only in
    the warnings it logs, which the CLI's quiet logging used to drop: a web server read 'Nothing is listening ...
    any more', a gRPC server without the profiler service 'the job may be idle'."""
    address = request.getfixturevalue(server)
    result = run_cli("capture", "--service-addr", address, "--attempts", "1", "--duration", "300ms",
                     "--logdir", str(tmp_path / "logs"))
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert cause in message and address in message, message
    assert "jax.profiler.start_server(PORT)" in message
    assert "idle" not in message and "Nothing is listening" not in message
    assert result.stdout == ""


def test_idle_job_gives_no_trace_event_error_after_the_attempts(profiler_job, tmp_path):
    idle = profiler_job("jax_job.py", "--idle")  # profiler server up, no step ever runs
    started = time.monotonic()
    result = run_cli("capture", "--service-addr", idle.address, "--attempts", "2", "--duration", "500ms",
                     "--logdir", str(tmp_path / "new" / "logs"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"tpuprof: No trace event was collected from {idle.address} after 2 attempt(s) of 0.5s: the job may be "
        "idle, between steps or still compiling; capture while it trains, or raise --duration / --attempts.")
    assert time.monotonic() - started < 20
    assert list(tmp_path.iterdir()) == []  # no run, no scratch, not the empty folders the logdir needed
    assert result.stdout == ""


def test_no_event_with_the_host_tracer_off_names_the_option_not_an_idle_job(jax_job, tmp_path):
    """The job trains (every step shows in a default capture), but on CPU only the host tracer sees it: with
    --host-tracer-level 0 nothing comes back, which read 'the job may be idle, between steps or still compiling'."""
    result = run_cli("capture", "--service-addr", jax_job.address, "--attempts", "1", "--duration", "300ms",
                     "--host-tracer-level", "0", "--logdir", str(tmp_path))
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert "with --host-tracer-level 0 only the devices were traced" in message, message
    assert "--host-tracer-level 2" in message and "idle" not in message
    assert list(tmp_path.iterdir()) == []


def test_unknown_host_is_a_dns_error():
    result = run_cli("capture", "--service-addr", "no-such-tpu-worker.invalid:8466", "--attempts", "1")
    assert result.returncode == 2
    assert "Cannot resolve host 'no-such-tpu-worker.invalid' (DNS lookup failed)" in result.stderr


@pytest.fixture
def no_google_cloud():
    """Environment of a machine off Google Cloud with no credentials: the metadata server refuses."""
    dead = f"127.0.0.1:{free_port()}"
    return {"GCE_METADATA_HOST": dead, "GCE_METADATA_IP": dead, "GOOGLE_APPLICATION_CREDENTIALS": "",
            "TPU_NAME": "", "HOME": "/nonexistent"}


def test_unresolvable_tpu_name_off_cloud(no_google_cloud):
    result = run_cli("capture", "--tpu", "no-such-tpu", "--attempts", "1", env=no_google_cloud)
    assert result.returncode == 2
    assert result.stderr.startswith("tpuprof: Cannot resolve TPU 'no-such-tpu': this machine is not on Google Cloud")
    assert len(result.stderr.strip().splitlines()) == 1


def test_unresolvable_tpu_name_without_credentials(no_google_cloud):
    started = time.monotonic()
    result = run_cli("capture", "--tpu", "no-such-tpu", "--zone", "us-central1-b", "--project", "p",
                     env=no_google_cloud)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tpuprof: Cannot resolve TPU 'no-such-tpu' (project p, zone us-central1-b): "
                           "no Google Cloud credentials were found"), result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("argv, message", [
    (["--duration", "soon"], "'soon' is not a duration"),
    (["--attempts", "0"], "--attempts must be at least 1."),
    (["--host-tracer-level", "7"], "--host-tracer-level must be one of 0, 1, 2, 3"),
    (["--service-addr", "host:notaport"], "has no valid port"),
])
def test_bad_options_are_one_sentence(argv, message):
    result = run_cli("capture", *argv)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------------
# Address rules (pure: no network unless a rule needs it)


@pytest.mark.parametrize("kwargs, env, expected, why", [
    ({"service_addr": "10.0.0.2:9012,10.0.0.3:9012"}, {}, ["10.0.0.2:9012", "10.0.0.3:9012"], "--service-addr"),
    # separated by a space (it read as one host '10.0.0.2:9012 10.0.0.3' and failed as a DNS lookup)
    ({"service_addr": "10.0.0.2:9012 10.0.0.3:9012"}, {}, ["10.0.0.2:9012", "10.0.0.3:9012"], "--service-addr"),
    ({"service_addr": "grpc://10.0.0.2:8470"}, {}, ["10.0.0.2:8466"], "--service-addr"),
    ({"service_addr": "grpc://10.0.0.2:8470", "port": 9999}, {}, ["10.0.0.2:8470"], "--service-addr"),
    ({"service_addr": "[::1]:6009"}, {}, ["[::1]:6009"], "--service-addr"),
    # one local server by two of its names: its second session found it busy and called it never started
    ({"service_addr": "localhost:9012,127.0.0.1:9012"}, {}, ["localhost:9012"], "--service-addr"),
    ({"service_addr": "127.0.0.1:9012 localhost:9013"}, {}, ["127.0.0.1:9012", "localhost:9013"], "--service-addr"),
    ({"service_addr": "myhost"}, {}, ["myhost:8466"], "--service-addr"),
    ({}, {"TPU_GRPC_URL": "grpc://10.1.2.3:8470"}, ["10.1.2.3:8466"], "TPU_GRPC_URL"),
    ({"port": 9012}, {"TPU_GRPC_URL": "grpc://10.1.2.3:8470"}, ["10.1.2.3:9012"], "TPU_GRPC_URL"),
    ({}, {"COLAB_TPU_ADDR": "10.4.5.6:8470"}, ["10.4.5.6:8466"], "COLAB_TPU_ADDR"),
    ({"port": 9999}, {"TPU_WORKER_HOSTNAMES": "t1k-w-0,t1k-w-1,t1k-w-2,t1k-w-3"},
     ["t1k-w-0:9999", "t1k-w-1:9999", "t1k-w-2:9999", "t1k-w-3:9999"], "Every worker"),
    ({}, {"TPU_PROCESS_ADDRESSES": "10.0.0.5:8476,10.0.0.6:8476"}, ["10.0.0.5:8466", "10.0.0.6:8466"],
     "TPU_PROCESS_ADDRESSES"),
    ({"port": 9012}, {}, ["localhost:9012"], "this machine"),
    ({}, {}, ["localhost:8466"], "default port"),
])
def test_address_rules(kwargs, env, expected, why, monkeypatch):
    monkeypatch.setattr(addresses, "_on_tpu_vm", lambda: False)  # this machine is not a TPU VM either way
    target = addresses.resolve(environ=env, **kwargs)
    assert target.addresses == expected
    assert why in target.why


def test_service_addr_wins_over_environment():
    target = addresses.resolve(service_addr="a:1", environ={"TPU_GRPC_URL": "grpc://b:8470"})
    assert target.addresses == ["a:1"]


def test_grpc_url_port_note():
    target = addresses.resolve(environ={"COLAB_TPU_ADDR": "10.4.5.6:8470"})
    assert target.notes == ["port 8470 is the TPU runtime's; its profiler listens on 8466"]


def test_one_local_server_named_twice_is_traced_once_and_said_so():
    target = addresses.resolve(service_addr="localhost:9012 127.0.0.1:9012")
    assert target.notes == ["127.0.0.1:9012 is localhost:9012, this machine's loopback: traced once"]


def test_empty_address_is_a_user_error():
    with pytest.raises(UserError):
        addresses.resolve(service_addr=" , ")


def test_same_second_run_name_gets_a_suffix_and_keeps_the_first(tmp_path):
    from tpuprof.sources import capture

    existing = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    existing.mkdir(parents=True)
    (existing / "h.xplane.pb").write_bytes(b"first")
    for expected in ("2026_01_01_00_00_00_2", "2026_01_01_00_00_00_3"):
        new = tmp_path / "scratch" / "2026_01_01_00_00_00"
        new.mkdir(parents=True)
        (new / "h.xplane.pb").write_bytes(b"second")
        placed = capture.place_local(new, "2026_01_01_00_00_00", str(tmp_path))
        assert Path(placed).name == expected and (Path(placed) / "h.xplane.pb").read_bytes() == b"second"
    assert (existing / "h.xplane.pb").read_bytes() == b"first"


def test_tpu_grpc_url_needs_no_lookup():
    target = addresses.resolve(tpu="grpc://10.2.3.4:8470")
    assert target.addresses == ["10.2.3.4:8466"] and target.why == "The address was given as a gRPC URL with --tpu"


@pytest.mark.parametrize("text, ms", [("2s", 2000), ("500ms", 500), ("1.5s", 1500), ("1m", 60000), ("3", 3000)])
def test_durations(text, ms):
    from tpuprof.sources.capture import parse_duration_ms

    assert parse_duration_ms(text) == ms


def test_idle_worker_is_reported_without_events(profiler_job, jax_job, tmp_path):
    idle = profiler_job("jax_job.py", "--idle")  # its server answers with an empty trace
    doc = capture_json("--service-addr", f"{jax_job.address},{idle.address}", "--logdir", str(tmp_path),
                       "--duration", "500ms", "--attempts", "1")
    events = {h["host"]: h["events"] for h in doc["hosts"]}
    assert events[f"localhost_{idle.port}"] == 0 and events[f"localhost_{jax_job.port}"] > 0
    assert doc["hosts_without_events"] == [idle.address]


def test_a_relative_logdir_is_where_tpuprof_runs_not_where_the_job_runs(jax_job, tmp_path):
    """The profiler server writes the trace itself, resolving the path in its own folder: `--logdir logs` (the
    default) from another folder than the job's must still land in tpuprof's folder, and nothing in the job's."""
    here = tmp_path / "here"
    here.mkdir()
    before = sorted(jax_job.cwd.rglob("*"))
    result = subprocess.run([sys.executable, "-m", "tpuprof", "capture", "--service-addr", jax_job.address,
                             "--logdir", "logs", "--duration", "500ms", "--json"], cwd=here, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (run,) = run_dirs(here / "logs")
    assert doc["run_dir"] == str(run) and doc["logdir"] == str(here / "logs") and doc["hosts_elsewhere"] == []
    assert [Path(h["path"]).parent for h in doc["hosts"]] == [run] and list(run.glob("*.xplane.pb"))
    assert sorted(jax_job.cwd.rglob("*")) == before, "the job's folder got files"
    assert sorted(p.name for p in here.iterdir()) == ["logs"]


def test_servers_on_this_machine_and_on_others():
    from tpuprof.sources import capture

    assert capture.on_this_machine("localhost:8466") and capture.on_this_machine("127.0.0.1:1")
    assert capture.on_this_machine(f"{socket.gethostname()}:8466") and capture.on_this_machine("[::1]:8466")
    assert not capture.on_this_machine("192.0.2.7:8466")  # TEST-NET-1: never a machine's own address
    assert not capture.on_this_machine("no-such-host.invalid:8466")


def test_a_worker_on_another_machine_is_told_where_its_trace_is_and_how_to_fetch_it():
    from tpuprof.sources import capture

    there = capture.where_elsewhere("10.0.0.3:8466", "/home/me/logs")
    assert there.where == "10.0.0.3:/home/me/logs/plugins/profile"
    assert there.fetch == "scp -r '10.0.0.3:/home/me/logs/plugins/profile/*' /home/me/logs/plugins/profile/"
    bucket = capture.where_elsewhere("10.0.0.3:8466", "gs://b/logs")
    assert bucket.where == "gs://b/logs/plugins/profile" and bucket.fetch == "tpuprof analyze gs://b/logs"
