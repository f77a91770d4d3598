"""Matmul kernels (interpreter): odd shapes, K tails, batched and broadcast batches, operands
read through transposes and slices, fused epilogues (bias, activation, residual, cast, several
outputs), float32 (TF32 and IEEE), bfloat16 and float16, and the TMA-descriptor loader."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nf_triton_testing import check, compiled, kernel_kinds, rel_err


def _ref64(fn, *args):
    return fn(*[a.double() if a.is_floating_point() else a for a in args])


@pytest.mark.parametrize("shape", [(37, 29, 45), (5, 16, 3), (1, 70, 17), (64, 32, 48)])
def test_matmul_2d_float32_ieee(shape):
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = check(torch.matmul, a, b, atol=1e-4, rtol=1e-4, options={"tf32": False})
    assert kernel_kinds(c) == {"matmul": 1}


def test_matmul_tf32_error_is_tf32_sized():
    a, b = torch.randn(65, 130), torch.randn(130, 33)
    c = compiled(torch.matmul)
    assert rel_err(c(a, b), a.double() @ b.double()) < 5e-4


@pytest.mark.parametrize("loader", ["pointer", "tma"])
def test_linear_epilogue_bias_gelu_residual(loader):
    w1, b1 = torch.randn(24, 16), torch.randn(24)
    w2, b2 = torch.randn(16, 24), torch.randn(16)

    def f(x):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        return x + F.linear(h, w2, b2), h

    x = torch.randn(3, 5, 16)
    c = check(f, x, atol=1e-4, rtol=1e-4, options={"tf32": False, "matmul_loader": loader})
    kinds = kernel_kinds(c)
    assert kinds == {"matmul": 2}, kinds
    loaders = {k.schedule.loader for k in c.stats().program.kernels}
    assert loaders == {loader}
    assert any(k.uses_tma for k in c.stats().program.kernels) == (loader == "tma")


def test_batched_and_broadcast_batches():
    check(torch.bmm, torch.randn(3, 19, 24), torch.randn(3, 24, 17), atol=1e-4, rtol=1e-4,
          options={"tf32": False})
    check(torch.matmul, torch.randn(2, 3, 9, 20), torch.randn(3, 20, 7), atol=1e-4, rtol=1e-4,
          options={"tf32": False})
    check(torch.matmul, torch.randn(2, 1, 9, 20), torch.randn(2, 3, 20, 7), atol=1e-4, rtol=1e-4,
          options={"tf32": False})


def test_transposed_and_sliced_operands():
    a, b = torch.randn(20, 33), torch.randn(17, 20)
    opts = {"tf32": False}
    check(lambda a, b: a.t() @ b.t(), a, b, atol=1e-4, rtol=1e-4, options=opts)
    check(lambda a, b: a[:, 3:20] @ b[2:, :5] * 2.0, torch.randn(9, 30), torch.randn(19, 6), atol=1e-4,
          rtol=1e-4, options=opts)
    q = torch.randn(2, 7, 4, 8)
    check(lambda q: q.transpose(1, 2) @ q.permute(0, 2, 3, 1), q, atol=1e-4, rtol=1e-4, options=opts)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loader", ["pointer", "tma"])
def test_16bit_matmul_with_epilogue(dtype, loader):
    w = torch.randn(48, 40, dtype=dtype) / 6
    bias = torch.randn(48, dtype=dtype)

    def f(x, r, w, bias):
        return F.silu(F.linear(x, w, bias)) * r

    x, r = torch.randn(2, 17, 40, dtype=dtype), torch.randn(2, 17, 48, dtype=dtype)
    c = compiled(f, matmul_loader=loader)
    got = c(x, r, w, bias)
    assert got.dtype == dtype
    assert kernel_kinds(c) == {"matmul": 1}
    assert rel_err(got, _ref64(f, x, r, w, bias)) < 1e-2
    assert rel_err(got, f(x, r, w, bias)) < 1e-2


def test_matmul_output_and_cast_epilogue_outputs():
    def f(a, b):
        y = a @ b
        return y, (y * 2).to(torch.bfloat16), y.relu().sum(-1, keepdim=True)

    check(f, torch.randn(18, 32), torch.randn(32, 20), atol=1e-2, rtol=1e-2, options={"tf32": False})


def test_empty_k_and_empty_output():
    check(torch.matmul, torch.randn(5, 0), torch.randn(0, 7), options={"tf32": False})
    check(torch.matmul, torch.randn(0, 4), torch.randn(4, 7), options={"tf32": False}, all_triton=False)
