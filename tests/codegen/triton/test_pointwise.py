"""Pointwise and gather kernels (interpreter): every elementwise op, broadcasting, strided
inputs, generators, casts, 16-bit floats, zero-size tensors, take/gather/cat."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nf_triton_testing import check, kernel_kinds

UNARY = [torch.exp, torch.log1p, torch.expm1, torch.tanh, torch.sigmoid, torch.erf, torch.sin, torch.cos,
         torch.tan, torch.sinh, torch.cosh, torch.floor, torch.ceil, torch.round, torch.trunc, torch.abs, torch.neg,
         torch.sign, torch.relu, torch.reciprocal, F.silu, lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"),
         lambda x: torch.sqrt(x.abs()), lambda x: torch.rsqrt(x.abs() + 0.1), lambda x: torch.log(x.abs() + 0.1),
         lambda x: torch.exp2(x), lambda x: torch.log2(x.abs() + 0.1)]


@pytest.mark.parametrize("fn", UNARY, ids=lambda f: getattr(f, "__name__", "lambda"))
def test_unary_ops_match_eager(fn):
    x = torch.randn(3, 17) * 2
    x[0, :4] = torch.tensor([0.5, -0.5, 2.5, 1e-4])  # rounding ties and tiny arguments
    check(fn, x, atol=2e-6, rtol=2e-5)


def test_binary_ops_pow_and_extremes():
    def f(x, y):
        a = torch.maximum(x, y) - torch.minimum(x, y)
        b = x ** 2 + y ** 3 + (x.abs() + 0.5) ** y + x.abs() ** 0.5
        c = torch.remainder(x, y.abs() + 0.5) + torch.floor_divide(x, y.abs() + 0.5)
        return a, b, c, x / (y.abs() + 1)

    x, y = torch.randn(5, 33, 7), torch.randn(5, 33, 7)
    x[0, 0, 0] = float("nan")
    check(f, x, y, atol=1e-5, rtol=1e-4)


def test_integer_and_boolean_ops():
    def f(a, b, x):
        q = torch.floor_divide(a, b) + torch.remainder(a, b) * 3
        m = (a > b) & ~(a == 0) | (b < -2)
        w = torch.where(m, x, -x)
        return q, m, w, (a & b) ^ (a | 5), (x > 0).to(torch.float32) + a.to(torch.float32)

    a = torch.randint(-20, 20, (4, 9))
    b = torch.randint(1, 7, (4, 9)) * torch.where(torch.rand(4, 9) > 0.5, 1, -1)
    check(f, a, b, torch.randn(4, 9))


def test_broadcasting_and_scalars():
    def f(x, y, z):
        return x * y + z * 0.5 - 1.0, (x + 2.0).exp() * z

    check(f, torch.randn(5, 1, 7), torch.randn(33, 1), torch.randn(7), atol=1e-5)


def test_strided_inputs_and_views():
    x = torch.randn(6, 10)
    check(lambda x: x.permute(1, 0) + 1.0, x)
    check(lambda x: x[:, 1:8:2] * x[:, :4], x)
    check(lambda x, y: x.t() * y, torch.randn(7, 5), torch.randn(5, 7))
    check(lambda w: (w[::2, 1:].T * 2).sin(), torch.randn(9, 7))
    # a non-contiguous *input* tensor (the program makes it contiguous at the boundary)
    check(lambda x: x * 3, torch.randn(8, 5).t())


def test_generators_iota_and_full():
    def f(x):
        i = torch.arange(17, dtype=torch.float32)
        return x * i + torch.full((3, 17), 2.5) + torch.arange(3).reshape(3, 1).float()

    check(f, torch.randn(3, 17))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_pointwise(dtype):
    x, y = torch.randn(5, 33, dtype=dtype), torch.randn(33, dtype=dtype)
    check(lambda x, y: F.silu(x) * y + x.float().to(dtype), x, y, atol=2e-2, rtol=2e-2)


def test_casts_round_like_eager():
    x = torch.randn(3, 17) * 100
    check(lambda x: (x.to(torch.int32), x.to(torch.float16), (x > 0).to(torch.int64)), x, atol=0, rtol=0)
    # Triton's interpreter rounds float32 -> bfloat16 with a carry bug (the GPU rounds to nearest
    # even): allow one bfloat16 ulp here
    check(lambda x: x.to(torch.bfloat16), x, atol=0, rtol=2**-7)


def test_integer_and_float64_to_16_bit_casts():
    # eager converts both through float32 (c10::BFloat16 / c10::Half are built from a float)
    i = torch.randint(-(2**30), 2**30, (4, 9))
    d = torch.randn(4, 9, dtype=torch.float64) * 1e3
    check(lambda i, d: (i.to(torch.bfloat16), i.to(torch.float16).abs(), d.to(torch.bfloat16), d.to(torch.float16)),
          i, d, atol=0, rtol=2**-7)


def test_one_element_gathers_and_cat_pieces():
    # the index or piece address does not depend on the lane: it must still be a block under a block mask
    x, i = torch.randn(1), torch.zeros(1, dtype=torch.long)
    check(lambda x, i: torch.gather(x, 0, i), x, i)
    check(lambda x: torch.stack([x, x], 0), x)
    check(lambda x, y: torch.cat([x, y * 2], 0), x, torch.randn(3), all_triton=False)


def test_float_pow_by_a_non_integer_constant():
    x = torch.tensor([-float("inf"), -2.0, -0.0, 0.0, 0.5, 2.0, float("inf"), float("nan")])
    for e in (1.5, -1.5, 0.25):
        check(lambda x: x ** e, x, atol=1e-6, rtol=1e-6)


def test_zero_size_tensors():
    check(lambda x: x * 2 + 1, torch.randn(0, 5), all_triton=False)


def test_take_gather_cat_are_generated():
    emb = torch.randn(11, 6)
    idx = torch.randint(0, 11, (3, 5))
    c = check(lambda e, i: F.embedding(i, e) * 2, emb, idx)
    assert kernel_kinds(c)["gather"] >= 1
    x = torch.randn(4, 9)
    gi = torch.randint(0, 9, (4, 3))
    check(lambda x, i: torch.gather(x, 1, i) + 1, x, gi)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    check(lambda x: rotate_half(x) * 2, torch.randn(2, 3, 5, 8))
    check(lambda a, b: torch.cat([a, b, a], dim=0), torch.randn(2, 7), torch.randn(3, 7))


def test_generated_kernels_read_no_nan_global():
    """Triton 3.6 compares a kernel's globals with their compile-time values at every launch, and a
    NaN constant never equals itself: a `_NAN` global failed every launch on the H200."""
    import math

    from novaforge.codegen.triton import exprs

    ns: dict = {}
    exec(exprs.PRELUDE, ns)
    for name, value in ns.items():
        value = getattr(value, "value", value)
        assert not (isinstance(value, float) and math.isnan(value)), name
    assert "_NAN" not in exprs.PRELUDE + "".join(exprs.HELPERS.values()) + exprs.literal(float("nan"), torch.float32)
