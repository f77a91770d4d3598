"""Cat fusion: simplify factors negated / scaled cat pieces out exactly (bit-identical), and
fuse makes cats loads of pointwise kernels (RoPE is one kernel), keeps them out of reductions
and anchors, replicates cats of generators, and leaves huge cats as single kernels."""

from __future__ import annotations

import pytest
import torch

from nf_testing import captured_graph, check_pass
from novaforge.ir import OPS, Graph, GraphInput, Value, make_node
from novaforge.ir.types import TensorType
from novaforge.passes.context import PassContext
from novaforge.passes.fuse import MAX_CAT_PIECES, fuse
from novaforge.passes.pipeline import graph_passes, run_pipeline
from novaforge.passes.simplify import simplify
from novaforge.runtime.interpret import interpret


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(q, cos, sin):
    q = q.transpose(1, 2)  # a view of the projection output, as in HF Llama
    return q * cos + rotate_half(q) * sin


def optimized(fn, *args):
    g, records = run_pipeline(captured_graph(fn, *args), graph_passes())
    return g, {k: v for r in records for k, v in r.counters.items()}


def kernels(g):
    return [n.attrs["kernel"] for n in g.nodes if n.op == "kernel"]


def body_ops(k):
    return [n.op for n in k.body.nodes]


def check_cat_loads(k):
    """The body contract: a cat reads (views of) body inputs or generators, never computed values."""
    producer = {o: n for n in k.body.nodes for o in n.outputs}
    for n in k.body.nodes:
        if n.op != "cat":
            continue
        assert k.kind == "pointwise", k
        for v in n.inputs:
            p = producer.get(v)
            while p is not None and OPS[p.op].has("view"):
                p = producer.get(p.inputs[0])
            assert p is None or OPS[p.op].has("generator"), (k.name, p)


# ------------------------------------------------------------------------------ simplify
def _simplified(fn, *args):
    g = captured_graph(fn, *args)
    ctx = PassContext()
    out = check_pass(simplify, g, list(args), ctx=ctx, atol=0, rtol=0)
    return g, out, ctx.counters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_rotate_half_is_factored_bit_exactly(dtype):
    x = (torch.randn(2, 3, 5, 8) * 10).to(dtype)
    _, out, counters = _simplified(rotate_half, x)
    assert counters.get("cat_pieces_factored") == 1
    cat = next(n for n in out.nodes if n.op == "cat" and len(n.inputs) == 2 and out.producer(n.inputs[0]).op == "slice")
    assert all(out.producer(v).op == "slice" for v in cat.inputs)  # the data cat gathers views only
    got = interpret(out, [x])[0]
    assert torch.equal(got, rotate_half(x))


def test_three_pieces_with_scalar_multiples_and_odd_sizes():
    def fn(x, y):
        return torch.cat((x[:, :3] * 0.5, -y, x[:, 3:], 2.0 * y[:, :1]), dim=1)

    x, y = torch.randn(4, 7), torch.randn(4, 5)
    _, out, counters = _simplified(fn, x, y)
    assert counters.get("cat_pieces_factored") == 1
    ops = [n.op for n in out.nodes]
    assert ops.count("full") >= 3  # one fill per run of equal factors
    assert torch.equal(interpret(out, [x, y])[0], fn(x, y))


def test_negation_with_other_users_is_not_factored():
    def fn(x):
        n = -x[:, 4:]
        return torch.cat((n, x[:, :4]), dim=1), n * 3

    _, _, counters = _simplified(fn, torch.randn(3, 8))
    assert "cat_pieces_factored" not in counters


def test_all_pieces_negated_becomes_one_scalar_multiple():
    def fn(x, y):
        return torch.cat((-x, -y), dim=0)

    x, y = torch.randn(2, 3), torch.randn(4, 3)
    _, out, counters = _simplified(fn, x, y)
    assert counters.get("cat_pieces_factored") == 1
    assert "full" not in [n.op for n in out.nodes]
    assert torch.equal(interpret(out, [x, y])[0], fn(x, y))


# ---------------------------------------------------------------------------------- fuse
def test_rope_is_one_pointwise_kernel():
    q, cos, sin = torch.randn(2, 16, 4, 16), torch.randn(16, 16), torch.randn(16, 16)
    g, counters = optimized(rope, q, cos, sin)
    assert counters.get("cat_pieces_factored") == 1
    out = check_pass(fuse, g, [q, cos, sin])
    ks = kernels(out)
    assert len(ks) == 1 and ks[0].kind == "pointwise", [(k.name, k.kind) for k in ks]
    assert "neg" not in body_ops(ks[0]) and body_ops(ks[0]).count("cat") == 2  # data and sign
    check_cat_loads(ks[0])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat_of_views_joins_its_consumers(dim):
    def fn(a, b, c):
        x = torch.cat((a, b[..., ::2], c.transpose(0, 2).transpose(0, 2)), dim=dim)
        return torch.exp(x) * 2 + 1

    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for s, n in zip(shapes, (2, 1, 4), strict=True):
        s[dim] = n
    shapes[1][2] *= 2  # b is read with a step
    a, b, c = (torch.randn(*s) for s in shapes)
    g, _ = optimized(fn, a, b, c)
    out = check_pass(fuse, g, [a, b, c])
    ks = kernels(out)
    assert [k.kind for k in ks] == ["pointwise"] and "cat" in body_ops(ks[0]), [(k.name, k.kind) for k in ks]
    check_cat_loads(ks[0])


