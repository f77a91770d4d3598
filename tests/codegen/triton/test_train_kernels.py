"""The training kernels of codegen/triton/train_kernels.py (interpreter) against torch: AdamW
steps against torch.optim.AdamW over a list of odd-sized tensors (float32 and bfloat16 grads,
a device-tensor step), LayerNorm / RMSNorm backward against autograd, cross-entropy forward and
backward over a vocabulary longer than one block, with ignored targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from novaforge.codegen.triton import train_kernels as tk

SHAPES = [(7, 5), (13,), (3, 4, 5), (1,), (1100,)]  # the last one spans two 1024-element chunks


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_fused_adamw_matches_torch(grad_dtype):
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    ours = [p.detach().clone() for p in ref]
    opt = torch.optim.AdamW(ref, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    m = [torch.zeros_like(p) for p in ours]
    v = [torch.zeros_like(p) for p in ours]
    grads = [torch.empty(s, dtype=grad_dtype) for s in SHAPES]
    step = torch.zeros(1)
    adamw = tk.MultiTensorAdamW(ours, grads, m, v)  # tables built once, reused every step
    for _ in range(3):
        for p, g in zip(ref, grads, strict=True):
            g.copy_(torch.randn(p.shape))
            p.grad = g.float()
        opt.step()
        step += 1
        adamw(step=step, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for p, q, mi, vi in zip(ref, ours, m, v, strict=True):
        st = opt.state[p]
        torch.testing.assert_close(q, p.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mi, st["exp_avg"], atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(vi, st["exp_avg_sq"], atol=1e-7, rtol=1e-5)


def test_fused_adamw_bf16_params_and_int_step():
    torch.manual_seed(1)
    p32 = torch.randn(37)
    p = p32.to(torch.bfloat16)
    g = torch.randn(37)
    m, v = torch.zeros(37), torch.zeros(37)
    want = p.float() - 0.25 * g / (g.abs() + 1e-8)  # step 1: m_hat = g, v_hat = g^2: a step of lr * sign(g)
    tk.fused_adamw_([p], [g], [m], [v], step=1, lr=0.25, weight_decay=0.0)
    # one bf16 ulp: the interpreter rounds float32 -> bfloat16 with a carry bug (docs/gpu-backend.md)
    torch.testing.assert_close(p.float(), want.to(torch.bfloat16).float(), atol=0, rtol=2 ** -7)
    torch.testing.assert_close(m, 0.1 * g)
    with pytest.raises(ValueError, match="not contiguous"):
        tk.MultiTensorAdamW([torch.randn(4, 4).t()], [torch.randn(4, 4)], [torch.zeros(4, 4)], [torch.zeros(4, 4)])


def _norm_ref(x, w, b, eps, rms):
    if rms:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * w if w is not None else y
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 37), (9, 300)])
def test_norm_backward_matches_autograd(rms, affine, shape):
    torch.manual_seed(2)
    n = shape[-1]
    x = torch.randn(shape, requires_grad=True)
    w = (torch.randn(n) * 0.5 + 1).requires_grad_() if affine else None
    b = torch.randn(n, requires_grad=True) if affine and not rms else None
    dy = torch.randn(shape)
    _norm_ref(x, w, b, 1e-5, rms).backward(dy)
    dx, dw, db = tk.norm_backward(dy, x.detach(), w.detach() if w is not None else None,
                                  b.detach() if b is not None else None, eps=1e-5, rms=rms)
    torch.testing.assert_close(dx, x.grad, atol=1e-5, rtol=1e-4)
    if affine:
        torch.testing.assert_close(dw, w.grad, atol=1e-4, rtol=1e-4)
    assert (db is None) == (b is None)
    if b is not None:
        torch.testing.assert_close(db, b.grad, atol=1e-4, rtol=1e-4)


def test_norm_backward_bf16():
    torch.manual_seed(3)
    x = torch.randn(6, 48).to(torch.bfloat16).requires_grad_()
    w = torch.randn(48).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(6, 48).to(torch.bfloat16)
    _norm_ref(x.float(), w.float(), None, 1e-6, True).backward(dy.float())
    dx, dw, _ = tk.norm_backward(dy, x.detach(), w.detach(), None, eps=1e-6, rms=True)
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.bfloat16
    torch.testing.assert_close(dx.float(), x.grad.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(dw.float(), w.grad.float(), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy_forward_backward(dtype, inplace):
    torch.manual_seed(4)
    rows, vocab = 11, 1000  # 4 blocks of 256 per row, the last one partial
    logits = (torch.randn(rows, vocab) * 3).to(dtype)
    target = torch.randint(0, vocab, (rows,))
    target[[2, 7]] = -100  # ignored rows
    ref = logits.float().requires_grad_()
    want = F.cross_entropy(ref, target, ignore_index=-100)
    want.backward(torch.tensor(2.0))
    loss, grad = tk.cross_entropy_forward_backward(logits.clone() if inplace else logits, target, grad_output=2.0,
                                                   inplace=inplace, block_v=256)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss, want.detach(), atol=tol, rtol=tol)
    assert grad.dtype == dtype and grad.shape == logits.shape
    torch.testing.assert_close(grad.float(), ref.grad, atol=tol / 10 if dtype == torch.float32 else 2e-3, rtol=tol)
    assert grad[2].abs().max() == 0 and grad[7].abs().max() == 0
    only, none = tk.cross_entropy_forward_backward(logits.view(1, rows, vocab), target.view(1, rows),
                                                   need_grad=False)
    assert none is None
    torch.testing.assert_close(only, want.detach(), atol=tol, rtol=tol)
