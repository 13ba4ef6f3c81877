"""Shared by the benchmarks: the median wall time of a call, after one warm-up run."""

from __future__ import annotations

import statistics
import time


def median_time(fn, runs: int) -> float:
    fn()  # warm-up: imports, page cache
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
