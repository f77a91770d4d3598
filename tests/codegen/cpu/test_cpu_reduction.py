"""Generated reduction kernels against eager: any axes, keepdim or not, odd/zero sizes, norms, softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check


def _r(*shape):
    return torch.randn(shape)


@pytest.mark.parametrize("shape,dims", [((7, 37), (1,)), ((7, 37), (0,)), ((4, 5, 6), (1,)), ((4, 5, 6), (0, 2)),
                                        ((3, 4, 5, 6), (1, 2)), ((9, 1), (1,)), ((5, 0), (1,)), ((0, 5), (1,)),
                                        ((1000,), (0,)), ((2, 3), (0, 1))])
def test_sum_any_axes(shape, dims):
    x = _r(*shape)
    check(lambda a: (a.sum(dims, keepdim=True), a.sum(dims), (a * a).mean(dims)), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,dim", [((7, 37), 1), ((7, 37), 0), ((4, 5, 6), 1), ((3, 1, 8), 2)])
def test_max_min_prod(shape, dim):
    x = _r(*shape)
    check(lambda a: (a.amax(dim, keepdim=True), a.amin(dim), (a * 0.1 + 1).prod(dim)), x)


def test_full_reductions():
    x = _r(33, 17)
    check(lambda a: (a.sum(), a.amax(), (a * a).sum() * 0.5), x)


def test_noncontiguous_reduction():
    x = _r(10, 12).t()
    check(lambda a: (a.softmax(-1), a.sum(0)), x)


@pytest.mark.parametrize("hidden", [37, 64, 1])
def test_layernorm(hidden):
    ln = torch.nn.LayerNorm(hidden).eval()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    check(ln, _r(3, 5, hidden), expect_kinds={"reduction": 1})


def test_rmsnorm():
    w = torch.randn(48)

    def rms(x):
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + 1e-6) * w

    check(rms, _r(2, 7, 48), expect_kinds={"reduction": 1})


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_log_softmax(dim):
    x = _r(5, 19, 7) * 4
    check(lambda a: (torch.softmax(a, dim), F.log_softmax(a, dim)), x)


def test_var_mean_and_norm():
    x = _r(6, 29)
    check(lambda a: (*torch.var_mean(a, -1), a.norm(dim=-1), a.std(0)), x, allow_torch=1)


def test_bf16_norm_and_softmax():
    x = _r(4, 70).to(torch.bfloat16)
    ln = torch.nn.LayerNorm(70).to(torch.bfloat16).eval()
    check(lambda a: (ln(a), torch.softmax(a, -1)), x, atol=3e-2, rtol=3e-2)


def test_reduction_with_broadcast_inputs_and_summary_outputs():
    x, m = _r(3, 9, 16), (torch.rand(3, 9, 1) > 0.3).float()

    def f(a, mask):
        s = (a * mask).sum(-1, keepdim=True)
        mx = a.amax(-1, keepdim=True)
        return s, mx, (a - mx) * s

    check(f, x, m)


def test_row_cache_softmax_long_rows():
    from novaforge.codegen.registry import get_backend

    x = _r(3, 2500) * 3
    c, _ = check(lambda a: torch.softmax(a, -1), x)
    be = get_backend("cpu")
    (node,) = [n for n in c.stats().graph.nodes if n.op == "kernel"]
    src = be.plan(node.attrs["kernel"]).gen.render()
    assert "rc[i] = " in src, "exp(x - max) should be kept in the row buffer, not recomputed"


def test_column_order_reductions():
    """Reductions whose innermost dim is kept vectorize across neighbouring rows ("column" order)."""
    from novaforge.codegen.registry import get_backend

    def f(a, b):
        mu = a.mean(1, keepdim=True)
        var = ((a - mu) ** 2).mean(1, keepdim=True)
        return torch.softmax(b, 0), (a - mu) * torch.rsqrt(var + 1e-5), a.amax(1)

    a, b = _r(4, 33, 70), _r(9, 130)
    c, _ = check(f, a, b)
    check(lambda x: x.to(torch.bfloat16).sum(0), b, atol=3e-2, rtol=1e-2)
    be = get_backend("cpu")
    orders = [be.plan(n.attrs["kernel"]).gen.schedule.order for n in c.stats().graph.nodes if n.op == "kernel"]
    assert orders.count("column") >= 3, orders
    c2, _ = check(lambda x: (torch.softmax(x, 0), x.sum(0)), a)
