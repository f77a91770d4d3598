"""The profile adds up: every launch timed and attributed by kernel ordinal, kernels + measured
overhead = the wall time of the same calls; rooflines from measured peaks."""

from __future__ import annotations

import torch
from torch import nn

import novaforge
from novaforge.report.metrics import kernel_rows
from novaforge.report.peaks import Peaks, machine_peaks
from novaforge.report.roofline import format_profile, profile_program, roofline


def _profiled(fn, *args, runs=5):
    c = novaforge.compile(fn, backend="cpu", freeze=True, profile=True)
    with torch.no_grad():
        c(*args)
    return c, profile_program(c, args, {}, runs=runs)


def test_every_kernel_is_timed_including_torch_steps():
    def f(x):
        return torch.cumsum(torch.tanh(x), 1) * 3 + 1  # cumsum runs as a torch step

    x = torch.randn(64, 256)
    c, prof = _profiled(f, x)
    program = c.stats().program
    assert {st.kind for st in program.steps} >= {"seg", "torch"}
    rows = kernel_rows(c.stats().graph)
    assert len(prof.per_kernel) == len(rows) >= 3
    assert all(t > 0 for t in prof.per_kernel), prof.per_kernel
    torch_ordinals = [st.kernel for st in program.steps if st.kind == "torch"]
    assert all(prof.per_kernel[o] > 0 for o in torch_ordinals)
    assert abs(sum(r.seconds for r in prof.rows) - prof.kernels_s) < 1e-9
    assert sum(r.launches for r in prof.rows) == len(rows)
    assert prof.calls == 5


def test_kernels_plus_overhead_match_the_wall_time():
    # ~2 GFLOP per call (10-50 ms here): the wrapper's microseconds, and a time slice lost to another
    # process while in Python, stay far below 10% of the wall time
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024)).eval()
    x = torch.randn(128, 1024)
    _, prof = _profiled(model, x, runs=8)
    assert prof.wall_s > 0 and prof.kernels_s > 0 and prof.overhead_s >= 0
    # measured independently (wall outside the call, kernels inside the generated code)
    assert prof.accounted_s <= prof.wall_s * 1.02
    assert abs(prof.unaccounted_s) / prof.wall_s < 0.10, prof.summary()
    text = format_profile(prof)
    assert text.startswith("kernels ") and " + runtime overhead " in text and " wall " in text
    assert "GFLOP/s FMA (measured" in text


def test_shared_name_kernels_each_get_their_time():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    c, prof = _profiled(model, torch.randn(32, 64))
    names = [r["name"] for r in kernel_rows(c.stats().graph)]
    assert len(names) > len(set(names))  # consecutive kernels of one name (the old label matching lost them)
    assert all(t > 0 for t in prof.per_kernel)


def test_gather_bytes_count_only_the_rows_read():
    emb = nn.Embedding(10000, 64).eval()
    ids = torch.randint(0, 10000, (1, 8))
    c = novaforge.compile(emb, backend="cpu", freeze=True)
    with torch.no_grad():
        torch.testing.assert_close(c(ids), emb(ids))
    (row,) = kernel_rows(c.stats().graph)
    assert row["ops"] == ["take"]
    assert row["bytes"] == 8 * 64 * 4 * 2 + 8 * 8  # rows read + written + the ids, not the 2.5 MB table


def test_roofline_never_above_the_roof_without_a_reason():
    p = Peaks(flops=100e9, dram_bw=10e9, cache_bw=50e9, cache_bytes=2**20, threads=2, flops_source="measured")
    eff, bound, cache = roofline(1e9, 1e6, 0.02, p)  # 1 GFLOP in 20 ms: half the FLOP roof
    assert (round(eff, 3), bound, cache) == (0.5, "compute", False)
    eff, bound, cache = roofline(0, 1e6, 50e-6, p)  # 20 GB/s: above DRAM, fits in cache
    assert cache and bound == "memory" and round(eff, 3) == 0.4
    eff, _, cache = roofline(0, 1e8, 5e-3, p)  # 20 GB/s on 100 MB: not cache-resident, stays > 1 (flagged)
    assert not cache and eff > 1


def test_measured_peaks_are_plausible():
    p = machine_peaks()
    assert p.flops_source == "measured"
    assert 1e9 < p.flops < 1e13 and 1e9 < p.dram_bw <= p.cache_bw < 1e13
