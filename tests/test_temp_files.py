"""Nothing stays behind in the temp directory: every command that can write temporaries (the libtpu recompile of
`memory`, `preflight`, `report`, `capture`, `oom --dump`, `analyze`) runs as a user runs it, with TMPDIR pointing at
a fresh folder, and that folder must be empty afterwards. libtpu writes its own log files too, to /tmp/tpu_logs
whatever TMPDIR says (named after the process id): none may be left there by the command's process either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DUMPS, ROOT, SAMPLES

pytestmark = pytest.mark.subprocess  # each command in a process of its own, with a fresh TMPDIR

LIBTPU_LOGS = Path("/tmp/tpu_logs")  # libtpu's folder when TPU_LOG_DIR is not set


def run_in_fresh_tmpdir(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    temp = tmp_path / "tmpdir"
    temp.mkdir()
    merged = {**os.environ, "COLUMNS": "200", "TMPDIR": str(temp), **(env or {})}
    merged.pop("TPU_LOG_DIR", None)
    # Logs another process left under the pid this one gets (pids are reused) are not this command's.
    earlier = set(LIBTPU_LOGS.iterdir()) if LIBTPU_LOGS.is_dir() else set()
    process = subprocess.Popen([sys.executable, "-m", "tpuprof", *map(str, args)], cwd=ROOT, env=merged,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    left = sorted(str(p.relative_to(temp)) for p in temp.rglob("*"))
    assert left == [], f"`tpuprof {args[0]}` left {left} in TMPDIR"
    libtpu_logs = sorted(set(LIBTPU_LOGS.glob(f"*.{process.pid}")) - earlier) if LIBTPU_LOGS.is_dir() else []
    assert libtpu_logs == [], f"`tpuprof {args[0]}` left libtpu's logs {libtpu_logs}"
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.compile
def test_memory_recompile_of_a_cpu_module_leaves_nothing(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    module = tmp_path / "module_0001.jit_step.before_optimizations.hlo.pb"
    args = (jnp.ones((64, 128)), jnp.ones((128, 256)))
    module.write_bytes(jax.jit(lambda x, w: jnp.tanh(x @ w).sum()).lower(*args)
                       .compiler_ir("hlo").as_serialized_hlo_module_proto())
    done = run_in_fresh_tmpdir(tmp_path, "memory", module, "--target", "v5e")
    assert "recompiled with libtpu" in done.stdout  # the recompile ran: the path that wrote temporaries


@pytest.mark.compile
def test_preflight_leaves_nothing(tmp_path):
    pytest.importorskip("jax")
    run_in_fresh_tmpdir(tmp_path, "preflight", f"{SAMPLES / 'models' / 'int8_matmul.py'}:factory", "--tpu", "v5e",
                        "--batch", "8", env={"XDG_CACHE_HOME": str(tmp_path / "cache")})


def test_report_leaves_nothing(tmp_path):
    run_in_fresh_tmpdir(tmp_path, "report", DUMPS / "int8_matmul_v5e", "-o", tmp_path / "report.html")
    assert (tmp_path / "report.html").stat().st_size > 0


def test_analyze_and_oom_leave_nothing(tmp_path):
    for command, *args in (("analyze", SAMPLES / "captures" / "tf_slow_map"),
                           ("oom", SAMPLES / "oom" / "libtpu_keras_mlp_v5e.txt", "--dump", DUMPS / "keras_mlp_v5e")):
        (tmp_path / command).mkdir()
        run_in_fresh_tmpdir(tmp_path / command, command, *args)


def test_capture_leaves_nothing(profiler_job, tmp_path):
    job = profiler_job("jax_job.py", "--slow-loader-ms", "20")
    run_in_fresh_tmpdir(tmp_path, "capture", "--service-addr", job.address, "--logdir", tmp_path / "logs",
                        "--duration", "500ms")
    assert list((tmp_path / "logs").rglob("*.xplane.pb"))
