"""The decode-sized streaming path of nf_gemm (nf_gemv.cpp: float32, M <= 4 rows of A, 8 with row-major
B on AVX-512 builds; B read in place with one contiguous stream per thread) against float64 torch, and
against the library's other path (`ops.gemv_path(False)`), on both weight layouts: W [N, K]
(nn.Linear, `linear`) and B [K, N] row-major (Conv1D, `matmul`), with every epilogue, strided A,
accumulation, one or two threads, the tile callback with and without C, and the portable and AVX2
builds."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from novaforge.codegen.cpu.gemm import build, ops

ACTS = {"none": lambda x: x, "relu": torch.relu, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "silu": torch.nn.functional.silu}
SHAPES = [(1, 1), (5, 7), (17, 3), (768, 97), (130, 2304), (3, 64), (3072, 40), (1000, 1)]
TILE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_long, ctypes.POINTER(ctypes.c_float), ctypes.c_long,
                           ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)


def _close(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, post=lambda x: x) -> None:
    """got == post(a @ b) within float32 rounding of a K-long sum (bound from |a| @ |b|)."""
    ref = post(a.double() @ b.double())
    scale = a.double().abs() @ b.double().abs()
    tol = 6e-7 * math.sqrt(a.shape[1] + 1) * scale + 2e-6 * (1 + ref.abs())
    err = (got.double() - ref).abs()
    assert not (err > tol).any(), f"max err {err.max().item():.3g}"


def _operands(m: int, k: int, n: int, layout: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, 2 * k + 1, generator=g)[:, 1::2]  # column stride 2: staged by the library
    w = torch.randn(n, k, generator=g)
    b = w.t() if layout == "nt" else w.t().contiguous()
    return a, b, torch.randn(n, generator=g), torch.randn(m, n, generator=g)


def _product(layout: str, a: torch.Tensor, b: torch.Tensor, **kw) -> torch.Tensor:
    return ops.linear(a, b.t(), **kw) if layout == "nt" else ops.matmul(a, b, **kw)


def test_bound_can_fail():
    a, b, _, _ = _operands(2, 300, 50, "kn", 0)
    good = a @ b
    _close(good, a, b)
    with pytest.raises(AssertionError):
        _close(good + 1e-3 * good.abs().max(), a, b)


@pytest.mark.parametrize("layout", ["nt", "kn"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 8, 9])
@pytest.mark.parametrize("k,n", SHAPES)
def test_streaming_path_matches_torch_and_the_other_path(layout, m, k, n):
    a, b, bias, res = _operands(m, k, n, layout, m * 1000 + k + n)
    for threads in (1, 2):
        for on in (True, False):
            with ops.gemv_path(on):
                _close(_product(layout, a, b, nthreads=threads), a, b)
                act = ("relu", "gelu_tanh", "silu")[(m + k) % 3]
                got = _product(layout, a, b, bias=bias, act=act, residual=res, nthreads=threads)
                _close(got, a, b, lambda x, act=act: ACTS[act](x + bias.double()) + res.double())
                out = torch.randn(m, n)
                old = out.double()
                _product(layout, a, b, out=out, accumulate=True, nthreads=threads)
                _close(out, a, b, lambda x, old=old: x + old)


@pytest.mark.parametrize("layout", ["nt", "kn"])
@pytest.mark.parametrize("with_c", [True, False])
@pytest.mark.parametrize("M", [3, 7])
def test_tile_callback_sees_every_column_once(layout, with_c, M):
    """The callback gets each C chunk once, after the bias and activation; on the kn path C may be NULL
    (the chunk lives in a per-thread buffer). The nt path needs C (nf_sgemm_nt's contract)."""
    if layout == "nt" and not with_c:
        pytest.skip("the nt entries always have C")
    K, N = 300, 150
    a, b, bias, _ = _operands(M, K, N, layout, 7)
    a = a.contiguous()
    got = torch.full((M, N), float("nan"), dtype=torch.float64)
    seen = torch.zeros(M, N, dtype=torch.int32)

    def on_tile(ctx, batch, c, ldc, row0, col0, rows, cols):
        for i in range(rows):
            for j in range(cols):
                got[row0 + i, col0 + j] = c[i * ldc + j]
        seen[row0:row0 + rows, col0:col0 + cols] += 1

    fn = TILE_FN(on_tile)
    ep = build.Epilogue()
    ep.bias = bias.data_ptr()
    ep.act = build.ACTS["relu"]
    ep.tile_fn = ctypes.cast(fn, ctypes.c_void_p)
    out = torch.empty(M, N)
    c_ptr = out.data_ptr() if with_c else None
    lib = ops.lib()
    if layout == "nt":
        w = b.t()
        lib.nf_sgemm_nt(M, N, K, a.data_ptr(), K, 1, w.data_ptr(), K, c_ptr, N, 0, ctypes.byref(ep), 2)
    else:
        lib.nf_sgemm(M, N, K, a.data_ptr(), K, 1, b.data_ptr(), N, 1, c_ptr, N, 0, ctypes.byref(ep), 2)
    assert torch.equal(seen, torch.ones(M, N, dtype=torch.int32))
    _close(got.float(), a, b, lambda x: torch.relu(x + bias.double()))
    if with_c:
        torch.testing.assert_close(out.double(), got)


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_builds(isa):
    """The same path on the portable build (GCC vector extensions, 4 lanes) and the AVX2 one."""
    lib = build.load(isa, ())
    with ops.using(lib):
        for m, k, n in [(1, 5, 3), (4, 300, 70), (2, 1700, 37), (3, 33, 129), (7, 65, 40)]:
            for layout in ("nt", "kn"):
                a, b, bias, res = _operands(m, k, n, layout, k + n)
                _close(_product(layout, a, b, nthreads=2), a, b)
                got = _product(layout, a, b, bias=bias, act="silu", residual=res, nthreads=2)
                _close(got, a, b, lambda x: ACTS["silu"](x + bias.double()) + res.double())


def test_switch_reports_what_it_replaced():
    lib = ops.lib()
    before = lib.nf_gemm_set_gemv(0)
    try:
        assert lib.nf_gemm_set_gemv(0) == 0
    finally:
        lib.nf_gemm_set_gemv(before)
    assert before == 1


BF16_CASES = [("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]


@pytest.mark.parametrize("layout", ["nt", "kn"])
@pytest.mark.parametrize("dtypes", BF16_CASES, ids=lambda d: "x".join(d))
@pytest.mark.parametrize("m", [1, 3, 5, 8, 9])
@pytest.mark.parametrize("k,n", [(1, 1), (17, 3), (768, 97), (130, 2304), (3072, 40)])
def test_bf16_operands_stream_in_place(layout, dtypes, m, k, n):
    """bf16 A and / or bf16 W (decode of a bf16 model: half the weight bytes, converted in registers):
    equal to the float64 product of the same bf16 values, with and without the streaming path."""
    a, b, bias, res = _operands(m, k, n, layout, m * 31 + k + n)
    a16 = a.bfloat16() if dtypes[0] == "bf16" else a
    if dtypes[1] == "bf16":  # the same layout (W^T view or row-major) as the float32 operand
        b16 = b.t().bfloat16().t() if layout == "nt" else b.bfloat16()
    else:
        b16 = b
    assert b16.stride() == b.stride()
    a_ref, b_ref = a16.float(), b16.float()
    # rows the streaming path takes: nt 8 with a bf16 W (else 4); kn 8 on AVX-512 builds (else 4)
    streams = m <= (8 if (dtypes[1] == "bf16" if layout == "nt" else ops.isa() == "avx512") else 4)
    for threads in (1, 2):
        for on in (True, False):
            with ops.gemv_path(on):
                before = ops.bf16_counts()["stream"]
                _close(_product(layout, a16, b16, nthreads=threads), a_ref, b_ref)
                # the report's count of streamed bf16 products: exactly the calls that took the path
                assert ops.bf16_counts()["stream"] - before == int(on and streams)
                got = _product(layout, a16, b16, bias=bias, act="gelu_tanh", residual=res, nthreads=threads)
                _close(got, a_ref, b_ref, lambda x: ACTS["gelu_tanh"](x + bias.double()) + res.double())
                out = torch.randn(m, n)
                old = out.double()
                _product(layout, a16, b16, out=out, accumulate=True, nthreads=threads)
                _close(out, a_ref, b_ref, lambda x, old=old: x + old)


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_bf16_other_builds(isa):
    lib = build.load(isa, ())
    with ops.using(lib):
        for m, k, n in [(1, 5, 3), (4, 300, 70), (2, 1700, 37), (8, 33, 129)]:
            for layout in ("nt", "kn"):
                a, b, bias, _ = _operands(m, k, n, layout, k + n)
                a16 = a.bfloat16()
                b16 = b.t().bfloat16().t() if layout == "nt" else b.bfloat16()
                _close(_product(layout, a16, b16, bias=bias, nthreads=2), a16.float(), b16.float(),
                       lambda x: x + bias.double())
