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
    c = compiled(torch.matmul, tf32=True)
    assert rel_err(c(a, b), a.double() @ b.double()) < 5e-4


def test_float32_precision_follows_torch_unless_the_option_says():
    """tf32=None (the default) does what eager's CUDA matmuls do: IEEE float32 under torch's
    default precision "highest", TF32 under "high"; tf32=True/False decide alone."""
    a, b = torch.randn(33, 40), torch.randn(24, 40)
    prev = torch.get_float32_matmul_precision()
    try:
        for precision, want in (("highest", "ieee"), ("high", "tf32")):
            torch.set_float32_matmul_precision(precision)
            c = compiled(lambda a, b: a @ b.t())
            c(a, b)
            assert c.stats().program.kernels[0].schedule.input_precision == want
        c = compiled(lambda a, b: a @ b.t(), tf32=False)
        c(a, b)
        assert c.stats().program.kernels[0].schedule.input_precision == "ieee"
    finally:
        torch.set_float32_matmul_precision(prev)


@pytest.mark.parametrize("layout", ["a@b", "a.T@b"])
def test_tf32_operand_not_k_major_runs_on_cublas(layout):
    """TF32 wgmma reads operands K-major only; Triton's other path ran at 0.25x cuBLAS on the
    H200. A row-major B or a column-major A (training's dX and dW) goes to a torch step with the
    reason; a@b.T (a Linear's forward) stays generated."""
    a = torch.randn(96, 80) if layout == "a@b" else torch.randn(80, 96)
    b = torch.randn(80, 72)
    fn = (lambda a, b: a @ b + 1.0) if layout == "a@b" else (lambda a, b: a.t() @ b + 1.0)
    c = compiled(fn, tf32=True)
    with torch.no_grad():
        torch.testing.assert_close(c(a, b), fn(a, b), atol=1e-3, rtol=1e-3)
    fallbacks = c.stats().program.info()["fallbacks"]
    assert len(fallbacks) == 1 and "not K-major: cuBLAS" in fallbacks[0]["reason"], fallbacks
    fast = compiled(lambda a, b: a @ b.t() + 1.0, tf32=True)
    fast(a if layout == "a@b" else a.t(), b.t().contiguous())
    assert not fast.stats().program.info()["fallbacks"] and kernel_kinds(fast) == {"matmul": 1}


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


@pytest.mark.parametrize("loader", ["pointer", "tma"])
@pytest.mark.parametrize("subtile", [1, 2, 4])
def test_persistent_matmul_with_epilogue_subtiles(loader, subtile):
    """A persistent grid of 3 programs walks the 4 tiles of a [27, 40] @ [40, 72] GEMM (the batch
    folded into rows; 16x64 tiles, edges masked); the epilogue (bias, GELU, residual) runs once
    per column subtile."""
    w, bias = torch.randn(72, 40), torch.randn(72)

    def f(x, r):
        return F.gelu(F.linear(x, w, bias), approximate="tanh") + r

    x, r = torch.randn(3, 9, 40), torch.randn(3, 9, 72)
    opts = {"tf32": False, "matmul_loader": loader, "matmul_persistent": "on", "matmul_tile": (16, 64),
            "matmul_programs": 3, "matmul_subtile": subtile}
    c = check(f, x, r, atol=1e-4, rtol=1e-4, options=opts)
    (k,) = c.stats().program.kernels
    assert k.grid == (3, 1) and k.schedule.persistent and k.schedule.subtile == subtile
    assert "tl.range(tl.program_id(0)" in k.source and k.source.count("tl.split(") == subtile - 1
    assert k.uses_tma == (loader == "tma")


def test_persistent_batched_matmul():
    a, b = torch.randn(3, 37, 29), torch.randn(3, 29, 45)
    opts = {"tf32": False, "matmul_persistent": "on", "matmul_programs": 4, "matmul_tile": (32, 32),
            "matmul_subtile": 2}
    c = check(torch.bmm, a, b, atol=1e-4, rtol=1e-4, options=opts)
    (k,) = c.stats().program.kernels
    assert k.grid == (4, 1) and "pid_b = tile // 4" in k.source  # 2 x 2 tiles per batch


def test_tf32_constant_row_major_weight_is_read_k_major():
    """TF32 wgmma reads B only K-major: a frozen [K, N] weight (GPT-2's Conv1D) is read from a copy
    transposed once at build; 16-bit weights, nn.Linear weights ([N, K]) and non-frozen
    parameters are read in place."""
    w = torch.randn(40, 24)
    x = torch.randn(7, 40)
    c = compiled(lambda x: x @ w + 1.0, freeze=True, tf32=True)
    got = c(x)
    assert rel_err(got, x.double() @ w.double() + 1.0) < 5e-4
    info = c.stats().program.info()
    assert info["transposed_weights"] == {"count": 1, "bytes": w.numel() * 4}
    src = c.stats().program.kernels[0].source
    assert "(rk * 1)[:, None] + (rbn * 40)[None, :]" in src  # B element (k, n) at n * K + k
    lin = torch.nn.Linear(40, 24)
    with torch.no_grad():
        c2 = compiled(lin, freeze=True, tf32=True)
        torch.testing.assert_close(c2(x), lin(x), atol=1e-2, rtol=1e-2)
    assert "transposed_weights" not in c2.stats().program.info()
    wb = w.to(torch.bfloat16)
    c3 = compiled(lambda x: x @ wb, freeze=True, tf32=True)
    c3(x.to(torch.bfloat16))
    assert "transposed_weights" not in c3.stats().program.info()
    ieee = compiled(lambda x: x @ w, freeze=True, tf32=False)
    ieee(x)
    assert "transposed_weights" not in ieee.stats().program.info()
