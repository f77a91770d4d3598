"""Native bf16 matrix products of nf_gemm (nf_gemm_bf16.cpp) on each path: AMX tiles, AVX512-BF16,
and the float32-conversion fallback, forced through `gemm.forced_bf16_path`.

Every product of two bf16 values is exact in float32, so each result is compared with a float64
product of the same (upcast) bf16 inputs under a float32-summation bound (~1e-5 of |A| @ |B|), far
below what a wrong element, lane or k pair would give (a test checks that a perturbed result
fails). Each test asserts that the path it names ran (the library's per-path call counts); a
native path the CPU lacks is skipped with the reason.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from novaforge.codegen.cpu import gemm
from novaforge.codegen.cpu.gemm import build, ops

PATHS = ["amx", "avx512_bf16", "convert"]
_RANK = {"convert": 0, "avx512_bf16": 1, "amx": 2}

ACTS = {
    "none": lambda x: x,
    "relu": torch.relu,
    "gelu_erf": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


@pytest.fixture(params=PATHS)
def path(request):
    name = request.param
    hw = gemm.bf16_hw_path()
    if _RANK[name] > _RANK[hw]:
        pytest.skip(f"this CPU's best bf16 path is {hw!r}: no {name} (see /proc/cpuinfo flags)")
    with gemm.forced_bf16_path(name):
        assert gemm.bf16_path() == name
        yield name


class _Ran:
    """Did the path run (its call count grew) inside the block?"""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.before = gemm.bf16_counts()[self.name]
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            assert gemm.bf16_counts()[self.name] > self.before, f"the {self.name} path did not run"


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


def _check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, bias=None, act="none", residual=None,
           c_old=None) -> None:
    """c against act(a @ b [+ c_old] + bias) + residual in float64 from the same bf16 values."""
    a64, b64 = a.double(), b.double()
    ref = a64 @ b64
    scale = a64.abs() @ b64.abs()
    if c_old is not None:
        ref = ref + c_old.double()
        scale = scale + c_old.double().abs()
    if bias is not None:
        ref = ref + bias.double()
        scale = scale + bias.double().abs()
    ref = ACTS[act](ref)
    if residual is not None:
        ref = ref + residual.double()
        scale = scale + residual.double().abs()
    tol = 1e-5 * scale + 1e-6 * (1 + ref.abs())
    err = (c.double() - ref).abs()
    assert not (err > tol).any(), f"max err {err.max().item():.3g}, worst excess {(err - tol).max().item():.3g}"


def _a(M: int, K: int, layout: str) -> torch.Tensor:
    if layout == "contig":
        return _bf16(M, K)
    if layout == "row_padded":
        return _bf16(M, K + 7)[:, :K]
    if layout == "transposed":  # column-major: copied into scratch rows by the library
        return _bf16(K, M).t()
    if layout == "strided":
        return _bf16(M, 2 * K + 1)[:, 1 : 2 * K + 1 : 2]
    raise ValueError(layout)


def _b(K: int, N: int, layout: str) -> torch.Tensor:
    if layout == "kn":  # row-major [K, N] (a Conv1D weight): two rows interleaved per k pair
        return _bf16(K, N)
    if layout == "weight_t":  # nn.Linear weight [N, K] seen as [K, N]: 32-bit transposes
        return _bf16(N, K).t()
    if layout == "strided":
        return _bf16(K, 2 * N + 3)[:, 1 : 2 * N + 1 : 2]
    raise ValueError(layout)


# (M, K, N): odd sizes, K odd, K < 32, N < 16, partial row and column tiles, several column blocks
SHAPES = [(16, 32, 16), (17, 33, 3), (37, 45, 33), (33, 255, 17), (64, 31, 100), (130, 1, 40), (48, 64, 1),
          (200, 96, 70), (128, 768, 96), (40, 3072, 50), (100, 800, 700)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_layout", ["kn", "weight_t", "strided"])
def test_matmul(path, shape, b_layout):
    M, K, N = shape
    a, b = _a(M, K, "contig"), _b(K, N, b_layout)
    with _Ran(path):
        c = gemm.matmul(a, b, nthreads=2)
    _check(c, a, b)


@pytest.mark.parametrize("a_layout", ["row_padded", "transposed", "strided"])
@pytest.mark.parametrize("shape", [(37, 45, 33), (64, 128, 80)], ids=lambda s: "x".join(map(str, s)))
def test_strided_a(path, a_layout, shape):
    M, K, N = shape
    a, b = _a(M, K, a_layout), _b(K, N, "weight_t")
    with _Ran(path):
        c = gemm.matmul(a, b, nthreads=2)
    _check(c, a, b)


@pytest.mark.parametrize("shape", [(16, 32, 16), (37, 45, 33), (128, 768, 96), (130, 64, 200)],
                         ids=lambda s: "x".join(map(str, s)))
def test_linear(path, shape):
    """nf_gemm_nt_mixed: W [N, K] read as B = W^T (the default route of an nn.Linear)."""
    M, K, N = shape
    a, w = _bf16(M, K), _bf16(N, K)
    with _Ran(path):
        c = gemm.linear(a, w, nthreads=2)
    _check(c, a, w.t())


@pytest.mark.parametrize("shape", SHAPES[:8] + [(1, 64, 40), (5, 33, 17)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_layout", ["kn", "weight_t"])
def test_vnni_packed(path, shape, b_layout):
    """Prepacked VNNI panels, any M (decode rows too), on every path (the fallback in plain C++)."""
    M, K, N = shape
    a, b = _a(M, K, "contig"), _b(K, N, b_layout)
    pb = gemm.pack_b_vnni(b)
    assert pb.layout == "vnni" and pb.data.numel() == ((N + 15) // 16) * 16 * ((K + 31) // 32) * 32
    with _Ran(path):
        c = gemm.matmul(a, pb, nthreads=2)
    _check(c, a, b)


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("entry", ["mixed", "nt", "packed"])
def test_epilogues(path, act, entry, bias_dtype):
    """Each activation with a bias (float32, or bf16 through nf_epilogue.bias_bf16) and a residual."""
    M, K, N = 45, 70, 50
    a, w = _bf16(M, K), _bf16(N, K)
    bias, residual = torch.randn(N).to(bias_dtype), torch.randn(M, N)
    kw = {"bias": bias, "act": act, "residual": residual, "nthreads": 2}
    with _Ran(path):
        if entry == "nt":
            c = gemm.linear(a, w, **kw)
        elif entry == "packed":
            c = gemm.matmul(a, gemm.pack_b_vnni(w.t()), **kw)
        else:
            c = gemm.matmul(a, w.t(), **kw)
    _check(c, a, w.t(), bias=bias, act=act, residual=residual)


@pytest.mark.parametrize("entry", ["mixed", "packed"])
def test_accumulate_and_row_stride(path, entry):
    """accumulate adds C_old; C with a row stride > N; nothing outside C's columns is written."""
    M, K, N = 40, 64, 36
    a, b = _bf16(M, K), _bf16(K, N)
    full = torch.randn(M, N + 9)
    c_old = full[:, :N].clone()
    pad = full[:, N:].clone()
    with _Ran(path):
        gemm.matmul(a, gemm.pack_b_vnni(b) if entry == "packed" else b, out=full[:, :N], accumulate=True, nthreads=2)
    _check(full[:, :N], a, b, c_old=c_old)
    assert torch.equal(full[:, N:], pad)


