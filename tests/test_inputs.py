"""The input registry (tpuprof.sources.inputs): what each kind of input on disk is, and commands that are
given another command's input name the one that reads it."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from conftest import DUMPS, ROOT, SAMPLES, run_cli
from tpuprof.errors import UserError
from tpuprof.sources import inputs

CAPTURE = SAMPLES / "captures" / "tf_slow_map"
DUMP = DUMPS / "conv18_f32_v5e"
OOM = SAMPLES / "oom" / "libtpu_transformer_v5e.txt"


def _run_folder():
    return next((CAPTURE / "plugins" / "profile").iterdir())


@pytest.mark.parametrize("path, kind, family", [
    (DUMP, "dump_folder", "memory"),
    (DUMPS / "tf_hlo_cpu", "dump_folder", "memory"),
    (next(DUMP.glob("*.after_optimizations.hlo.pb")), "hlo_proto", "memory"),
    (next(DUMP.glob("*-buffer-assignment.txt")), "buffer_assignment", "memory"),
    (next(DUMP.glob("*.after_optimizations.txt")), "hlo_text", "memory"),
    (CAPTURE, "profile_logdir", "steps"),
    (SAMPLES / "captures", "profile_logdir", "steps"),  # a folder of logdirs: analyze names them
    ("RUN", "profile_run", "steps"),
    ("XPLANE", "xplane", "steps"),
    ("gs://bucket/logs", "remote_profile", "steps"),
    (OOM, "oom_log", "oom"),
    (ROOT / "pyproject.toml", "oom_log", "oom"),  # any other text is a log the OOM triage searches
])
def test_identify_samples(path, kind, family):
    if path == "RUN":
        path = _run_folder()
    elif path == "XPLANE":
        path = next(_run_folder().glob("*.xplane.pb"))
    source = inputs.identify(path)
    assert (source.kind.name, source.family) == (kind, family)


@pytest.mark.parametrize("command", ["analyze", "memory", "report", "diff"])
def test_a_picture_is_said_to_be_a_picture(command, tmp_path):
    """Binary that is no protobuf (no HloProto starts otherwise than with its field 1): what it is, and what
    tpuprof reads; never "not a readable HloProto"."""
    photo = ROOT / "tests" / "fixtures" / "memory" / "photo.jpg"
    args = {"report": [photo, "-o", tmp_path / "r.html"], "diff": [photo, DUMP]}.get(command, [photo])
    result = run_cli(command, *args)
    assert result.returncode == 2 and result.stderr.startswith(f"tpuprof: {photo} is a JPEG image, not an input of "
                                                                "tpuprof: it reads XLA dumps"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["analyze", "memory", "trace"])
def test_an_oom_log_given_to_another_command_points_at_oom(command, tmp_path):
    log = tmp_path / "oom.txt"
    shutil.copy(OOM, log)
    result = run_cli(command, log, *(["-o", tmp_path / "t.pftrace"] if command == "trace" else []))
    assert result.returncode == 2 and result.stderr.strip().endswith(f"`tpuprof oom {log}` explains it."), result.stderr


def test_analyze_of_other_text_says_what_it_reads(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("step 1 loss 2.3\n")
    result = run_cli("analyze", notes)
    assert result.returncode == 2 and f"{notes} is a text file, not a profile: analyze reads a logdir" in result.stderr


def test_identify_renamed_and_compressed_files(tmp_path):
    proto = tmp_path / "model.bin"  # an HloProto under another name: its bytes say
    shutil.copy(next(DUMP.glob("*.after_optimizations.hlo.pb")), proto)
    assert inputs.identify(proto).kind.name == "hlo_proto"
    text = tmp_path / "module.log"
    text.write_text(next(DUMP.glob("*.after_optimizations.txt")).read_text())
    assert inputs.identify(text).kind.name == "hlo_text"
    log = tmp_path / "train.log.gz"
    log.write_bytes(gzip.compress(OOM.read_bytes()))
    assert inputs.identify(log).kind.name == "oom_log"
    saved = tmp_path / "memory.json"
    saved.write_text(run_cli("memory", DUMP, "--json").stdout)
    assert inputs.identify(saved).kind.name == "document"
    assert inputs.read_document(saved)[0] == "memory"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert inputs.identify(empty).kind.name == "folder"


@pytest.mark.parametrize("command, artefact, what", [
    ("memory", "TPU_PALLAS_MATMUL_HLO_PROTO", "an XLA dump file"),
    ("memory", "QWEN3_8B_TRAIN_STEP_V6E_8_HLO", "an XLA dump file"),
    ("analyze", "TPU_PALLAS_MATMUL_V6E_1", "a profile"),
    ("report", "TPU_PALLAS_MATMUL_V6E_1", "a profile"),
])
def test_a_gzipped_dump_or_capture_is_said_to_be_compressed(command, artefact, what, tmp_path):
    """A dump file or a capture gzipped to be shared (as sample_profiles/estimate keeps its HLO texts) is named for
    what it is, with the way to read it; never "a text file" or "not a readable HloProto"."""
    import real_data

    original = real_data.real_artefact(getattr(real_data, artefact), tmp_path / "original")
    packed = tmp_path / (original.name + ".gz")
    packed.write_bytes(gzip.compress(original.read_bytes()))
    result = run_cli(command, packed, *(["-o", tmp_path / "r.html"] if command == "report" else []))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"tpuprof: {packed} is {what}, gzip-compressed: `gunzip"), result.stderr


def test_a_log_that_starts_with_an_empty_line_is_a_log(tmp_path):
    """Logs pasted or saved from a terminal often start with an empty line: the OOM log stays a log for report."""
    import real_data

    original = real_data.real_artefact(real_data.OOM_QWEN3_CUT_LIST, tmp_path)
    log = tmp_path / "pasted.log"
    log.write_bytes(b"\n" + original.read_bytes())
    assert inputs.identify(log).kind.name == "oom_log"
    result = run_cli("report", log, "-o", tmp_path / "r.html")
    assert result.returncode == 0 and (tmp_path / "r.html").exists(), result.stderr


def test_identify_missing_path():
    with pytest.raises(UserError, match="does not exist"):
        inputs.identify("/no/such/input")


@pytest.mark.parametrize("command, source", [
    ("memory", next(DUMP.glob("*.after_optimizations.hlo.pb"))),
    ("analyze", next(_run_folder().glob("*.xplane.pb"))),
    ("oom", OOM),
])
def test_pipe_input(tmp_path, command, source):
    """A pipe (`tpuprof memory <(gsutil cat ...)`) is told apart before its head is read: memory and analyze read an
    input more than once and say so in one sentence; the OOM triage reads a log once, from a pipe as from a file."""
    import os
    import threading

    pipe = tmp_path / "input"
    os.mkfifo(pipe)

    def feed():
        try:
            with open(pipe, "wb") as out:
                out.write(source.read_bytes())
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    result = run_cli(command, pipe)
    if command == "oom":
        assert result.returncode == 0 and "Ran out of memory" in result.stdout, result.stderr
    else:
        assert result.returncode == 2 and result.stdout == "", result.stdout[:300]
        assert result.stderr.strip().splitlines() == [
            f"tpuprof: {pipe} is a pipe or a device, not a file: save it to a file first (`tpuprof oom` alone reads "
            "a log from a pipe or stdin)."]
        open(pipe, "rb").close()  # the writer, still waiting for a reader, is let go
    writer.join(timeout=10)


def test_read_document_refuses_other_json(tmp_path):
    other = tmp_path / "package.json"
    other.write_text(json.dumps({"name": "x"}))
    with pytest.raises(UserError, match="not a tpuprof --json document"):
        inputs.read_document(other)


@pytest.mark.parametrize("command, path, names", [
    ("memory", CAPTURE, "`tpuprof analyze"),
    ("analyze", DUMP, "`tpuprof memory"),
    ("analyze", next(DUMP.glob("*.after_optimizations.hlo.pb")), "`tpuprof memory"),
])
def test_command_given_another_commands_input_names_it(command, path, names):
    result = run_cli(command, path)
    assert result.returncode == 2 and result.stdout == ""
    assert names in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_hloproto_copied_as_text_is_said_to_be(tmp_path):
    """What a text channel does to a binary file (every byte that is not UTF-8 becomes U+FFFD), done to a committed
    HloProto: memory names the cause and the remedy in one sentence, as analyze does for a capture."""
    proto = next((DUMPS / "diff_b64").glob("*.after_optimizations.hlo.pb")).read_bytes()
    mangled = tmp_path / "module.hlo.pb"
    mangled.write_bytes(proto.decode("utf-8", "replace").encode("utf-8"))
    done = run_cli("memory", mangled)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "not a readable HloProto: it holds" in done.stderr and "copied as text" in done.stderr
