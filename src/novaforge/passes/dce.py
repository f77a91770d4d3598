"""Dead-code elimination.

Keeps a node iff one of its outputs is (transitively) needed by a graph output, a mutation
write-back, or a `side_effect` node. Unused const inputs are dropped (they hold memory);
user, parameter and buffer inputs stay, since they are the calling convention.
"""

from __future__ import annotations

from ..ir import OPS, Graph
from .context import PassContext, describe


def dce(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    live = set(graph.outputs) | {new for _, new in graph.mutations}
    keep = []
    for n in reversed(graph.nodes):
        if OPS[n.op].has("side_effect") or any(o in live for o in n.outputs) \
                or not ctx.take_fuel(lambda n=n: f"dce: removed {describe(n)}"):
            keep.append(n)
            live.update(n.inputs)
    keep.reverse()
    removed = len(graph.nodes) - len(keep)
    inputs = [gi for gi in graph.inputs if gi.kind not in ("const", "size") or gi.value in live
              or not ctx.take_fuel(lambda gi=gi: f"dce: dropped constant {gi.name or gi.value}")]
    ctx.count("nodes_removed", removed)
    ctx.count("consts_dropped", len(graph.inputs) - len(inputs))
    if removed == 0 and len(inputs) == len(graph.inputs):
        return graph
    from ..ir import Graph as G

    return G(inputs, keep, graph.outputs, graph.mutations, graph.meta)
