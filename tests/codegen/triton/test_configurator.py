"""The analytical configurator (schedule/gpu.py) on a table of shapes: the choices fit shared
memory and registers, follow the equations of docs/gpu-backend.md, account for wave
quantization over the SMs, pipeline fill and epilogue (persistent kernels where they are
exposed), avoid the attention configs Triton's tutorial excludes on Hopper, and are
deterministic. Run with -s to see the table (docs/gpu-backend.md prints it)."""

from __future__ import annotations

import math

import pytest
import torch

from novaforge.schedule.gpu import (
    ACC_REGS_MAX,
    KNOWN_GPUS,
    attention_excluded,
    attention_schedule,
    cdiv,
    itemsize,
    matmul_candidates,
    matmul_schedule,
    pointwise_schedule,
    reduction_schedule,
)

H200 = KNOWN_GPUS["H200"]
A100 = KNOWN_GPUS["A100"]

MATMULS = [  # (name, M, N, K)
    ("square 1024", 1024, 1024, 1024), ("square 2048", 2048, 2048, 2048), ("square 4096", 4096, 4096, 4096),
    ("square 8192", 8192, 8192, 8192),
    ("gpt42m qkv", 16384, 1536, 512), ("gpt42m fc", 16384, 2048, 512), ("gpt42m proj", 16384, 512, 2048),
    ("gpt42m head", 16384, 32000, 512),
    ("gpt2 qkv", 16384, 2304, 768), ("gpt2 fc", 16384, 3072, 768), ("gpt2 proj", 16384, 768, 3072),
    ("llama gate", 16384, 2048, 768), ("odd small", 37, 45, 29), ("skinny", 8, 4096, 4096),
    ("gpt42m head dX", 16384, 512, 32000), ("gpt42m head dW", 32000, 512, 16384),
]
K512 = [row for row in MATMULS if row[3] == 512]


