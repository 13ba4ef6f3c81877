"""Hostile input: the fuzzer's findings as regression inputs run through the real CLI, and a short fuzz run.

Every crash class the fuzzer found (issue #15) has an input in tests/fuzz/regressions/: a layout that does not fit
its shape, numbers past int64 or float or 4,300 digits, lower-case units, sizes of zero, buffer sharing in a
cycle, timestamps that overflow int64, damaged --json documents. Each must end in one sentence on stderr and exit
code 2 (or, where the input still holds a readable answer, exit 0), never a traceback or a hang.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

REGRESSIONS = ROOT / "tests" / "fuzz" / "regressions"
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

# (input, command, exit code, what stderr says)
CASES = [
    ("alias_self_cycle.hlo.pb", "memory", 2, "share memory with itself"),
    ("alias_two_buffer_cycle.hlo.pb", "memory", 2, "share memory with itself through buffer"),
    ("layout_unclosed_tile.hlo.txt", "memory", 2, "tile dimension"),
    ("layout_short_minor_to_major.hlo.txt", "memory", 2, "does not fit its 2 dimension(s)"),
    ("layout_missing_dimension.hlo.txt", "memory", 2, "does not fit its 2 dimension(s)"),
    ("layout_tail_padding_zero.hlo.txt", "memory", 2, "tail padding L()"),
    ("layout_element_size_not_integer.hlo.txt", "memory", 2, "element size E()"),
    ("layout_tile_dim_not_integer.hlo.txt", "memory", 2, "tile dimension"),
    ("dimension_5000_digits.hlo.txt", "memory", 2, "out of range"),
    ("size_5000_digits-buffer-assignment.txt", "memory", 2, "out of range"),
    ("layout_missing_dimension-buffer-assignment.txt", "memory", 2, "does not fit its 2 dimension(s)"),
    ("oom_size_beyond_float.txt", "oom", 2, "out of range"),
    # Still a readable message: the answer, with what could not be read said in it.
    ("oom_lowercase_units.txt", "oom", 0, ""),
    ("oom_used_zero.txt", "oom", 0, ""),
    ("oom_hlo_temp_zero.txt", "oom", 0, ""),
    ("oom_layout_short_minor_to_major.txt", "oom", 0, ""),
    ("oom_layout_tail_padding_zero.txt", "oom", 0, ""),
    ("timestamp_near_int64.xplane.pb", "analyze", 2, "more than 26 days"),
    ("duration_int64_max.xplane.pb", "analyze", 2, "more than 26 days"),
    ("dangling_metadata_id.xplane.pb", "analyze", 0, ""),
    ("json_size_is_a_string.json", "report", 2, "size_bytes should be a non-negative integer, not a string"),
    ("json_buffer_without_instruction.json", "report", 2, "instruction is missing"),
    ("json_suggestions_not_a_list.json", "diff", 2, "suggestions should be a list"),
    ("json_negative_peak.json", "diff", 2, "peak_heap_bytes should be a non-negative integer"),
    ("json_integer_5000_digits.json", "report", 2, "an integer of 5000 digits"),
    ("json_nan.json", "diff", 2, "NaN is not a number JSON allows"),
    ("json_nested_5000_deep.json", "report", 2, "nested too deeply"),
    ("json_pod_not_an_object.json", "report", 2, "steps.pod should be an object, not the number 5"),
    ("json_preflight_slice_not_an_object.json", "report", 2, "targets[0].slice should be an object, not a list"),
    # A module's caveats given as a number (the memory section listed them).
    ("json_module_caveats_not_a_list.json", "report", 2, "caveats should be a list, not the number 5"),
    # An analyze document whose roofline ridge underflows to 0 when quartered (the log axis had no range).
    ("json_roofline_ridge_underflow.json", "report", 0, ""),
    # A preflight document whose dump_dir is longer than a file name may be (is_dir raised OSError).
    ("json_preflight_dump_dir_too_long.json", "report", 0, ""),
    # A logical buffer defined at a negative tuple index.
    ("shape_index_negative.hlo.pb", "memory", 0, ""),
    # Two logical buffers with one id and different defining instructions (describe looked the id up).
    ("logical_buffer_id_repeated.hlo.pb", "memory", 0, ""),
    # A buffer's shape index reaching a tuple element by a negative number (subshape).
    ("subshape_negative_index.hlo.pb", "memory", 0, ""),
    # A category's share of the step past a float (1e999 reads as inf): the schema's int64 maximum holds for the
    # named categories as for any other key (the page rounded it: decimal.InvalidOperation).
    ("json_breakdown_percent_1e999.json", "report", 2, "steps.breakdown_percent.input should be a non-negative number"),
    # A suggestion's framework given as a list: the reader checks every field the page reads.
    ("json_suggestion_framework_list.json", "report", 2, "framework should be a string"),
    # A layer index of 4,401 digits in an op name (int() refuses it): not a layer index.
    ("oom_layer_index_4401_digits.txt", "oom", 0, ""),
    # parameter(N) with 4,401 digits in HLO text: read by the one number reader, like every other integer there.
    ("parameter_number_4401_digits.hlo.txt", "memory", 2, "a parameter number is"),
    # A module proto without a buffer assignment (the estimate's path) whose input_output_alias names an output
    # index its result does not have (a negative one indexed the tuple from its end, past it: IndexError).
    ("alias_output_index_negative.hlo.pb", "memory", 2, "input_output_alias gives output {-1000}"),
    # The same in HLO text: output {3} of a module whose result is one array (was silently ignored).
    ("alias_output_index_missing.hlo.txt", "memory", 2, "input_output_alias gives output {3} to parameter 1"),
    # A shape proto with fewer is_dynamic_dimension flags than dimensions (its text indexed past the flags).
    ("dynamic_flags_fewer_than_dims.hlo.pb", "memory", 2, "has 1 dynamic-dimension flag(s) for its 2 dimension(s)"),
]


def _args(command: str, path: Path, tmp_path: Path) -> list[str]:
    if command == "report":
        return ["report", str(path), "-o", str(tmp_path / "report.html")]
    if command == "diff":  # B is the damaged one; A a good document of the same kind
        good = tmp_path / "good.json"
        done = run_cli("memory", "sample_profiles/dumps/int8_matmul_v5e", "--json", "--top", "3")
        good.write_text(done.stdout)
        return ["diff", str(good), str(path)]
    if command == "memory":
        return ["memory", str(path), "--target", "v5e"]
    return [command, str(path)]


def test_every_regression_input_is_in_the_table():
    assert sorted(p.name for p in REGRESSIONS.iterdir()) == sorted(c[0] for c in CASES)


@pytest.mark.parametrize("name, command, code, said", CASES, ids=[c[0] for c in CASES])
def test_regression_input_ends_in_one_sentence(name, command, code, said, tmp_path):
    done = run_cli(*_args(command, REGRESSIONS / name, tmp_path), timeout=60)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    if code == 2:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tpuprof: ") and lines[0].endswith("."), done.stderr
        assert said in lines[0]
        assert done.stdout == ""
    else:
        assert done.stdout.strip()


@pytest.fixture(scope="module")
def targets():
    from targets import TARGETS

    loaded = {}
    for name, cls in TARGETS.items():
        loaded[name] = cls()
        loaded[name].load()
    return loaded


@pytest.mark.slow
def test_short_fuzz_run_finds_no_crash_hang_or_memory_blowup(targets):
    """The same 60 mutated inputs per parser every run (a fixed seed and count, about a second each), in a worker
    process with the time and memory limits of `make fuzz`; what long campaigns found is replayed above
    (test_regression_input_ends_in_one_sentence)."""
    import harness

    worker = harness.Worker(targets, timeout=10.0, memory_mb=1536)
    failures = []
    try:
        for name, target in targets.items():
            stats = harness.campaign(target, worker, seed=15, inputs=60)
            assert stats.inputs == 60, stats.line()
            for key, (count, _, detail) in stats.classes.items():
                failures.append(f"{name}: {count} x {key}\n{detail}")
    finally:
        worker.stop()
    assert not failures, "\n\n".join(failures)


# ------------------------------------------------------------------------------------------------
# Remote paths: a host that accepts and never answers, and a real GCS emulator on loopback


@pytest.fixture
def silent_host():
    """A loopback port that accepts connections and never sends a byte (a firewall that swallows packets)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.5)
    accepted, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for connection in accepted:
        connection.close()
    server.close()


