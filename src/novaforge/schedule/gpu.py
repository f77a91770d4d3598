"""GPU target description and the analytical configurator for the Triton backend.

Invariant: every schedule here is a frozen dataclass computed in closed form from the kernel's
sizes, its dtypes and a `GpuTarget`; nothing in this module compiles, launches or times a
kernel (zero benchmarking during compilation). The same inputs always give the same schedule.
The equations are written out in docs/gpu-backend.md; each function names the equation it
implements.

* `GpuTarget`: SM count, shared memory per block and per SM, registers, L2 size and bandwidth,
  DRAM bandwidth and latency, peak FLOP/s per math kind (tf32, bf16, fp16, fp32) -- read from the
  device where torch exposes it, completed from `KNOWN_GPUS` (measured ceilings where we have
  them, datasheet values otherwise).
* `matmul_schedule`: tile sizes, BLOCK_K, GROUP_M, num_warps, num_stages, the form (one tile per
  program, or persistent: min(tiles, SMs x resident CTAs) programs looping over tiles, with the
  epilogue in column subtiles) and the operand loader, from M, N, K, batch, dtype, wave
  quantization over the SMs, occupancy from shared memory and registers, pipeline fill and
  epilogue exposure (a small enumerated candidate set scored by a roofline time model; the best
  predicted time wins).
* `pointwise_schedule`, `reduction_schedule` (single-pass vs looped rows), `attention_schedule`
  (never a config that Triton's fused-attention tutorial excludes on Hopper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

# ------------------------------------------------------------------------------ the target


@dataclass(frozen=True)
class GpuTarget:
    """What the configurator knows about one GPU. Rates are per second, sizes in bytes."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    smem_per_block: int  # opt-in maximum of dynamic shared memory per block
    smem_per_sm: int
    regs_per_sm: int
    l2_bytes: int
    mem_bandwidth: float  # DRAM, bytes/s (a measured device copy where known)
    peak_flops: tuple[tuple[str, float], ...]  # (math kind, FLOP/s): tf32, bf16, fp16, fp32, fp64
    l2_bandwidth: float = 0.0  # L2 -> SM bytes/s; 0 means 2.5 x mem_bandwidth
    mem_latency_s: float = 700e-9  # DRAM load-to-use latency under load
    clock_hz: float = 1.755e9
    smem_bytes_per_clk: int = 128  # shared-memory bandwidth per SM per clock
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    regs_per_thread: int = 255
    total_memory: int = 0
    interpret: bool = False  # kernels run in Triton's CPU interpreter (tests)
    source: str = "table"

    def peak(self, kind: str) -> float:
        for k, v in self.peak_flops:
            if k == kind:
                return v
        return dict(self.peak_flops).get("fp32", 1e12)

    @property
    def l2_bw(self) -> float:
        return self.l2_bandwidth or 2.5 * self.mem_bandwidth

    @property
    def smem_bandwidth_per_sm(self) -> float:
        return self.smem_bytes_per_clk * self.clock_hz

    @property
    def hopper(self) -> bool:
        return self.capability >= (9, 0)

    def key(self) -> str:
        """The part of cache keys that depends on the target (schedules change with it)."""
        return f"{self.name}|sm{self.capability[0]}{self.capability[1]}|{self.sm_count}|{self.smem_per_block}" + (
            "|interp" if self.interpret else "")

    def __str__(self) -> str:
        pk = ", ".join(f"{k} {v / 1e12:.0f}" for k, v in self.peak_flops)
        return (f"{self.name} (sm_{self.capability[0]}{self.capability[1]}, {self.sm_count} SMs, "
                f"{self.smem_per_block // 1024} KiB smem/block, {self.l2_bytes >> 20} MiB L2, "
                f"{self.mem_bandwidth / 1e12:.2f} TB/s, TFLOP/s: {pk})")


def _peaks(**kw: float) -> tuple[tuple[str, float], ...]:
    return tuple((k, v * 1e12) for k, v in kw.items())


