"""Tests of the CPU GEMM library (novaforge.codegen.cpu.gemm) against float64 torch references.

Every result is compared with a float64 product of the same (float32) inputs under a bound that
grows with sqrt(K) and with |A| @ |B|; the tests also check that a wrong answer would fail it
(torch's own float32 result passes, a perturbed one does not).
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import threading

import pytest
import torch

from novaforge.codegen.cpu import gemm
from novaforge.codegen.cpu.gemm import build, ops

torch.manual_seed(0)


def _ref(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a64, b64 = a.double(), b.double()
    return a64 @ b64, a64.abs() @ b64.abs()


def _check(c: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, K: int, slack: float = 1.0) -> None:
    tol = slack * (6e-7 * math.sqrt(K + 1) * scale + 1e-6 * (1 + ref.abs()))
    err = (c.double() - ref).abs()
    bad = err > tol
    assert not bad.any(), f"max err {err.max().item():.3g}, worst excess {(err - tol).max().item():.3g}"


def _acts() -> dict[str, object]:
    return {
        "none": lambda x: x,
        "relu": torch.relu,
        "gelu_erf": torch.nn.functional.gelu,
        "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "silu": torch.nn.functional.silu,
    }


def _b_layout(K: int, N: int, layout: str) -> torch.Tensor:
    if layout == "kn":
        return torch.randn(K, N)
    if layout == "weight_t":  # nn.Linear weight [N, K] seen as [K, N]: stride_k = 1
        return torch.randn(N, K).t()
    if layout == "row_padded":  # rows of a wider matrix: row-major, row stride N + 5 (read in place)
        return torch.randn(K, N + 5)[:, :N]
    if layout == "strided":  # every other column of a wider, row-padded matrix
        return torch.randn(K, 2 * N + 3)[:, 1 : 2 * N + 1 : 2]
    raise ValueError(layout)


SHAPES = [(1, 1, 1), (3, 17, 5), (17, 33, 3), (33, 255, 17), (6, 16, 16), (7, 1, 31), (128, 64, 48), (2, 300, 129),
          (255, 17, 33), (13, 513, 40), (9, 40, 1100),  # wide N: A is packed (many panels reuse it)
          (5, 1700, 37),  # long K: more than one K block
          (20, 2053, 96), (130, 1024, 97)]  # weight_t: staged transposes over several K blocks and chunks


def test_reference_bound_can_fail():
    a, b = torch.randn(33, 255), torch.randn(255, 17)
    ref, scale = _ref(a, b)
    _check(a @ b, ref, scale, 255)
    wrong = (a @ b).clone()
    wrong[5, 7] += 1e-3 * (1 + ref[5, 7].abs().item())
    with pytest.raises(AssertionError):
        _check(wrong, ref, scale, 255)


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("layout", ["kn", "row_padded", "weight_t", "strided"])
@pytest.mark.parametrize("packed", [True, False])
def test_matmul_matches_torch(M, K, N, layout, packed):
    a, b = torch.randn(M, K), _b_layout(K, N, layout)
    rhs = gemm.pack_b(b) if packed else b
    for nthreads in (1, 2, 3):
        c = gemm.matmul(a, rhs, nthreads=nthreads)
        ref, scale = _ref(a, b)
        _check(c, ref, scale, K)


@pytest.mark.parametrize("a_layout", ["transposed", "row_padded", "col_strided"])
def test_a_strides(a_layout):
    M, K, N = 29, 70, 37
    if a_layout == "transposed":
        a = torch.randn(K, M).t()
    elif a_layout == "row_padded":
        a = torch.randn(M, K + 9)[:, 4 : 4 + K]
    else:
        a = torch.randn(M, 2 * K)[:, ::2]
    b = torch.randn(K, N)
    ref, scale = _ref(a, b)
    for path in PATHS:
        _check(_product(path, a, b, nthreads=2), ref, scale, K)


@pytest.mark.parametrize("M,K,N", [(1537, 67, 130), (125, 1030, 64), (40, 33, 520)])
def test_column_major_a_as_in_weight_gradients(M, K, N):
    # dW = dY^T X: A column-major is packed per task; the 2-thread grid splits M or N by what it packs
    a = torch.randn(K, M).t()
    b = torch.randn(K, N)
    ref, scale = _ref(a, b)
    for path in ("unpacked", "row_major", "packed"):
        _check(_product(path, a, b, nthreads=2), ref, scale, K)


@pytest.mark.parametrize("b_kind", ["row_major", "strided", "bf16"])
def test_weight_gradient_packs_b_once_per_call(b_kind):
    """Column-major A with more rows than one row block holds (small cache sizes here; a tall dW
    on a real machine): B is packed once for the call, before the tasks, and every task reads
    those panels. With a bias + ReLU epilogue, an accumulating call, 1 and 2 threads, and a
    second, smaller call reusing the calling thread's buffer."""
    lib = ops.lib()
    lib.nf_gemm_set_cache_sizes(4096, 16384, 0)
    try:
        for M, K, N in ((301, 200, 70), (97, 40, 30)):
            a = torch.randn(K, M).t()
            b = torch.randn(K, N)
            if b_kind == "strided":
                b = torch.randn(N, K).t()
            elif b_kind == "bf16":
                b = b.bfloat16()
            ref, scale = _ref(a, b.float())
            bias = torch.randn(N)
            for nthreads in (1, 2):
                _check(gemm.matmul(a, b, nthreads=nthreads), ref, scale, K)
                got = gemm.matmul(a, b, bias=bias, act="relu", nthreads=nthreads)
                _check(got, torch.relu(ref + bias.double()), scale, K)
            c = torch.randn(M, N)
            before = c.double().clone()
            gemm.matmul(a, b, out=c, accumulate=True, nthreads=2)
            _check(c, before + ref, scale + before.abs(), K)
    finally:
        lib.nf_gemm_set_cache_sizes(*build.cache_sizes().values())


