"""`tpuprof trace`: the exported Perfetto trace, read back with the perfetto package's own protos, holds the steps
`tpuprof analyze` measured for the window (count and durations), a track per TPU core, the op names, flows and
counters; bad input is one sentence and exit 2, and an existing file is never replaced unless asked."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import perfetto_reader
from conftest import SAMPLES, run_cli
from helpers.real_data import TPU_HOST_OFFLOAD_V6E_4, TPU_PALLAS_MATMUL_V6E_1, real_artefact

CAPTURES = SAMPLES / "captures"


def analyzed(path) -> dict:
    result = run_cli("analyze", str(path), "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def median_window(step_list: list[dict]) -> list[int]:
    """The default window, worked out from analyze's own step list: the median step by duration, one either side."""
    ordered = sorted(step_list, key=lambda s: s["number"])
    durations = [s["duration_ms"] for s in ordered]
    middle = sorted(range(len(ordered)), key=lambda i: (durations[i], i))[(len(ordered) - 1) // 2]
    assert ordered[middle]["duration_ms"] == statistics.median_low(durations)
    return [s["number"] for s in ordered[max(0, middle - 1):middle + 2]]


def export(path, output, *options) -> perfetto_reader.Track:
    result = run_cli("trace", str(path), "-o", str(output), *options)
    assert result.returncode == 0, result.stderr
    assert output.exists() and not list(output.parent.glob(f".{output.name}.*")), "a temporary file was left"
    return perfetto_reader.read(output)


def steps_of(tracks, process: str) -> list[tuple[str, float]]:
    """The steps on the process's `tpuprof steps` track and its overflow tracks (TPU step periods can overlap)."""
    slices = [s for t in tracks.values() if t.name.startswith("tpuprof steps") and t.process == process
              for s in t.slices]
    assert slices, f"no steps track in {process}"
    return [(s.name, (s.end_ns - s.start_ns) / 1e6) for s in sorted(slices, key=lambda s: s.start_ns)]


def assert_steps_equal_analyze(tracks, host: dict, numbers: list[int], process: str) -> None:
    expected = [(f"step {s['number']}", s["duration_ms"]) for s in host["step_list"] if s["number"] in numbers]
    got = steps_of(tracks, process)
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (_, ms), (_, want) in zip(got, expected):
        assert ms == pytest.approx(want, abs=0.0015)  # ns in the trace, ms to 3 decimals in the JSON


def test_default_window_is_the_median_step_and_its_neighbours(tmp_path):
    capture = CAPTURES / "jax_compute"
    document = analyzed(capture)
    host = document["hosts"][0]
    numbers = median_window(host["step_list"])
    assert len(numbers) == 3
    tracks = export(capture, tmp_path / "t.pftrace")
    assert_steps_equal_analyze(tracks, host, numbers, f"{host['host']} /host:CPU")
    threads = [t for t in tracks.values() if t.slices and t.name != "tpuprof steps"]
    assert threads, "no host thread track"
    names = {s.name for t in threads for s in t.slices}
    assert {op["name"] for op in document["top_ops"]} & names, "none of analyze's top ops is in the trace"


def test_chosen_steps_and_tf_data_stages(tmp_path):
    capture = CAPTURES / "tf_slow_map"
    host = analyzed(capture)["hosts"][0]
    tracks = export(capture, tmp_path / "t.pftrace", "--steps", "2:5")
    assert_steps_equal_analyze(tracks, host, [2, 3, 4], f"{host['host']} /host:CPU")
    stages = [s for t in tracks.values() for s in t.slices if "tf.data" in s.categories]
    assert stages and all(s.name.startswith("Iterator::") for s in stages)
    assert any(s.name.endswith("::Map") for s in stages), "the slow Map stage of the job is missing"


@pytest.fixture(scope="module", params=["offload", "pallas"])
def real_tpu(request, tmp_path_factory):
    artefact = {"offload": TPU_HOST_OFFLOAD_V6E_4, "pallas": TPU_PALLAS_MATMUL_V6E_1}[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    path = real_artefact(artefact, folder)
    document = analyzed(path)
    return request.param, path, document, export(path, folder / "t.pftrace")


def test_real_tpu_capture_has_every_core_its_steps_and_ops(real_tpu):
    name, _, document, tracks = real_tpu
    host = document["hosts"][0]
    numbers = median_window(host["step_list"]) if host["step_list"] else []
    assert_steps_equal_analyze(tracks, host, numbers, f"{host['host']} /host:CPU")
    for device in document["devices"]:
        process = f"{host['host']} /device:{device['id']}"
        assert len(steps_of(tracks, process)) == len(numbers), f"{device['id']} lacks the window's steps"
        ops = [t for t in tracks.values() if t.process == process and t.name.startswith("XLA Ops")]
        assert ops and any(t.slices for t in ops), f"{device['id']} has no op track"
        assert any(t.name == "XLA Modules" and t.slices for t in tracks.values() if t.process == process)
    op_names = {s.name for t in tracks.values() if t.name.startswith("XLA Ops") for s in t.slices}
    if name == "offload":  # the job copies its host-memory arrays in and out every step
        assert {"copy-start", "copy-done"} <= {n.split(".")[0] for n in op_names}
    else:  # the Pallas matmul kernel, a custom call
        assert any("custom" in n or "matmul" in n.lower() for n in op_names), sorted(op_names)[:20]


def test_real_tpu_flows_join_what_the_capture_links(real_tpu):
    """The v6e-4 capture links each host enqueue to the XLA module it runs (`_p`/`_c` contexts); the Pallas one
    links only host events (its device modules consume a context no host event produces)."""
    name, _, _, tracks = real_tpu
    device = {f for t in tracks.values() if t.name == "XLA Modules" for s in t.slices for f in s.flows}
    host = [f for t in tracks.values() if "/host:" in t.process for s in t.slices for f in s.flows]
    assert any(host.count(f) > 1 for f in host), "no flow joins two host events"
    if name == "offload":
        assert device & set(host), "no flow joins a host event to a device program"
        counters = [t for t in tracks.values() if t.counters]
        assert counters and all(value >= 0 for t in counters for _, value in t.counters)


def test_an_existing_output_is_kept(tmp_path):
    output = tmp_path / "t.pftrace"
    output.write_bytes(b"mine")
    result = run_cli("trace", str(CAPTURES / "jax_compute"), "-o", str(output))
    assert result.returncode == 2 and output.read_bytes() == b"mine"
    assert result.stderr.strip() == f"tpuprof: {output} exists: give another -o, or --force to replace it."
    assert run_cli("trace", str(CAPTURES / "jax_compute"), "-o", str(output), "--force").returncode == 0
    assert output.read_bytes() != b"mine"


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "x:y"], "--steps takes FIRST:END"),
    (["--steps", "5:5"], "END > FIRST"),
    (["--steps", "9000:9003"], "the capture holds steps"),
    (["--hosts", "nowhere"], "no host nowhere in the capture"),
])
def test_bad_options_are_one_sentence(tmp_path, arguments, message):
    output = tmp_path / "t.pftrace"
    result = run_cli("trace", str(CAPTURES / "jax_compute"), "-o", str(output), *arguments)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not output.exists()
    assert not list(tmp_path.iterdir()), "something was written"


