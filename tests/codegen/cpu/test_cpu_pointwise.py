"""Generated pointwise kernels against eager: broadcasts, strides, odd and zero sizes, math, dtypes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check

import novaforge


def _r(*shape):
    return torch.randn(shape)


@pytest.mark.parametrize("xs,ys", [((7, 13), (13,)), ((3, 1, 5), (1, 4, 5)), ((0, 5), (5,)), ((2, 0, 3), (3,)),
                                    ((1,), (9, 1)), ((), (4, 3)), ((5, 31), (5, 1))])
def test_broadcast_binary(xs, ys):
    x, y = _r(*xs), _r(*ys)
    check(lambda a, b: (a + b) * b - a / (b.abs() + 1), x, y)


def test_noncontiguous_inputs():
    x = _r(12, 10).t()
    y = _r(10, 24)[:, ::2]
    z = _r(3, 4, 5).permute(2, 0, 1)
    check(lambda a, b, c: (a * b).sum() + c.exp().sum() * 0 + (a - b), x, y, z, allow_torch=1)
    check(lambda a, b: a * 2 + b, x, y)
    check(lambda c: torch.sigmoid(c) + 1, z)


UNARY = {
    "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3), "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "erf": torch.erf, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1), "sin": torch.sin,
    "cos": torch.cos, "abs": torch.abs, "neg": torch.neg, "relu": torch.relu, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "reciprocal": lambda x: 1 / (x.abs() + 0.5),
    "log1p": lambda x: torch.log1p(x.abs()), "expm1": torch.expm1, "exp2": torch.exp2,
    "log2": lambda x: torch.log2(x.abs() + 1e-3), "pow": lambda x: torch.pow(x.abs(), 2.5),
    "clamp": lambda x: x.clamp(-0.5, 0.7), "sign": torch.sign, "square": lambda x: x * x,
    "atan": torch.atan, "tan": lambda x: torch.tan(x * 0.3), "leaky": lambda x: F.leaky_relu(x, 0.1),
    "hardtanh": F.hardtanh, "softplus": F.softplus, "mish": F.mish, "elu": F.elu,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_math(name):
    x = _r(5, 67) * 3
    check(UNARY[name], x, atol=2e-6, rtol=2e-6)


def test_math_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 88.8, -104.0, 30.0, -30.0])
    check(lambda a: (torch.exp(a), torch.tanh(a), torch.sigmoid(a), torch.erf(a), torch.log(a.abs()),
                     torch.maximum(a, torch.zeros_like(a)), torch.isnan(a), torch.isinf(a), torch.isfinite(a)), x)


def test_exp_over_its_whole_range():
    """nf_exp clamps with max/min, rounds by the 1.5 * 2^23 shift and scales by two powers of two:
    within 2 ulp everywhere it is normal, subnormal results to the last bit or two, 0 below
    -103.97, inf from 88.7229 on, NaN kept."""
    edges = [88.72283, 88.72284, 88.7229, 89.0, 95.0, -87.3365, -87.34, -103.97, -103.98, -104.0, -150.0,
             0.0, -0.0, 1e-30, -1e-30, float("inf"), -float("inf"), float("nan")]
    x = torch.cat([torch.linspace(-110.0, 95.0, 200_003), torch.tensor(edges)])
    with torch.no_grad():
        got = novaforge.compile(torch.exp, backend="cpu")(x)
    ref = torch.exp(x.double())
    normal = (ref >= 1.1754944e-38) & (ref <= 3.4028234e38)
    rel = ((got.double() - ref).abs() / ref)[normal]
    assert rel.max().item() < 2.5e-7, rel.max().item()
    sub = ref < 1.1754944e-38
    assert (got.double() - ref)[sub].abs().max().item() <= 2.9e-45  # two subnormal steps
    assert torch.isinf(got[ref > 3.4028236e38]).all() and torch.isnan(got[torch.isnan(x)]).all()
    assert (got[x <= -104.0] == 0).all()


def test_compare_where_and_bools():
    x, y = _r(6, 9), _r(9)
    check(lambda a, b: (torch.where(a > b, a, b * 2), (a >= 0) & (b < 0.5), ~(a == b), a.masked_fill(a < 0, -1.0)),
          x, y)


def test_integer_ops():
    a = torch.randint(-50, 50, (7, 11))
    b = torch.randint(1, 9, (11,))
    check(lambda p, q: (p + q * 3, p // q, p % q, torch.remainder(p, -q), p - q, torch.maximum(p, q), p > q,
                        (p.float() * 0.5).to(torch.int64), p.to(torch.int32) + 1, p.abs()), a, b)


def test_casts_and_bf16():
    x = _r(9, 33) * 10
    check(lambda a: (a.to(torch.bfloat16), a.to(torch.bfloat16).float() * 2, a.to(torch.int32), a > 0,
                     (a > 0).float()), x)
    xb = _r(4, 45).to(torch.bfloat16)
    yb = _r(45).to(torch.bfloat16)
    check(lambda a, b: F.silu(a) * b + a, xb, yb, atol=2e-2, rtol=2e-2)


def test_float16_storage():
    x = _r(3, 17).half()
    check(lambda a: (a.float() * 2).half() + a, x, atol=1e-2, rtol=1e-2)


def test_gelu_tanh_formula():
    import math

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    check(gelu_new, _r(3, 65))


def test_silu_gate():
    check(lambda g, u: F.silu(g) * u, _r(2, 5, 96), _r(2, 5, 96), expect_kinds={"pointwise": 1})


def test_rope():
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(q, cos, sin):
        return q * cos + rotate_half(q) * sin

    q = _r(2, 3, 7, 16)
    pos = torch.arange(7).float()[:, None] * torch.rand(8)[None, :]
    emb = torch.cat([pos, pos], -1)
    check(rope, q, emb.cos(), emb.sin())


def test_transpose_copy_and_arange():
    x = _r(5, 7, 9)
    check(lambda a: a.permute(2, 0, 1).contiguous() * 1.5, x)
    check(lambda a: a + torch.arange(9, dtype=torch.float32) * 0.5, x)


@pytest.mark.parametrize("shape", [(1, 300001), (3, 70001), (257, 1031)])
def test_large_parallel_and_split(shape):
    x, y = _r(*shape), _r(shape[-1])
    check(lambda a, b: torch.tanh(a) * b + 1, x, y)


def test_zero_size():
    x = _r(0, 7)
    check(lambda a: torch.exp(a) + 1, x)
    check(lambda a, b: a * b, _r(3, 0), _r(0))


def test_float64_scalar_cast_is_generated_and_float64_math_is_not():
    """A 0-d float64 input cast to float32 (how Dynamo passes a float attribute such as an
    epsilon) is loaded by the generated kernel; float64 arithmetic itself runs through torch."""
    x = _r(4, 33)
    eps = torch.tensor(1e-6, dtype=torch.float64)
    check(lambda a, e: torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + e.float()) * a, x, eps, freeze=False)
    check(lambda a, e: a * e.to(torch.bfloat16).float() - e.to(torch.int64), x, eps * 1e6, freeze=False)
    check(lambda a, e: (a.double() * e).exp(), x, eps, freeze=False, allow_torch=1)