def _product(path: str, a: torch.Tensor, b: torch.Tensor, **kw) -> torch.Tensor:
    """a @ b (+ epilogue) through one of the library's paths: packed B, B packed on the fly (as given or
    as a row-major copy), or the dot-product kernel on b.t()."""
    if path == "packed":
        return gemm.matmul(a, gemm.pack_b(b), **kw)
    if path == "unpacked":
        return gemm.matmul(a, b, **kw)
    if path == "row_major":
        return gemm.matmul(a, b.contiguous(), **kw)
    if path == "nt":
        return gemm.linear(a, b.t().contiguous(), **kw)
    raise ValueError(path)


PATHS = ["packed", "unpacked", "row_major", "nt"]


@pytest.mark.parametrize("act", list(_acts()))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_epilogue(act, with_bias, with_residual, path):
    M, K, N = 37, 70, 45
    a, b = torch.randn(M, K), torch.randn(N, K).t()
    bias = torch.randn(N) if with_bias else None
    residual = torch.randn(M, N + 5)[:, :N] if with_residual else None  # row stride != N
    c = _product(path, a, b, bias=bias, act=act, residual=residual, nthreads=2)
    pre, scale = _ref(a, b)
    if bias is not None:
        pre = pre + bias.double()
    ref = _acts()[act](pre)
    if residual is not None:
        ref = ref + residual.double()
    _check(c, ref, scale, K, slack=1.5)


# (112, 300, 70): the dot-product kernel above the packing threshold; (128, 1024, 40): rows aliasing in L1, staged
@pytest.mark.parametrize("M,K,N", SHAPES + [(64, 8, 64), (3, 24, 1000), (112, 300, 70), (128, 1024, 40)])
@pytest.mark.parametrize("w_layout", ["contiguous", "row_padded"])
def test_linear_matches_torch(M, K, N, w_layout):
    """The dot-product kernel on W [N, K] read in place: K tails (K % 8), row/column remainders."""
    a = torch.randn(M, K)
    w = torch.randn(N, K) if w_layout == "contiguous" else torch.randn(N, K + 7)[:, 2 : 2 + K]
    ref, scale = _ref(a, w.t())
    for nthreads in (1, 2, 3):
        _check(gemm.linear(a, w, nthreads=nthreads), ref, scale, K)


@pytest.mark.parametrize("path", ["row_major", "nt"])
def test_accumulate_and_k_zero_unpacked(path):
    M, K, N = 20, 33, 19
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    c0 = torch.randn(M, N)
    c = c0.clone()
    _product(path, a, b, bias=bias, act="relu", out=c, accumulate=True, nthreads=2)
    pre, scale = _ref(a, b)
    _check(c, torch.relu(pre + c0.double() + bias.double()), scale, K)
    z = _product(path, torch.randn(M, 0), torch.randn(0, N), bias=bias, act="relu")
    assert torch.equal(z, torch.relu(bias).expand(M, N))
    c = c0.clone()
    _product(path, torch.randn(M, 0), torch.randn(0, N), out=c, accumulate=True)
    assert torch.equal(c, c0)
    assert gemm.linear(torch.randn(0, 8), torch.randn(5, 8)).shape == (0, 5)
    assert gemm.linear(torch.randn(4, 8), torch.randn(0, 8)).shape == (4, 0)