def test_cat_stays_out_of_reductions_and_anchors():
    w = torch.randn(10, 6)

    def fn(a, b):
        x = torch.cat((a, b), dim=-1)
        return torch.softmax(x, -1), (x + 1) @ w

    a, b = torch.randn(4, 3), torch.randn(4, 7)
    g, _ = optimized(fn, a, b)
    out = check_pass(fuse, g, [a, b])
    for k in kernels(out):
        check_cat_loads(k)
    kinds = sorted(k.kind for k in kernels(out))
    assert "single" not in kinds and "reduction" in kinds and "matmul" in kinds, kinds


def test_shared_cat_of_fills_is_replicated_into_each_consumer():
    """CSE merges the sign cats of two RoPEs; each kernel gets its own copy (no kernel output)."""
    def fn(q, k, cos, sin):
        return rope(q, cos, sin), rope(k, cos, sin)

    q, k = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)
    cos, sin = torch.randn(8, 16), torch.randn(8, 16)
    g, _ = optimized(fn, q, k, cos, sin)
    signs = [n for n in g.nodes if n.op == "cat" and all(g.producer(v).op == "full" for v in n.inputs)]
    assert len(signs) == 1 and len(g.users(signs[0].out)) == 2
    out = check_pass(fuse, g, [q, k, cos, sin])
    ks = kernels(out)
    assert len(ks) == 2 and all(len(kk.body.outputs) == 1 for kk in ks)
    for kk in ks:
        check_cat_loads(kk)


def _hand_graph_shared_sign():
    """One sign cat (fills) read by two pointwise consumers with separate data."""
    t = TensorType((3, 8), torch.float32)
    a, b = Value(t), Value(t)
    f1 = make_node("full", [], {"shape": (3, 4), "value": -1.0, "dtype": torch.float32})
    f2 = make_node("full", [], {"shape": (3, 4), "value": 1.0, "dtype": torch.float32})
    sign = make_node("cat", [f1.out, f2.out], {"axis": 1})
    m1 = make_node("mul", [a, sign.out])
    e1 = make_node("exp", [b])
    m2 = make_node("mul", [e1.out, sign.out])
    nodes = [f1, f2, sign, m1, e1, m2]
    return Graph([GraphInput(a, "user", "a"), GraphInput(b, "user", "b")], nodes, [m1.out, m2.out])


def test_cat_of_fills_used_by_two_kernels_is_copied_not_exported():
    g = _hand_graph_shared_sign()
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    out = check_pass(fuse, g, [x, y])
    ks = kernels(out)
    assert all(body_ops(k).count("cat") == 1 for k in ks), [body_ops(k) for k in ks]
    assert sum(len(k.body.outputs) for k in ks) == 2  # the graph's two outputs only


def test_cat_of_too_many_pieces_is_a_single_kernel():
    n = MAX_CAT_PIECES + 1

    def fn(x):
        return torch.cat([x[:, i:i + 1] for i in range(n)], dim=1) * 2

    x = torch.randn(3, n)
    g, _ = optimized(fn, x)
    out = check_pass(fuse, g, [x])
    assert [k.kind for k in kernels(out)] == ["single", "pointwise"]


def test_cat_of_fills_read_by_a_matmul_or_a_cat_is_materialized():
    x, y = Value(TensorType((3, 4), torch.float32)), Value(TensorType((3, 6), torch.float32))
    f1 = make_node("full", [], {"shape": (2, 6), "value": -1.0, "dtype": torch.float32})
    f2 = make_node("full", [], {"shape": (2, 6), "value": 2.0, "dtype": torch.float32})
    sign = make_node("cat", [f1.out, f2.out], {"axis": 0})  # [4, 6]
    mm = make_node("matmul", [x, sign.out])
    outer = make_node("cat", [y, sign.out], {"axis": 0})  # reads the inner cat as a buffer
    g = Graph([GraphInput(x, "user", "x"), GraphInput(y, "user", "y")], [f1, f2, sign, mm, outer],
              [mm.out, outer.out])
    out = check_pass(fuse, g, [torch.randn(3, 4), torch.randn(3, 6)])
    ks = kernels(out)
    for k in ks:
        check_cat_loads(k)
    assert sorted(k.kind for k in ks) == ["matmul", "pointwise", "pointwise"], [(k.name, k.kind) for k in ks]
