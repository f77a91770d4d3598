"""Flash attention forward (with log-sum-exp) and backward of codegen/triton/attention_train.py
(interpreter) against torch autograd through scaled_dot_product_attention: causal and not,
grouped-query heads, L != S, a head dim that is not a power of two, q/k/v read through the
strided views of a fused QKV projection, float32 (IEEE) and bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from novaforge.codegen.triton.attention_train import flash_attention_backward, flash_attention_forward


def _ref(q, k, v, causal, do):
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
    scores = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    o.backward(do.float())
    return o.detach(), torch.logsumexp(scores, -1).detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 37, 16), (1, 3, 1, 19, 33, 24)])  # B, Hq, Hk, L, S, D
def test_flash_attention_forward_backward_fp32(causal, shape):
    b, hq, hk, length, s, d = shape
    torch.manual_seed(5)
    q, k, v = torch.randn(b, hq, length, d), torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    do = torch.randn(b, hq, length, d)
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref = _ref(q, k, v, causal, do)
    o, lse = flash_attention_forward(q, k, v, causal=causal, tf32=False, block_m=16, block_n=16)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=causal, tf32=False, block_m=16, block_n=16)
    torch.testing.assert_close(dq, dq_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dk, dk_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dv, dv_ref, atol=1e-4, rtol=1e-4)


def test_flash_attention_strided_views_and_bf16():
    torch.manual_seed(6)
    b, t, h, d = 2, 21, 2, 32
    qkv = torch.randn(b, t, 3 * h * d).to(torch.bfloat16)
    q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=2))  # non-contiguous views
    do = torch.randn(b, h, t, d).to(torch.bfloat16)
    o_ref, _, dq_ref, dk_ref, dv_ref = _ref(q, k, v, True, do)
    o, lse = flash_attention_forward(q, k, v, causal=True)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(o.float(), o_ref, atol=2e-2, rtol=2e-2)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < 2e-2, err


@pytest.mark.parametrize("causal", [False, True])
def test_attention_records_cuda_implementation_matches_the_cpu_one(causal):
    """`attention_lse` / `attention_backward` on CUDA tensors run novaforge's Triton flash kernels
    (ir/ops/attention_cuda_impl.py); here the same code on CPU tensors (interpreter) against the
    records' CPU implementation (ATen's CPU flash): heads-last outputs, [B, H, L] logsumexp, GQA."""
    from novaforge.ir.ops import OPS
    from novaforge.ir.ops.attention_cuda_impl import attention_backward_cuda, attention_lse_cuda

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 19, 16), torch.randn(2, 2, 19, 16), torch.randn(2, 2, 19, 16)
    a = {"scale": 0.3, "causal": causal}
    out, lse = attention_lse_cuda([q, k, v], a)
    want_out, want_lse = OPS["attention_lse"].impl([q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)], a)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(want_out.transpose(-3, -2))
    o = out.transpose(-3, -2)
    dq, dk, dv = attention_backward_cuda([g, q, k, v, o, lse], a)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, scale=0.3, enable_gqa=True).backward(g)
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got.transpose(-3, -2), want, atol=1e-4, rtol=1e-4)
