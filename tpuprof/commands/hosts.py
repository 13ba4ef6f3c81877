"""One analysis per host file: in this machine's processes, or as tasks on a Ray cluster.

Each task reads its host file where it lies (a local path the workers share, or gs://) and sends back only that
host's summary (analyses.steps.HostProfile: per-step figures and per-op totals, kilobytes), never the XSpace.
The results come back in file order whichever runs them, so the merged report is the same.
"""

from __future__ import annotations

import os

from tpuprof.analyses import steps as analysis
from tpuprof.commands.ray_tasks import map_on_ray, ray_address
from tpuprof.models.profile import HostProfile


def host_profiles(files: list[str], workers: int | None = None, ray: str | None = None) -> list[HostProfile]:
    address = ray_address(ray)
    if address:
        return map_on_ray(analysis.host_profile_of_file, files, address)
    if len(files) == 1:
        return [analysis.host_profile_of_file(files[0])]
    # One process per host file: parsing is CPU-bound Python and the hosts are independent.
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or min(len(files), os.cpu_count() or 1)
    if workers == 1:
        return [analysis.host_profile_of_file(f) for f in files]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(analysis.host_profile_of_file, files))