# 96 <= M <= 128 with W rows aliasing in L1 (the row stride a multiple of 1024 floats): the dot-product
# kernel on staged groups of W rows for float32 A (K = 2048 and 3072 take several K blocks), W packed on
# the fly for M > 128 (200, 255)
@pytest.mark.parametrize("M,K,N,ldw", [(96, 1024, 37, 1024), (128, 1000, 70, 1024), (200, 33, 13, 33),
                                       (120, 2048, 50, 2048), (100, 3072, 6, 3072), (97, 1024, 1, 1024),
                                       (255, 2048, 50, 2048)])
def test_linear_many_rows(M, K, N, ldw):
    """C = act(A @ W^T + C_old + bias) + residual with W [N, K] read in place (row stride ldw), 1-3
    threads; A contiguous, column-strided and bf16; every element checked against float64."""
    w = torch.randn(N, ldw)[:, :K]
    bias, res, c0 = torch.randn(N), torch.randn(M, N), torch.randn(M, N)
    for a in (torch.randn(M, K), torch.randn(K, M).t(), torch.randn(M, K).bfloat16()):
        pre, scale = _ref(a.float(), w.t())
        ref = torch.nn.functional.gelu(pre + c0.double() + bias.double(), approximate="tanh") + res.double()
        for nthreads in (1, 2, 3):
            _check(gemm.linear(a, w, nthreads=nthreads), pre, scale, K)
            c = gemm.linear(a, w, bias=bias, act="gelu_tanh", residual=res, out=c0.clone(), accumulate=True,
                            nthreads=nthreads)
            _check(c, ref, scale, K, slack=1.5)


def test_linear_rejects_bad_weights():
    with pytest.raises(ValueError):
        gemm.linear(torch.randn(4, 8), torch.randn(8, 5).t())  # not contiguous along K
    with pytest.raises(ValueError):
        gemm.linear(torch.randn(4, 8), torch.randn(5, 7))


def test_accumulate_and_k_zero():
    M, K, N = 20, 33, 19
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    c0 = torch.randn(M, N)
    c = c0.clone()
    gemm.matmul(a, gemm.pack_b(b), bias=bias, act="relu", out=c, accumulate=True)
    pre, scale = _ref(a, b)
    _check(c, torch.relu(pre + c0.double() + bias.double()), scale, K)
    # K = 0: the product is zero, the epilogue still applies
    z = gemm.matmul(torch.randn(M, 0), torch.randn(0, N), bias=bias)
    assert torch.equal(z, bias.expand(M, N))
    c = c0.clone()
    gemm.matmul(torch.randn(M, 0), gemm.pack_b(torch.randn(0, N)), out=c, accumulate=True)
    assert torch.equal(c, c0)


def test_zero_size_m_n():
    assert gemm.matmul(torch.randn(0, 8), torch.randn(8, 5)).shape == (0, 5)
    assert gemm.matmul(torch.randn(4, 8), gemm.pack_b(torch.randn(8, 0))).shape == (4, 0)
    assert gemm.bmm(torch.randn(0, 3, 4), torch.randn(0, 4, 5)).shape == (0, 3, 5)


@pytest.mark.parametrize("path", ["packed", "unpacked", "nt"])
def test_block_writes_only_its_block(path):
    M, K, N = 50, 40, 77
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    residual = torch.randn(M, N)
    pre, scale = _ref(a, b)
    ref = torch.nn.functional.gelu(pre + bias.double()) + residual.double()
    w = b.t().contiguous()
    for rows, cols in [((0, M), (0, N)), ((3, 17), (5, 29)), ((49, 50), (76, 77)), ((10, 40), (16, 48)),
                       ((0, 1), (0, 77)), ((7, 7), (0, 5))]:
        out = torch.full((M, N), float("nan"))
        if path == "nt":
            gemm.linear_block(a, w, out, rows, cols, bias=bias, act="gelu", residual=residual)
        else:
            rhs = gemm.pack_b(b) if path == "packed" else b
            gemm.matmul_block(a, rhs, out, rows, cols, bias=bias, act="gelu", residual=residual)
        inside = torch.zeros(M, N, dtype=torch.bool)
        inside[rows[0] : rows[1], cols[0] : cols[1]] = True
        assert out[~inside].isnan().all()
        _check(out[inside].view(-1), ref[inside].view(-1), scale[inside].view(-1), K, slack=1.5)


