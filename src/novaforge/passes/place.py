"""Device-affinity placement: which executor runs each top-level node.

Each kernel goes to the backend's generated code when the backend supports it, else to the
`torch` executor (the reference implementation of its ops). A transition is an edge whose two
ends run on different executors or devices (it forces a copy or breaks fusion); the pass
counts them and records the assignment in `graph.meta.placement` ({node: executor}) and `graph.meta.transitions`.
Placement follows capability, so transitions only appear where an op is unsupported; the
count is reported so that work on the backend can drive it to zero.
"""

from __future__ import annotations

from ..ir import OPS, Graph
from .context import PassContext


def place(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    be = ctx.backend
    placement = {}
    for n in graph.nodes:
        fused = OPS[n.op].has("fused")
        if fused and be is not None:
            placement[n] = be.executor_for(n.attrs["kernel"])
        elif fused:
            placement[n] = "torch"
        else:
            placement[n] = "view"
    device_of = {}
    for gi in graph.inputs:
        device_of[gi.value] = ("input", gi.value.type.device)
    transitions = 0
    for n in graph.nodes:
        ex = placement[n]
        for v in n.inputs:
            src = device_of.get(v)
            if src is None or ex == "view" or src[0] in ("input", "view"):
                continue
            if src[0] != ex or src[1] != v.type.device:
                transitions += 1
        for o in n.outputs:
            device_of[o] = (ex, o.type.device)
    counts: dict[str, int] = {}
    for ex in placement.values():
        counts[ex] = counts.get(ex, 0) + 1
    for ex, c in counts.items():
        ctx.count(f"on_{ex}", c)
    ctx.count("transitions", transitions)
    meta = graph.meta.copy()
    meta.placement, meta.transitions = placement, transitions
    return Graph(graph.inputs, graph.nodes, graph.outputs, graph.mutations, meta)
