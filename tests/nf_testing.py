"""Shared helpers for pass tests: capture small functions, run a pass, compare interpreters."""

from __future__ import annotations

import torch

from novaforge.frontend.capture import capture
from novaforge.ir import Graph, verify
from novaforge.passes.context import PassContext
from novaforge.runtime.interpret import interpret


def captured_graph(fn, *args, freeze: bool = False) -> Graph:
    return capture(fn, args, freeze=freeze).graph


def bind(graph: Graph, user_inputs, params=()):
    """Non-const graph inputs in order: user inputs and (for param/buffer) the given tensors."""
    it_user, it_par = iter(user_inputs), iter(params)
    return [next(it_user) if gi.kind == "user" else next(it_par) for gi in graph.inputs if gi.kind != "const"]


def check_pass(pass_fn, graph: Graph, inputs, ctx: PassContext | None = None, atol=1e-6, rtol=1e-5) -> Graph:
    """Run a pass; the result verifies and computes what the input computed; the input graph is unchanged."""
    before_text = str(graph)
    ctx = ctx or PassContext()
    out = pass_fn(graph, ctx)
    verify(out)
    assert str(graph) == before_text, "a pass modified its input graph"
    ref = interpret(graph, inputs)
    got = interpret(out, inputs)
    assert len(ref) == len(got)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=atol, rtol=rtol)
    return out


def cross_entropy_in_place_case(backend: str) -> None:
    """log_softmax of a matmul output and the softmax-gradient reduction of cross-entropy's
    backward write over the buffer they read (a reduction kernel reads a row in its passes
    before its last pass stores it); the exp(log_softmax) the backward needs moves into the
    backward's kernel instead of being a second vocabulary-sized output. Same results as
    eager (tests/passes/test_fuse_and_memory.py runs it on the CPU backend,
    tests/codegen/triton/test_reductions.py on Triton)."""
    w = torch.randn(24, 40, requires_grad=True)

    def fn(x, t):
        with torch.enable_grad():
            logits = x @ w
            loss = torch.nn.functional.cross_entropy(logits, t)
            (g,) = torch.autograd.grad(loss, [w])
        return loss.detach(), g

    x, t = torch.randn(16, 24), torch.randint(0, 40, (16,))
    ref = fn(x, t)
    import novaforge

    c = novaforge.compile(fn, backend=backend)
    got = c(x, t)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    graph = c.stats().graph
    plan = graph.meta.memory_plan
    rows = [v for v in plan.sizes if tuple(v.type.shape) == (16, 40)]
    assert len(rows) >= 3 and len({plan.offsets[v] for v in rows}) == 1, [plan.offsets[v] for v in rows]
    (lsm,) = [n for n in graph.nodes if n.op == "kernel" and any(m.op == "log" for m in n.attrs["kernel"].body.nodes)]
    assert len(lsm.outputs) == 1
