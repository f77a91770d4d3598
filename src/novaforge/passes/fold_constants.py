"""Constant folding.

A node whose inputs are all constant (const inputs, generator outputs, or folded values) is
evaluated once at compile time with the op's reference implementation and replaced by a new
const input. Never folded: `random`/`side_effect` ops, generators themselves (a scalar or an
`expand` of a scalar stays symbolic, so fills cost no memory), views of original constants
(a permuted or reshaped weight is a free strided view; copying it would double the model's
memory), and results larger than `fold_max_elements`. With `freeze=True` parameters are const
inputs, so parameter-only subgraphs (weight casts, concatenations, the causal mask built from
`arange`) fold here.
"""

from __future__ import annotations

import torch

from ..ir import OPS, Graph, Rewriter, Value
from ..ir.symbolic import is_symbolic
from ..options import Options
from .context import PassContext, describe

DEFAULT_MAX_ELEMENTS = Options().fold_max_elements


def fold_constants(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    limit = ctx.options.fold_max_elements
    rw = Rewriter(graph)
    const: dict[Value, torch.Tensor | None] = {}  # value -> tensor (None: symbolic generator)
    original = set()
    for gi in graph.inputs:
        if gi.kind == "const":
            const[gi.value] = gi.tensor
            original.add(gi.value)
    folded = 0
    lazy_defs = {}  # symbolic const-like value -> its defining node (generators, views of consts)
    for n in graph.nodes:
        d = OPS[n.op]
        ins = [rw.get(v) for v in n.inputs]
        if is_symbolic(n.attrs) or is_symbolic([o.type for o in n.outputs]):
            rw.keep(n)  # its value depends on the sizes of the call: never a constant
            continue
        if d.has("generator"):
            node = rw.keep(n)
            const[node.outputs[0]] = None
            lazy_defs[node.outputs[0]] = node
            continue
        if not d.evaluable or not all(v in const for v in ins):
            rw.keep(n)
            continue
        if d.has("view") and (ins[0] in original or const[ins[0]] is None):
            node = rw.keep(n)
            const[node.outputs[0]] = None
            lazy_defs[node.outputs[0]] = node
            continue
        if any(o.type.numel > limit for o in n.outputs) \
                or not ctx.take_fuel(lambda n=n: f"fold_constants: folded {describe(n)}"):
            rw.keep(n)
            continue
        args = [_materialize(v, const, lazy_defs) for v in ins]
        outs = d.evaluate(args, n.attrs)
        for o, t in zip(n.outputs, outs, strict=True):
            t = t.detach().contiguous()
            c = rw.add_const(t, f"folded.{n.op}.{o.id}")
            rw.replace(o, c)
            const[c] = t
        folded += 1
    ctx.count("folded", folded)
    return rw.finish() if folded else graph


def _materialize(v: Value, const: dict, lazy_defs: dict) -> torch.Tensor:
    t = const.get(v)
    if t is not None:
        return t
    node = lazy_defs[v]
    args = [_materialize(i, const, lazy_defs) for i in node.inputs]
    return OPS[node.op].evaluate(args, node.attrs)[0]
