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
