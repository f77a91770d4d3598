"""Measurement primitives used inside a worker: the timing loop, memory, energy, sync.

The timing loop runs warm-up calls, then up to `runs` timed calls, each completed (device
synchronized) before its clock stops. A per-process time budget caps slow runners: after the
budget is spent the loop stops as soon as `min_runs` calls are timed, and the number of calls
actually timed is reported with the times, so a capped runner is visible, never hidden.

Invariant: every time in `Timing.times_ms` covers exactly one complete call; nothing else
(result conversion, loss readback, bookkeeping) runs between a clock's start and stop.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timing:
    times_ms: list[float] = field(default_factory=list)
    warmup: int = 0
    capped: bool = False  # the budget stopped the loop before `runs` calls
    energy_j: list[float] | None = None  # joules per timed call, when NVML can tell


def sync_for(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def time_calls(call: Callable[[], Any], *, sync: Callable[[], None], warmup: int, runs: int, budget_s: float,
               min_runs: int = 3, on_result: Callable[[Any], None] | None = None,
               energy: Callable[[], float | None] | None = None) -> Timing:
    """Warm up, then time up to `runs` calls (see the module docstring for the budget rule)."""
    timing = Timing()
    start = time.perf_counter()
    for _ in range(warmup):
        out = call()
        sync()
        if on_result is not None:
            on_result(out)
        timing.warmup += 1
        if time.perf_counter() - start > budget_s / 4:
            break
    start = time.perf_counter()
    e0 = energy() if energy is not None else None
    for i in range(runs):
        t0 = time.perf_counter()
        out = call()
        sync()
        t1 = time.perf_counter()
        timing.times_ms.append((t1 - t0) * 1e3)
        if on_result is not None:
            on_result(out)
        if t1 - start > budget_s and len(timing.times_ms) >= min_runs and i + 1 < runs:
            timing.capped = True
            break
    e1 = energy() if energy is not None else None
    if e0 is not None and e1 is not None and timing.times_ms:
        timing.energy_j = [(e1 - e0) / len(timing.times_ms)]
    return timing


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def nvml_energy_reader(device_index: int = 0) -> Callable[[], float | None] | None:
    """A function returning the GPU's total energy counter in joules, or None without NVML."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # no pynvml, no driver support, no permission: energy is simply not reported
        return None

    def read() -> float | None:
        try:
            return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ -> J
        except Exception:
            return None

    return read


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