# name fragment (as torch reports it) -> description. H200: measured ceilings from ANCHORS.md
# (bf16 814, tf32 422 TFLOP/s, copy 4.2 TB/s); others: vendor datasheets (dense, no sparsity).
KNOWN_GPUS: dict[str, GpuTarget] = {
    "H200": GpuTarget("NVIDIA H200", (9, 0), 132, 227 * 1024, 228 * 1024, 65536, 50 * 2**20, 4.2e12,
                      _peaks(tf32=422, bf16=814, fp16=814, fp32=67, fp64=67), clock_hz=1.98e9,
                      total_memory=141 * 10**9, source="measured (ANCHORS.md)"),
    "H100": GpuTarget("NVIDIA H100", (9, 0), 132, 227 * 1024, 228 * 1024, 65536, 50 * 2**20, 3.0e12,
                      _peaks(tf32=400, bf16=790, fp16=790, fp32=67, fp64=67), clock_hz=1.98e9,
                      total_memory=80 * 10**9, source="datasheet x0.8"),
    "A100": GpuTarget("NVIDIA A100", (8, 0), 108, 163 * 1024, 164 * 1024, 65536, 40 * 2**20, 1.7e12,
                      _peaks(tf32=156, bf16=312, fp16=312, fp32=19.5, fp64=19.5), clock_hz=1.41e9,
                      total_memory=80 * 10**9, source="datasheet"),
    "L4": GpuTarget("NVIDIA L4", (8, 9), 58, 99 * 1024, 100 * 1024, 65536, 48 * 2**20, 0.3e12,
                    _peaks(tf32=60, bf16=121, fp16=121, fp32=30, fp64=0.5), clock_hz=2.04e9,
                    total_memory=24 * 10**9, source="datasheet"),
    "RTX 4090": GpuTarget("NVIDIA GeForce RTX 4090", (8, 9), 128, 99 * 1024, 100 * 1024, 65536, 72 * 2**20,
                          1.0e12, _peaks(tf32=82, bf16=165, fp16=165, fp32=82, fp64=1.3), clock_hz=2.52e9,
                          total_memory=24 * 10**9, source="datasheet"),
}

GENERIC = GpuTarget("generic GPU", (8, 0), 80, 99 * 1024, 100 * 1024, 65536, 32 * 2**20, 1.0e12,
                    _peaks(tf32=100, bf16=200, fp16=200, fp32=20, fp64=5), source="generic guess")


def _scaled_peaks(base: GpuTarget, sm_count: int, clock_hz: float) -> tuple[tuple[str, float], ...]:
    f = (sm_count / base.sm_count) * (clock_hz / base.clock_hz)
    return tuple((k, v * f) for k, v in base.peak_flops)


def target_from_device(index: int | None = None) -> GpuTarget:
    """The target for a CUDA device: device properties, completed from the known-chip table."""
    if not torch.cuda.is_available():
        raise RuntimeError("target_from_device: no CUDA device")
    idx = torch.cuda.current_device() if index is None else index
    p = torch.cuda.get_device_properties(idx)
    base = next((t for frag, t in KNOWN_GPUS.items() if frag in p.name), None)
    known = base is not None
    base = base or GENERIC
    sms = int(getattr(p, "multi_processor_count", base.sm_count))
    smem_block = int(getattr(p, "shared_memory_per_block_optin", 0) or base.smem_per_block)
    smem_sm = int(getattr(p, "shared_memory_per_multiprocessor", 0) or base.smem_per_sm)
    regs = int(getattr(p, "regs_per_multiprocessor", 0) or base.regs_per_sm)
    l2 = int(getattr(p, "L2_cache_size", 0) or base.l2_bytes)
    threads = int(getattr(p, "max_threads_per_multi_processor", 0) or base.max_threads_per_sm)
    cap = (int(p.major), int(p.minor))
    peaks = base.peak_flops if known and sms == base.sm_count else _scaled_peaks(base, sms, base.clock_hz)
    return replace(base, name=p.name, capability=cap, sm_count=sms, smem_per_block=smem_block, smem_per_sm=smem_sm,
                   regs_per_sm=regs, l2_bytes=l2, max_threads_per_sm=threads, peak_flops=peaks,
                   total_memory=int(p.total_memory), source=("device + " + base.source) if known else "device + guess")


