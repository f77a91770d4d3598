"""Common-subexpression elimination.

Two nodes with the same op, attributes and (already deduplicated) inputs compute the same
values, which is the structural-key equality of DESIGN.md evaluated incrementally; the later
one is replaced by the earlier. `random` and `side_effect` ops are never merged.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Rewriter
from ..ir.structural import canonical
from .context import PassContext, describe


def cse(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    rw = Rewriter(graph)
    seen: dict[tuple, object] = {}
    merged = 0
    for n in graph.nodes:
        d = OPS[n.op]
        if d.has("random") or d.has("side_effect"):
            rw.keep(n)
            continue
        ins = tuple(rw.get(v) for v in n.inputs)
        if d.has("commutative") and len(ins) == 2 and ins[0].id > ins[1].id:
            key_ins = (ins[1], ins[0])
        else:
            key_ins = ins
        key = (n.op, canonical(n.attrs), key_ins, tuple(o.type for o in n.outputs))
        prev = seen.get(key)
        if prev is None:
            seen[key] = rw.keep(n)
            continue
        if not ctx.take_fuel(lambda n=n, prev=prev: f"cse: merged into {prev.outputs[0]!r}: {describe(n)}"):
            rw.keep(n)
            continue
        for old, new in zip(n.outputs, prev.outputs, strict=True):
            rw.replace(old, new)
        merged += 1
    ctx.count("merged", merged)
    return rw.finish() if merged else graph