def test_blocks_from_partition_cover_the_product():
    lib = ops.lib()
    M, K, N = 128, 96, 200
    a, b = torch.randn(M, K), torch.randn(K, N)
    pb = gemm.pack_b(b)
    tm, tn = ctypes.c_long(), ctypes.c_long()
    lib.nf_gemm_partition(M, N, K, 2, ctypes.byref(tm), ctypes.byref(tn))
    assert tm.value * tn.value >= 2
    out = torch.full((M, N), float("nan"))
    rows = [round(M * i / tm.value) for i in range(tm.value + 1)]
    cols = [round(N * j / tn.value) for j in range(tn.value + 1)]
    for i in range(tm.value):
        for j in range(tn.value):
            gemm.matmul_block(a, pb, out, (rows[i], rows[i + 1]), (cols[j], cols[j + 1]))
    ref, scale = _ref(a, b)
    _check(out, ref, scale, K)


@pytest.mark.parametrize("batch", [1, 3, 12])
def test_bmm(batch):
    S, d = 37, 24
    q, k, v = torch.randn(batch, S, d), torch.randn(batch, S, d), torch.randn(batch, S, d)
    # attention-like: q @ k^T (B transposed through strides), then p @ v with a residual
    s = gemm.bmm(q, k.transpose(1, 2), nthreads=2)
    ref, scale = _ref(q, k.transpose(1, 2))
    _check(s, ref, scale, d)
    res = torch.randn(batch, S, d)
    o = gemm.bmm(s, v, residual=res, nthreads=2)
    ref2, scale2 = _ref(s, v)
    _check(o, ref2 + res.double(), scale2, S)
    # shared packed weights across the batch, with bias and activation
    w, bias = torch.randn(d, 50), torch.randn(50)
    y = gemm.bmm(q, gemm.pack_b(w), bias=bias, act="silu", nthreads=3)
    ref3, scale3 = _ref(q, w.expand(batch, d, 50))
    _check(y, torch.nn.functional.silu(ref3 + bias.double()), scale3, d, slack=1.5)


def test_bf16_inputs():
    M, K, N = 33, 70, 45
    a, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    c = gemm.matmul(a, gemm.pack_b(w.t()), nthreads=2)
    assert c.dtype == torch.float32
    ref, scale = _ref(a.float(), w.float().t())
    _check(c, ref, scale, K)
    # unpacked (packed on the fly) bf16 B, as W^T and row-major, with float32 or bf16 A
    for lhs in (a, a.float()):
        for rhs in (w.t(), w.t().contiguous()):
            _check(gemm.matmul(lhs, rhs, nthreads=2), ref, scale, K)
    # column-major bf16 A (packed block by block, k-major chunks)
    at = a.t().contiguous().t()
    assert at.stride() == (1, M)
    _check(gemm.matmul(at, w.t().contiguous(), nthreads=2), ref, scale, K)


@pytest.mark.parametrize("dtypes", [("bf16", "f32"), ("f32", "bf16"), ("bf16", "bf16")])
def test_linear_bf16(dtypes):
    M, K, N = 33, 70, 45
    conv = {"bf16": torch.bfloat16, "f32": torch.float32}
    a, w, bias = torch.randn(M, K).to(conv[dtypes[0]]), torch.randn(N, K).to(conv[dtypes[1]]), torch.randn(N)
    c = gemm.linear(a, w, bias=bias, act="silu", nthreads=2)
    assert c.dtype == torch.float32
    ref, scale = _ref(a.float(), w.float().t())
    _check(c, torch.nn.functional.silu(ref + bias.double()), scale, K, slack=1.5)
    at = torch.randn(K, M).to(conv[dtypes[0]]).t()  # strided bf16/f32 A
    ref2, scale2 = _ref(at.float(), w.float().t())
    _check(gemm.linear(at, w), ref2, scale2, K)


def test_small_cache_blocking_exercises_all_loops():
    lib = ops.lib()
    saved = ops.blocking()
    try:
        lib.nf_gemm_set_cache_sizes(4096, 16384, 0)  # short K blocks, few rows and panels per block
        small = ops.blocking()
        assert small["kc"] < 300 <= saved["kc"]  # K = 300 below takes 2 K blocks now, 1 by default
        a, b, bias, res = torch.randn(70, 300), torch.randn(300, 100), torch.randn(100), torch.randn(70, 100)
        pre, scale = _ref(a, b)
        ref = torch.nn.functional.gelu(pre + bias.double(), approximate="tanh") + res.double()
        for path in PATHS:
            c = _product(path, a, b, bias=bias, act="gelu_tanh", residual=res, nthreads=2)
            _check(c, ref, scale, 300, slack=1.5)
        # the dot-product kernel (M < 96): K blocks (partial sums in C), several row blocks, accumulate
        a2, w2 = torch.randn(90, 300), torch.randn(70, 300)
        c0 = torch.randn(90, 70)
        c = gemm.linear(a2, w2, bias=bias[:70], act="relu", out=c0.clone(), accumulate=True, nthreads=2)
        pre2, scale2 = _ref(a2, w2.t())
        _check(c, torch.relu(pre2 + c0.double() + bias[:70].double()), scale2, 300)
    finally:
        lib.nf_gemm_set_cache_sizes(*build.cache_sizes().values())
    assert ops.blocking() == saved


