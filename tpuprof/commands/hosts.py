"""One analysis per host file: in this machine's processes, or as tasks on a Ray cluster.

Each task reads its host file where it lies (a local path the workers share, or gs://) and sends back only that
host's summary (analyses.steps.HostProfile: per-step figures and per-op totals, kilobytes), never the XSpace.
The results come back in file order whichever runs them, so the merged report is the same.
"""

from __future__ import annotations

import os

from tpuprof.analyses import steps as analysis
from tpuprof.errors import UserError
from tpuprof.models.profile import HostProfile

RAY_ADDRESS_ENV = "TPUPROF_RAY_ADDRESS"


def ray_address(option: str | None) -> str | None:
    """--ray, else $TPUPROF_RAY_ADDRESS, else None (local processes)."""
    return option or os.environ.get(RAY_ADDRESS_ENV) or None


def analyze_hosts(files: list[str], workers: int | None = None, ray: str | None = None) -> list[HostProfile]:
    address = ray_address(ray)
    if address:
        return _on_ray(files, address)
    if len(files) == 1:
        return [analysis.analyze_file(files[0])]
    # One process per host file: parsing is CPU-bound Python and the hosts are independent.
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or min(len(files), os.cpu_count() or 1)
    if workers == 1:
        return [analysis.analyze_file(f) for f in files]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(analysis.analyze_file, files))


def _on_ray(files: list[str], address: str) -> list[HostProfile]:
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray installed here and on the cluster: pip install 'tpuprof[ray]'.") from None
    import logging

    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as error:
            # Ray's own sentence, and the reason under it (an authentication token missing, nothing listening).
            why = [str(e).strip().splitlines()[0][:200] for e in (error, error.__cause__) if e and str(e).strip()]
            raise UserError(f"cannot reach the Ray cluster at {address}: {'; '.join(why).rstrip('.')}.") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(analysis.analyze_file)
        refs = [task.remote(f) for f in files]
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            raise UserError(f"a Ray task failed: {str(cause or error).splitlines()[0][:300]}.") from None
    finally:
        if connected_here:
            ray.shutdown()
