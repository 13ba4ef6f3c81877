"""A preflight compile stopped by Ctrl-C (SIGINT) or a job scheduler's time limit (SIGTERM) leaves no staging
folder in the compile cache: the real CLI process gets the real signal while libtpu compiles. Staging folders that
dead processes left behind are removed by the next compile; a running process's are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES

pytest.importorskip("jax")
MODEL = f"{SAMPLES / 'models' / 'int8_matmul.py'}:factory"


def staging_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".") and p.is_dir()) if root.is_dir() else []


_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.argv[0] = 'tpuprof'; runpy.run_module('tpuprof', run_name='__main__', alter_sys=True)")


def stopped_mid_compile(cache: Path, sig: int) -> subprocess.CompletedProcess:
    """`tpuprof preflight` sent SIG as soon as its compile's staging folder appears (libtpu is compiling)."""
    root = cache / "tpuprof" / "preflight"
    before = set(staging_folders(root))
    # Ctrl-C's handler as in a terminal: a process started in the background (nohup, `&`, some CI runners) inherits
    # SIGINT ignored, and Python then installs none.
    process = subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, "preflight", MODEL, "--tpu", "v5e", "--batch", "8"],
                               cwd=ROOT, env={**os.environ, "XDG_CACHE_HOME": str(cache)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not set(staging_folders(root)) - before:
        assert process.poll() is None and time.monotonic() < deadline, "the compile never started"
        time.sleep(0.005)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def dead_process_id() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_sigterm_mid_compile_leaves_no_staging_folder(tmp_path):
    done = stopped_mid_compile(tmp_path, signal.SIGTERM)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert staging_folders(tmp_path / "tpuprof" / "preflight") == []


def test_ctrl_c_mid_compile_leaves_no_staging_folder_and_stale_ones_go(tmp_path):
    root = tmp_path / "tpuprof" / "preflight"
    root.mkdir(parents=True)
    dead = root / f".0123abcd.staging-{dead_process_id()}.x1y2z3"  # a compile killed with SIGKILL
    alive = root / f".4567ef01.staging-{os.getpid()}.a1b2c3"  # a compile running now (this process)
    unowned_old = root / ".89ab2345.k9k9k9k9"  # written before staging folders named their process
    for folder in (dead, alive, unowned_old):
        (folder / "dump").mkdir(parents=True)
        (folder / "dump" / "module.hlo.pb").write_bytes(b"x" * 1000)
    two_days_ago = time.time() - 2 * 86400
    os.utime(unowned_old, (two_days_ago, two_days_ago))
    done = stopped_mid_compile(tmp_path, signal.SIGINT)
    assert done.returncode == 130 and done.stderr.strip().endswith("tpuprof: interrupted."), done.stderr
    assert staging_folders(root) == [alive.name]
