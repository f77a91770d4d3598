"""Row-reduction kernels (interpreter): LayerNorm, RMSNorm, softmax, log-softmax, cross-entropy
forward, reductions over non-trailing axes, keepdim=False and full reductions, single-pass and
looped forms, 16-bit inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nf_triton_testing import check, kernel_kinds

LOOPED = {"max_reduction_block": 16}


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("options", [{}, LOOPED], ids=["single", "looped"])
def test_layernorm_rmsnorm_softmax(options):
    x = torch.randn(5, 33)
    w, b = torch.randn(33), torch.randn(33)
    c = check(_ln, x, w, b, atol=1e-5, rtol=1e-4, options=options)
    assert kernel_kinds(c) == {"reduction": 1}
    schedule = c.stats().program.kernels[0].schedule
    assert schedule.looped == bool(options)
    check(_rms, x, w, atol=1e-5, rtol=1e-4, options=options)
    check(lambda x: torch.softmax(x * 2, -1), torch.randn(7, 19), options=options)
    check(lambda x: torch.log_softmax(x, -1), torch.randn(3, 5, 37), atol=1e-5, options=options)


@pytest.mark.parametrize("options", [{}, LOOPED], ids=["single", "looped"])
def test_cross_entropy_forward(options):
    logits = torch.randn(7, 41)
    target = torch.randint(0, 41, (7,))
    target[2] = -100  # ignored
    check(lambda x, t: F.cross_entropy(x, t), logits, target, atol=1e-5, rtol=1e-5, options=options)
    check(lambda x, t: F.cross_entropy(x, t, reduction="none"), logits, target, atol=1e-5, options=options)


def test_non_trailing_axes_and_other_reductions():
    x = torch.randn(5, 33, 7)
    check(lambda x: x - x.sum(1, keepdim=True), x, atol=1e-5)
    check(lambda x: x / x.abs().amax((0, 2), keepdim=True), x)
    check(lambda x: x.amin(-1, keepdim=True) + x, x)
    check(lambda x: (x * 0.1 + 1).prod(-1, keepdim=True), torch.randn(3, 9), atol=1e-5)
    check(lambda x: x.sum(1), x, atol=1e-5)  # keepdim=False: a lone reduction
    check(lambda x: x.mean(), torch.randn(3, 50), atol=1e-6)
    check(lambda x: x.sum(0), torch.randint(-5, 5, (6, 4)))


def test_looped_reduction_with_two_dependent_passes():
    x = torch.randn(4, 70)
    c = check(lambda x: torch.softmax(x, -1) * x.sum(-1, keepdim=True), x, atol=1e-5, options=LOOPED)
    src = c.stats().program.kernels[0].source
    assert src.count("for c0 in range(0, 70, 16)") >= 2  # one loop per reduction wave + the output loop


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_norms(dtype):
    x = torch.randn(6, 40, dtype=dtype)
    w, b = torch.randn(40, dtype=dtype), torch.randn(40, dtype=dtype)
    check(_ln, x, w, b, atol=3e-2, rtol=3e-2)
    check(lambda x: torch.softmax(x, -1), x, atol=1e-2, rtol=2e-2)


def test_cross_entropy_rows_are_computed_in_place():
    """The CPU test's case (log_softmax and its gradient written over the logits) on Triton."""
    from nf_testing import cross_entropy_in_place_case

    cross_entropy_in_place_case("triton")


def test_outer_axis_reductions_in_tiles_when_asked():
    """`reduction_outer_tile` (experimental, off by default): a reduction over an outer axis (a
    bias gradient: the sum over tokens of a [tokens, features] value, with ops before and after)
    runs looped in [tile, tile] tiles of (kept, reduced) elements, coalesced along the kept axis;
    results equal eager's, masks included (sizes not multiples of the tile). Row reductions keep
    their schedule."""
    opts = {"reduction_outer_tile": 16}
    g = torch.randn(37, 50, dtype=torch.bfloat16)
    x = torch.randn(37, 50)
    c = check(lambda g, x: (g.float() * x).sum(0) * 0.5, g, x, atol=1e-4, rtol=1e-4, options=opts)
    (k,) = [k for k in c.stats().program.kernels if k.kind == "reduction"]
    assert "in0 + r + c * 50" in k.source  # (the kept axis along the tile's rows: contiguous)
    assert (k.schedule.block_rows, k.schedule.block_cols, k.schedule.looped) == (16, 16, True)
    assert k.grid == ((50 + 15) // 16,)
    c = check(lambda x: x.sum(0), torch.randn(3, 8), options=opts)
    assert c.stats().program.kernels[0].schedule.block_rows == 8  # (the kept axis rounded to its size)
    row = check(lambda x: x.sum(-1), torch.randn(37, 50), options=opts)
    assert row.stats().program.kernels[0].schedule.key() == check(lambda x: x.sum(-1), torch.randn(37, 50)
                                                                  ).stats().program.kernels[0].schedule.key()
