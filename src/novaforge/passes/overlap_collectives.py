"""Collectives overlap compute: each is issued as early as its inputs allow and waited on as late as
its first use.

torch.distributed's functional collectives (`_c10d_functional.all_reduce`, `all_gather_into_tensor`,
`reduce_scatter_tensor`, ...) are asynchronous: the op returns at once and `wait_tensor` blocks until the
process group has written the result. In a traced graph the wait usually follows its collective
directly (tensor parallel's backward: the all-reduce of an input gradient, then its wait, then the
weight-gradient GEMMs that do not need it). After ordering, this pass moves, over the top-level
kernels:

by list scheduling over the same dependences as the order pass (producers, the effect chain, the
collective chain: every rank issues its collectives in the traced order, and a mutated input's readers
before its update), with the order pass's order as the priority among the rest:

* a collective is scheduled as soon as it is ready (just after the last producer of its inputs and the
  collective before it);
* a `wait_tensor` only when nothing else is ready: compute that does not need the result runs first,
  and the wait lands just before the first kernel that reads its result (or the program's end).

The compute between the two runs while the process group communicates; the CPU runtime issues such a
collective without waiting (runtime/collectives.py) and records the time each wait blocks (the exposed
communication). The memory plan runs after this pass: the result's buffer is live from issue to wait.

Applies when: option `overlap_collectives` (default True); programs with collectives.

Invariant: every dependence is kept (the result is a topological order of them) and the collectives'
relative order is the graph's.
"""

from __future__ import annotations

from ..ir import Graph
from .context import PassContext
from .order import WAIT, collective_target, dependences


def overlap_collectives(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if not ctx.options.overlap_collectives:
        return graph
    nodes = list(graph.nodes)
    kind = [collective_target(n) for n in nodes]
    if not any(k not in (None, WAIT) for k in kind):
        return graph
    deps, _ = dependences(graph)
    users: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    pending = [len(d) for d in deps]
    ready = {i for i, p in enumerate(pending) if p == 0}
    out: list[int] = []
    while ready:
        issues = [i for i in ready if kind[i] not in (None, WAIT)]
        compute = [i for i in ready if kind[i] is None]
        best = min(issues or compute or ready)  # (a wait only when nothing else is ready)
        ready.remove(best)
        out.append(best)
        for u in users[best]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.add(u)
    assert len(out) == len(nodes), "overlap_collectives: the dependences have a cycle"
    if out == sorted(out):
        return graph
    new = [nodes[i] for i in out]
    ctx.count("nodes_moved", sum(1 for k, i in enumerate(out) if k != i))
    ctx.count("kernels_between_collective_and_wait", _distance(new))
    return Graph(graph.inputs, new, graph.outputs, graph.mutations, graph.meta)


def _distance(nodes) -> int:
    """Sum over waits of the nodes between the wait and the collective it waits on."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    return sum(i - producer[n.inputs[0]] - 1 for i, n in enumerate(nodes)
               if collective_target(n) == WAIT and n.inputs and n.inputs[0] in producer)
