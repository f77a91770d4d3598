"""Rematerialization of cheap elementwise values for their far readers (a training step).

A value computed by an elementwise op and read both near its definition and far later (a
forward activation that the backward reads again: GELU(h), read by the next matmul in the
forward and by that matmul's weight gradient in the backward; LayerNorm's output `x_hat * w +
b`, read by the projection and by its weight gradient) is recomputed just before its first far
reader, from inputs that are live there anyway (each is a graph input, or has a reader at or
after that point itself: `h` for GELU's derivative, `x_hat` for LayerNorm's backward). The
original then dies after its near readers, and the far readers get the copy, so one buffer per
such value is not kept from the forward to the backward. Views between the value and a far
reader are copied onto the recomputed value; an input that is not live there is recomputed too
when an elementwise node computes it from live values (up to `DEPTH` levels).

Far means more than `FAR` nodes apart in the graph's order (the fuse pass keeps such a late copy
out of the early value's kernel by the same measure, see passes/fuse.py). Values smaller than
`MIN_BYTES` are left alone. The copy computes the same op on the same inputs: the same values.

**memory_budget** (option, 1.0 by default: only the above). The forward-to-backward bytes are
those of the values (at least `MIN_BYTES`, not graph outputs) read far from their definition, in
the traced order (that includes weight gradients waiting for the optimizer update, which the
order pass later moves next to their GEMM). With a budget below 1, values are recomputed for
their far readers, whatever their op (matmuls, reductions; not externs, random or multi-output
ops), until at most budget x those bytes are kept from definition to far reader. Candidates go
cheapest first by recompute FLOPs per byte freed. A candidate's inputs must be kept anyway, or
be computed again by such nodes (up to `BUDGET_DEPTH` levels: a bias add, its matmul, the
LayerNorm output it reads) from such inputs. An input that is itself recomputed is not kept: a
chain that needs it uses its one copy (made at the first point that needs it), never the
original. The pass counts the bytes it freed and the FLOPs it added (`budget_*` in the pass
record, shown by the report).

Invariant: the result computes what the input graph computes; no value's definition moves,
and a recomputed node is emitted after all its inputs and before every reader it feeds.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node, Rewriter, Value
from ..ir.ops import node_flops
from ..ir.symbolic import hint
from ..ir.views import readers_through_views
from .context import PassContext, describe

DEPTH = 2  # elementwise producers recomputed along with a value (beyond the value's own node)
BUDGET_DEPTH = 4  # producers recomputed along with a value under a memory budget (a bias add's matmul, ...)
FAR = 128  # nodes between a value's definition and a reader that makes the reader "far"
MIN_BYTES = 64 * 1024  # smaller values are not worth a recomputation


def _root(w: Value, defined: dict[Value, Node]) -> Value:
    while w in defined and OPS[defined[w].op].has("view"):
        w = defined[w].inputs[0]
    return w


def _available(graph: Graph, w: Value, defined: dict[Value, Node], pos: dict[Node, int], at: int,
               dropped: frozenset[Value] | set[Value] = frozenset()) -> bool:
    """Is w free to read at position `at`: a graph input, a generator (through views), or a value
    that is read at or after `at` anyway (and not `dropped`: recomputed for its far readers)?"""
    w = _root(w, defined)
    if w not in defined or OPS[defined[w].op].has("generator"):
        return True
    if w in dropped:
        return False
    return max((pos[u] for u, _ in readers_through_views(graph, w)), default=-1) >= at


def _recomputable(graph: Graph, n: Node, defined: dict[Value, Node], pos: dict[Node, int], at: int,
                  depth: int) -> bool:
    """Can n be computed again at position `at`: each input available there, or itself computed by
    an elementwise node that can (up to `depth` levels: LayerNorm's `x_hat * w + b`)?"""
    for w in n.inputs:
        if _available(graph, w, defined, pos, at):
            continue
        p = defined.get(w)
        if depth <= 0 or p is None or not OPS[p.op].has("elementwise") or len(p.outputs) != 1 \
                or not _recomputable(graph, p, defined, pos, at, depth - 1):
            return False
    return True


def remat(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    pos = {n: i for i, n in enumerate(graph.nodes)}
    defined = {o: n for n in graph.nodes for o in n.outputs}
    escaping = set(graph.outputs) | {new for _, new in graph.mutations}
    # node -> (reader node -> view chain) for the readers that get a recomputed value
    plans: dict[Node, list[tuple[Node, list[Node]]]] = {}
    for n in graph.nodes:
        if not OPS[n.op].has("elementwise") or len(n.outputs) != 1:
            continue
        v = n.outputs[0]
        if v in escaping or not isinstance(hint(v.type.nbytes), int) or hint(v.type.nbytes) < MIN_BYTES:
            continue
        readers = readers_through_views(graph, v)
        far = [(u, chain) for u, chain in readers if pos[u] - pos[n] > FAR]
        if not far or len(far) == len(readers):
            continue  # all near (nothing to gain) or all far (the value itself is late: left to fusion)
        first = min(pos[u] for u, _ in far)
        k = len(far)
        if _recomputable(graph, n, defined, pos, first, DEPTH) and ctx.take_fuel(
                lambda n=n, k=k: f"remat: recompute {describe(n)} for {k} far reader(s)"):
            plans[n] = far
    dropped: set[Value] = set()
    if ctx.options.memory_budget < 1.0:
        dropped = _budget_plans(graph, plans, ctx, pos, defined, escaping)
    if not plans:
        return graph
    by_reader: dict[Node, list[tuple[Node, list[Node]]]] = {}
    for n, far in plans.items():
        for u, chain in far:
            by_reader.setdefault(u, []).append((n, chain))
    rw = Rewriter(graph)
    copies: dict[Node, Value] = {}  # original node -> its recomputed value
    views: dict[tuple[Node, Value], Value] = {}  # (view node, copy of its source) -> the view of the copy
    subst: dict[Value, Value] = {}

    def recompute(n: Node, at: Node) -> Value:
        """n emitted again, with the inputs that are not available at `at` recomputed too (under a
        memory budget, a recomputed value's one copy, made here if it was not made yet)."""
        ins = []
        for w in n.inputs:
            p = defined.get(w)
            if p is not None and not _available(graph, w, defined, pos, pos[at], dropped):
                ins.append(planned_copy(p, at) if dropped and p in plans else recompute(p, at))
            else:
                ins.append(rw.get(w))
        return rw.emit(n.op, ins, n.attrs, meta=dict(n.meta or {})).outputs[0]

    def planned_copy(n: Node, at: Node) -> Value:
        if n not in copies:
            copies[n] = recompute(n, at)
            ctx.count("recomputed")
            ctx.count("recomputed_bytes", hint(n.outputs[0].type.nbytes))
        return copies[n]

    for node in graph.nodes:
        for n, chain in by_reader.get(node, ()):
            x = planned_copy(n, node)
            for vn in chain:
                key = (vn, x)
                if key not in views:
                    views[key] = rw.emit(vn.op, [x], vn.attrs, meta=dict(vn.meta or {})).outputs[0]
                x = views[key]
            end = chain[-1].outputs[0] if chain else n.outputs[0]
            subst[end] = x
        if node in by_reader:
            ins = [subst.get(v, rw.get(v)) for v in node.inputs]
            rw.nodes.append(node.with_inputs(tuple(ins)))
            for n, chain in by_reader[node]:
                subst.pop(chain[-1].outputs[0] if chain else n.outputs[0], None)
        else:
            rw.keep(node)
    return rw.finish()


def _budget_candidate(n: Node) -> bool:
    d = OPS[n.op]
    return len(n.outputs) == 1 and not any(d.has(f) for f in ("view", "generator", "extern", "random", "side_effect",
                                                                "fused"))


def _chain_flops(graph: Graph, n: Node, at: int, defined: dict[Value, Node], pos: dict[Node, int],
                 dropped: set[Value], depth: int) -> float | None:
    """FLOPs of computing n again at position `at` (with its producers that are not available
    there, up to `depth` levels); None when it cannot be."""
    flops = node_flops(n.op, [v.type for v in n.inputs], [o.type for o in n.outputs], n.attrs)
    for w in n.inputs:
        if _available(graph, w, defined, pos, at, dropped):
            continue
        p = defined.get(w)
        while p is not None and OPS[p.op].has("view"):
            p = defined.get(p.inputs[0])
        if depth <= 0 or p is None or not _budget_candidate(p):
            return None
        f = _chain_flops(graph, p, at, defined, pos, dropped, depth - 1)
        if f is None:
            return None
        flops += f
    return flops


def _budget_plans(graph: Graph, plans: dict[Node, list], ctx: PassContext, pos: dict[Node, int],
                  defined: dict[Value, Node], escaping: set[Value]) -> set[Value]:
    """Add recomputations (to `plans`) until at most memory_budget x the forward-to-backward bytes
    are kept; returns the values whose far readers read a recomputed copy (see the docstring)."""
    kept: list[tuple[Node, list, int]] = []
    total = 0
    for n in graph.nodes:
        if not _budget_candidate(n):
            continue
        v = n.outputs[0]
        nbytes = hint(v.type.nbytes)
        if v in escaping or not isinstance(nbytes, int) or nbytes < MIN_BYTES:
            continue
        far = [(u, chain) for u, chain in readers_through_views(graph, v) if pos[u] - pos[n] > FAR]
        if far:
            total += nbytes
            if n not in plans:
                kept.append((n, far, nbytes))
    dropped = {n.outputs[0] for n in plans}
    left = sum(b for _, _, b in kept)
    target = ctx.options.memory_budget * total
    ctx.count("budget_far_bytes", total)
    costs = []
    for n, far, nbytes in kept:
        f = _chain_flops(graph, n, min(pos[u] for u, _ in far), defined, pos, dropped, BUDGET_DEPTH)
        if f is not None:
            costs.append((f / nbytes, pos[n], n, far, nbytes))
    costs.sort(key=lambda c: c[:2])
    for _, _, n, far, nbytes in costs:
        if left <= target:
            break
        f = _chain_flops(graph, n, min(pos[u] for u, _ in far), defined, pos, dropped, BUDGET_DEPTH)
        if f is None or not ctx.take_fuel(
                lambda n=n, f=f: f"remat (memory_budget): recompute {describe(n)} ({f / 1e6:.1f} MFLOP)"):
            continue
        plans[n] = far
        dropped.add(n.outputs[0])
        left -= nbytes
        ctx.count("budget_recomputed")
        ctx.count("budget_recomputed_bytes", nbytes)
        ctx.count("budget_recompute_mflop", round(f / 1e6))
    ctx.count("budget_kept_bytes", left)
    return dropped