_TILE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_long, ctypes.POINTER(ctypes.c_float), ctypes.c_long,
                            ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)


def _relu_epilogue_with_tile_fn(bias: torch.Tensor, on_tile):
    """An epilogue adding `bias` and applying ReLU, then calling the Python `on_tile(ctx, batch, c,
    ldc, row0, col0, rows, cols)`; returns (epilogue, callback), the callback kept alive by the caller."""
    fn = _TILE_FN(on_tile)
    ep = build.Epilogue()
    ep.bias = bias.data_ptr()
    ep.act = build.ACTS["relu"]
    ep.tile_fn = ctypes.cast(fn, ctypes.c_void_p)
    return ep, fn


@pytest.mark.parametrize("path", ["packed", "nt", "nt_many_rows"])
def test_tile_callback_sees_final_tiles_once(path):
    M, K, N = (112, 1024, 150) if path == "nt_many_rows" else (40, 30, 150)
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    ref = torch.relu(a.double() @ b.double() + bias.double())
    seen = torch.zeros(M, N, dtype=torch.int32)
    got = torch.full((M, N), float("nan"), dtype=torch.float64)

    def on_tile(ctx, batch, c, ldc, row0, col0, rows, cols):
        for i in range(rows):
            for j in range(cols):
                got[row0 + i, col0 + j] = c[i * ldc + j]
        seen[row0 : row0 + rows, col0 : col0 + cols] += 1

    ep, _keep = _relu_epilogue_with_tile_fn(bias, on_tile)
    out = torch.empty(M, N)
    if path == "packed":
        pb = gemm.pack_b(b)
        ops.lib().nf_sgemm_packed(M, N, K, a.data_ptr(), K, 1, pb.ptr(), out.data_ptr(), N, 0, ctypes.byref(ep), 1)
    else:
        w = b.t().contiguous()
        ops.lib().nf_sgemm_nt(M, N, K, a.data_ptr(), K, 1, w.data_ptr(), K, out.data_ptr(), N, 0, ctypes.byref(ep), 2)
    assert torch.equal(seen, torch.ones(M, N, dtype=torch.int32))
    _, scale = _ref(a, b)
    _check(got.float(), ref, scale, K)


@pytest.mark.parametrize("path", ["unpacked", "packed", "strided_a"])
@pytest.mark.parametrize("small_blocks", [False, True])
def test_tile_callback_without_c(path, small_blocks):
    """C == NULL: nothing is stored, each block of C lives in a per-thread buffer and the tile
    callback sees every final tile exactly once, with the bias and activation applied (several
    K blocks, row blocks and column blocks with small cache sizes; 2 threads)."""
    M, K, N = 77, 300, 150
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    if path == "strided_a":
        a = torch.randn(K, M).t()  # column-major A, packed by the library
    ref = torch.relu(a.double() @ b.double() + bias.double())
    got = torch.full((M, N), float("nan"), dtype=torch.float64)
    seen = torch.zeros(M, N, dtype=torch.int32)

    def on_tile(ctx, batch, c, ldc, row0, col0, rows, cols):
        for i in range(rows):
            for j in range(cols):
                got[row0 + i, col0 + j] = c[i * ldc + j]
        seen[row0 : row0 + rows, col0 : col0 + cols] += 1

    ep, _keep = _relu_epilogue_with_tile_fn(bias, on_tile)
    lib = ops.lib()
    if small_blocks:
        lib.nf_gemm_set_cache_sizes(4096, 16384, 0)
    try:
        if path == "packed":
            pb = gemm.pack_b(b)
            lib.nf_sgemm_packed(M, N, K, a.data_ptr(), K, 1, pb.ptr(), None, N, 0, ctypes.byref(ep), 2)
        else:
            rs, cs = a.stride()
            lib.nf_sgemm(M, N, K, a.data_ptr(), rs, cs, b.data_ptr(), N, 1, None, N, 0, ctypes.byref(ep), 2)
    finally:
        lib.nf_gemm_set_cache_sizes(*build.cache_sizes().values())
    assert torch.equal(seen, torch.ones(M, N, dtype=torch.int32))
    _, scale = _ref(a, b)
    _check(got.float(), ref, scale, K)


