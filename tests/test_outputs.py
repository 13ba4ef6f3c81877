"""Where the output goes: `report -o` and `trace -o` write a symlink's target (the link stays), refuse what is not a
regular file (a FIFO, a device, a folder) and an existing file without --force, in one sentence; an output that
cannot be written (no such folder, a read-only file system, a full disk, stdout on /dev/full) is one sentence and
exit 2, never an internal error or a partial file. With --json an error is also a JSON document on stdout."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from jsonschema import Draft202012Validator

from conftest import DUMPS, ROOT, SAMPLES, run_cli
from tpuprof import schemas

DUMP = DUMPS / "int8_matmul_v5e"  # the smallest sample: its page is 4.8 MB
CAPTURE = SAMPLES / "captures" / "jax_compute"


def one_sentence(result, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpuprof: ") and "internal error" not in lines[0], result.stderr
    return lines[0]


def nothing_left_beside(path) -> None:
    assert not list(path.parent.glob(f".{path.name}.*")), "a temporary file was left"


@pytest.mark.parametrize("command", ["report", "trace"])
def test_a_symlink_is_written_through_to_its_target(tmp_path, command):
    target, link = tmp_path / "real" / "out.bin", tmp_path / "link.bin"
    target.parent.mkdir()
    target.write_bytes(b"before")
    link.symlink_to(target)
    source = DUMP if command == "report" else CAPTURE
    refused = run_cli(command, source, "-o", link)
    assert "exists: give another -o, or --force" in one_sentence(refused) and target.read_bytes() == b"before"
    assert run_cli(command, source, "-o", link, "--force").returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.stat().st_size > 1000 and target.read_bytes() != b"before"
    nothing_left_beside(target)


def device_like_dev_full(folder):
    """A character device (/dev/full's numbers) in FOLDER: code that replaces its output would replace this one,
    not the machine's /dev/full."""
    path = folder / "full"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


@pytest.mark.parametrize("command", ["report", "trace"])
def test_what_is_not_a_regular_file_is_refused(tmp_path, command):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    device = device_like_dev_full(tmp_path)
    source = DUMP if command == "report" else CAPTURE
    for path, what in ((fifo, "is a named pipe (FIFO), not a file"), (device, "is a device, not a file"),
                       (tmp_path, "is a folder")):
        for force in ((), ("--force",)):
            assert what in one_sentence(run_cli(command, source, "-o", path, *force))
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISCHR(device.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "pipe"]


def test_report_keeps_an_existing_file_without_force(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("mine")
    result = run_cli("report", DUMP, "-o", page)
    assert one_sentence(result) == f"tpuprof: {page} exists: give another -o, or --force to replace it."
    assert page.read_text() == "mine"


@pytest.mark.parametrize("path", ["/proc/nope/x.html", "/sys/x.html"])
def test_an_output_that_cannot_be_written_is_one_sentence(path):
    assert f"cannot write {path}" in one_sentence(run_cli("report", DUMP, "-o", path))


# A disk that fills after 100 kB: the file-size limit, set in the process that then becomes tpuprof (Python
# ignores SIGXFSZ, so a write past it fails with EFBIG as on a full disk).
LIMITED = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)); "
           "os.execv(sys.executable, [sys.executable, '-m', 'tpuprof', *sys.argv[1:]])")


def test_a_full_disk_is_one_sentence_and_leaves_no_partial_file(tmp_path):
    page = tmp_path / "page.html"
    result = subprocess.run([sys.executable, "-c", LIMITED, "report", str(DUMP), "-o", str(page)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert "cannot write" in one_sentence(result) and "File too large" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [("--json",), ()])
def test_stdout_on_a_full_device_is_one_sentence(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "tpuprof", "memory", str(DUMP), *args], cwd=ROOT,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    result.stdout = ""
    assert one_sentence(result) == "tpuprof: cannot write the output: No space left on device."


def error_document(result) -> dict:
    document = json.loads(result.stdout)
    Draft202012Validator(schemas.schema("error")).validate(document)
    assert document["schema"] == "tpuprof.error/1"
    return document["error"]


@pytest.mark.parametrize("args, kind, message", [
    (["memory", "nope", "--json"], "input", "nope does not exist."),
    (["oom", "--format", "json", str(DUMP / "sample.json")], "input", "no TPU out-of-memory error found"),
    (["report", str(DUMP), "-o", str(ROOT), "--json"], "input", f"{ROOT} is a folder"),
    (["memory", str(DUMP), "--top", "x", "--json"], "usage", "Invalid value for '--top'"),
    (["analyze", "--tpo", "3", "x", "--json"], "usage", "No such option: --tpo"),
])
def test_with_json_an_error_is_also_a_document_on_stdout(args, kind, message):
    result = run_cli(*args)
    assert result.returncode == 2 and message in result.stderr
    error = error_document(result)
    assert error["kind"] == kind and message in error["message"] and error["message"] in result.stderr


def test_without_json_stdout_stays_empty_on_an_error():
    result = run_cli("memory", "nope")
    assert result.returncode == 2 and result.stdout == ""


@pytest.mark.parametrize("args", [("memory", str(DUMP)), ("memory", str(DUMP), "--json")])
def test_stdout_closed_is_one_sentence(args):
    """`tpuprof memory DUMP >&-`: sys.stdout is None; the flush after the command was a traceback, exit 1."""
    result = subprocess.run([sys.executable, "-m", "tpuprof", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            timeout=300, preexec_fn=lambda: os.close(1))
    result.stdout = ""
    assert one_sentence(result) == "tpuprof: cannot write the output: stdout is closed."
