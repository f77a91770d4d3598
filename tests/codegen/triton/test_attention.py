"""Flash-attention kernels (interpreter): causal, boolean padding masks (with fully masked
rows), additive masks, grouped-query heads, head dims 16/64/128, L != S, float32 / bfloat16 /
float16, q/k/v read through the views of a fused QKV projection, and an epilogue."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nf_triton_testing import check, kernel_kinds, rel_err

IEEE = {"tf32": False}


def sdpa(q, k, v, mask=None, causal=False, gqa=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_fp32(d, causal):
    q, k, v = (torch.randn(2, 3, 19, d) for _ in range(3))
    c = check(lambda q, k, v: sdpa(q, k, v, causal=causal), q, k, v, atol=1e-4, rtol=1e-4, options=IEEE)
    assert kernel_kinds(c) == {"attention": 1}


def test_attention_head_dim_128_and_uneven_lengths():
    q, k, v = torch.randn(1, 2, 7, 128), torch.randn(1, 2, 23, 128), torch.randn(1, 2, 23, 128)
    check(sdpa, q, k, v, atol=1e-4, rtol=1e-4, options=IEEE)
    check(lambda q, k, v: sdpa(q, k, v, causal=True), q, k, v, atol=1e-4, rtol=1e-4, options=IEEE)


def test_attention_masks():
    q, k, v = (torch.randn(2, 2, 19, 16) for _ in range(3))
    pad = torch.ones(2, 1, 19, 19, dtype=torch.bool)
    pad[0, :, :, 15:] = False  # padded keys
    pad[1, :, 3, :] = False  # a fully masked query row: zeros, as torch does
    check(lambda q, k, v, m: sdpa(q, k, v, m), q, k, v, pad, atol=1e-4, rtol=1e-4, options=IEEE)
    add = torch.randn(19, 19)
    add[:, 0] = float("-inf")
    check(lambda q, k, v, m: sdpa(q, k, v, m), q, k, v, add, atol=1e-4, rtol=1e-4, options=IEEE)


def test_grouped_query_heads():
    q = torch.randn(2, 4, 19, 16)
    k, v = torch.randn(2, 2, 19, 16), torch.randn(2, 2, 19, 16)
    check(lambda q, k, v: sdpa(q, k, v, causal=True, gqa=True), q, k, v, atol=1e-4, rtol=1e-4, options=IEEE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_attention(dtype):
    q, k, v = (torch.randn(2, 2, 19, 64, dtype=dtype) for _ in range(3))
    got = check(lambda q, k, v: sdpa(q, k, v, causal=True), q, k, v, atol=2e-2, rtol=2e-2)
    ref = sdpa(q.double(), k.double(), v.double(), causal=True)
    assert rel_err(got(q, k, v), ref) < 1e-2


def test_attention_reads_fused_qkv_views_and_fuses_an_epilogue():
    def f(qkv):  # [B, S, 3*H*D] -> heads, as GPT-2 does, then a cast epilogue
        b, s, _ = qkv.shape
        q, k, v = qkv.split(32, dim=2)
        heads = [t.view(b, s, 2, 16).transpose(1, 2) for t in (q, k, v)]
        return (sdpa(*heads, causal=True) * 2.0).to(torch.bfloat16)

    c = check(f, torch.randn(2, 19, 96), atol=2e-2, rtol=2e-2, options=IEEE)
    assert kernel_kinds(c)["attention"] == 1
