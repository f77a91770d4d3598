"""The analytical CPU configurator: loop shape + CpuTarget -> frozen CpuSchedule.

No candidate is ever timed. The configurator estimates a kernel's single-thread time from its
bytes and FLOPs with a two-term machine model (streaming bandwidth per core, vector FLOP rate
per core, both derived from the target's SIMD width) and decides:

* threads: 1 when the estimate is below a few OpenMP fork/join costs (tiny kernels run
  serially: the fork costs more than it saves) or when the kernel is memory-bound on data that
  fits one core's L2 (its input was just produced by a kernel split differently over the cores:
  a second thread would mostly pull cache lines across), else as many as the estimate pays for,
  at most the target's threads and the number of parallel iterations;
* block: a long innermost loop with too few outer iterations to feed every thread is split
  into blocks (a multiple of the vector width) so that the threads share it;
* reductions: "row" order (vectorize along the reduced axis, rows in parallel) when the
  innermost space dimension is reduced, "column" order (vectorize across neighbouring rows,
  accumulators per lane) when it is kept; a per-row stack buffer (`row_cache`, elements)
  keeps an expensive row value (one with transcendentals) across passes when the row fits in
  half of L1, else it is recomputed;
* attention: query and key/value tile sizes so that a K and a V tile fit in L1 and the score
  tile stays in registers/L1.

Alternatives (`candidates`): the model's choice first, then up to 3 others it ranks next by
the same estimate (the other thread count, the loop split or not, other attention tiles, the row
cache off). They exist for measured refinement (codegen/cpu/refine.py, `Options.refine`), which
builds a kernel at another variant (`schedule_variant(k)`: `configure` then returns the k-th
candidate) and keeps the faster one. Every candidate computes the same values; at most the
order of a sum differs (thread splits of a reduction, attention's key tiles).

Invariant: `configure` is a pure function of (KernelShape, CpuTarget, the variant in effect,
0 unless `schedule_variant` says otherwise); schedules are frozen data whose `key()` enters
cache keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace

from .. import settings
from ..ir.symbolic import Sym, hint
from .target import CpuTarget

# one OpenMP parallel region (fork + join) on a warm pool, ns (NOVAFORGE_CPU_FORK_NS: experiments)
FORK_NS = settings.cpu_fork_ns()
BYTES_PER_NS_CORE = 12.0  # streaming bandwidth one core sustains from L2/L3, bytes/ns
GHZ = 2.5


@dataclass(frozen=True)
class KernelShape:
    """What the configurator knows about a kernel: its loop nest and its cost."""

    kind: str  # pointwise | reduction | attention
    outer: int  # parallel iterations (rows for reductions, outer loop trip count for pointwise)
    inner: int  # innermost (vectorized) loop trip count
    reduce: int = 0  # elements per row of a reduction
    inner_reduced: bool = True  # reductions: is the innermost space dim reduced?
    flops: float = 0.0
    bytes: float = 0.0
    passes: int = 1  # reductions: passes over each row
    expensive_cross_pass: bool = False  # a transcendental row value is read by a later pass
    head_dim: int = 0  # attention
    kv_len: int = 0
    q_len: int = 0

    def __post_init__(self) -> None:
        # a symbolic size is planned at its hint (ir/symbolic.py: performance only; whatever
        # correctness needs from a size, the code generator takes from the size itself)
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Sym):
                object.__setattr__(self, f.name, hint(v))


@dataclass(frozen=True)
class CpuSchedule:
    kind: str
    threads: int = 1
    vector: int = 8  # SIMD lanes (floats) of the inner loop
    block: int = 0  # innermost-loop block shared between threads; 0: not split
    order: str = "row"  # reductions: row | column
    row_cache: int = 0  # reductions: stack elements keeping one row value across passes
    q_tile: int = 0  # attention
    kv_tile: int = 0

    def key(self) -> str:
        # (fields are scalars: getattr, not astuple's recursive deep copy, ~30 us a call)
        return "sched(" + ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)) + ")"


def estimate_ns(shape: KernelShape, target: CpuTarget) -> float:
    """Single-thread time estimate: streaming bytes plus vector FLOPs (2 FMA ports)."""
    flop_rate = target.vector_floats * 2 * 2 * GHZ * 0.5  # half of peak for mixed code
    return shape.bytes / BYTES_PER_NS_CORE + shape.flops / flop_rate


def _cache_bound(shape: KernelShape, target: CpuTarget) -> bool:
    """A memory-bound kernel whose data fits one core's L2: its inputs were just written by the
    previous kernel (split over the cores differently, e.g. a GEMM by columns), so a second
    thread mostly moves lines between the cores' caches instead of adding bandwidth."""
    flop_rate = target.vector_floats * 2 * 2 * GHZ * 0.5
    return shape.bytes <= target.l2_bytes and shape.bytes / BYTES_PER_NS_CORE >= shape.flops / flop_rate