@pytest.mark.parametrize("path", ["unpacked", "strided_a"])
def test_tile_prefetch_announces_each_next_tile(path):
    """nf_epilogue.tile_prefetch is called (c == NULL) with the coordinates of the tile whose
    tile_fn comes next, before that tile is computed: every tile after the first of a row block
    is announced exactly once, before its tile_fn call (one thread, so the order is the call
    order; small cache sizes for several row and column blocks)."""
    M, K, N = 77, 300, 150
    a, b = torch.randn(M, K), torch.randn(K, N)
    if path == "strided_a":
        a = torch.randn(K, M).t()
    events: list[tuple] = []

    def on_tile(ctx, batch, c, ldc, row0, col0, rows, cols):
        events.append(("tile", row0, col0, rows, cols))

    def on_prefetch(ctx, batch, c, ldc, row0, col0, rows, cols):
        assert not c
        events.append(("pf", row0, col0, rows, cols))

    bias = torch.zeros(N)
    ep, _keep = _relu_epilogue_with_tile_fn(bias, on_tile)
    pf_fn = _TILE_FN(on_prefetch)
    ep.tile_prefetch = ctypes.cast(pf_fn, ctypes.c_void_p)
    lib = ops.lib()
    lib.nf_gemm_set_cache_sizes(4096, 16384, 0)
    try:
        rs, cs = a.stride()
        out = torch.empty(M, N)
        lib.nf_sgemm(M, N, K, a.data_ptr(), rs, cs, b.data_ptr(), N, 1, out.data_ptr(), N, 0, ctypes.byref(ep), 1)
    finally:
        lib.nf_gemm_set_cache_sizes(*build.cache_sizes().values())
    torch.testing.assert_close(out, torch.relu(a @ b), atol=1e-3, rtol=1e-4)
    tiles = [e[1:] for e in events if e[0] == "tile"]
    announced = [e[1:] for e in events if e[0] == "pf"]
    assert len(set(tiles)) == len(tiles) and set(announced) <= set(tiles)
    assert len(announced) == len(set(announced)) and len(announced) >= len(tiles) // 2
    for i, e in enumerate(events):  # an announced tile's tile_fn comes after its announcement
        if e[0] == "pf":
            assert ("tile", *e[1:]) in events[i + 1:]


@pytest.mark.parametrize(
    "variant",
    [("generic", ("-DNF_GEMM_NT_BCAST=1",)), ("avx2", ("-DNF_GEMM_MR=6", "-DNF_GEMM_NV=4", "-DNF_GEMM_DOT_MR=4")),
     ("avx2", ("-DNF_GEMM_MR=3", "-DNF_GEMM_DOT_MR=2", "-DNF_GEMM_DOT_NR=6", "-DNF_GEMM_B_IN_PLACE_ANY_CPU=1",
               "-DNF_GEMM_BC_NR=13")),
     ("native", ("-DNF_GEMM_NT_BCAST=1",))],
)
def test_other_builds(variant):
    """The portable fallback, and other tile shapes on this machine's ISA: AVX-512's (6 x 4 vectors,
    dot-product 4 x 4), a 3-row tile with a 2 x 6 dot-product tile (scalar reductions) that also
    reads row-major B in place on any CPU (by default only on AMD's) and a 13-column broadcast tile
    (columns past one vector); and the broadcast kernel (112 x 1024 below) in the portable build and in
    this machine's own (where it is off by default: AVX-512)."""
    isa, extra = variant
    lib = build.load(isa, extra)
    with ops.using(lib):
        if extra and extra[0].startswith("-DNF_GEMM_MR"):
            assert lib.nf_sgemm_mr() == int(extra[0].split("=")[1])
        for M, K, N in [(1, 5, 3), (25, 300, 70), (13, 64, 33), (10, 20, 1601), (7, 1700, 50), (112, 1024, 45)]:
            a, b, bias, res = torch.randn(M, K), torch.randn(N, K).t(), torch.randn(N), torch.randn(M, N)
            pre, scale = _ref(a, b)
            for act in ("none", "gelu_erf", "silu"):
                c = gemm.matmul(a, gemm.pack_b(b), bias=bias, act=act, residual=res, nthreads=2)
                _check(c, _acts()[act](pre + bias.double()) + res.double(), scale, K, slack=1.5)
            _check(gemm.matmul(a, b, nthreads=2), pre, scale, K)
            _check(gemm.matmul(a, b.contiguous(), nthreads=2), pre, scale, K)
            c = gemm.linear(a, b.t(), bias=bias, act="gelu_tanh", residual=res, nthreads=2)
            _check(c, _acts()["gelu_tanh"](pre + bias.double()) + res.double(), scale, K, slack=1.5)