def test_a_remote_path_that_never_answers_says_so_then_fails_within_its_time_limit(silent_host):
    """The limit is 30 s unless TPUPROF_REMOTE_TIMEOUT_S says otherwise: 6 s here, so that the test waits 6."""
    import os
    import subprocess
    import threading
    import time

    from tpuprof.sources import remote

    assert remote.LIMIT_S == 30 or "TPUPROF_REMOTE_TIMEOUT_S" in os.environ
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", "analyze", "gs://bucket/logs"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "STORAGE_EMULATOR_HOST": silent_host,
                                    "TPUPROF_REMOTE_TIMEOUT_S": "6"})
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic() - started, line)
                                                          for line in process.stderr), daemon=True)
    reader.start()
    code = process.wait(timeout=60)
    reader.join(5)
    elapsed = time.monotonic() - started
    assert code == 2 and process.stdout.read() == ""
    (first_at, first), (_, last) = lines[0], lines[-1]
    assert len(lines) == 2 and "Traceback" not in "".join(line for _, line in lines)
    assert first.startswith("tpuprof: waiting for gs://bucket to answer") and "giving up after 6 s" in first, lines
    assert first_at < 6, lines
    assert last.startswith("tpuprof: no answer from gs://bucket within 6 s") and 6 <= elapsed < 16, (elapsed, lines)