def _threads_for(est_ns: float, iterations: int, target: CpuTarget) -> int:
    if target.threads <= 1 or est_ns < 3 * FORK_NS or iterations < 2:
        return 1
    pays = int(est_ns // (1.5 * FORK_NS))
    return max(1, min(target.threads, pays, iterations))


ATTENTION_Q_TILE = 24  # query rows per block of the flash-attention forward
ATTENTION_KV_TILE = 128  # most keys per block


_VARIANT: ContextVar[int] = ContextVar("nf_cpu_schedule_variant", default=0)
_RECORD: ContextVar[list | None] = ContextVar("nf_cpu_schedule_record", default=None)


@contextmanager
def schedule_variant(k: int, record: list | None = None) -> Iterator[None]:
    """Within: `configure` returns its k-th candidate (the model's choice where there is no
    k-th); with `record`, each call appends (shape, schedule, number of candidates)."""
    tv, tr = _VARIANT.set(k), _RECORD.set(record)
    try:
        yield
    finally:
        _VARIANT.reset(tv)
        _RECORD.reset(tr)


def configure(shape: KernelShape, target: CpuTarget) -> CpuSchedule:
    k, record = _VARIANT.get(), _RECORD.get()
    if k == 0 and record is None:
        return _choose(shape, target)
    alts = candidates(shape, target)
    sched = alts[k] if k < len(alts) else alts[0]
    if record is not None:
        record.append((shape, sched, len(alts)))
    return sched


def predicted_ns(shape: KernelShape, sched: CpuSchedule, target: CpuTarget) -> float:
    """The model's time for `shape` run with `sched`: the single-thread estimate shared by its
    threads, plus a fork/join where there is more than one."""
    est = estimate_ns(shape, target)
    return est / max(1, sched.threads) + (FORK_NS if sched.threads > 1 else 0.0)


def gemm_predicted_ns(flops: float, target: CpuTarget) -> float:
    """A GEMM's time at the vector FMA peak of every thread (nf_gemm's packed kernels reach
    70-90% of it; refinement tries the other B layout of one measured slower than SLOW x this)."""
    return flops / (target.vector_floats * 2 * 2 * GHZ * max(1, target.threads))


def candidates(shape: KernelShape, target: CpuTarget) -> list[CpuSchedule]:
    """The model's choice, then up to 3 distinct alternatives ranked by `predicted_ns` (ties:
    the order below). All are valid schedules of the same loop nest."""
    first = _choose(shape, target)
    T, vec = target.threads, target.vector_floats
    alts: list[CpuSchedule] = []
    if T > 1:  # the other side of the thread decision
        if first.threads > 1:
            alts.append(replace(first, threads=1, block=0))
        elif shape.outer >= 2 or shape.kind == "pointwise":
            split = _split_block(shape, T, vec) if shape.kind == "pointwise" and shape.outer < 2 else 0
            if shape.outer >= 2 or split:
                alts.append(replace(first, threads=T, block=split))
    if first.kind == "pointwise" and T > 1 and first.threads > 1:
        if first.block:
            if shape.outer >= 2:
                alts.append(replace(first, block=0))
            finer = _split_block(shape, 2 * T, vec)
            if finer and finer != first.block:
                alts.append(replace(first, block=finer))
        elif shape.inner >= 8 * vec * T:
            alts.append(replace(first, block=_split_block(shape, T, vec)))
    if first.kind == "reduction" and first.order == "row" and first.row_cache:
        alts.append(replace(first, row_cache=0))
    if first.kind == "attention":
        step = 2 * vec
        for q, kv in ((16, 64), (24, 64), (12, 128)):
            q = max(1, min(q, shape.q_len))
            kv = max(step, min(kv // step * step, -(-max(shape.kv_len, 1) // step) * step))
            alts.append(replace(first, q_tile=q, kv_tile=kv))
    seen = {first}
    unique = [s for s in alts if not (s in seen or seen.add(s))]
    unique.sort(key=lambda s: predicted_ns(shape, s, target))
    return [first] + unique[:3]


def _split_block(shape: KernelShape, parts_per_thread: int, vec: int) -> int:
    """A block of the innermost loop giving each thread `parts_per_thread` parts (0: too short)."""
    nblocks = 4 * parts_per_thread
    if shape.inner < nblocks * vec:
        return 0
    block = -(-shape.inner // nblocks)
    return -(-block // vec) * vec


def _choose(shape: KernelShape, target: CpuTarget) -> CpuSchedule:
    """The model's schedule (`configure` without a variant)."""
    vec = target.vector_floats
    est = estimate_ns(shape, target)
    if shape.kind == "attention":
        # q: four 6-row register tiles. kv: each row pays a fixed softmax cost per key tile (its
        # rescale exp, two reductions, the accumulator rescale), so wide key tiles amortize it; the
        # products stream K^T and V in 16-key / 16-column strips, so the whole K^T tile need not
        # sit in L1. Against the L1-sized 16 x 64 tiles used before (Zen 3, 2 threads, one
        # process, calls interleaved), 24 x 128 took 0.95x (causal 4 x 8 x 256 x 64), 0.88x and
        # 0.87x (1 and 8 x 12 x 128 x 64) and 0.92x (causal 1 x 32 x 128 x 64); 24 x 96 and
        # 16 x 128 were in between.
        q = max(1, min(ATTENTION_Q_TILE, shape.q_len))
        step = 2 * vec  # the register tiles cover two vectors of keys
        kv = max(step, min(ATTENTION_KV_TILE // step * step, -(-max(shape.kv_len, 1) // step) * step))
        threads = _threads_for(est, shape.outer, target)
        return CpuSchedule("attention", threads=threads, vector=vec, q_tile=q, kv_tile=kv)
    if shape.kind == "reduction":
        order = "row" if shape.inner_reduced else "column"
        threads = 1 if _cache_bound(shape, target) else _threads_for(est, shape.outer, target)
        row_cache = 0
        if order == "row" and shape.expensive_cross_pass and 0 < shape.reduce * 4 <= target.l1d_bytes // 2:
            row_cache = shape.reduce  # (a symbolic row: its hint; the renderer caches only rows it bounds)
        return CpuSchedule("reduction", threads=threads, vector=vec, order=order, row_cache=row_cache)
    # pointwise (and epilogues)
    block = 0
    iterations = shape.outer
    if target.threads > 1 and shape.outer < 2 * target.threads and shape.inner >= 4 * vec * target.threads:
        # split the innermost loop so that every thread gets work
        nblocks = 4 * target.threads
        block = -(-shape.inner // nblocks)
        block = -(-block // vec) * vec
        iterations = shape.outer * -(-shape.inner // block)
    threads = 1 if _cache_bound(shape, target) else _threads_for(est, iterations, target)
    if threads == 1:
        block = 0
    return CpuSchedule("pointwise", threads=threads, vector=vec, block=block)
