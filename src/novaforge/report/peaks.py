"""The machine's measured peaks, the roofs of every roofline in the reports.

* FLOP/s: a generated FMA loop (12 independent vector accumulators per thread, enough to
  cover two FMA pipes of latency 4-5), compiled with the CPU backend's own flags for the
  target's SIMD width, run on the target's thread count and on one thread (x threads); the
  best of a few short trials.
* DRAM bandwidth: a streaming copy (read + write) of buffers 2x the last-level cache.
* Cache bandwidth: the same copy of a buffer of a quarter of L2 repeated in place; the roof
  for kernels whose data is cache-resident (their bytes fit in L3), which can legitimately run
  above the DRAM roof.

Measured once per process and thread count (about 0.1 s; the probe library is cached like any
other generated library), for reporting only: nothing here runs during a compile.

Invariant: every number is measured on this machine, never derived from a nominal clock; if
the probe cannot be built the FLOP roof falls back to the nominal estimate and says so.
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

UNROLL = 12
PROBE_SRC = """#include <omp.h>
typedef float nf_vf __attribute__((vector_size(NF_VEC * 4)));
extern "C" const char* nf_lib_key() { return "%(key)s"; }
extern "C" double nf_fma_probe(long iters, int threads) {
  float sink = 0.f;
  double t0 = omp_get_wtime();
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    nf_vf m = nf_vf{} + 0.99999f, c = nf_vf{} + 1e-5f;
    %(decl)s
    for (long i = 0; i < iters; ++i) {
      %(body)s
    }
    nf_vf s = %(sum)s;
    for (int l = 0; l < NF_VEC; ++l) sink += s[l];
  }
  double dt = omp_get_wtime() - t0;
  return sink == 12345.f ? -dt : dt;  /* keeps the loop alive */
}
"""


@dataclass(frozen=True)
class Peaks:
    flops: float  # FLOP/s (float32 FMA, all threads)
    dram_bw: float  # bytes/s, streaming copy (read + write)
    cache_bw: float  # bytes/s, copy within L2
    cache_bytes: int  # last-level cache size: data up to this is "cache-resident"
    threads: int
    flops_source: str  # "measured" or "nominal (probe failed: ...)"

    def describe(self) -> str:
        return (f"{self.flops / 1e9:.0f} GFLOP/s FMA ({self.flops_source}, {self.threads} threads), "
                f"{self.dram_bw / 1e9:.1f} GB/s copy, {self.cache_bw / 1e9:.0f} GB/s in cache")


def _probe_source(key: str) -> str:
    return PROBE_SRC % {
        "key": key,
        "decl": " ".join(f"nf_vf a{i} = nf_vf{{}} + {0.5 + i / 64:.4f}f;" for i in range(UNROLL)),
        "body": " ".join(f"a{i} = a{i} * m + c;" for i in range(UNROLL)),
        "sum": " + ".join(f"a{i}" for i in range(UNROLL)),
    }


def _probe_lib(target) -> ctypes.CDLL:
    from ..cache.store import cache_key, library_cache
    from ..codegen.cpu.build import compile_flags, compile_library, compiler, compiler_version

    key = cache_key("fma-probe", target.key(), compiler_version(compiler()), " ".join(compile_flags(target)))

    def build(work: Path) -> tuple[Path, list[Path]]:
        out = work / "lib.so"
        compile_library([_probe_source(key)], out, target, work, extra_flags=["-ffp-contract=fast"])
        return out, sorted(work.glob("*.cpp"))

    def verify(lib: ctypes.CDLL) -> bool:
        try:
            fn = lib.nf_lib_key
        except AttributeError:
            return False
        fn.restype = ctypes.c_char_p
        return fn() == key.encode() and hasattr(lib, "nf_fma_probe")

    lib, _ = library_cache("probe").load_or_build(key, build, verify)
    return lib


def measure_flops(target) -> float:
    """FLOP/s of the FMA probe: the larger of the best all-threads run and threads x the best
    one-thread run, each the best of 7 short runs (a few ms). On a shared machine another
    process can stall one thread of a parallel region for a whole time slice, which says
    nothing about the roof; one thread on a free core still measures it."""
    fn = _probe_lib(target).nf_fma_probe
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, ctypes.c_int]
    iters = 200_000
    flop = iters * UNROLL * target.vector_floats * 2
    best = 0.0
    for threads in sorted({target.threads, 1}, reverse=True):
        fn(iters // 10, threads)  # wake the thread pool
        dt = min(abs(fn(iters, threads)) for _ in range(7))
        best = max(best, target.threads * flop / dt)
    return best


def _copy_bw(numel: int, repeats: int, trials: int) -> float:
    src = torch.empty(numel, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return 2 * numel * 4 / best


def nominal_flops(target) -> float:
    """threads x clock x SIMD lanes x 2 FMA pipes x 2 (the fallback when the probe fails)."""
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        ghz = max(mhz) / 1000 if mhz else 2.5
    except OSError:
        ghz = 2.5
    return target.threads * ghz * 1e9 * target.vector_floats * 2 * 2


@functools.lru_cache(maxsize=4)
def _measure(threads: int) -> Peaks:
    from ..schedule.target import detect_cpu_target

    target = detect_cpu_target()
    try:
        flops, source = measure_flops(target), "measured"
    except Exception as e:  # noqa: BLE001 - a report must not fail on the probe
        flops, source = nominal_flops(target), f"nominal (probe failed: {type(e).__name__})"
    llc = max(target.l3_bytes, target.l2_bytes)
    big, small = max(2 * llc, 32 * 2**20) // 4, max(target.l2_bytes // 4, 16 * 1024) // 4
    dram, cache = _copy_bw(big, 1, 5), _copy_bw(small, 200, 3)
    if threads > 1:  # as for FLOPs: a stalled thread is not the roof (one thread's copy is a lower bound)
        torch.set_num_threads(1)
        try:
            dram, cache = max(dram, _copy_bw(big, 1, 3)), max(cache, _copy_bw(small, 200, 3))
        finally:
            torch.set_num_threads(threads)
    return Peaks(flops, dram, max(cache, dram), llc, target.threads, source)


def machine_peaks() -> Peaks:
    """The peaks for the current torch thread count (measured on first use)."""
    return _measure(torch.get_num_threads())
