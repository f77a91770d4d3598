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
import re
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
    energy_j: list[float] | None = None  # joules per timed call, where a counter exists (RAPL, NVML)


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


POWERCAP = "/sys/class/powercap"


def rapl_domains(root: str | None = None) -> list[tuple[str, float]]:
    """The package-level RAPL counters under `root` (`intel-rapl:N`, also on AMD): (folder, wrap in J).
    Sub-domains (`intel-rapl:N:M`: cores, dram) are parts of a package and are not added again."""
    out: list[tuple[str, float]] = []
    root = POWERCAP if root is None else root
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        if not re.fullmatch(r"intel-rapl:\d+", name):
            continue
        folder = os.path.join(root, name)
        try:
            with open(os.path.join(folder, "energy_uj")) as f:
                int(f.read())
            with open(os.path.join(folder, "max_energy_range_uj")) as f:
                wrap = int(f.read()) / 1e6
        except (OSError, ValueError):  # unreadable (permissions): this counter does not count
            continue
        out.append((folder, wrap))
    return out


def rapl_energy_reader(root: str | None = None) -> Callable[[], float | None] | None:
    """A function returning the CPU packages' energy in joules since its creation (RAPL), or None
    where the machine exposes no readable counter. The counters wrap at `max_energy_range_uj`;
    each read unwraps against the previous one, so reads must come at least once per wrap
    period (minutes at full power), which a timing loop's start and end reads do."""
    domains = rapl_domains(root)
    if not domains:
        return None

    def raw() -> list[float] | None:
        try:
            vals = []
            for folder, _ in domains:
                with open(os.path.join(folder, "energy_uj")) as f:
                    vals.append(int(f.read()) / 1e6)
            return vals
        except (OSError, ValueError):
            return None

    first = raw()
    if first is None:
        return None
    state = {"last": first, "total": 0.0}

    def read() -> float | None:
        now = raw()
        if now is None:
            return None
        for (_, wrap), a, b in zip(domains, state["last"], now, strict=True):
            state["total"] += b - a if b >= a else b + wrap - a
        state["last"] = now
        return state["total"]

    return read


def energy_counter(device: str) -> tuple[Callable[[], float | None] | None, str]:
    """The energy counter for `device` and what it is, or (None, why there is none). Nothing is
    estimated where no counter exists."""
    if device.startswith("cuda"):
        reader = nvml_energy_reader(0)
        what = "NVML total energy (GPU 0)" if reader else "none: NVML is not available (no pynvml or driver support)"
        return reader, what
    reader = rapl_energy_reader()
    if reader is not None:
        return reader, f"RAPL package energy ({len(rapl_domains())} package(s), {POWERCAP})"
    why = "not readable" if os.path.isdir(POWERCAP) else "absent"
    return None, f"none: no RAPL counter ({POWERCAP} {why} on this machine); energy is not estimated"


def decode_weight_bytes(model: Any) -> int:
    """Bytes one decode step reads: every parameter and buffer once (tied ones once, a torchao
    weight as its int8 data and scales), except embedding tables that no other module uses (a
    step reads one row of them)."""
    import torch

    from ..frontend.subclass_state import flatten_state

    embed = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Embedding)
              for p in m.parameters(recurse=False)}
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    skip = {n for n, t in state.items() if id(t) in embed and id(t) not in shared}
    seen, total = set(), 0
    for t in flatten_state({n: t for n, t in state.items() if n not in skip}).values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