@pytest.fixture(scope="module")
def gcs_emulator():
    import socket
    import subprocess
    import time

    from helpers.jobs import free_port

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                                "--port", str(port), "--in-memory", "--default-bucket", "tpuprof-robust"],
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


def test_a_capture_on_gcs_reads_like_the_local_copy_and_a_missing_one_fails_at_once(gcs_emulator, monkeypatch):
    import json
    import time

    import fsspec

    local = next((ROOT / "sample_profiles" / "captures" / "tf_slow_map").rglob("*.xplane.pb"))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    fs = fsspec.filesystem("gs", skip_instance_cache=True)
    fs.put_file(str(local), f"tpuprof-robust/logs/plugins/profile/{local.parent.name}/{local.name}")
    env = {"STORAGE_EMULATOR_HOST": gcs_emulator}
    remote = run_cli("analyze", "gs://tpuprof-robust/logs", "--json", env=env, timeout=120)
    assert remote.returncode == 0, remote.stderr
    mine = run_cli("analyze", str(local), "--json")
    assert json.loads(remote.stdout)["steps"] == json.loads(mine.stdout)["steps"]
    started = time.monotonic()
    missing = run_cli("analyze", "gs://tpuprof-robust/nothing-here", env=env, timeout=60)
    assert missing.returncode == 2 and time.monotonic() - started < 20
    assert missing.stderr.strip().splitlines()[-1] == "tpuprof: gs://tpuprof-robust/nothing-here does not exist."


# ------------------------------------------------------------------------------------------------
# Nothing is written into an input folder


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_xprof_oracles_and_commands_leave_the_sample_folders_as_they_were(tmp_path):
    """XProf writes ALL_HOSTS.op_stats_v2.pb and <module>.hlo_proto.pb beside what it reads: the oracles give it
    copies, and no command writes beside its inputs."""
    from helpers.xprof_oracle import memory_viewer, tool_data

    samples = ROOT / "sample_profiles"
    before = _snapshot(samples)
    capture = next((samples / "captures" / "jax_recompile").rglob("*.xplane.pb"))
    dump = next((samples / "dumps" / "int8_matmul_v5e").glob("*.after_optimizations.hlo.pb"))
    assert tool_data(capture, "overview_page", tmp_path / "xprof")
    assert memory_viewer(dump, tmp_path / "viewer")
    for args in (("analyze", capture.parent.parent.parent.parent), ("memory", dump.parent),
                 ("report", capture.parent, dump.parent, "-o", tmp_path / "page.html"),
                 ("diff", dump.parent, dump.parent)):
        assert run_cli(*map(str, args)).returncode == 0
    assert _snapshot(samples) == before


def test_a_buffer_assignment_line_with_a_huge_size_is_read_in_linear_time(tmp_path):
    """A 3-million-digit allocation size with no closing colon: the allocation pattern once tried every split of the
    digits (about 27 s for 1 million, quadratic); now the line is refused or read at once (fuzz, seed 1)."""
    text = "BufferAssignment:\nallocation 0: size 512, thread-local:\nallocation 1: size " + "1" * 3_000_000 + " x\n"
    path = tmp_path / "huge-buffer-assignment.txt"
    path.write_text(text)
    done = run_cli("memory", str(path), "--target", "v5e", timeout=60)
    assert "Traceback" not in done.stderr and done.returncode in (0, 2), done.stderr


# ------------------------------------------------------------------------------------------------
# Inputs a user really gives: a real file cut short, stdin closed


@pytest.mark.parametrize("keep", [100_000, 800_000, 866_000])
def test_a_real_hlo_text_cut_short_is_said_to_be_cut_short(tmp_path, keep):
    """A Llama train step's HLO text cut inside a fused computation, inside the entry at a half line, and just before
    the entry's closing brace: the file's end is the cause, not an alias, a layout or a hand edit (what the half
    module was blamed on before)."""
    from helpers import real_data

    whole = real_data.real_artefact(real_data.LLAMA3_8B_TRAIN_STEP_V6E_8_HLO, tmp_path / "real")
    cut = tmp_path / whole.name
    cut.write_bytes(whole.read_bytes()[:keep])
    done = run_cli("memory", str(cut), "--tpu", "v6e")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and done.stdout == "", done.stderr
    assert lines[0].startswith(f"tpuprof: {cut} ends inside computation ") and "cut short" in lines[0]
    assert run_cli("memory", str(whole), "--tpu", "v6e").returncode == 0


@pytest.mark.parametrize("args", [["oom"], ["oom", "-"], ["oom", "-", "--json"]])
def test_oom_with_stdin_closed_asks_for_the_log(args):
    """`tpuprof oom <&-` (a cron job or a service without stdin): Python's sys.stdin is None."""
    import os
    import subprocess

    done = subprocess.run([sys.executable, "-m", "tpuprof", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: os.close(0))
    assert done.stderr == "tpuprof: give the log file, or pipe the log into `tpuprof oom -`.\n", done.stderr
    assert done.returncode == 2
    assert (done.stdout != "") == ("--json" in args)
