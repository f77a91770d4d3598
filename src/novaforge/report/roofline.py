"""Where the time went: per-kernel measured time and roofline efficiency.

Used by `novaforge.explain(..., profile=True)` and `novaforge demo --profile`. The program
is built with the backend's `profile=True` option (each launch timed inside the generated
code), run a few times, and every distinct kernel gets: time per call, achieved GFLOP/s and
GB/s, and its roofline efficiency = max(FLOPs / peak FLOP/s, bytes / peak bandwidth) / measured
time, i.e. how close the kernel runs to what the machine allows for its arithmetic intensity.
Peaks: FLOP/s from the target (threads x clock x SIMD lanes x 2 FMA pipes x 2), bandwidth
measured once per process with a large copy (reporting only, never during compilation).

Invariant: nothing here changes what is compiled or how it runs, except that profiling
programs time their launches.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import torch

from .metrics import kernel_rows


@dataclass
class KernelTime:
    key: str
    name: str
    kind: str
    launches: int
    seconds: float  # per call, all launches of this kernel
    flops: float  # per call
    bytes: float  # per call
    efficiency: float  # roofline efficiency, 0..1


def cpu_clock_ghz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        return max(mhz) / 1000 if mhz else 2.5
    except OSError:
        return 2.5


@functools.cache
def memory_bandwidth_gbs() -> float:
    """Streaming copy bandwidth (read + write), GB/s, measured once."""
    src = torch.empty(32 * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def peak_flops(target: Any) -> float:
    lanes = getattr(target, "vector_floats", 8)
    threads = getattr(target, "threads", torch.get_num_threads())
    return threads * cpu_clock_ghz() * 1e9 * lanes * 2 * 2


def profile_kernels(compiled: Any, args: tuple, kwargs: dict, runs: int = 5) -> list[KernelTime]:
    """Run a program built with profile=True and attribute launch times to kernels."""
    stats = compiled.stats()
    program = stats.program
    if program is None or not hasattr(program, "profile"):
        return []
    before = dict(_by_launch(program.profile()))
    with torch.no_grad():
        for _ in range(runs):
            compiled(*args, **kwargs)
    after = program.profile()
    if not after:
        return []
    per_launch = [(lab, (s - before.get(i, 0.0)) / runs) for i, (lab, s) in enumerate(after)]
    rows = kernel_rows(stats.graph)
    # launches follow the kernel order; a kernel may have a second "(epilogue)" launch
    times: dict[str, KernelTime] = {}
    li = 0
    peak_f, peak_b = peaks(stats)
    for r in rows:
        t = 0.0
        while li < len(per_launch) and per_launch[li][0] in (r["name"], r["name"] + " (epilogue)"):
            t += per_launch[li][1]
            li += 1
        key = r["node"].attrs["kernel"].structural_key
        kt = times.get(key)
        if kt is None:
            kt = times[key] = KernelTime(key, r["name"], r["kind"], 0, 0.0, 0.0, 0.0, 0.0)
        kt.launches += 1
        kt.seconds += t
        kt.flops += r["flops"]
        kt.bytes += r["bytes"]
    for kt in times.values():
        bound = max(kt.flops / peak_f, kt.bytes / peak_b)
        kt.efficiency = bound / kt.seconds if kt.seconds > 0 else 0.0
    return sorted(times.values(), key=lambda k: -k.seconds)


def peaks(stats: Any) -> tuple[float, float]:
    """(peak FLOP/s, peak bytes/s) of the machine the program runs on."""
    return peak_flops(_target(stats)), memory_bandwidth_gbs() * 1e9


def _by_launch(prof: list[tuple[str, float]]) -> list[tuple[int, float]]:
    return [(i, s) for i, (_, s) in enumerate(prof)]


def _target(stats: Any) -> Any:
    from ..codegen.registry import get_backend

    try:
        return get_backend(stats.backend).target()
    except Exception:
        return None


def format_profile(rows: list[KernelTime], peak: tuple[float, float], wall_ms: float | None = None) -> str:
    if not rows:
        return "(no per-kernel profile: this backend does not time its launches)"
    total = sum(r.seconds for r in rows)
    lines = [f"{'kernel':<24}{'kind':<11}{'x':>4}{'ms/call':>9}{'share':>7}{'GFLOP/s':>9}{'GB/s':>8}{'roofline':>9}"]
    for r in rows:
        gfs = r.flops / r.seconds / 1e9 if r.seconds else 0.0
        gbs = r.bytes / r.seconds / 1e9 if r.seconds else 0.0
        lines.append(f"{r.name[:23]:<24}{r.kind:<11}{r.launches:>4}{r.seconds * 1e3:>9.2f}"
                     f"{100 * r.seconds / max(total, 1e-12):>6.1f}%{gfs:>9.1f}{gbs:>8.1f}{100 * r.efficiency:>8.0f}%")
    head = f"kernels {total * 1e3:.2f} ms per call"
    if wall_ms is not None:
        head += f" of {wall_ms:.2f} ms wall (the rest: runtime overhead)"
    lines.insert(0, head + f"; peaks: {peak[0] / 1e9:.0f} GFLOP/s (nominal clock), {peak[1] / 1e9:.1f} GB/s (copy)")
    return "\n".join(lines)
