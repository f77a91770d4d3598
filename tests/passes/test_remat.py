"""passes/remat.py: cheap elementwise values read near and far are recomputed for the far
readers; under a memory budget, matmuls too; results unchanged (interpreter and the CPU backend
against eager)."""

from __future__ import annotations

import pytest
import torch

import novaforge
from nf_testing import captured_graph
from novaforge.options import Options
from novaforge.passes.context import PassContext
from novaforge.passes.pipeline import graph_passes, run_pipeline
from novaforge.passes.remat import FAR, remat
from novaforge.runtime.interpret import interpret

W1, B1, W2 = torch.randn(32, 128), torch.randn(128), torch.randn(128, 32)  # activations of 512 x 128: 256 KiB


def step_like(x, dy):
    """A forward (GELU between two matmuls, a LayerNorm-like affine) and, after many unrelated
    nodes, a backward that reads the GELU output (weight gradient) and its input (derivative)."""
    h = x @ W1 + B1
    g = torch.nn.functional.gelu(h, approximate="tanh")
    out = g @ W2
    z = out
    for _ in range(FAR // 2 + 10):  # a long middle: the late readers are more than FAR nodes away
        z = torch.sin(z) * 0.5
    dw2 = g.t() @ (dy * z)              # far reader of g
    dh = (dy @ W2.t()) * torch.tanh(h)  # far reader of h: h is live there anyway
    return out, dw2, dh


def _graph(x, dy):
    g = captured_graph(step_like, x, dy)
    g, _ = run_pipeline(g, [(n, p) for n, p in graph_passes() if n != "remat"])
    return g


def test_gelu_is_recomputed_for_its_far_reader():
    x, dy = torch.randn(512, 32), torch.randn(512, 32)
    g = _graph(x, dy)
    ctx = PassContext()
    out = remat(g, ctx)
    assert ctx.counters.get("recomputed") == 1
    gelus = [n for n in out.nodes if n.op == "gelu"]
    assert len(gelus) == 2
    # the copy sits after the long middle, right before the weight-gradient matmul
    pos = {n: i for i, n in enumerate(out.nodes)}
    assert pos[gelus[1]] - pos[gelus[0]] > FAR
    args = [x, dy]
    for a, b in zip(interpret(g, args), interpret(out, args), strict=True):
        assert torch.equal(a, b)


def test_near_only_values_and_dead_inputs_are_left_alone():
    x, dy = torch.randn(512, 32), torch.randn(512, 32)

    def near(x, dy):  # no far reader
        return torch.nn.functional.gelu(x @ W1 + B1) @ W2

    g = captured_graph(near, x, dy)
    ctx = PassContext()
    assert remat(g, ctx) is g and not ctx.counters

    def dead_input(x, dy):  # g's input is read near only: recomputing it would keep it alive
        z = torch.exp(x @ W1)
        g = z * 2.0
        w = g @ W2
        for _ in range(FAR // 2 + 10):
            w = torch.sin(w)
        return g.sum() + w.sum() + (g * dy.sum()).sum()

    g2 = captured_graph(dead_input, x, dy)
    ctx = PassContext()
    remat(g2, ctx)
    assert not ctx.counters.get("recomputed")


def test_compiled_results_equal_eager():
    x, dy = torch.randn(512, 32), torch.randn(512, 32)
    ref = step_like(x, dy)
    c = novaforge.compile(step_like, backend="cpu")
    got = c(x, dy)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
    rec = {r.name: r.counters for r in c.stats().records}
    assert rec["remat"].get("recomputed") == 1
    # the copy stays a late kernel (fuse's far rule), not a second output of the forward's kernel
    kernels = [n for n in c.stats().graph.nodes if n.op == "kernel"]
    with_gelu = [n for n in kernels if any(m.op == "gelu" for m in n.attrs["kernel"].body.nodes)]
    assert [n.attrs["kernel"].kind for n in with_gelu] == ["matmul", "pointwise"]


def test_memory_budget_recomputes_a_matmul_and_frees_its_bytes():
    x, dy = torch.randn(512, 32), torch.randn(512, 32)
    g = _graph(x, dy)
    default, budget = PassContext(), PassContext(options=Options(memory_budget=0.0))
    plain, lean = remat(g, default), remat(g, budget)
    assert not any(k.startswith("budget") for k in default.counters)
    # h = x @ W1 + B1 is read far (dh's tanh(h)): recomputed from x, a graph input, with its matmul
    assert budget.counters["budget_recomputed"] == 1
    assert budget.counters["budget_recomputed_bytes"] == 512 * 128 * 4
    assert budget.counters["budget_kept_bytes"] < budget.counters["budget_far_bytes"]
    count = lambda gr: sum(n.op == "matmul" for n in gr.nodes)  # noqa: E731
    assert count(lean) == count(plain) + 1
    args = [x, dy]
    for a, b in zip(interpret(g, args), interpret(lean, args), strict=True):
        assert torch.equal(a, b)


def test_memory_budget_compiled_results_equal_eager():
    x, dy = torch.randn(512, 32), torch.randn(512, 32)
    ref = step_like(x, dy)
    c = novaforge.compile(step_like, backend="cpu", memory_budget=0.0)
    for r, o in zip(ref, c(x, dy), strict=True):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
    assert {r.name: r.counters for r in c.stats().records}["remat"]["budget_recomputed"] == 1


def test_memory_budget_is_validated():
    for bad in (1.5, -0.1, "half", True):
        with pytest.raises((ValueError, TypeError), match="memory_budget"):
            Options(memory_budget=bad)
