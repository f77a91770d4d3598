"""Each graph pass: interpreter output before and after on random inputs, verifier after,
input graph untouched, and the counters show the pass did what it claims."""

from __future__ import annotations

import torch

from nf_testing import captured_graph, check_pass
from novaforge.ir import Graph, GraphInput, TensorType, Value, make_node
from novaforge.passes.context import PassContext
from novaforge.passes.cse import cse
from novaforge.passes.dce import dce
from novaforge.passes.fold_constants import fold_constants
from novaforge.passes.layout import layout
from novaforge.passes.simplify import simplify


def f32(*s):
    return TensorType(tuple(s), torch.float32)


def test_dce_removes_dead_and_keeps_side_effects():
    x = Value(f32(4), "x")
    live = make_node("exp", [x])
    dead = make_node("sin", [x])
    dead2 = make_node("cos", [dead.out])
    effect = make_node("extern_effect", [x], {"target": "aten.rand_like.default",
                                              "spec": ("__list__", ("__list__", _targ(0)), ("__dict__",)),
                                              "out_types": (f32(4),)}, out_types=[f32(4)])
    g = Graph([GraphInput(x, "user", "x")], [live, dead, dead2, effect], [live.out])
    ctx = PassContext()
    out = dce(g, ctx)
    assert [n.op for n in out.nodes] == ["exp", "extern_effect"]
    assert ctx.counters["nodes_removed"] == 2


def _targ(i):
    from novaforge.ir.extern import TensorArg

    return TensorArg(i)


def test_cse_merges_duplicates_but_not_random_ops():
    def fn(x, y):
        a = torch.sin(x) + torch.cos(y)
        b = torch.sin(x) + torch.cos(y)
        c = y * x + x * y  # commutative duplicates
        return a * b + c

    x, y = torch.randn(3, 5), torch.randn(3, 5)
    g = captured_graph(fn, x, y)
    ctx = PassContext()
    out = check_pass(cse, g, [x, y], ctx)
    assert ctx.counters["merged"] >= 4
    assert len(out.nodes) < len(g.nodes)
    # random ops are never merged
    r = Value(f32(3), "r")
    spec = ("__list__", ("__list__", _targ(0)), ("__dict__",))
    attrs = {"target": "aten.rand_like.default", "spec": spec, "out_types": (f32(3),)}
    n1 = make_node("extern_effect", [r], attrs, out_types=[f32(3)])
    n2 = make_node("extern_effect", [r], attrs, out_types=[f32(3)])
    add = make_node("add", [n1.out, n2.out])
    g2 = Graph([GraphInput(r, "user", "r")], [n1, n2, add], [add.out])
    assert len(cse(g2, PassContext()).nodes) == 3


def test_fold_constants_folds_const_subgraphs_not_weight_views():
    w = torch.randn(8, 4)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w.clone())

        def forward(self, x):
            mask = torch.arange(4) < 2            # input-independent -> folds
            scale = self.w.sum() * 2              # parameter-only (frozen) -> folds
            return (x @ self.w.t()) * scale + mask.sum()

    m = M().eval()
    x = torch.randn(3, 4)
    g = captured_graph(m, x, freeze=True)
    ctx = PassContext()
    out = check_pass(fold_constants, g, [x], ctx)
    assert ctx.counters["folded"] >= 2
    ops = [n.op for n in out.nodes]
    assert "permute" in ops, "a view of a weight must stay a (free) view, not a folded copy"
    assert "iota" not in ops or ops.count("lt") == 0


def test_fold_constants_folds_a_qkv_weight_concatenation_and_cast_when_frozen():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(6, 6) for _ in range(3))

        def forward(self, x):
            w = torch.cat((self.q.weight, self.k.weight, self.v.weight)).to(torch.float64).float()
            b = torch.cat((self.q.bias, self.k.bias, self.v.bias))
            return torch.nn.functional.linear(x, w, b).split(6, dim=-1)

    m = Attn().eval()
    x = torch.randn(2, 5, 6)
    g = captured_graph(m, x, freeze=True)
    assert [n.op for n in g.nodes].count("cat") == 2
    ctx = PassContext()
    out = check_pass(fold_constants, g, [x], ctx)
    ops = [n.op for n in out.nodes]
    assert "cat" not in ops and "cast" not in ops, ops
    assert ctx.counters["folded"] >= 3


def test_simplify_rules():
    def fn(x, y):
        a = (x + 0.0) * 1.0 / 1.0
        b = torch.pow(a, 2) + torch.pow(y, 0.5) + torch.pow(a, -1.0) + torch.pow(a, 1)
        c = torch.neg(torch.neg(b))
        d = c / 4.0
        return torch.where(x > 0, d, d) + x.float().double().float()

    x, y = torch.randn(4, 6) + 3, torch.rand(4, 6) + 0.5
    g = captured_graph(fn, x, y)
    ctx = PassContext()
    out = dce(check_pass(simplify, g, [x, y], ctx))
    ops = [n.op for n in out.nodes]
    assert ctx.counters["rewrites"] >= 8
    assert "pow" not in ops and "sqrt" in ops and "reciprocal" in ops and "neg" not in ops
    assert "where" not in ops and "div" not in ops


def test_layout_folds_view_chains():
    def fn(x):
        a = x.permute(1, 0, 2).permute(1, 0, 2)      # identity
        b = x.reshape(6, 4).reshape(2, 12).reshape(24)
        c = x.transpose(0, 2).transpose(0, 1)        # one permute
        return a.sum() + b.sum() + c.sum(0)

    x = torch.randn(2, 3, 4)
    g = captured_graph(fn, x)
    ctx = PassContext()
    out = dce(check_pass(layout, g, [x], ctx))
    ops = [n.op for n in out.nodes]
    assert ops.count("permute") == 1 and ops.count("reshape") == 1
    assert ctx.counters["views_folded"] >= 4


def test_passes_on_random_graph_compositions():
    from novaforge.passes.pipeline import graph_passes

    def fn(x, y):
        z = torch.softmax(x @ y.t() * 0.125, -1)
        w = torch.nn.functional.layer_norm(z + 1.0, (z.shape[-1],))
        return (w * torch.sigmoid(w)).sum(0), z.max(-1).values

    x, y = torch.randn(5, 7), torch.randn(3, 7)
    g = captured_graph(fn, x, y)
    for name, p in graph_passes():
        g = check_pass(p, g, [x, y], atol=1e-5)
        assert g is not None, name