def interpreter_target() -> GpuTarget:
    """Tests under TRITON_INTERPRET=1 schedule exactly as for an H200 (so they exercise the real
    choices), marked `interpret` so that codegen can route around interpreter gaps."""
    return replace(KNOWN_GPUS["H200"], interpret=True, source="interpreter (H200 description)")


def default_target() -> GpuTarget:
    return target_from_device() if torch.cuda.is_available() else interpreter_target()


# ------------------------------------------------------------------------------- helpers


def pow2_ceil(n: float) -> int:
    n = max(1, math.ceil(n))
    return 1 << (n - 1).bit_length()


def pow2_floor(n: float) -> int:
    n = max(1, int(n))
    return 1 << (n.bit_length() - 1)


def clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def math_kind(dtype: torch.dtype, tf32: bool = True) -> str:
    """The tensor-core math a matmul of this dtype runs on (eq. M0)."""
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float64:
        return "fp64"
    return "tf32" if tf32 else "fp32"


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ------------------------------------------------------------------------------- matmul


@dataclass(frozen=True)
class MatmulSchedule:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    loader: str = "pointer"  # pointer | tma (Hopper tensor-memory-accelerator descriptors)
    input_precision: str = "tf32"  # tf32 | ieee (float32 only; 16-bit inputs ignore it)
    programs: int = 0  # persistent: grid min(tiles, SMs x resident CTAs), each looping over tiles; 0: one per tile
    subtile: int = 1  # epilogue column subtiles (2: the accumulator is stored in two BLOCK_N/2 halves)
    # the model's view of the choice (documentation; not part of the key)
    predicted_s: float = field(default=0.0, compare=False)
    tiles: int = field(default=0, compare=False)
    waves: float = field(default=0.0, compare=False)
    wave_efficiency: float = field(default=0.0, compare=False)
    intensity: float = field(default=0.0, compare=False)
    bound: str = field(default="", compare=False)
    smem: int = field(default=0, compare=False)  # predicted shared memory per CTA, bytes
    ctas_per_sm: int = field(default=0, compare=False)

    @property
    def persistent(self) -> bool:
        return self.programs > 0

    def key(self) -> str:
        return (f"mm{self.block_m}x{self.block_n}x{self.block_k}g{self.group_m}w{self.num_warps}"
                f"s{self.num_stages}{self.loader}{self.input_precision}"
                + (f"p{self.programs}e{self.subtile}" if self.persistent else ""))

    def launch(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


@dataclass(frozen=True)
class MatmulEstimate:
    """One scored candidate (eq. M1-M10)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int
    ctas_per_sm: int
    tiles: int
    t_compute: float
    t_l2: float
    t_dram: float
    t_fill: float  # latency paid once: the first pipeline fill (eq. M9)
    smem: int
    regs: int
    persistent: bool = False
    programs: int = 0
    subtile: int = 1
    t_overhead: float = 0.0  # exposed per-tile fills and epilogues on the busiest SM (eq. M10)

    @property
    def time(self) -> float:
        return max(self.t_compute + self.t_overhead, self.t_l2, self.t_dram) + self.t_fill

    @property
    def bound(self) -> str:
        m = max(self.t_compute + self.t_overhead, self.t_l2, self.t_dram)
        if m == self.t_compute + self.t_overhead:
            return "compute" if self.t_overhead <= 0.1 * self.t_compute else "latency"
        return "l2" if m == self.t_l2 else "dram"


MM_TILES = (16, 32, 64, 128, 256)
ACC_REGS_MAX = 128  # fp32 accumulator registers per thread (eq. M3); the rest hold addresses/operands
REGS_OVERHEAD = 40
SMEM_USABLE = 0.9  # of the per-block limit: the rest is left to barriers and epilogue layout conversions
MAX_STAGES = 4
SM_BW_SHARE = 2.0
PERSISTENT_MIN_TILES = 2  # eq. M10: a persistent grid only when every program gets at least two tiles on average


def _epilogue_scratch(bm: int, bn: int, subtile: int) -> int:
    """Shared memory of the epilogue's layout conversion (MMA accumulator -> coalesced stores), one
    float32 (sub)tile. A one-tile kernel reuses the drained pipeline buffers for it; a persistent
    kernel keeps them live (the next tile's loads are in flight), so it adds (eq. M5')."""
    return bm * (bn // subtile) * 4


def matmul_candidates(batch: int, m: int, n: int, k: int, dtype: torch.dtype, target: GpuTarget,
                      out_bytes: int | None = None, extra_bytes: int = 0, tf32: bool = True,
                      persistent: bool | None = None) -> list[MatmulEstimate]:
    """Every feasible (BLOCK_M, BLOCK_N, one-tile or persistent) with its derived BLOCK_K, warps,
    stages, GROUP_M and predicted time. `persistent`: None scores both forms, True/False only one."""
    e = itemsize(dtype)
    e_out = e if out_bytes is None else out_bytes
    kind = math_kind(dtype, tf32)
    peak = target.peak(kind)
    p_sm = peak / target.sm_count
    lam = target.mem_latency_s
    epi_per_elem = e_out + extra_bytes / max(1, batch * m * n)  # bytes an epilogue moves per output element
    # eq. M2: BLOCK_K spans 128 bytes (one swizzled shared-memory row), no more than K needs
    bk = clamp(128 // e, 16, max(16, pow2_ceil(k)))
    k_pad = cdiv(max(k, 1), bk) * bk
    forms = (False, True) if persistent is None else (persistent,)
    out = []
    for bm in MM_TILES:
        if bm > max(16, pow2_ceil(m)):
            continue
        for bn in MM_TILES:
            if bn > max(16, pow2_ceil(n)):
                continue
            # eq. M3: warps so that each thread holds ~64 accumulator registers, 4..8 (one or two warpgroups)
            w = clamp(pow2_ceil(bm * bn / (32 * 64)), 4, 8)
            acc = bm * bn // (32 * w)
            if acc > ACC_REGS_MAX:
                continue
            regs = acc + REGS_OVERHEAD
            stage_bytes = (bm * bk + bk * bn) * e
            tiles = batch * cdiv(m, bm) * cdiv(n, bn)
            # eq. M6: shared-memory bandwidth efficiency (A slice per warpgroup, all of B per warpgroup)
            wg = max(1, w // 4)
            smem_demand = (bm * bk + wg * bk * bn) * e / (2.0 * bm * bn * bk) * p_sm
            eta = min(1.0, target.smem_bandwidth_per_sm / smem_demand)
            # eq. M1: wave quantization -- the busiest SM runs ceil(tiles / SMs) tiles
            t_tile = 2.0 * bm * bn * k_pad / (p_sm * eta)
            # eq. M7: operand traffic L2 -> SMs
            t_l2 = tiles * (bm + bn) * k_pad * e / target.l2_bw
            # eq. M10: one tile's epilogue: its outputs (and epilogue inputs) at the SM's share of L2 bandwidth
            t_epi = bm * bn * epi_per_elem / (target.l2_bw / target.sm_count)
            # eq. M4: enough stages in flight to cover 1.5x the DRAM latency with one k-step of MMA each
            t_k = 2.0 * bm * bn * bk / p_sm
            want = clamp(1 + math.ceil(1.5 * lam / t_k), 2, min(MAX_STAGES, cdiv(k, bk) + 1))
            for pers in forms:
                # eq. M5': a persistent kernel keeps its stages live during the epilogue, whose layout
                # conversion scratch then adds to them: split the epilogue into column subtiles (1, 2, 4)
                # until the wanted stages fit
                subtile, stages = 1, 0
                for sub in ((1, 2, 4) if pers else (1,)):
                    if sub > 1 and bn // sub < 32:
                        break
                    budget = int(SMEM_USABLE * target.smem_per_block) - (_epilogue_scratch(bm, bn, sub) if pers else 0)
                    st = min(want, budget // stage_bytes)
                    if st > stages:
                        subtile, stages = sub, st
                    if st >= want:
                        break
                if stages < 2:
                    continue
                scratch = _epilogue_scratch(bm, bn, subtile)
                # eq. M5': shared memory per CTA (the epilogue scratch aliases drained stages in one-tile kernels)
                smem = stages * stage_bytes + scratch if pers else max(stages * stage_bytes, scratch)
                # eq. M4': fewer stages than wanted (shared memory) leave part of the latency uncovered
                rho = 1.0 if stages >= want else min(1.0, (stages - 1) * t_k / lam)
                t_tile_s = t_tile / rho
                # eq. M5: resident CTAs per SM
                ctas = min(target.smem_per_sm // smem, target.regs_per_sm // (32 * w * regs),
                           target.max_threads_per_sm // (32 * w), target.max_ctas_per_sm)
                if ctas < 1:
                    continue
                programs = min(tiles, target.sm_count * ctas)
                if pers and tiles < PERSISTENT_MIN_TILES * programs:
                    continue  # every program would run about one tile: nothing to overlap
                # eq. M8: DRAM traffic with GROUP_M swizzling
                active = min(tiles, target.sm_count * ctas)
                g = clamp(round(math.sqrt(active * bn / bm)), 1, max(1, cdiv(m, bm)))
                compulsory = batch * (m * k + k * n) * e + batch * m * n * e_out + extra_bytes
                if batch * (m * k + k * n) * e <= target.l2_bytes // 2:
                    dram = compulsory
                else:
                    per_wave = (g * bm + (active / g) * bn) * k * e
                    dram = max(compulsory, cdiv(tiles, active) * per_wave + batch * m * n * e_out + extra_bytes)
                # eq. M8': one SM pulls at most twice its fair share of DRAM bandwidth
                sms = min(tiles, target.sm_count)
                t_dram = dram / min(target.mem_bandwidth, sms * SM_BW_SHARE * target.mem_bandwidth / target.sm_count)
                # eq. M10: per tile, a one-tile CTA waits for its first loads (one latency) and drains its
                # epilogue; a persistent CTA has the next tile's loads in flight during the epilogue, so it
                # pays only the epilogue. The other resident CTAs' main loops hide what they can.
                per_tile = t_epi if pers else lam + t_epi
                exposed = max(0.0, per_tile - (ctas - 1) * t_tile_s)
                t_over = cdiv(tiles, target.sm_count) * exposed
                # eq. M9: the first fill (one latency) is paid once whatever the form
                t_compute = cdiv(tiles, target.sm_count) * t_tile_s
                out.append(MatmulEstimate(bm, bn, bk, w, stages, g, ctas, tiles, t_compute, t_l2, t_dram, lam,
                                          smem, regs, pers, programs if pers else 0, subtile, t_over))
    return out


def matmul_schedule(batch: int, m: int, n: int, k: int, dtype: torch.dtype, target: GpuTarget, *,
                    out_bytes: int | None = None, extra_bytes: int = 0, tf32: bool = True,
                    tma_ok: bool = False, persistent: bool | None = None) -> MatmulSchedule:
    """The configurator's matmul choice: the candidate with the least predicted time; within 3%
    of it, the largest tile (more reuse, less traffic), then the fewest warps, then the wider N
    (a warpgroup's MMA instruction spans all of BLOCK_N), then the one-tile form (simpler code).
    `persistent` forces the form (None: the model decides; a forced form that no candidate has
    falls back to the other)."""
    cands = matmul_candidates(batch, m, n, k, dtype, target, out_bytes, extra_bytes, tf32, persistent)
    if not cands and persistent is not None:
        cands = matmul_candidates(batch, m, n, k, dtype, target, out_bytes, extra_bytes, tf32, None)
    if not cands:  # tiny shared memory: smallest legal tile
        return MatmulSchedule(16, 16, 16, 1, 4, 2, "pointer", "tf32" if tf32 else "ieee")
    best_t = min(c.time for c in cands)
    near = [c for c in cands if c.time <= best_t * 1.03]
    c = min(near, key=lambda c: (-(c.block_m * c.block_n), c.num_warps, -c.block_n, c.persistent, c.time))
    e = itemsize(dtype)
    waves = c.tiles / target.sm_count
    loader = "tma" if tma_ok and target.hopper else "pointer"
    return MatmulSchedule(c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages, loader,
                          "tf32" if tf32 else "ieee", c.programs, c.subtile, predicted_s=c.time, tiles=c.tiles,
                          waves=waves, wave_efficiency=c.tiles / (target.sm_count * cdiv(c.tiles, target.sm_count)),
                          intensity=2.0 * c.block_m * c.block_n / ((c.block_m + c.block_n) * e), bound=c.bound,
                          smem=c.smem, ctas_per_sm=c.ctas_per_sm)


# ---------------------------------------------------------------------------- pointwise


@dataclass(frozen=True)
class PointwiseSchedule:
    block: int
    num_warps: int
    programs: int
    vec: int

    def key(self) -> str:
        return f"pw{self.block}w{self.num_warps}"

    def launch(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": 1}


def pointwise_schedule(numel: int, bytes_read: int, max_itemsize: int, target: GpuTarget) -> PointwiseSchedule:
    """eq. P1-P4: a block large enough that the bytes in flight per SM cover bandwidth x latency
    (Little's law), small enough that every SM gets work, vectors of 16 bytes per thread."""
    vec = max(1, 16 // max(1, max_itemsize))
    w = 4
    ctas = min(target.max_threads_per_sm // (32 * w), target.max_ctas_per_sm)
    inflight = target.mem_bandwidth * target.mem_latency_s / target.sm_count  # eq. P1
    block = pow2_ceil(inflight / (max(1, bytes_read) * ctas))  # eq. P2
    block = clamp(block, 32 * w * vec, 4096)
    fill = pow2_floor(max(numel, 1) // target.sm_count)  # eq. P3: at least one program per SM
    block = clamp(min(block, fill), max(128, 32 * vec), 4096)
    w = clamp(block // (32 * vec * 2), 1, 8)  # eq. P4: two 16-byte vectors per thread
    w = pow2_floor(w)
    return PointwiseSchedule(block, w, cdiv(max(numel, 1), block), vec)


# ---------------------------------------------------------------------------- reduction


@dataclass(frozen=True)
class ReductionSchedule:
    block_rows: int
    block_cols: int
    looped: bool
    num_warps: int
    programs: int

    def key(self) -> str:
        return f"red{self.block_rows}x{self.block_cols}{'L' if self.looped else 'S'}w{self.num_warps}"

    def launch(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": 1}


ROW_REGS = 64  # registers per thread for row-shaped live values in a single pass (eq. R1)
MAX_WARPS = 16


def reduction_schedule(rows: int, cols: int, live_row_values: int, max_itemsize: int,
                       target: GpuTarget) -> ReductionSchedule:
    """eq. R1-R4: single pass when all live row values fit in registers of one program, else a
    looped reduction over column chunks; short rows are packed several per program."""
    vec = max(1, 16 // max(1, max_itemsize))
    t = max(1, live_row_values)
    bc = pow2_ceil(max(cols, 1))
    single = bc * t <= ROW_REGS * 32 * MAX_WARPS  # eq. R1
    if single:
        # eq. R2: pack rows until a program holds ~2048 elements, keeping >= 2 programs per SM
        br = clamp(pow2_floor(2048 // bc) if bc < 2048 else 1, 1, pow2_ceil(rows))
        while br > 1 and cdiv(rows, br) < 2 * target.sm_count:
            br //= 2
        # eq. R3: warps so that each thread holds ~8 elements of each row value (>= one 16 B vector)
        w = clamp(pow2_floor(max(1, br * bc // (32 * max(8, vec)))), 1, MAX_WARPS)
        while w > 1 and br * bc * t // (32 * w) > ROW_REGS * 2:
            w //= 2
        while br * bc * t // (32 * w) > ROW_REGS and w < MAX_WARPS:
            w *= 2
        return ReductionSchedule(br, bc, False, w, cdiv(max(rows, 1), br))
    # eq. R4: looped -- a chunk of 8 warps x 2 vectors per thread, one row per program
    w = 8
    chunk = clamp(32 * w * vec * 2, 256, 4096)
    return ReductionSchedule(1, min(chunk, bc), True, w, max(rows, 1))


# ---------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionSchedule:
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    input_precision: str = "tf32"

    def key(self) -> str:
        return (f"at{self.block_m}x{self.block_n}d{self.block_d}v{self.block_dv}w{self.num_warps}"
                f"s{self.num_stages}{self.input_precision}")

    def launch(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


ATTN_REGS = 96  # float32 registers per thread for the output accumulator and the score tile (eq. A2)
ATTN_REGS_HOPPER = 128  # eq. A2': one warpgroup's wgmma tiles (m64) hold more per thread on Hopper


def attention_excluded(block_m: int, block_n: int, num_warps: int, target: GpuTarget) -> bool:
    """The configs Triton's fused-attention tutorial drops on Hopper (its `keep`): eight warps on a
    tile smaller than 128 x 128 (two warpgroups then split too little work per wgmma)."""
    return target.hopper and block_m * block_n < 128 * 128 and num_warps == 8


def attention_schedule(batch_heads: int, q_len: int, kv_len: int, d: int, dv: int, dtype: torch.dtype,
                       target: GpuTarget, tf32: bool = True) -> AttentionSchedule:
    """eq. A1-A3: BLOCK_M query rows per program (128, fewer when that leaves SMs idle), BLOCK_N
    keys per step, warps from the register footprint of the accumulator and the score tile,
    stages from shared memory; never a config of `attention_excluded`."""
    e = itemsize(dtype)
    bd, bdv = max(16, pow2_ceil(d)), max(16, pow2_ceil(dv))
    bm = clamp(128, 16, max(16, pow2_ceil(q_len)))
    while bm > 64 and batch_heads * cdiv(q_len, bm) < target.sm_count:  # eq. A1
        bm //= 2
    kv_cap = max(16, pow2_ceil(kv_len))
    bn = clamp(64 if max(bd, bdv) <= 128 else 32, 16, kv_cap)

    def regs(bm_: int, bn_: int, w_: int) -> float:
        return (bm_ * bdv + bm_ * bn_) / (32 * w_)

    if target.hopper:
        # eq. A2': four warps while acc + scores fit 128 registers per thread; else eight warps on a
        # 128 x 128 tile (BLOCK_N raised to 128 keys), the smallest 8-warp tile the tutorial keeps
        w = 4
        if regs(bm, bn, 4) > ATTN_REGS_HOPPER:
            if bm * 128 >= 128 * 128 and kv_cap >= 128 and regs(bm, 128, 8) <= ATTN_REGS_HOPPER:
                bn, w = 128, 8
            else:  # wide heads: fewer keys per step, then fewer query rows
                while bn > 32 and regs(bm, bn, 4) > ATTN_REGS_HOPPER:
                    bn //= 2
                while bm > 64 and regs(bm, bn, 4) > ATTN_REGS_HOPPER:
                    bm //= 2
    else:
        w = 4
        while regs(bm, bn, w) > ATTN_REGS and w < 8:  # eq. A2: acc + scores <= 96 regs/thread
            w *= 2
    q_bytes = bm * bd * e
    stage = bn * (bd + bdv) * e
    stages = clamp((target.smem_per_block - q_bytes) // max(stage, 1), 1, 3)  # eq. A3
    return AttentionSchedule(bm, bn, bd, bdv, w, max(1, stages), "tf32" if tf32 else "ieee")


def describe(schedule: Any) -> str:
    fields = getattr(schedule, "__dataclass_fields__", {})
    return type(schedule).__name__ + "(" + ", ".join(f"{f}={getattr(schedule, f)!r}" for f in fields) + ")"
