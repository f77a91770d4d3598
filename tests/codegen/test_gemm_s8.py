"""nf_gemm_s8s8: int8 A times int8 B summed exactly in int32 (dynamic int8 quantization, `aten._int_mm`),
against int64 torch, bit for bit.

Covers every path this CPU runs (VNNI vpdpwssd where it has AVX512-VNNI, the AVX2 vpmaddwd micro-kernel
where the build has it, and the portable tile, each forced; a path the CPU lacks is skipped with the reason),
B packed once (`pack_b_s8`) and read through any strides (a Linear weight W^T, row-major, strided), A
strided, odd K, K = 0, row tails of the 6-row tile, column tails of the 16-column panel, 1 and 2 threads,
the extremes (every product -128 x -128 over K = 4096), the int32 result, and the float result with the
register epilogue (bias, activation, residual)."""

import pytest
import torch

from novaforge.codegen.cpu.gemm import ops
from novaforge.codegen.cpu.gemm.build import S8_PATHS

HERE = ops.lib().nf_gemm_s8_path()  # (the CPU's best: nothing is forced at import)
PATHS = [pytest.param(name, marks=pytest.mark.skipif(code > HERE, reason=f"no {name} int8 kernel on this CPU or build"))
         for code, name in S8_PATHS.items()]


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.long() @ b.long()).to(torch.int32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("M", [1, 5, 6, 7, 13, 40])
@pytest.mark.parametrize("K,N", [(96, 130), (77, 45), (1, 16), (300, 17)])
@pytest.mark.parametrize("layout", ["wt", "kn", "packed"])
def test_int8_products_are_exact(path, M, K, N, layout):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    b = {"wt": w.t(), "kn": w.t().contiguous(), "packed": ops.pack_b_s8(w.t())}[layout]
    with ops.forced_s8_path(path):
        before = ops.s8_counts()[path]
        for threads in (1, 2):
            c = ops.int_mm(a, b, nthreads=threads)
            assert c.dtype == torch.int32
            assert torch.equal(c, _ref(a, w.t()))
        assert ops.s8_counts()[path] == before + 2


@pytest.mark.parametrize("path", PATHS)
def test_strided_operands_and_empty_k(path):
    g = torch.Generator().manual_seed(3)
    big_a = torch.randint(-128, 128, (30, 200), dtype=torch.int8, generator=g)
    big_b = torch.randint(-128, 128, (160, 90), dtype=torch.int8, generator=g)
    a, b = big_a[::2, 1:160:2], big_b[::2, 3:70]  # column stride 2 in A; B rows 2 * 90 apart
    with ops.forced_s8_path(path):
        assert torch.equal(ops.int_mm(a, b), _ref(a, b))
        assert torch.equal(ops.int_mm(a.t().contiguous().t(), b), _ref(a, b))  # A column-major
        e = ops.int_mm(torch.empty(5, 0, dtype=torch.int8), torch.empty(0, 9, dtype=torch.int8))
        assert torch.equal(e, torch.zeros(5, 9, dtype=torch.int32))
        bias = torch.randn(9, generator=g)
        f = ops.int_mm(torch.empty(5, 0, dtype=torch.int8), torch.empty(0, 9, dtype=torch.int8),
                       out_dtype=torch.float32, bias=bias)
        assert torch.equal(f, bias.expand(5, 9))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fill", [-128, 127])
def test_extreme_sums_are_exact(path, fill):
    K = 4096  # every product 2^14 (or -128 * 127): sums of 2^26, beyond float32's exact integers
    a = torch.full((7, K), fill, dtype=torch.int8)
    w = torch.full((19, K), -128, dtype=torch.int8)
    w[3, 5] = 127
    with ops.forced_s8_path(path):
        assert torch.equal(ops.int_mm(a, ops.pack_b_s8(w.t())), _ref(a, w.t()))
        # the float result is float(acc), rounded once, as eager's .to(torch.float32)
        got = ops.int_mm(a, w.t(), out_dtype=torch.float32)
        assert torch.equal(got, _ref(a, w.t()).to(torch.float32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("act", ["none", "gelu", "silu", "relu"])
def test_float_epilogue(path, act):
    g = torch.Generator().manual_seed(7)
    M, K, N = 23, 130, 70
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    bias, res = torch.randn(N, generator=g) * 100, torch.randn(M, N, generator=g)
    fn = {"none": lambda x: x, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "relu": torch.relu}[act]
    ref = fn(_ref(a, w.t()).float() + bias) + res
    with ops.forced_s8_path(path):
        got = ops.int_mm(a, ops.pack_b_s8(w.t()), out_dtype=torch.float32, bias=bias, act=act, residual=res)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-3)


def test_refusals():
    a = torch.zeros(3, 4, dtype=torch.int8)
    with pytest.raises(TypeError):
        ops.int_mm(a.float(), torch.zeros(4, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.int_mm(a, torch.zeros(5, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="no epilogue"):
        ops.int_mm(a, torch.zeros(4, 2, dtype=torch.int8), bias=torch.zeros(2))
    with pytest.raises(ValueError, match="pack_b_s8"):
        ops.int_mm(a, ops.pack_b(torch.zeros(4, 2)))
