"""`tpuprof analyze` on a synthetic pod (bench/pod_capture.py): whole-process time at 1 and 2 local workers, and
on a local Ray cluster of 2 CPUs, with the same JSON from each.

    .venv/bin/python bench/bench_pod.py [--hosts 16 64] [--runs 3] [--source PATH] [--no-ray]

SOURCE defaults to sample_profiles/captures/jax_compute (1.2 MB, 157 steps); pass a real capture (the v6e
tpu_inference_2.xplane.pb of tests/real_data.py) to time TPU hosts. Times are whole processes (`python -m
tpuprof analyze POD --json`, interpreter start-up included), the median of --runs after one warm-up; peak RSS
is the largest of the command's processes (driver or worker, from getrusage of the children). The Ray cluster
is started once by this script (loopback, 2 CPUs, no dashboard) and stopped at the end: its start-up is not
in the figures, each run's connection to it is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from pod_capture import build  # noqa: E402  (bench/ is on sys.path when run as a script)


def _run(pod: str, args: list[str], env: dict) -> tuple[float, dict, float]:
    """(seconds, JSON document, peak RSS MB of the largest child so far) of one whole `tpuprof analyze`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tpuprof", "analyze", pod, "--json", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, json.loads(done.stdout), peak


def _median(pod: str, args: list[str], env: dict, runs: int) -> tuple[float, dict, float]:
    _run(pod, args, env)  # warm-up: page cache
    results = [_run(pod, args, env) for _ in range(runs)]
    times = sorted(r[0] for r in results)
    return times[len(times) // 2], results[0][1], max(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", type=Path, default=ROOT / "sample_profiles" / "captures" / "jax_compute")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "TPUPROF_RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    ray_address = None
    if not args.no_ray:
        # Loopback only: Ray's single-machine mode (read when ray is imported; the drivers inherit it).
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        ray_address = ray.get_runtime_context().gcs_address
        env = dict(os.environ, **{k: v for k, v in env.items() if k == "PYTHONPATH"})  # ray.init's auth settings
        env.pop("TPUPROF_RAY_ADDRESS", None)
    try:
        print(f"source {args.source} ({os.cpu_count()} cores)")
        print("| hosts | pod MB | 1 worker s | 2 workers s | Ray (2 CPUs) s | peak RSS MB | same JSON |")
        print("|---:|---:|---:|---:|---:|---:|:---|")
        for hosts in args.hosts:
            with tempfile.TemporaryDirectory(prefix="tpuprof-pod-") as folder:
                pod = build(args.source, Path(folder), hosts=hosts)
                size = sum(Path(f).stat().st_size for f in pod.files) / 1e6
                one, doc1, peak = _median(pod.folder, ["--workers", "1"], env, args.runs)
                two, doc2, peak2 = _median(pod.folder, ["--workers", "2"], env, args.runs)
                ray_s, same = "", doc1 == doc2
                if ray_address:
                    seconds, doc3, _ = _median(pod.folder, ["--ray", ray_address], env, args.runs)
                    ray_s, same = f"{seconds:.2f}", same and doc1 == doc3
                print(f"| {hosts} | {size:.0f} | {one:.2f} | {two:.2f} | {ray_s} | {max(peak, peak2):.0f} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    finally:
        if ray_address:
            ray.shutdown()


if __name__ == "__main__":
    main()
