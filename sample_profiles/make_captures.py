"""Regenerate the small real captures in sample_profiles/captures/ from the jobs in sample_profiles/jobs/.

Each capture runs one job with a built-in bottleneck (the ground truth lives in the job), waits for its
READY line and a warm-up, traces its profiler server on loopback for a short window, and keeps the run
as a logdir: captures/<name>/plugins/profile/<run>/<host>.xplane.pb. Windows are short so every file
stays well under 2 MB.

Usage: python sample_profiles/make_captures.py [NAME ...]     (default: all of them, one at a time)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tpuprof.sources.capture import TraceOptions  # noqa: E402
from tpuprof.sources.capture import capture as capture_run  # noqa: E402

JOBS = HERE / "jobs"
OUT = HERE / "captures"

# name: ([(job script, job arguments), ...], warm-up seconds after READY, trace window in ms).
# Several jobs make a multi-host run: one client call traces them all, one <host>.xplane.pb each.
CAPTURES = {
    # Python map sleeping 2 ms per example, sequential, no prefetch: input-bound.
    "tf_slow_map": ([("tf_keras_job.py", ["--slow-map-ms", "2"])], 2.0, 1500),
    # Cached + prefetched data: after the first epoch the step is the model's: compute-bound.
    "tf_cached": ([("tf_keras_job.py", ["--cache"])], 6.0, 500),
    # A model of a few hundred FLOPs, one step per call: the host's per-call overhead dominates.
    "tf_tiny_spe1": ([("tf_keras_job.py", ["--tiny", "--steps-per-execution", "1"])], 2.0, 300),
    # The same with 64 steps per call: the overhead is amortised.
    "tf_tiny_spe64": ([("tf_keras_job.py", ["--tiny", "--steps-per-execution", "64"])], 2.0, 200),
    # A Python loader sleeping 20 ms per batch inside each step: input-bound, nothing traced while it sleeps.
    "jax_slow_loader": ([("jax_job.py", ["--slow-loader-ms", "20"])], 1.0, 1000),
    # A free loader: the jitted MLP step fills the step: compute-bound.
    "jax_compute": ([("jax_job.py", [])], 1.0, 700),
    # A new batch size every step, so a new compilation every step: compile-bound.
    "jax_recompile": ([("jax_job.py", ["--new-shape-every-step"])], 3.0, 5000),
    # Two "hosts" (two JAX jobs traced in one call), one with a loader twice as slow: a straggler.
    "jax_two_hosts_straggler": ([("jax_job.py", ["--slow-loader-ms", "10"]),
                                 ("jax_job.py", ["--slow-loader-ms", "20"])], 1.0, 1000),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(script: str, args: list[str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    job = subprocess.Popen([sys.executable, str(JOBS / script), "--port", str(port), "--seconds", "120", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    for line in job.stdout:
        if "READY" in line:
            return job, port
        if time.monotonic() > deadline:
            break
    job.kill()
    raise RuntimeError(f"{script} {' '.join(args)} did not print READY (exit code {job.wait()})")


def capture(name: str) -> Path:
    jobs, warmup, duration_ms = CAPTURES[name]
    running = []
    try:
        for script, args in jobs:
            running.append(start(script, args))
        time.sleep(warmup)
        target = OUT / name
        shutil.rmtree(target / "plugins", ignore_errors=True)  # the old run (a job may live beside it)
        # tpuprof's own capture (the profiler client, run folder published whole).
        addresses = [f"localhost:{port}" for _, port in running]
        result = capture_run(addresses, str(target), TraceOptions(duration_ms=duration_ms))
        return Path(result.run_dir)
    finally:
        for job, _ in running:
            job.kill()
            job.wait()


def main(names: list[str]) -> int:
    for name in names or list(CAPTURES):
        dest = capture(name)
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.2f} MB" for p in dest.glob("*.xplane.pb"))
        print(f"{name}: {dest.relative_to(HERE)} ({sizes})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