def test_a_file_that_is_not_a_capture_is_one_sentence(tmp_path):
    bad = tmp_path / "x.xplane.pb"
    bad.write_bytes(b"\x00garbage" * 10)
    result = run_cli("trace", str(bad), "-o", str(tmp_path / "t.pftrace"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t.pftrace").exists()


def test_overlapping_events_go_to_another_lane_and_every_lane_nests(tmp_path):
    """A line whose events overlap without nesting (an async copy running over the next op) gets a second track;
    the reader checks that time never goes back on a track, so BEGIN/END pairs nest."""
    from tpuprof.renderers.perfetto import Lanes, Writer

    output = tmp_path / "lanes.pftrace"
    with open(output, "wb") as handle:
        writer = Writer(handle)
        process = writer.process(1, "p")
        lanes = Lanes(writer, lambda lane: writer.track(process, f"line {lane}"))
        for start, end, name in [(0, 100, "outer"), (10, 20, "inner"), (50, 150, "overlapping"), (120, 130, "later")]:
            lanes.add(start, end, name)
        lanes.close()
    tracks = {t.name: sorted((s.name, s.start_ns, s.end_ns) for s in t.slices)
              for t in perfetto_reader.read(output).values() if t.slices}
    assert tracks == {"line 0": [("inner", 10, 20), ("later", 120, 130), ("outer", 0, 100)],
                      "line 1": [("overlapping", 50, 150)]}


def test_a_logdir_of_several_runs_says_which_run_it_read(tmp_path):
    """A logdir holds one run per capture; trace reads the newest, as analyze does, and now says which (the JSON's
    `run`, and analyze's sentence above the summary): it named no run, so a user could not tell which capture the
    trace was of."""
    import shutil

    (source,) = (CAPTURES / "jax_compute" / "plugins" / "profile").iterdir()
    runs = tmp_path / "logdir" / "plugins" / "profile"
    for name in ("2026_01_01_00_00_00", "2026_01_02_00_00_00"):
        shutil.copytree(source, runs / name)
    done = run_cli("trace", str(tmp_path / "logdir"), "-o", str(tmp_path / "t.pftrace"), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["run"] == {"name": "2026_01_02_00_00_00", "folder": str(runs), "other_runs": 1}
    text = run_cli("trace", str(tmp_path / "logdir"), "-o", str(tmp_path / "u.pftrace")).stdout
    assert text.splitlines()[0].startswith("Run 2026_01_02_00_00_00, the newest in ")
    assert "1 older run not read" in text.splitlines()[0]
    single = json.loads(run_cli("trace", str(runs / "2026_01_01_00_00_00"), "-o", str(tmp_path / "v.pftrace"),
                                "--json").stdout)
    assert single["run"] is None