def _check_fits(s, m, n, k, dtype, target):
    e = itemsize(dtype)
    stages = s.num_stages * (s.block_m * s.block_k + s.block_k * s.block_n) * e
    scratch = s.block_m * (s.block_n // s.subtile) * 4  # epilogue layout conversion (eq. M5')
    assert s.smem == (stages + scratch if s.persistent else max(stages, scratch)), s
    assert s.smem <= target.smem_per_block, s
    assert s.ctas_per_sm == min(target.smem_per_sm // s.smem, target.regs_per_sm // (32 * s.num_warps * (
        s.block_m * s.block_n // (32 * s.num_warps) + 40)), target.max_threads_per_sm // (32 * s.num_warps), 32)
    if s.persistent:
        assert s.programs == min(s.tiles, target.sm_count * s.ctas_per_sm) and s.tiles >= 2 * s.programs
    assert s.block_m * s.block_n // (32 * s.num_warps) <= ACC_REGS_MAX
    assert s.num_stages >= 2 and s.num_warps in (4, 8)
    assert s.block_k == min(128 // e, max(16, 1 << (k - 1).bit_length()))  # eq. M2: 128-byte K rows
    assert s.block_m <= max(16, 1 << (m - 1).bit_length()) and s.block_n <= max(16, 1 << (n - 1).bit_length())
    assert 1 <= s.group_m <= cdiv(m, s.block_m)


@pytest.mark.parametrize("target", [H200, A100], ids=["H200", "A100"])
def test_matmul_table(target, capsys):
    rows = []
    for name, m, n, k in MATMULS:
        for dtype in (torch.float32, torch.bfloat16):
            s = matmul_schedule(1, m, n, k, dtype, target)
            assert s == matmul_schedule(1, m, n, k, dtype, target)  # deterministic
            _check_fits(s, m, n, k, dtype, target)
            kind = "tf32" if dtype == torch.float32 else "bf16"
            flops = 2.0 * m * n * k
            floor = max(flops / target.peak(kind), (m * k + k * n + m * n) * itemsize(dtype) / target.mem_bandwidth)
            assert s.predicted_s >= floor * 0.999  # never faster than the roofline
            cands = matmul_candidates(1, m, n, k, dtype, target)
            assert s.predicted_s <= min(c.time for c in cands) * 1.03  # the model's best (within the tie band)
            form = f"persistent {s.programs}, {s.subtile} subtiles" if s.persistent else "one tile"
            rows.append(f"| {target.name} | {name} | {m}x{n}x{k} | {kind} | {s.block_m}x{s.block_n}x{s.block_k} | "
                        f"{s.group_m} | {s.num_warps} | {s.num_stages} | {form} | {s.smem // 1024} KiB x "
                        f"{s.ctas_per_sm} | {s.tiles} | {s.wave_efficiency:.2f} | {s.bound} | "
                        f"{flops / s.predicted_s / 1e12:.0f} |")
    with capsys.disabled():
        print("\n| target | shape | MxNxK | math | tile | GROUP_M | warps | stages | form | smem x CTAs/SM | tiles "
              "| wave eff | bound | predicted TFLOP/s |")
        print("\n".join(rows))


def test_wave_quantization_decides_the_tile():
    """1024^2 with 128x128 tiles is 64 tiles on 132 SMs (48% of one wave); the configurator
    picks a tile count that fills the SMs instead."""
    s = matmul_schedule(1, 1024, 1024, 1024, torch.bfloat16, H200)
    assert s.tiles >= H200.sm_count * 0.9 and s.wave_efficiency >= 0.9
    big = [c for c in matmul_candidates(1, 1024, 1024, 1024, torch.bfloat16, H200)
           if (c.block_m, c.block_n) == (128, 128)][0]
    assert big.tiles == 64 and big.time > s.predicted_s
    for _, m, n, k in MATMULS[:8]:
        for dtype in (torch.float32, torch.bfloat16):
            assert matmul_schedule(1, m, n, k, dtype, H200).wave_efficiency >= 0.85


def test_large_matmuls_are_predicted_compute_bound_near_peak():
    for _, m, n, k in [row for row in MATMULS[:8] if row[3] >= 2048] + MATMULS[-2:]:
        for dtype, kind in ((torch.float32, "tf32"), (torch.bfloat16, "bf16")):
            s = matmul_schedule(1, m, n, k, dtype, H200)
            assert s.bound == "compute", (m, n, k, s)
            assert 2.0 * m * n * k / s.predicted_s >= 0.85 * H200.peak(kind)
            assert s.block_m * s.block_n >= 128 * 128  # large tiles: high per-tile intensity


def test_short_k_matmuls_go_persistent():
    """K = 512 (the GPT-42M projections and LM head): a 128x256 one-tile CTA fills 144 KiB of shared
    memory (one per SM), so every tile's fill and epilogue are exposed (eq. M10); the persistent
    form hides the fill behind the previous tile's epilogue and wins by more than the tie band."""
    for _, m, n, k in K512:
        for dtype in (torch.float32, torch.bfloat16):
            s = matmul_schedule(1, m, n, k, dtype, H200)
            one = matmul_schedule(1, m, n, k, dtype, H200, persistent=False)
            assert s.persistent and not one.persistent
            assert s.predicted_s < one.predicted_s / 1.03
            assert one.ctas_per_sm == 1 and (one.block_m, one.block_n) == (128, 256)
            assert s.programs == H200.sm_count and s.subtile > 1  # epilogue subtiles make room for the stages
            assert s.num_stages >= one.num_stages
    # long K: the exposed per-tile overhead is small, the one-tile form stays (within the tie band)
    assert not matmul_schedule(1, 8192, 8192, 8192, torch.bfloat16, H200).persistent
    # too few tiles for every program to loop: no persistent candidate, the forced form falls back
    assert not matmul_schedule(1, 37, 45, 29, torch.float32, H200, persistent=True).persistent
    assert not matmul_candidates(1, 37, 45, 29, torch.float32, H200, persistent=True)


def test_tma_loader_only_on_hopper():
    assert matmul_schedule(1, 4096, 4096, 4096, torch.bfloat16, H200, tma_ok=True).loader == "tma"
    assert matmul_schedule(1, 4096, 4096, 4096, torch.bfloat16, A100, tma_ok=True).loader == "pointer"
    assert matmul_schedule(1, 4096, 4096, 4096, torch.bfloat16, H200, tma_ok=False).loader == "pointer"


@pytest.mark.parametrize("numel", [1, 1000, 2**16, 16384 * 768, 16384 * 32000])
@pytest.mark.parametrize("itemsize_", [2, 4])
def test_pointwise_blocks(numel, itemsize_):
    s = pointwise_schedule(numel, itemsize_, itemsize_, H200)
    assert 128 <= s.block <= 4096 and s.block & (s.block - 1) == 0
    assert s.programs == cdiv(numel, s.block)
    if numel >= 128 * H200.sm_count:
        assert s.programs >= H200.sm_count  # every SM gets work (eq. P3)
    if numel >= 2**24:  # Little's law (eq. P1-P2): enough bytes in flight per SM
        ctas = min(H200.max_threads_per_sm // (32 * 4), H200.max_ctas_per_sm)
        assert s.block * itemsize_ * ctas >= H200.mem_bandwidth * H200.mem_latency_s / H200.sm_count
    assert s.block // (32 * s.num_warps) >= s.vec  # at least one 16-byte vector per thread


def test_reduction_single_pass_vs_looped(capsys):
    table = []
    for rows, cols, live, e in [(16384, 768, 5, 2), (16384, 4096, 5, 4), (16384, 32000, 3, 4), (16384, 64, 3, 4),
                                (192 * 1024, 1024, 3, 2), (1, 16384, 2, 4), (5, 33, 5, 4)]:
        s = reduction_schedule(rows, cols, live, e, H200)
        table.append(f"| {rows} x {cols} | live {live} | {e} B | {'looped' if s.looped else 'single'} | "
                     f"{s.block_rows}x{s.block_cols} | {s.num_warps} warps | {s.programs} programs |")
        assert s.looped == ((1 << (cols - 1).bit_length()) * live > 64 * 32 * 16)
        if not s.looped:
            assert s.block_cols >= cols and s.block_rows * s.block_cols * live // (32 * s.num_warps) <= 128
        else:
            assert s.block_cols < cols and s.block_rows == 1
        if rows >= 2 * H200.sm_count:
            assert s.programs >= 2 * H200.sm_count or s.block_rows == 1
    assert not reduction_schedule(16384, 768, 5, 2, H200).looped  # LayerNorm rows: one pass
    assert reduction_schedule(16384, 32000, 3, 4, H200).looped  # vocabulary rows: looped
    assert reduction_schedule(16384, 64, 3, 4, H200).block_rows > 1  # short rows packed per program
    with capsys.disabled():
        print("\n" + "\n".join(table))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("target", [H200, A100], ids=["H200", "A100"])
def test_attention_schedule(d, dtype, target):
    s = attention_schedule(16 * 12, 1024, 1024, d, d, dtype, target)
    e = itemsize(dtype)
    assert s.block_m == 128 and s.block_d == d
    cap = 128 if target.hopper else 96  # eq. A2 / A2'
    assert (s.block_m * s.block_dv + s.block_m * s.block_n) // (32 * s.num_warps) <= cap
    assert not attention_excluded(s.block_m, s.block_n, s.num_warps, target)
    assert s.block_m * s.block_d * e + s.num_stages * s.block_n * (s.block_d + s.block_dv) * e <= target.smem_per_block
    small = attention_schedule(2, 1024, 1024, d, d, dtype, target)  # few heads: smaller query blocks (eq. A1)
    assert small.block_m < s.block_m
    assert not attention_excluded(small.block_m, small.block_n, small.num_warps, target)
    tiny = attention_schedule(4, 19, 19, 16, 16, dtype, target)
    assert tiny.block_m == 32 and tiny.block_n == 32 and math.log2(tiny.block_d).is_integer()


def test_attention_avoids_the_tutorials_excluded_hopper_configs():
    # GPT-2 / Llama heads (d = 64): 128 x 64 on 4 warps on Hopper (was 8 warps: excluded there)
    s = attention_schedule(16 * 12, 1024, 1024, 64, 64, torch.bfloat16, H200)
    assert (s.block_m, s.block_n, s.num_warps) == (128, 64, 4)
    assert attention_excluded(128, 64, 8, H200) and not attention_excluded(128, 64, 8, A100)
    wide = attention_schedule(16 * 12, 1024, 1024, 128, 128, torch.bfloat16, H200)
    assert (wide.block_m, wide.block_n, wide.num_warps) == (128, 128, 8)
    for bh, length, d in [(1, 4096, 256), (8, 77, 80), (192, 1024, 32)]:
        t = attention_schedule(bh, length, length, d, d, torch.bfloat16, H200)
        assert not attention_excluded(t.block_m, t.block_n, t.num_warps, H200), t
