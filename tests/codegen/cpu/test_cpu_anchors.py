"""Matmul (library + generated epilogue) and attention kernels against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check

import novaforge


def _r(*shape):
    return torch.randn(shape)


def test_linear_bias_gelu_residual():
    lin = torch.nn.Linear(33, 47).eval()

    def f(x, r):
        return F.gelu(lin(x)) + r

    check(f, _r(2, 5, 33), _r(2, 5, 47), atol=1e-5, rtol=1e-4)


def test_matmul_no_epilogue_and_transposed():
    check(lambda a, b: a @ b, _r(7, 19), _r(19, 5), atol=1e-5, rtol=1e-4)
    check(lambda a, b: a @ b.t(), _r(7, 19), _r(5, 19), atol=1e-5, rtol=1e-4)
    check(lambda a, b: torch.relu(a.t() @ b) * 2, _r(19, 7), _r(19, 5), atol=1e-5, rtol=1e-4)


def test_batched_broadcast_matmul_epilogue_two_outputs():
    def f(a, b, c):
        y = torch.matmul(a, b) + c
        return y, y * y

    check(f, _r(2, 3, 7, 11), _r(11, 6), _r(6), atol=1e-5, rtol=1e-4)
    check(lambda a, b: torch.bmm(a, b).tanh(), _r(4, 5, 6), _r(4, 6, 3), atol=1e-5, rtol=1e-4)


def test_weight_gradient_with_a_fused_update_prefetches_its_epilogue_rows():
    """A GEMM whose epilogue reads and updates [M, N] tensors in place (an optimizer step fused
    into a weight gradient: C is kept in a per-thread buffer) gets a tile prefetch function that
    prefetches the rows of every such tensor once (a store to a loaded buffer is not prefetched
    again); the results equal eager's, with several row and column blocks."""
    from pathlib import Path

    def f(dy, x, p, m):
        g = dy.t() @ x
        m.mul_(0.9).add_(g, alpha=0.1)
        p.sub_(0.01 * m)
        return p.sum()

    dy, x = _r(300, 96), _r(300, 130)
    p, m = _r(96, 130), _r(96, 130)
    ref_p, ref_m = p.clone(), m.clone()
    ref = f(dy, x, ref_p, ref_m)
    c = novaforge.compile(f, backend="cpu")
    with torch.no_grad():
        got = c(dy, x, p, m)
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(p, ref_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m, ref_m, atol=1e-5, rtol=1e-5)
    src = "".join(f.read_text() for f in Path(c.stats().program.info["source_dir"]).glob("*.cpp"))
    pf = src[src.index("_tile_pf(void* ctx"):]
    pf = pf[:pf.index("\n}\n")]
    assert pf.count("nf_pf_row(") == 4, pf  # p and m read, each maybe stored elsewhere: loads 2, guarded stores 2
    assert "_tile_pf};" in src


def test_matmul_epilogue_cast_and_zero_size():
    check(lambda a, b: (a @ b).to(torch.bfloat16), _r(4, 8), _r(8, 3), atol=1e-2, rtol=1e-2)
    check(lambda a, b: (a @ b) + 1, _r(0, 8), _r(8, 3))
    check(lambda a, b: (a @ b) + 1, _r(3, 0), _r(0, 4))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_causal(causal):
    q, k, v = _r(2, 3, 9, 16), _r(2, 3, 9, 16), _r(2, 3, 9, 16)
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v, atol=1e-5, rtol=1e-4)


def test_attention_masks_and_gqa():
    q, k, v = _r(1, 4, 7, 8), _r(1, 2, 11, 8), _r(1, 2, 11, 8)
    mask = torch.rand(1, 1, 7, 11) > 0.3
    mask[..., 0] = True
    fmask = torch.randn(1, 4, 7, 11)
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True), q, k, v, mask,
          atol=1e-5, rtol=1e-4)
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True, scale=0.3),
          q, k, v, fmask, atol=1e-5, rtol=1e-4)


def test_attention_from_packed_qkv_with_epilogue():
    def f(x):
        q, k, v = x.split(16, dim=-1)
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(2, 5, 16) * 2

    check(f, _r(2, 5, 48), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("L,S,causal", [(200, 200, True), (5, 300, False), (37, 150, True), (150, 37, True)])
def test_flash_attention_tiles(L, S, causal):
    q, k, v = _r(1, 3, L, 64), _r(1, 3, S, 64), _r(1, 3, S, 48)
    c, _ = check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v,
                 atol=1e-5, rtol=1e-4)
    info = c.stats().program.info
    assert info["library"] == 0, "attention did not run the generated flash kernel"


@pytest.mark.parametrize("E", [40, 24, 16])
def test_flash_attention_head_dims_off_the_register_block(E):
    """K^T is packed W x W keys and head dims at a time in registers (nf_transpose_into); head
    dims that are not a multiple of W, and key counts with a partial block, take the edge loops."""
    q, k, v = _r(2, 3, 45, E), _r(2, 3, 45, E), _r(2, 3, 45, E)
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v, atol=1e-5, rtol=1e-4)
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), q, k, v, atol=1e-5, rtol=1e-4)


def test_flash_attention_fully_masked_rows():
    q, k, v = _r(1, 2, 6, 8), _r(1, 2, 70, 8), _r(1, 2, 70, 8)
    mask = torch.rand(1, 1, 6, 70) > 0.5
    mask[..., 2, :] = False  # a row with no key: zeros, as in eager
    mask[..., 3, :65] = False  # a row whose only keys are in the last tile
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v, mask, atol=1e-5,
          rtol=1e-4)


def _grouped_rows_ran(c) -> bool:
    """Did the program's attention run with the group's heads as one block's rows?"""
    from pathlib import Path

    src = Path(c.stats().program.info["source_dir"])
    return any("the group's first head" in f.read_text() for f in src.glob("*.cpp"))


@pytest.mark.parametrize("B,hq,hk,S,E,dtype", [(1, 12, 4, 160, 64, torch.float32), (2, 8, 1, 45, 40, torch.float32),
                                               (2, 16, 2, 300, 64, torch.float32), (1, 6, 3, 70, 32, torch.bfloat16)])
def test_decode_attention_with_grouped_heads_as_rows(B, hq, hk, S, E, dtype):
    """One query row of grouped-query heads (a decode step): a task per key/value head with the
    group's heads as rows. Masks per batch row and per head (a fully masked head gives zeros), a
    mask broadcast over heads with an unwritten cache tail, a float mask, causal and no mask."""
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-4}
    q, k, v = _r(B, hq, 1, E).to(dtype), _r(B, hk, S, E).to(dtype), _r(B, hk, S, E).to(dtype)
    per_head = torch.rand(B, hq, 1, S) > 0.4
    per_head[:, 1] = False  # one head sees no key: zeros, as in eager
    tail = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    tail[0, ..., : S // 3] = True
    tail[-1, ..., : S - 5] = True
    fmask = torch.randn(B, 1, 1, S).to(dtype)
    for mask in (per_head, tail, fmask):
        c, _ = check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True),
                     q, k, v, mask, **tol)
        assert _grouped_rows_ran(c) == (B * hk >= 2)
    for causal in (False, True):
        c, _ = check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True),
                     q, k, v, **tol)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_bf16(causal):
    q, k, v = (_r(1, 4, 70, 32).to(torch.bfloat16) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    c, _ = check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True),
                 q, k, v, atol=2e-2, rtol=2e-2)
    assert c.stats().program.info["library"] == 0
    mask = torch.randn(1, 1, 70, 70).to(torch.bfloat16)
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, q * 0.5, q, mask,
          atol=2e-2, rtol=2e-2)
