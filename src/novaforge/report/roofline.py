"""Where the time went: a per-call profile that adds up, and each kernel's roofline efficiency.

Used by `novaforge.explain(..., profile=True)`, `novaforge demo` and `novaforge report`. The
program is built with the backend's `profile=True` option and `profile_program` runs it a few
times, timing, over the *same* calls:

* wall: each `compiled(...)` call, from Python, outside everything;
* kernels: every generated launch, timed inside the generated glue (`omp_get_wtime` around
  the call), plus every library or torch step (a GEMM through torch, SDPA, a fallback), timed
  in Python around the step; each time is attributed to its kernel by the kernel's ordinal
  (never by name: consecutive kernels often share a name);
* runtime overhead, measured: glue (a segment's ctypes call minus its launches) and program
  (`run()` minus its steps: binding inputs, allocating outputs);
* unaccounted = wall - kernels - overhead: the Python wrapper around `run()` (argument
  flattening, the guard lookup) plus timer noise. It is small (tens of microseconds), so
  "kernels + overhead = wall" holds within a few percent on real models; the text and the
  HTML report state all four numbers.

Roofline efficiency of a kernel = max(FLOPs / peak FLOP/s, bytes / bandwidth) / measured
time, with the machine's measured peaks (`peaks.py`) and the kernel's touched bytes
(`metrics.touched_bytes`). Against the DRAM bandwidth a kernel whose data fits in the last-
level cache can exceed 100%: such a kernel is marked cache-resident and measured against the
measured cache bandwidth instead. A figure still above 100% is shown with a "!" (the timer's
resolution on a microsecond kernel), never silently.

Invariant: nothing here changes what is compiled or how it runs, except that profiling
programs time their launches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .metrics import kernel_rows
from .peaks import Peaks, machine_peaks


@dataclass
class KernelTime:
    key: str
    name: str
    kind: str
    launches: int
    seconds: float  # per call, all launches of this kernel
    flops: float  # per call
    bytes: float  # per call (touched bytes)
    efficiency: float = 0.0  # roofline efficiency (see the module docstring)
    bound: str = ""  # "compute" or "memory": which roof applies
    cache_resident: bool = False  # measured against the cache bandwidth
    ordinals: list[int] = field(default_factory=list)  # the kernel nodes (graph order) of this kernel

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass
class Profile:
    """Per-call times over `calls` calls (seconds); see the module docstring."""

    rows: list[KernelTime]
    per_kernel: list[float]  # seconds per call of each kernel node, in graph order
    calls: int
    wall_s: float
    kernels_s: float
    glue_s: float
    program_s: float
    peaks: Peaks

    @property
    def overhead_s(self) -> float:
        return self.glue_s + self.program_s

    @property
    def accounted_s(self) -> float:
        return self.kernels_s + self.overhead_s

    @property
    def unaccounted_s(self) -> float:
        return self.wall_s - self.accounted_s

    def summary(self) -> str:
        w = self.wall_s * 1e3
        return (f"kernels {self.kernels_s * 1e3:.2f} ms + runtime overhead {self.overhead_s * 1e3:.2f} ms "
                f"(glue {self.glue_s * 1e3:.2f}, program {self.program_s * 1e3:.2f}) = {self.accounted_s * 1e3:.2f} ms "
                f"per call; wall {w:.2f} ms over the same {self.calls} calls (unaccounted "
                f"{self.unaccounted_s * 1e3:.2f} ms = {100 * self.unaccounted_s / max(self.wall_s, 1e-12):.1f}%: "
                "the Python wrapper around the program)")


def roofline(flops: float, nbytes: float, seconds: float, peaks: Peaks) -> tuple[float, str, bool]:
    """(efficiency, bound, cache_resident) of a kernel that moved `nbytes` and did `flops` in `seconds`."""
    if seconds <= 0:
        return 0.0, "", False
    t_f = flops / peaks.flops
    t_b = nbytes / peaks.dram_bw
    eff = max(t_f, t_b) / seconds
    cache = False
    if eff > 1.0 and nbytes <= peaks.cache_bytes:
        cache = True
        t_b = nbytes / peaks.cache_bw
        eff = max(t_f, t_b) / seconds
    return eff, "compute" if t_f >= t_b else "memory", cache


def profile_program(compiled: Any, args: tuple, kwargs: dict | None = None, runs: int = 5,
                    peaks: Peaks | None = None) -> Profile | None:
    """Run a compiled callable built with profile=True `runs` times; None when its program does
    not time its launches (another backend, or profile=False)."""
    kwargs = kwargs or {}
    stats = compiled.stats()
    program = stats.program if stats is not None else None
    timings = getattr(program, "timings", None)
    if timings is None or timings() is None:
        return None
    with torch.no_grad():
        compiled(*args, **kwargs)  # warm
        before = timings()
        wall = 0.0
        for _ in range(runs):
            t0 = time.perf_counter()
            compiled(*args, **kwargs)
            wall += time.perf_counter() - t0
        d = timings().minus(before)
    n = max(d.calls, 1)
    rows = kernel_rows(stats.graph)
    per_kernel = [0.0] * len(rows)
    launch_s = 0.0
    for ordinal, _label, s in d.launches:
        launch_s += s
        if 0 <= ordinal < len(per_kernel):
            per_kernel[ordinal] += s
    seg_s = steps_s = 0.0
    for kind, ordinal, s in d.steps:
        steps_s += s
        if kind == "seg":
            seg_s += s
        elif 0 <= ordinal < len(per_kernel):
            per_kernel[ordinal] += s
    per_kernel = [s / n for s in per_kernel]
    peaks = peaks or machine_peaks()
    groups: dict[str, KernelTime] = {}
    for i, r in enumerate(rows):
        key = r["node"].attrs["kernel"].structural_key
        kt = groups.get(key)
        if kt is None:
            kt = groups[key] = KernelTime(key, r["name"], r["kind"], 0, 0.0, 0.0, 0.0)
        kt.launches += 1
        kt.seconds += per_kernel[i]
        kt.flops += r["flops"]
        kt.bytes += r["bytes"]
        kt.ordinals.append(i)
    for kt in groups.values():
        kt.efficiency, kt.bound, kt.cache_resident = roofline(kt.flops / kt.launches, kt.bytes / kt.launches,
                                                              kt.seconds / kt.launches, peaks)
    return Profile(sorted(groups.values(), key=lambda k: -k.seconds), per_kernel, d.calls, wall / runs,
                   sum(per_kernel), max(seg_s - launch_s, 0.0) / n, max(d.run_s - steps_s, 0.0) / n, peaks)


def efficiency_text(kt: KernelTime) -> str:
    if kt.seconds <= 0:
        return "-"
    mark = "c" if kt.cache_resident else ""
    if kt.efficiency > 1.0:
        mark += "!"
    return f"{100 * kt.efficiency:.0f}%{mark}"


def format_profile(prof: Profile | None, limit: int = 40) -> str:
    if prof is None:
        return "(no per-kernel profile: this backend does not time its launches)"
    total = max(prof.kernels_s, 1e-12)
    lines = [prof.summary(),
             f"peaks (measured): {prof.peaks.describe()}; roofline c = cache-resident (against the cache "
             "bandwidth), ! = above the roof (timer resolution)",
             f"{'kernel':<24}{'kind':<11}{'x':>4}{'ms/call':>9}{'share':>7}{'GFLOP/s':>9}{'GB/s':>8}{'roofline':>10}"]
    for r in prof.rows[:limit]:
        lines.append(f"{r.name[:23]:<24}{r.kind:<11}{r.launches:>4}{r.seconds * 1e3:>9.3f}"
                     f"{100 * r.seconds / total:>6.1f}%{r.gflops:>9.1f}{r.gbs:>8.1f}{efficiency_text(r):>10}")
    if len(prof.rows) > limit:
        lines.append(f"... {len(prof.rows) - limit} more kernels")
    return "\n".join(lines)