def test_k_zero_packed(path):
    """K = 0: act(bias) + residual through the same entry."""
    M, N = 20, 24
    a, b = _bf16(M, 0), _bf16(0, N)
    bias, residual = torch.randn(N), torch.randn(M, N)
    c = gemm.matmul(a, gemm.pack_b_vnni(b), bias=bias, act="relu", residual=residual)
    torch.testing.assert_close(c, torch.relu(bias).expand(M, N) + residual)


def test_threads_agree(path):
    """Each C element is computed by one tile in one order: 1 and 2 threads give identical bits."""
    M, K, N = 96, 160, 200
    a, b = _bf16(M, K), _bf16(K, N)
    assert torch.equal(gemm.matmul(a, b, nthreads=1), gemm.matmul(a, b, nthreads=2))


_TILE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_long, ctypes.POINTER(ctypes.c_float), ctypes.c_long,
                            ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)


@pytest.mark.parametrize("with_c", [True, False])
@pytest.mark.parametrize("small_l2", [False, True])
def test_tile_callback(path, with_c, small_l2):
    """The tile callback sees every final element once, after the epilogue; with C == NULL the
    tiles live in per-thread buffers (several column blocks with a small L2)."""
    M, K, N = 50, 300, 450
    a, b, bias = _bf16(M, K), _bf16(K, N), torch.randn(N)
    got = torch.full((M, N), float("nan"), dtype=torch.float64)
    seen = torch.zeros(M, N, dtype=torch.int32)

    def on_tile(ctx, batch, c, ldc, row0, col0, rows, cols):
        for i in range(rows):
            for j in range(cols):
                got[row0 + i, col0 + j] = c[i * ldc + j]
        seen[row0 : row0 + rows, col0 : col0 + cols] += 1

    fn = _TILE_FN(on_tile)
    ep = build.Epilogue()
    ep.bias, ep.act, ep.tile_fn = bias.data_ptr(), build.ACTS["relu"], ctypes.cast(fn, ctypes.c_void_p)
    out = torch.empty(M, N)
    lib = ops.lib()
    if small_l2:
        lib.nf_gemm_set_cache_sizes(4096, 16384, 0)
    try:
        with _Ran(path):
            lib.nf_gemm_mixed(M, N, K, a.data_ptr(), 1, K, 1, b.data_ptr(), 1, N, 1,
                              out.data_ptr() if with_c else None, N, 0, ctypes.byref(ep), 2)
    finally:
        lib.nf_gemm_set_cache_sizes(*build.cache_sizes().values())
    assert torch.equal(seen, torch.ones(M, N, dtype=torch.int32))
    _check(got.float(), a, b, bias=bias, act="relu")
    if with_c:
        assert torch.equal(out.double(), got)


