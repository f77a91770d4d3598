"""The lowering driver's fallbacks (frontend/lower.py), against eager execution of the same
FX graph: in-place ops on fresh intermediates, CompositeImplicitAutograd decompositions of
ops without a rule, zero-size fills, and the refusals (mutations it cannot prove safe)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx

import novaforge
from novaforge.frontend.lower import InputSpec, UnsupportedError, lower_fx
from novaforge.ir import verify
from novaforge.runtime.interpret import interpret

aten = torch.ops.aten


def _graph(build) -> torch.fx.GraphModule:
    """An FX graph from `build(g, x)` over one placeholder x, with meta['val'] filled in by
    running it (ShapeProp-style) on the example input."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    out = build(g, x)
    g.output(out if isinstance(out, tuple) else (out,))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _annotate(gm: torch.fx.GraphModule, example: torch.Tensor) -> None:
    env: dict = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = example.clone()
        elif n.op == "call_function":
            args = torch.fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
            env[n] = n.target(*args, **kwargs)
        else:
            continue
        n.meta["val"] = env[n].clone() if isinstance(env[n], torch.Tensor) else env[n]


def _lower_and_run(gm: torch.fx.GraphModule, x: torch.Tensor):
    _annotate(gm, x)
    graph, ctx = lower_fx(gm, [InputSpec("user", "x")])
    verify(graph)
    return interpret(graph, [x.clone()], check=True), ctx, graph


def test_inplace_on_fresh_intermediate_is_functional() -> None:
    def build(g, x):
        y = g.call_function(aten.mul.Tensor, (x, 2.0))
        early = g.call_function(aten.neg.default, (y,))  # reads y before the mutation
        z = g.call_function(aten.add_.Scalar, (y, 1.0))
        w = g.call_function(aten.mul.Tensor, (y, z))  # reads y after it: the mutated value
        t = g.call_function(aten.unsqueeze_.default, (w, 0))
        return early, t, y

    gm = _graph(build)
    x = torch.randn(3, 4)
    want = gm(x.clone())
    got, ctx, graph = _lower_and_run(gm, x)
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=0, atol=0)
    assert not ctx.externs and "add" in {n.op for n in graph.nodes}


@pytest.mark.parametrize("case", ["view-mutated", "viewed-before", "input-mutated"])
def test_unsafe_inplace_is_refused(case: str) -> None:
    def build(g, x):
        y = g.call_function(aten.mul.Tensor, (x, 2.0))
        if case == "view-mutated":  # mutating a view writes through to y
            v = g.call_function(aten.slice.Tensor, (y, 1, 0, 2))
            g.call_function(aten.mul_.Tensor, (v, 3.0))
            return (y,)
        if case == "viewed-before":  # v aliases y and must see the update
            v = g.call_function(aten.view.default, (y, [-1]))
            g.call_function(aten.add_.Scalar, (y, 1.0))
            return (v,)
        return (g.call_function(aten.add_.Scalar, (x, 1.0)),)

    gm = _graph(build)
    with pytest.raises(UnsupportedError, match="mutates its input"):
        _lower_and_run(gm, torch.randn(3, 4))


@pytest.mark.parametrize(("op", "args"), [
    (aten.einsum.default, ("ij,kj->ik", None)),
    (aten.max_pool2d.default, (None, [2, 2])),
    (aten.cosine_similarity.default, (None, None, 1)),
    (aten.one_hot.default, (None, 5)),
])
def test_composite_without_rule_is_decomposed(op, args) -> None:
    x = torch.randn(1, 2, 4, 6) if op is aten.max_pool2d.default else torch.randn(3, 6)
    if op is aten.one_hot.default:
        x = torch.tensor([0, 3, 4, 1])

    def build(g, ph):
        real = [ph if a is None else a for a in args]
        if op is aten.einsum.default:
            real = [args[0], [ph, ph]]
        return g.call_function(op, tuple(real))

    gm = _graph(build)
    want = gm(x.clone())
    got, ctx, graph = _lower_and_run(gm, x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    externs = [t for t, _ in ctx.externs]
    if op is aten.max_pool2d.default:  # decomposes to max_pool2d_with_indices, which has no rule
        assert externs == ["aten.max_pool2d_with_indices.default"]
    else:
        assert not externs, externs
        assert op.name() not in str(graph)


def test_zero_size_output_is_a_fill_even_without_rule() -> None:
    def build(g, x):
        t = g.call_function(aten.topk.default, (x, 2))
        return g.call_function(operator.getitem, (t, 0)), g.call_function(operator.getitem, (t, 1))

    gm = _graph(build)
    x = torch.randn(0, 5)
    _annotate(gm, x)
    graph, ctx = lower_fx(gm, [InputSpec("user", "x")])
    assert not ctx.externs
    assert {n.op for n in graph.nodes} <= {"scalar", "expand"}
    out = interpret(graph, [x])
    assert [tuple(t.shape) for t in out] == [(0, 2), (0, 2)] and out[1].dtype == torch.int64


def test_export_capture_uses_decompositions() -> None:
    def f(x, y):
        return torch.nn.functional.relu6(torch.einsum("bij,bjk->bik", x, y)) + torch.nn.functional.glu(x, -1).sum()

    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    compiled = novaforge.compile(f, backend="interpret", capture="export")
    torch.testing.assert_close(compiled(x, y), f(x, y), rtol=1e-5, atol=1e-5)
    assert not compiled.stats().captured.externs
