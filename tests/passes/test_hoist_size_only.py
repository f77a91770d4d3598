"""hoist_size_only: values of the sizes alone become `size` inputs with a recipe, in graphs
with symbolic sizes only; the graph's specializations still compute eager's values."""

from __future__ import annotations

import torch

from novaforge.frontend.capture import capture
from novaforge.frontend.dynamic import specialize, symbol_values
from novaforge.ir.verify import verify
from novaforge.passes.dce import dce
from novaforge.passes.hoist_size_only import hoist_size_only
from novaforge.runtime.interpret import interpret


def _fn(x):
    n = x.shape[0]
    ramp = torch.cumsum(torch.arange(n) % 3, 0)  # the sizes alone: cumsum has no CPU code
    return x * ramp[:, None] + torch.arange(n)[:, None]


def test_size_only_values_become_size_inputs():
    cap = capture(_fn, (torch.randn(7, 4),), {}, dynamic=[{0: (2, 512)}])
    with cap.symbols.ranges_context():
        g = dce(hoist_size_only(cap.graph))
    verify(g, "hoist_size_only")
    sizes = [gi for gi in g.inputs if gi.kind == "size"]
    assert sizes and all(gi.recipe is not None for gi in sizes)
    assert "cumsum" not in [n.op for n in g.nodes]
    assert any("cumsum" in [n.op for n in gi.recipe.nodes] for gi in sizes)
    for n in (3, 7, 40):
        x = torch.randn(n, 4)
        values = symbol_values(cap.symbols, g, [x])
        torch.testing.assert_close(interpret(specialize(g, values), [x])[0], _fn(x))


def test_static_graphs_are_unchanged():
    cap = capture(_fn, (torch.randn(7, 4),), {})
    assert hoist_size_only(cap.graph) is cap.graph
