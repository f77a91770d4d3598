"""CPU target description: what the analytical CPU configurator derives schedules from.

Invariant: a `CpuTarget` is frozen data read once per process from the machine (or given
explicitly in tests): thread count, SIMD width, cache sizes and ISA features. Its `key()` is
part of every CPU cache key, so code built for one machine (say with AVX-512) is never loaded
on another. Detection never runs timing experiments.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from .. import settings


@dataclass(frozen=True)
class CpuTarget:
    threads: int  # worker threads generated code may use (torch's intra-op count)
    simd: str  # "avx512" | "avx2" | "sse" | "scalar"
    vector_bytes: int  # 64 | 32 | 16 | 4
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    features: tuple[str, ...] = field(default=())  # fma, f16c, avx512bf16, amx_bf16, ...
    model: str = ""

    @property
    def vector_floats(self) -> int:
        return max(1, self.vector_bytes // 4)

    @property
    def has_bf16_dot(self) -> bool:
        return "avx512_bf16" in self.features or "amx_bf16" in self.features

    def key(self) -> str:
        feats = ",".join(sorted(self.features))
        return (f"cpu|{self.simd}|v{self.vector_bytes}|t{self.threads}|l1={self.l1d_bytes}|l2={self.l2_bytes}"
                f"|l3={self.l3_bytes}|{feats}|{self.model}")

    def describe(self) -> str:
        return (f"{self.model or 'cpu'}: {self.threads} threads, {self.simd} ({self.vector_floats} floats/vector), "
                f"L1d {self.l1d_bytes // 1024} KiB, L2 {self.l2_bytes // 1024} KiB, L3 {self.l3_bytes // 2**20} MiB")


_INTERESTING = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                "avx2", "fma", "f16c", "avx_vnni", "sse4_2")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cpu_flags() -> tuple[set[str], str]:
    text = _read("/proc/cpuinfo")
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
    return flags, model


def _size(text: str) -> int:
    text = text.strip().upper()
    if not text:
        return 0
    mult = 1
    if text.endswith("K"):
        mult, text = 1024, text[:-1]
    elif text.endswith("M"):
        mult, text = 2**20, text[:-1]
    try:
        return int(text) * mult
    except ValueError:
        return 0


def _cache_sizes() -> dict[int, int]:
    """{level: bytes} of cpu0's data/unified caches (per core for L1/L2)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    out: dict[int, int] = {}
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return out
    for e in entries:
        if not e.startswith("index"):
            continue
        kind = _read(f"{base}/{e}/type")
        if kind == "Instruction":
            continue
        lvl = _read(f"{base}/{e}/level")
        if lvl.isdigit():
            out[int(lvl)] = _size(_read(f"{base}/{e}/size"))
    return out


def _threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        import torch

        cores = min(cores, torch.get_num_threads())
    except ImportError:
        pass
    return max(1, cores)


def detect_cpu_target() -> CpuTarget:
    """The host CPU (cached per thread count: `torch.set_num_threads` gives a new target)."""
    return _detect(_threads(), settings.cpu_simd_override())


@functools.lru_cache(maxsize=8)
def _detect(threads: int, simd_override: str) -> CpuTarget:
    flags, model = _cpu_flags()
    if simd_override:
        simd = simd_override
    elif {"avx512f", "avx512bw", "avx512vl"} <= flags:
        simd = "avx512"
    elif "avx2" in flags and "fma" in flags:
        simd = "avx2"
    elif "sse4_2" in flags:
        simd = "sse"
    else:
        simd = "scalar"
    vbytes = {"avx512": 64, "avx2": 32, "sse": 16}.get(simd, 4)
    caches = _cache_sizes()
    return CpuTarget(
        threads=threads,
        simd=simd,
        vector_bytes=vbytes,
        l1d_bytes=caches.get(1, 32 * 1024),
        l2_bytes=caches.get(2, 1024 * 1024),
        l3_bytes=caches.get(3, 8 * 2**20),
        features=tuple(sorted(f for f in _INTERESTING if f in flags)),
        model=model,
    )