def test_check_rejects_wrong_results():
    a, b = _bf16(40, 64), _bf16(64, 48)
    c = gemm.matmul(a, b)
    _check(c, a, b)
    bad = c.clone()
    bad[3, 17] += 1e-3 * (a.double().abs() @ b.double().abs())[3, 17].item()
    with pytest.raises(AssertionError):
        _check(bad, a, b)


def test_forcing_is_clamped_to_the_hardware():
    hw = gemm.bf16_hw_path()
    with gemm.forced_bf16_path("amx"):
        assert gemm.bf16_path() == hw
    with gemm.forced_bf16_path("convert"):
        assert gemm.bf16_path() == "convert"
    assert gemm.bf16_path() == hw


def test_float32_operand_keeps_the_conversion_path():
    """A float32 A with bf16 B is not rounded to bf16: it computes in float32 as before."""
    a, b = torch.randn(64, 96), _bf16(96, 40)
    before = gemm.bf16_counts()
    c = gemm.matmul(a, b)
    assert gemm.bf16_counts()["amx"] == before["amx"] and gemm.bf16_counts()["avx512_bf16"] == before["avx512_bf16"]
    torch.testing.assert_close(c, a @ b.float(), rtol=1e-5, atol=1e-5)


def test_cpu_flags_agree_with_the_library():
    """The library's CPUID view matches /proc/cpuinfo (amx needs the tile permission too)."""
    flags = Path("/proc/cpuinfo").read_text()
    hw = gemm.bf16_hw_path()
    if hw == "amx":
        assert "amx_bf16" in flags and "amx_tile" in flags
    if hw in ("amx", "avx512_bf16"):
        assert "avx512_bf16" in flags
    elif "avx512_bf16" in flags:
        pytest.fail("avx512_bf16 in /proc/cpuinfo but the library does not use it")


def test_bf16_bias_on_the_conversion_entries():
    """A bf16 bias reaches the float32-conversion path too (M < 16, and bf16 A with float32 panels)."""
    a, w, bias = _bf16(5, 40), _bf16(24, 40), _bf16(24)
    _check(gemm.linear(a, w, bias=bias), a, w.t(), bias=bias)
    a = _bf16(30, 40)
    _check(gemm.matmul(a, gemm.pack_b(w.t()), bias=bias), a, w.t(), bias=bias)
    with pytest.raises(TypeError):
        gemm.matmul(torch.randn(8, 40), torch.randn(40, 24), bias=bias)  # a float32 entry: no bf16 bias