GENERATED_STYLE_CPP = r"""
#include "nf_gemm.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <vector>
// What generated code does: pack weights once, then run C blocks inside its own parallel loop,
// each followed by its own epilogue; and call the threaded entry from inside a parallel region.
int main() {
    const long M = 61, K = 300, N = 77;
    std::vector<float> A(M * K), W(N * K), bias(N), C(M * N), D(M * N), R(M * N);
    for (long i = 0; i < M * K; ++i) A[i] = (float)((i * 7) % 11) / 11.f - 0.5f;
    for (long i = 0; i < N * K; ++i) W[i] = (float)((i * 5) % 13) / 13.f - 0.5f;
    for (long j = 0; j < N; ++j) bias[j] = 0.01f * j;
    std::vector<float> P(nf_sgemm_packed_size(K, N));
    nf_sgemm_pack_b(K, N, W.data(), /*stride_k=*/1, /*stride_n=*/K, P.data());  // nn.Linear layout [N, K]
    for (long i = 0; i < M; ++i)
        for (long j = 0; j < N; ++j) {
            double s = bias[j];
            for (long k = 0; k < K; ++k) s += (double)A[i * K + k] * W[j * K + k];
            R[i * N + j] = (float)(s > 0 ? s : 0) * 2.f;
        }
    nf_epilogue ep = {bias.data(), NF_ACT_RELU, nullptr, 0, 0, nullptr, nullptr};
    long tm, tn;
    nf_gemm_partition(M, N, K, 3, &tm, &tn);
    tm *= 2, tn *= 2;  // more blocks than threads, unaligned bounds
#pragma omp parallel for collapse(2) num_threads(3)
    for (long bi = 0; bi < tm; ++bi)
        for (long bj = 0; bj < tn; ++bj) {
            long m0 = M * bi / tm, m1 = M * (bi + 1) / tm, n0 = N * bj / tn, n1 = N * (bj + 1) / tn;
            nf_sgemm_packed_block(M, N, K, A.data(), K, 1, P.data(), C.data(), N, m0, m1, n0, n1, 0, &ep);
            for (long i = m0; i < m1; ++i)
                for (long j = n0; j < n1; ++j) C[i * N + j] *= 2.f;  // the caller's own epilogue
        }
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        nf_sgemm_packed(M, N, K, A.data(), K, 1, P.data(), D.data(), N, 0, &ep, 2);  // runs serially
    }
    // the weight read in place (no packed copy): threaded entry, and blocks in the caller's loop
    std::vector<float> E(M * N), F(M * N);
    nf_sgemm_nt(M, N, K, A.data(), K, 1, W.data(), K, E.data(), N, 0, &ep, 2);
#pragma omp parallel for collapse(2) num_threads(3)
    for (long bi = 0; bi < tm; ++bi)
        for (long bj = 0; bj < tn; ++bj)
            nf_sgemm_nt_block(M, N, K, A.data(), K, 1, W.data(), K, F.data(), N, M * bi / tm, M * (bi + 1) / tm,
                              N * bj / tn, N * (bj + 1) / tn, 0, &ep);
    double worst = 0;
    for (long i = 0; i < M * N; ++i) {
        worst = fmax(worst, fabs(C[i] - R[i]) / (1 + fabs(R[i])));
        worst = fmax(worst, fabs(2.f * D[i] - R[i]) / (1 + fabs(R[i])));
        worst = fmax(worst, fabs(2.f * E[i] - R[i]) / (1 + fabs(R[i])));
        worst = fmax(worst, fabs(2.f * F[i] - R[i]) / (1 + fabs(R[i])));
    }
    printf("%g\n", worst);
    return worst < 1e-4 ? 0 : 1;
}
"""


