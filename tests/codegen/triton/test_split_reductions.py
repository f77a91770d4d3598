"""split_reductions (Triton backend): long sums with few outputs run as two sums; results equal
eager's (Triton interpreter), prologues still fuse into the first sum, 16-bit sums accumulate
their partials in float32, and the sums the pass must leave alone are left whole."""

from __future__ import annotations

import math

import pytest
import torch
from nf_triton_testing import check, step_like_eager_adamw

import novaforge
from novaforge.passes import split_reductions as sr


def _kernels(c):
    """(kind, input shapes, output shapes, output dtypes) of each kernel of the program."""
    return [(n.attrs["kernel"].kind, [tuple(v.type.shape) for v in n.inputs], [tuple(v.type.shape) for v in n.outputs],
             [v.type.dtype for v in n.outputs])
            for n in c.stats().program.graph.nodes if n.op == "kernel"]


def _split(c) -> int:
    return {r.name: r.counters for r in c.stats().records}["split_reductions"].get("sums split", 0)


def test_a_layernorm_weight_gradient_splits_with_its_product_fused():
    """sum over tokens of dy * xhat (dy bfloat16, xhat from a per-token scale and a feature
    weight): one split, the cast and the products computed inside the first sum's kernel (no
    kernel writes a [tokens, features] value), partials in float32."""
    torch.manual_seed(0)
    dy = torch.randn(4, 2048, 48, dtype=torch.bfloat16)
    x, rstd, w = torch.randn(4, 2048, 48), torch.rand(4, 2048, 1) + 0.5, torch.randn(48)
    c = check(lambda dy, x, rstd, w: (dy.float() * (x * rstd) * w).sum((0, 1)), dy, x, rstd, w,
              atol=1e-3, rtol=1e-4)
    assert _split(c) == 1
    ks = _kernels(c)
    assert all(out != [(4, 2048, 48)] for _, _, out, _ in ks), ks
    first = [k for k in ks if k[1] and (4, 2048, 48) in k[1]]
    assert len(first) == 1 and first[0][0] == "reduction" and first[0][3] == [torch.float32]
    assert first[0][2] == [(32, 1, 48)]  # (16384 tokens in 32 chunks of 512: at most 2**15 partials)


@pytest.mark.parametrize("case", ["bias_bf16", "global_sq", "inner_few_rows", "keepdim", "middle_block", "fp16"])
def test_split_sums_equal_eager(case):
    torch.manual_seed(1)
    if case == "bias_bf16":  # a bias gradient in bfloat16: the sum over [B*T, N] rows, rounded once
        fn, args = (lambda g: g.reshape(-1, 40).sum(0)), (torch.randn(8, 1024, 40, dtype=torch.bfloat16),)
        tol = dict(atol=2e-2, rtol=1e-2)
    elif case == "global_sq":  # a global gradient norm's sum of squares: one output
        fn, args = (lambda x: x.square().sum()), (torch.randn(300, 64),)
        tol = dict(atol=1e-3, rtol=1e-5)
    elif case == "inner_few_rows":  # three rows of 8192
        fn, args = (lambda x: (x * 2).sum(-1)), (torch.randn(3, 8192),)
        tol = dict(atol=1e-3, rtol=1e-5)
    elif case == "keepdim":
        fn, args = (lambda x: x.sum((0, 1), keepdim=True) + 1), (torch.randn(64, 128, 6),)
        tol = dict(atol=1e-3, rtol=1e-5)
    elif case == "middle_block":  # kept axes on both sides of the reduced block
        fn, args = (lambda x: x.sum((1, 2))), (torch.randn(2, 64, 96, 3),)
        tol = dict(atol=1e-3, rtol=1e-5)
    else:
        fn, args = (lambda x: x.sum(0)), (torch.randn(8192, 5, dtype=torch.float16),)
        tol = dict(atol=5e-2, rtol=1e-2)
    c = check(fn, *args, **tol)
    assert _split(c) == 1
    got, want = c(*args), fn(*args)
    if want.dtype in (torch.bfloat16, torch.float16):  # one rounding of a float32 total, as eager
        exact = fn(*(a.float() for a in args)).to(want.dtype)
        assert (got.float() - exact.float()).abs().max() <= (exact.float().abs().max() * 2 ** -7)


@pytest.mark.parametrize("fn,shape", [
    (lambda x: x.sum(-1), (64, 512)),  # short rows (LayerNorm, softmax): left whole
    (lambda x: x.sum((0, 2)), (64, 3, 96)),  # reduced axes not one block
    (lambda x: x.sum(0), (4096, 8192)),  # many outputs: parallel enough
    (lambda x: x.sum(0), (4099, 3)),  # no power of two >= 8 divides R
])
def test_sums_left_whole(fn, shape):
    c = check(fn, torch.randn(*shape), atol=1e-3, rtol=1e-5)
    assert _split(c) == 0


def test_the_pass_applies_to_the_triton_backend_and_its_option_only():
    x = torch.randn(64, 128, 6)
    off = check(lambda x: x.sum((0, 1)), x, atol=1e-3, rtol=1e-5, options={"split_reductions": False})
    assert _split(off) == 0
    cpu = novaforge.compile(lambda x: x.sum((0, 1)), backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(cpu(x), x.sum((0, 1)), atol=1e-3, rtol=1e-5)
    assert {r.name: r.counters for r in cpu.stats().records}["split_reductions"] == {}


@pytest.mark.parametrize("r,kept,want", [(16384, 512, 64), (16384, 2048, 16), (16384, 1, 64), (1 << 24, 1, 1 << 15),
                                         (5000, 1, 8), (4095, 1, None), (16384, 1 << 15, None)])
def test_chunks(r, kept, want):
    """S: the largest power of two dividing R with R / S >= SPLIT_CHUNK and S * kept <= SPLIT_PARTIALS."""
    from novaforge.ir import Value, make_node
    from novaforge.ir.types import TensorType

    x = Value(TensorType((r, kept), torch.float32, "cpu"))
    n = make_node("sum", [x], {"axes": (0,), "keepdim": False})
    plan = sr._plan(n)
    assert (plan.s if plan else None) == want
    if plan:
        assert r // plan.s >= sr.SPLIT_CHUNK and plan.s * kept <= sr.SPLIT_PARTIALS and r % plan.s == 0
        assert math.prod(plan.dims) == r * kept


def test_a_training_step_with_split_bias_gradients(monkeypatch):
    """compile_step on the Triton backend with the thresholds lowered so a small model's bias
    and weight gradients split: parameters equal eager AdamW's after two steps."""
    monkeypatch.setattr(sr, "SPLIT_MIN_R", 64)
    monkeypatch.setattr(sr, "SPLIT_CHUNK", 8)
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                           torch.nn.Linear(32, 4))

        def forward(self, x, y):
            return self.net(x)

    torch.manual_seed(0)
    step = step_like_eager_adamw(Net(), (128, 16, 4), steps=2)
    (fn,) = step._compiled.values()
    assert _split(fn) >= 3


def test_a_normalization_over_long_rows_stays_one_kernel():
    """A LayerNorm over 9000 features of 3 rows: its sums feed the normalization of every
    element, so they stay in its one looped kernel."""
    c = check(lambda x: torch.nn.functional.layer_norm(x, (9000,)), torch.randn(3, 9000), atol=1e-4, rtol=1e-4)
    assert _split(c) == 0
    assert [k[0] for k in _kernels(c)].count("reduction") == 1
