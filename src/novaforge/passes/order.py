"""Ordering for low peak memory.

Two candidate orders of the top-level nodes: greedy list scheduling (among ready nodes pick
the one that frees the most bytes minus what it allocates, ties broken by the original order,
which keeps the model's locality), and the original order with every node that allocates at
most a few KiB (scalars; an optimizer update whose results are the parameters' own buffers)
hoisted to just after its last dependence, so that the buffers it reads die there (a traced
training step runs the optimizer loop after the whole backward: each weight-gradient GEMM fused
with its update would otherwise keep its layer's activations alive to the end). The better
candidate is kept if its planned peak of live intermediate bytes is lower than the original
order's, or equal (within 64 KiB) with a lower sum of live bytes over the steps (fewer holes
for the arena's placement); the pass reports both peaks. Symbolic sizes count at their planning
hint (an order is a performance choice: any order is correct).

Nodes that draw random numbers or have side effects (dropout's ATen calls, in kernels or not)
keep their relative order: each depends on the previous one, so the same seed gives the same
draws as eager's order of the same calls. torch.distributed collectives keep theirs too (a chain
of their own): every rank must issue them in the same order, the traced one.

A node that computes a mutated graph input's new value is placed after every other reader of
the input's old value (and of its views) where the dependences allow it, in both orders: the
backend may then compute the new value into the input's own buffer (an optimizer step updates
a weight after the backward matmul that reads it, so the update needs no fresh buffer).
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node, Value
from ..ir.extern import COLLECTIVE
from ..ir.symbolic import hint
from ..ir.views import view_roots
from .context import PassContext

WAIT = COLLECTIVE + "wait_tensor.default"


def _peak(nodes: list[Node], escaping: set[Value]) -> tuple[int, int]:
    """(peak, sum over steps) of the live intermediate bytes."""
    last: dict[Value, int] = {}
    produced = {o for n in nodes for o in n.outputs}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            last[v] = i
    live = peak = area = 0
    for i, n in enumerate(nodes):
        live += sum(hint(o.type.nbytes) for o in n.outputs if o not in escaping)
        peak = max(peak, live)
        area += live
        for v in set(n.inputs):
            if last.get(v) == i and v not in escaping and v in produced:
                live -= hint(v.type.nbytes)
    return peak, area


def _update_after_readers(graph: Graph, nodes: list[Node], deps: list[set[int]]) -> int:
    """Add to `deps` (node -> nodes it must follow) an edge from each other reader of a mutated
    input's old value to the node computing its new value, unless the reader depends on that
    node (the edge would close a cycle). Returns the number of edges added."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    root = view_roots(nodes)
    readers: dict[Value, set[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            readers.setdefault(root.get(v, v), set()).add(i)
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    added = 0
    for old, new in graph.mutations:
        u = producer.get(new)
        if u is None or nodes[u].op != "kernel":
            continue
        after_u, stack = set(), [u]  # everything that depends on u
        while stack:
            for w in users[stack.pop()]:
                if w not in after_u:
                    after_u.add(w)
                    stack.append(w)
        for r in readers.get(old, ()):
            if r != u and r not in after_u and r not in deps[u]:
                deps[u].add(r)
                users[r].append(u)
                added += 1
    return added


def _has_effect(n: Node) -> bool:
    """Does n draw random numbers or have a side effect (itself, or an op of its kernel)?"""
    ops = [m.op for m in n.attrs["kernel"].body.nodes] if n.op == "kernel" else [n.op]
    return any(OPS[op].has("random") or OPS[op].has("side_effect") for op in ops)


def collective_target(n: Node) -> str | None:
    """The torch.distributed functional collective a top-level node runs (a kernel whose only
    computation is one `_c10d_functional` extern, or that extern itself: `WAIT` for wait_tensor),
    else None."""
    body_nodes = n.attrs["kernel"].body.nodes if n.op == "kernel" else [n]
    ext = [m for m in body_nodes if m.op.startswith("extern")]
    if len(ext) != 1:
        return None
    target = str(ext[0].attrs.get("target", ""))
    return target if target.startswith(COLLECTIVE) else None


def _is_collective(n: Node) -> bool:
    target = collective_target(n)
    return target is not None and target != WAIT


def _chain_effects(nodes: list[Node], deps: list[set[int]]) -> None:
    """Each node with an effect depends on the previous one, and each torch.distributed collective on
    the previous collective (both orders are kept: every rank issues its collectives in the traced
    order)."""
    for kind in (_has_effect, _is_collective):
        prev = None
        for i, n in enumerate(nodes):
            if kind(n):
                if prev is not None:
                    deps[i].add(prev)
                prev = i


def dependences(graph: Graph) -> tuple[list[set[int]], int]:
    """Per top-level node, the nodes it must follow: its producers, the effect and collective
    chains, and a mutated input's readers before its update; and how many of the last were added."""
    nodes = graph.nodes
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    deps = [{producer[v] for v in n.inputs if v in producer} for n in nodes]
    _chain_effects(nodes, deps)
    anti = _update_after_readers(graph, nodes, deps) if graph.mutations else 0
    return deps, anti


def _stable_topological(deps: list[set[int]]) -> list[int]:
    """The original order, moved only where an added edge requires it."""
    import heapq

    pending = [len(d) for d in deps]
    users: dict[int, list[int]] = {i: [] for i in range(len(deps))}
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return out


def order(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    nodes = list(graph.nodes)
    escaping = set(graph.outputs) | {new for _, new in graph.mutations}
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    deps, anti = dependences(graph)
    if anti:
        ctx.count("updates_after_readers", anti)
        nodes = [nodes[i] for i in _stable_topological(deps)]  # the baseline, updates moved last
        graph = Graph(graph.inputs, nodes, graph.outputs, graph.mutations, graph.meta)
        producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
        deps, _ = dependences(graph)
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
            alloc = sum(hint(o.type.nbytes) for o in n.outputs if o not in escaping)
            freed = sum(hint(v.type.nbytes) for v in set(n.inputs)
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
    baseline = _peak(nodes, escaping)
    candidates = [[nodes[i] for i in out], [nodes[i] for i in _hoist_small(nodes, deps, escaping)]]
    # a candidate wins on a lower peak, or on a lower area (sum of live bytes over steps: buffers
    # that die earlier leave the arena's best-fit placement fewer holes) at the same peak up to
    # `SLACK` (a few hoisted scalars add bytes at the peak)
    scored = sorted((_peak(c, escaping), k) for k, c in enumerate(candidates))
    (best_peak, best_area), k = min(scored, key=lambda s: (s[0][0] // SLACK, s[0][1]))
    ctx.count("peak_bytes_before", baseline[0])
    ctx.count("peak_bytes_after", min(baseline[0], best_peak))
    better = best_peak < baseline[0] - SLACK or (best_peak <= baseline[0] + SLACK and best_area < baseline[1])
    if better and ctx.take_fuel(
            f"order: reordered {len(nodes)} nodes (peak {baseline[0]} -> {best_peak} bytes, "
            f"{'greedy' if k == 0 else 'small nodes hoisted'})"):
        ctx.count("reordered", 1)
        return Graph(graph.inputs, candidates[k], graph.outputs, graph.mutations, graph.meta)
    return graph


SLACK = 1 << 16  # bytes of peak that count as equal
SMALL = 4096  # bytes: a node allocating at most this much is hoisted by `_hoist_small`


def _hoist_small(nodes: list[Node], deps: list[set[int]], escaping: set[Value]) -> list[int]:
    """The given order with every node that allocates at most SMALL bytes of intermediates (a
    scalar, an optimizer update whose results are the parameters' own buffers) moved up to just
    after the last node it depends on: the buffers it reads die there instead of waiting for
    its place in the traced order (the optimizer loop after the whole backward)."""
    # sort keys: a node that stays has (its index,); a hoisted one its last dependence's key plus
    # (its index,), which sorts right after that dependence and before the next node that stays
    key: list[tuple[int, ...]] = []
    for i, n in enumerate(nodes):
        alloc = sum(hint(o.type.nbytes) for o in n.outputs if o not in escaping)
        if alloc > SMALL:
            key.append((i,))
        else:
            key.append(max((key[d] for d in deps[i]), default=(-1,)) + (i,))
    return sorted(range(len(nodes)), key=key.__getitem__)