def test_generated_code_can_include_and_link(tmp_path):
    src = tmp_path / "use_gemm.cpp"
    src.write_text(GENERATED_STYLE_CPP)
    exe = tmp_path / "use_gemm"
    cmd = [build.compiler(), "-O1", "-fopenmp", f"-I{gemm.include_dir()}", str(src), "-o", str(exe)]
    subprocess.run([*cmd, *gemm.link_args()], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, f"worst relative error {run.stdout.strip()} {run.stderr}"


def _copying_compile():
    """(the names it was called for, a stand-in for build._compile that copies this session's
    library and writes its sidecar): the cache logic, not the compiler, is under test."""
    real = build.library_path()
    calls: list[str] = []

    def fake_compile(so, isa, extra):
        calls.append(so.name)
        shutil.copyfile(real, so)
        so.with_suffix(".sha256").write_text(build._sidecar(build._sha256(so), so.stat().st_size, build._key_of(so)))

    return calls, fake_compile


def test_cache_rebuilds_corrupt_library(tmp_path, monkeypatch):
    calls, fake_compile = _copying_compile()

    monkeypatch.setattr(build, "installed_dir", lambda: tmp_path / "none")  # no install-time build
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_compile", fake_compile)
    so = build.library_path()
    assert so.parent == tmp_path / "gemm" and len(calls) == 1
    assert build.library_path() == so and len(calls) == 1  # verified: reused
    with open(so, "r+b") as f:
        f.seek(100)
        f.write(b"\x00corrupt")
    assert build.library_path() == so and len(calls) == 2  # corrupt: rebuilt
    assert build._verified(so)


def test_cache_takes_the_install_time_build(tmp_path, monkeypatch):
    """A cache without the library copies the install-time build (same build key) instead of
    compiling; a damaged install-time copy is not trusted (rebuilt in the cache), and test builds
    with extra flags never take it."""
    calls, fake_compile = _copying_compile()

    monkeypatch.setattr(build, "_compile", fake_compile)
    monkeypatch.setattr(build, "installed_dir", lambda: tmp_path / "installed")
    installed = build.build_installed()
    assert installed.parent == tmp_path / "installed" and len(calls) == 1 and build._verified(installed)
    assert build.build_installed() == installed and len(calls) == 1

    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path / "cache1"))
    so = build.library_path()
    assert so.parent == tmp_path / "cache1" / "gemm" and so.name == installed.name
    assert len(calls) == 1 and build._verified(so) and so.read_bytes() == installed.read_bytes()
    assert not list(so.parent.glob("*.tmp"))

    with open(installed, "r+b") as f:  # damaged after installing: a new cache compiles its own
        f.seek(100)
        f.write(b"\x00corrupt")
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path / "cache2"))
    so2 = build.library_path()
    assert len(calls) == 2 and calls[-1] == so2.name and build._verified(so2)
    build.library_path(extra=("-DNF_GEMM_MR=4",))
    assert len(calls) == 3


def test_background_build_fills_the_cache_once(tmp_path, monkeypatch):
    calls, fake_compile = _copying_compile()

    monkeypatch.setattr(build, "installed_dir", lambda: tmp_path / "none")  # no install-time build
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_compile", fake_compile)
    monkeypatch.setattr(build, "_background", set())
    build.start_background_build()
    build.start_background_build()  # once per process
    for t in threading.enumerate():
        if t.name == "nf_gemm-build":
            t.join(timeout=60)
    assert len(calls) == 1
    assert build.library_path().parent == tmp_path / "gemm" and len(calls) == 1  # the foreground finds it


def test_real_build_compiles_units_in_parallel_and_links(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "installed_dir", lambda: tmp_path / "none")  # no install-time build
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    so = build.library_path()
    assert build._verified(so) and not list(so.parent.glob("*.objs.*")) and not list(so.parent.glob("*.tmp"))
    lib = ctypes.CDLL(str(so))
    assert lib.nf_sgemm_nr() > 0


def test_cache_sizes_and_blocking_are_sane():
    sizes = build.cache_sizes()
    blk = gemm.blocking()
    assert blk["nr"] == gemm.panel_width() and blk["nr"] % 8 == 0
    assert blk["kc"] >= 64 and blk["mc"] % blk["mr"] == 0 and blk["nc"] % blk["nr"] == 0
    if sizes["l1d"]:
        assert blk["kc"] * blk["mr"] * 4 <= sizes["l1d"]  # the A micro-panel fits L1


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k,n", [(1, 1), (5, 7), (768, 97), (130, 2304), (3, 64)])
def test_few_rows_row_major_b_streams_rows(m, k, n):
    """Decode with a row-major B read in place (a GPT-2 Conv1D weight): the row-streaming kernel,
    with every epilogue, a strided A, accumulation and one or two threads."""
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    a_full = torch.randn(m, 2 * k + 1, generator=g)
    a = a_full[:, 1::2]  # column stride 2
    b = torch.randn(k, n, generator=g)
    bias, res = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    want = a @ b
    for threads in (1, 2):
        torch.testing.assert_close(ops.matmul(a, b, nthreads=threads), want, atol=1e-4, rtol=1e-4)
        got = ops.matmul(a, b, bias=bias, act="relu", residual=res, nthreads=threads)
        torch.testing.assert_close(got, torch.relu(want + bias) + res, atol=1e-4, rtol=1e-4)
        out = torch.randn(m, n, generator=g)
        expect = out + want
        ops.matmul(a, b, out=out, accumulate=True, nthreads=threads)
        torch.testing.assert_close(out, expect, atol=1e-4, rtol=1e-4)
