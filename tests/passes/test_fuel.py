"""Fuel (passes/context.py): with any fuel every pass returns a valid graph computing the same
values; fuel 0 changes nothing a decision guards; the pipeline records decision counts."""

from __future__ import annotations

import pytest
import torch

from nf_testing import bind, captured_graph
from novaforge.ir import verify
from novaforge.passes.context import PassContext
from novaforge.passes.pipeline import default_pipeline, run_pipeline
from novaforge.runtime.interpret import interpret


def model(x, w):
    a = x @ w + 0
    b = torch.softmax(a * 1, -1) + torch.softmax(a * 1, -1)
    c = torch.cat([-a, a * 2], -1).sum(-1, keepdim=True)
    return torch.tanh(b) * c + torch.ones(3, 1) * 2 ** 2, (x * 1).t().contiguous()


@pytest.mark.parametrize("fuel", [0, 1, 2, 3, 5, 8, None])
def test_every_fuel_is_valid_and_exact(fuel):
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    g0 = captured_graph(model, x, w)
    inputs = bind(g0, [x, w])
    want = interpret(g0, inputs)
    passes = default_pipeline()
    for i, (name, _) in enumerate(passes):
        g, recs = run_pipeline(g0, passes=passes, options={"pass_fuel": {i: fuel}, "pass_trace": True}, check=True)
        verify(g)
        got = interpret(g, inputs)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} with fuel {fuel}")
        taken = len(recs[i].trace)
        assert taken == (recs[i].decisions if fuel is None else min(fuel, recs[i].decisions)), name


def test_fuel_zero_leaves_a_graph_pass_unchanged_and_counts():
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    g0 = captured_graph(model, x, w)
    _, full = run_pipeline(g0)
    by_name: dict[str, int] = {}
    for r in full:
        by_name[r.name] = max(by_name.get(r.name, 0), r.decisions)
    assert by_name["simplify"] >= 3 and by_name["cse"] >= 1 and by_name["fuse"] >= 1
    from novaforge.passes.cse import cse
    from novaforge.passes.simplify import simplify

    for p in (cse, simplify):
        ctx = PassContext(fuel=0)
        assert p(g0, ctx) is g0  # nothing rewritten: the very same graph
        assert ctx.decisions >= 1


def test_take_fuel_counts_and_traces():
    ctx = PassContext(fuel=2, trace=[])
    assert [ctx.take_fuel(lambda i=i: f"d{i}") for i in range(4)] == [True, True, False, False]
    assert ctx.decisions == 4 and ctx.trace == ["d0", "d1"]
    free = PassContext()
    assert all(free.take_fuel("x") for _ in range(3)) and free.trace is None and free.decisions == 3
