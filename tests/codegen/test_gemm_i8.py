"""nf_gemm_i8w: float32 A times an int8 B (weight-only quantization), against float64 torch.

Covers the decode path (B = W^T with W [N, K] int8, M <= 8: one stream of W per thread, rows 5-8 in a
second pass), the packed path (larger M, and any B layout: int8 converted while packing), K and N
tails, 1 and 2 threads, and the register epilogue (bias, activation)."""

import pytest
import torch

from novaforge.codegen.cpu.gemm import ops


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 8, 9, 33])
@pytest.mark.parametrize("K,N", [(96, 130), (77, 45), (300, 64)])
@pytest.mark.parametrize("layout", ["wt", "kn"])
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_weight_matmul_matches_float64(M, K, N, layout, threads):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    a = torch.randn(M, K, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    b = w.t() if layout == "wt" else w.t().contiguous()
    ref = _ref(a, b)
    c = ops.matmul(a, b, nthreads=threads)
    assert c.dtype == torch.float32
    assert ((c.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


@pytest.mark.parametrize("M", [1, 6, 40])
def test_int8_weight_matmul_epilogue_and_paths(M):
    g = torch.Generator().manual_seed(M)
    K, N = 200, 70
    a = torch.randn(M, K, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    bias = torch.randn(N, generator=g)
    ref = torch.nn.functional.gelu((_ref(a, w.t()) + bias.double()).float())
    for on in (True, False):  # the streaming decode path and the packed path give the same products
        with ops.gemv_path(on):
            c = ops.matmul(a, w.t(), bias=bias, act="gelu")
        assert torch.allclose(c, ref, rtol=1e-5, atol=1e-3)


def test_int8_weight_matmul_strided_a():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(50, 4, generator=g).t()  # [4, 50], column stride 4
    w = torch.randint(-128, 128, (33, 50), dtype=torch.int8, generator=g)
    c = ops.matmul(a, w.t())
    assert torch.allclose(c.double(), _ref(a, w.t()), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_int8_weight_matmul_other_builds(isa):
    """The int8 loads on the portable build (GCC vector extensions) and the AVX2 one (forced targets)."""
    from novaforge.codegen.cpu.gemm import build

    with ops.using(build.load(isa, ())):
        for M, K, N in [(1, 5, 3), (4, 300, 70), (8, 65, 40), (20, 33, 129)]:
            g = torch.Generator().manual_seed(M + K)
            a = torch.randn(M, K, generator=g)
            w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
            for b in (w.t(), w.t().contiguous()):
                ref = _ref(a, b)
                c = ops.matmul(a, b, nthreads=2)
                assert ((c.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
