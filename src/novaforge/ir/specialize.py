"""Specialization: a graph with symbolic sizes (ir/symbolic.py) at concrete symbol values.

`specialize(graph, values)` substitutes the values into every type and attribute: the result
is an ordinary static graph, value for value and node for node (a size used as a number takes
its scalar's dtype; a `size` input becomes a const input, its recipe evaluated).

Invariant: specializing at values the graph's `SymbolTable` admits gives the graph a static
capture at those sizes gives, up to value numbering.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy
import torch

from .graph import Attrs, Graph, GraphInput, Node, Value
from .symbolic import Sym, is_symbolic, substitute
from .types import TensorType, is_float


def specialize(graph: Graph, values: Mapping[sympy.Symbol, int]) -> Graph:
    """The static graph of `graph` at these symbol values (every type and attribute substituted)."""
    new: dict[Value, Value] = {}

    def val(v: Value) -> Value:
        out = new.get(v)
        if out is None:
            out = new[v] = Value(substitute(v.type, values), v.hint) if _symbolic_type(v.type) else v
        return out

    inputs = [GraphInput(val(gi.value), "const", gi.name, evaluate_recipe(gi.recipe, values)) if gi.kind == "size"
              else GraphInput(val(gi.value), gi.kind, gi.name, gi.tensor) for gi in graph.inputs]
    nodes = []
    for n in graph.nodes:
        attrs = n.attrs
        if _symbolic_attrs(attrs):
            attrs = Attrs({k: substitute(a, values) for k, a in attrs.items()})
            if n.op == "scalar":  # a size used as a number takes the scalar's dtype
                attrs = attrs.replace(value=python_scalar(attrs["value"], attrs["dtype"]))
        nodes.append(Node(n.op, [val(v) for v in n.inputs], attrs, [val(v) for v in n.outputs], dict(n.meta)))
    return Graph(inputs, nodes, [val(v) for v in graph.outputs],
                 [(val(a), val(b)) for a, b in graph.mutations], graph.meta.copy())


def evaluate_recipe(recipe: Graph, values: Mapping[sympy.Symbol, int]) -> torch.Tensor:
    """The tensor a `size` input's recipe computes at these symbol values (each op's reference
    implementation, as constant folding evaluates)."""
    from .ops import OPS

    g = specialize(recipe, values)
    env = {gi.value: gi.tensor for gi in g.inputs}
    for n in g.nodes:
        for o, t in zip(n.outputs, OPS[n.op].evaluate([env[v] for v in n.inputs], n.attrs), strict=True):
            env[o] = t
    return env[g.outputs[0]].detach().contiguous()


def python_scalar(value: int, dtype: torch.dtype) -> bool | int | float:
    if is_float(dtype):
        return float(value)
    return bool(value) if dtype == torch.bool else int(value)


def _symbolic_type(t: TensorType) -> bool:
    return any(isinstance(d, Sym) for d in t.shape)


def _symbolic_attrs(attrs: Attrs) -> bool:
    return any(is_symbolic(a) for a in attrs.values())
