"""Ordering for low peak memory.

Greedy list scheduling over the top-level nodes: among ready nodes pick the one that frees
the most bytes minus what it allocates, ties broken by the original order (which keeps the
model's locality). The new order is kept only if its planned peak of live intermediate bytes
is lower than the original order's; the pass reports both.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .context import PassContext


def _peak(nodes: list[Node], escaping: set[Value]) -> int:
    last: dict[Value, int] = {}
    produced = {o for n in nodes for o in n.outputs}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            last[v] = i
    live = peak = 0
    for i, n in enumerate(nodes):
        live += sum(o.type.nbytes for o in n.outputs if o not in escaping)
        peak = max(peak, live)
        for v in set(n.inputs):
            if last.get(v) == i and v not in escaping and v in produced:
                live -= v.type.nbytes
    return peak


def order(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    nodes = list(graph.nodes)
    escaping = set(graph.outputs) | {new for _, new in graph.mutations}
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    deps = [{producer[v] for v in n.inputs if v in producer} for n in nodes]
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    remaining_uses: dict[Value, int] = {}
    for i, n in enumerate(nodes):
        for d in deps[i]:
            users[d].append(i)
        for v in set(n.inputs):
            remaining_uses[v] = remaining_uses.get(v, 0) + 1
    pending = [len(d) for d in deps]
    ready = [i for i in range(len(nodes)) if pending[i] == 0]
    out: list[int] = []
    while ready:
        def score(i: int) -> tuple[int, int]:
            n = nodes[i]
            alloc = sum(o.type.nbytes for o in n.outputs if o not in escaping)
            freed = sum(v.type.nbytes for v in set(n.inputs)
                        if remaining_uses.get(v) == 1 and v in producer and v not in escaping)
            return (alloc - freed, i)

        best = min(ready, key=score)
        ready.remove(best)
        out.append(best)
        for v in set(nodes[best].inputs):
            remaining_uses[v] -= 1
        for u in users[best]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    new_nodes = [nodes[i] for i in out]
    before, after = _peak(nodes, escaping), _peak(new_nodes, escaping)
    ctx.count("peak_bytes_before", before)
    ctx.count("peak_bytes_after", min(before, after))
    if after < before and ctx.take_fuel(f"order: reordered {len(nodes)} nodes (peak {before} -> {after} bytes)"):
        ctx.count("reordered", 1)
        return Graph(graph.inputs, new_nodes, graph.outputs, graph.mutations, graph.meta)
    return graph
