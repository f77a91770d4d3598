"""Operator fusion: group nodes into Kernels, each with one iteration space.

Legality rules (all here):

* Views and generators are free: they are never a kernel of their own, but replicated into
  every kernel that reads them, where they become indexing (strides) and literals. A view that
  strides cannot express is preceded by a `copy` (see `legalize_views`).
* An anchor (matmul, attention) starts a kernel; elementwise consumers of its output with the
  output's shape join it as the epilogue (bias, activation, residual add, cast), also through a
  reshape of the output that keeps its element order ([B*T, N] -> [B, T, N]).
* A reduction joins the kernel that produces its input when that kernel is pointwise over the
  reduction's input shape, or a reduction kernel over the same shape and axes; then its
  consumers join: row-level (input shape) and row-summary (keepdim shape) elementwise ops. So
  LayerNorm, RMSNorm and softmax (two dependent reductions) are one kernel each.
* An elementwise op joins a producer's kernel when its shape fits that kernel's space; else it
  starts a pointwise kernel. Not a producer's kernel more than `remat.FAR` nodes back whose
  values it reads are also read near that kernel (forward activations the backward reads
  again): computed late, it keeps nothing extra alive from the forward (`far_from`).
* A `cat` is a *load*: its inputs are views of buffers (graph inputs, other kernels' outputs)
  or of generators, never values its own kernel computes, so a kernel reads it piecewise along
  the cat axis like an elementwise leaf. It starts a pointwise kernel over its output shape
  that its elementwise consumers join, or it moves into the one pointwise kernel that consumes
  it (see `sink_tails`), when its output is that kernel's space. Cat loads stay in pointwise
  kernels (no reduction joins a kernel holding one) and a kernel's cats split its space into at
  most `MAX_CAT_REGIONS` boxes; a cat of more than `MAX_CAT_PIECES` pieces is a `single` kernel.
  A cat of generators (fills) is free like a generator: replicated into each pointwise kernel
  over its shape that reads it (else materialized by a pointwise kernel of its own).
* Everything else (index ops, pad, scans, externs) is a `single` kernel.
* No cycles: a node joins group G only if none of its other input groups depends on G.

The result is a graph of `kernel` nodes (plus views of graph inputs returned as outputs). Each
kernel's body is built by `fuse_body.build_body`; kernel output values are the original IR
values, so consumers outside need no rewiring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import OPS, Graph, Node, Rewriter, Value, make_node
from ..ir.kernel import KernelKind
from ..ir.views import Strided, apply_view, permuted_copy, readers_through_views
from .context import PassContext, describe

MAX_CAT_PIECES = 16  # non-empty pieces of one cat load
MAX_CAT_REGIONS = 64  # boxes of the space in which every cat load of a kernel reads one piece


@dataclass(eq=False)
class Group:
    kind: KernelKind
    space: tuple[int, ...]
    index: int
    axes: tuple[int, ...] = ()
    nodes: list[Node] = field(default_factory=list)
    deps: set = field(default_factory=set)
    # values computed in the space but with another (reshaped) shape: value -> its shape
    reshaped: dict[Value, tuple[int, ...]] = field(default_factory=dict)

    def __hash__(self) -> int:
        return self.index


def _is_free(op: str) -> bool:
    d = OPS[op]
    return d.has("view") or d.has("generator")


def legalize_views(graph: Graph, ctx: PassContext) -> Graph:
    """Insert `copy` before views that strides cannot express, and materialize outputs that
    are views or fills of computed values, so every kernel input is a strided buffer."""
    rw = Rewriter(graph)
    layout: dict[Value, Strided] = {}
    root_is_input: dict[Value, bool] = {gi.value: True for gi in graph.inputs}
    copies = 0
    for n in graph.nodes:
        d = OPS[n.op]
        if d.has("view"):
            src = rw.get(n.inputs[0])
            lay = layout.get(src) or Strided.contiguous(src.type.shape)
            new = apply_view(lay, n.op, n.attrs)
            if new is None:
                c = rw.emit("copy", [src]).out
                copies += 1
                node = rw.emit(n.op, [c], n.attrs, meta=n.meta)
                rw.replace(n.outputs[0], node.out)
                layout[node.out] = apply_view(Strided.contiguous(c.type.shape), n.op, n.attrs)
                root_is_input[node.out] = False
                continue
            node = rw.keep(n)
            layout[node.out] = new
            root_is_input[node.out] = root_is_input.get(src, False)
        else:
            node = rw.keep(n)
            for o in node.outputs:
                root_is_input[o] = False
    # materialize escaping views/generators that do not view a graph input
    defs = {o: nd for nd in rw.nodes for o in nd.outputs}
    outs = []
    for v in graph.outputs:
        v = rw.get(v)
        p = defs.get(v)
        if p is not None and _is_free(p.op) and not root_is_input.get(v, False):
            v = rw.emit("copy", [v]).out
            copies += 1
        outs.append(v)
    muts = []
    for old, new in graph.mutations:
        new = rw.get(new)
        p = defs.get(new)
        if p is not None and _is_free(p.op):
            new = rw.emit("copy", [new]).out
            copies += 1
        muts.append((old, new))
    ctx.count("copies_inserted", copies)
    g = rw.finish(outs)
    return Graph(g.inputs, g.nodes, g.outputs, muts, g.meta)


class _Grouper:
    def __init__(self, graph: Graph, ctx: PassContext | None = None) -> None:
        self.graph = graph
        self.ctx = ctx or PassContext()
        self.defs: dict[Value, Node] = {o: n for n in graph.nodes for o in n.outputs}
        self.pos: dict[Node, int] = {n: i for i, n in enumerate(graph.nodes)}
        self.group_of: dict[Node, Group] = {}
        self.groups: list[Group] = []
        self.generator_cats: list[Node] = []
        self.replicated: set[Node] = set()  # nodes copied into every kernel that reads them
        # while every group depends only on older groups, a search for a path to group T can
        # skip groups older than T; an edge to a newer group (a node joining an older group,
        # a tail moved into a consumer) ends that, and `reaches` searches everything
        self.deps_older_only = True

    def join(self, g: Group, n: Node, how: str) -> bool:
        """A fusion decision: may n join group g (`ctx.take_fuel`)?"""
        return self.ctx.take_fuel(lambda: f"fuse: into group {g.index} [{g.kind}: "
                                          f"{' '.join(m.op for m in g.nodes[:8])}] {how}: {describe(n)}")

    def new(self, kind: str, space, axes=()) -> Group:
        g = Group(KernelKind(kind), tuple(space), len(self.groups), tuple(axes))
        self.groups.append(g)
        return g

    def add(self, g: Group, n: Node) -> None:
        g.nodes.append(n)
        self.group_of[n] = g
        for src in self.source_groups(n):
            if src is not g:
                self.depend(g, src)

    def depend(self, g: Group, d: Group) -> None:
        """Record that group g reads an output of group d."""
        g.deps.add(d)
        if d.index > g.index:
            self.deps_older_only = False

    def source_groups(self, n: Node) -> set[Group]:
        """Groups whose outputs n reads (directly or through free views)."""
        out = set()
        for v in n.inputs:
            root = self.root(v)
            p = self.defs.get(root)
            if p is not None and p in self.group_of:
                out.add(self.group_of[p])
        return out

    def root(self, v: Value) -> Value:
        p = self.defs.get(v)
        while p is not None and OPS[p.op].has("view"):
            v = p.inputs[0]
            p = self.defs.get(v)
        return v

    def reaches(self, start: Group, target: Group) -> bool:
        stack, seen = [start], set()
        while stack:
            g = stack.pop()
            if g is target:
                return True
            if g.index in seen:
                continue
            seen.add(g.index)
            stack.extend(g.deps if not self.deps_older_only else (d for d in g.deps if d.index >= target.index))
        return False

    def acyclic(self, g: Group, n: Node) -> bool:
        return not any(h is not g and self.reaches(h, g) for h in self.source_groups(n))

    def internal_input(self, g: Group, v: Value) -> tuple[str, Value] | None:
        """How n's input v relates to g: ('direct', v) when a g node produced it, ('reshaped',
        inner) when it is a reshape of a value g computes over its whole space."""
        p = self.defs.get(v)
        if p is None:
            return None
        if self.group_of.get(p) is g:
            return ("reshaped", v) if v in g.reshaped else ("direct", v)
        if p.op == "reshape":
            inner = p.inputs[0]
            q = self.defs.get(inner)
            if q is not None and self.group_of.get(q) is g and (inner.type.shape == g.space or inner in g.reshaped):
                return ("reshaped", v)
        return None

    def fits(self, g: Group, n: Node) -> bool:
        shape = n.outputs[0].type.shape
        rels = [self.internal_input(g, v) for v in n.inputs]
        if not any(rels):
            return False
        if any(r is None and self.group_of.get(self.defs.get(self.root(v))) is g for v, r in zip(n.inputs, rels,
                                                                                                strict=True)):
            return False  # a value g computes, read through a view (a transpose): not the lane's own element
        if g.kind == "reduction":
            outer = tuple(1 if i in g.axes else s for i, s in enumerate(g.space))
            if shape not in (g.space, outer) or any(r and r[0] == "reshaped" for r in rels):
                return False
            return all(_broadcasts_to(v.type.shape, shape) for v in n.inputs)
        if g.kind in ("pointwise", "matmul", "attention"):
            if shape == g.space and not any(r and r[0] == "reshaped" for r in rels):
                return all(_broadcasts_to(v.type.shape, shape) for v in n.inputs)
            if g.kind == "attention" or _numel(shape) != _numel(g.space):
                return False
            # computed in g's space through a reshape: every operand must re-view to the space
            for v, r in zip(n.inputs, rels, strict=True):
                if r is not None and r[0] == "reshaped":
                    if v.type.shape != shape:
                        return False
                    continue
                if r is not None and v.type.shape != g.space and v.type.rank != 0:
                    return False
                if not _broadcasts_to(v.type.shape, shape):
                    return False
                if v.type.rank and not _reviewable(v.type.shape, shape, g.space):
                    return False
            return True
        return False

    def run(self) -> list[Group]:
        for n in self.graph.nodes:
            d = OPS[n.op]
            if _is_free(n.op):
                continue
            if d.has("anchor"):
                self.add(self.new(KernelKind(n.op), n.outputs[0].type.shape), n)  # anchors name their kind
            elif d.reduce is not None:  # a combining reduction (sum, prod, max, min)
                self.place_reduction(n)
            elif d.has("elementwise") and len(n.outputs) == 1:
                self.place_elementwise(n)
            elif is_cat_load(n) and all(self._generator_rooted(v) for v in n.inputs):
                self.generator_cats.append(n)  # placed after grouping (see place_generator_cats)
            elif is_cat_load(n):
                self.add(self.new("pointwise", n.outputs[0].type.shape), n)
            else:
                self.add(self.new("single", n.outputs[0].type.shape if n.outputs else ()), n)
        self.sink_tails()
        self.sink_groups()
        self.place_generator_cats()
        return self.groups

    def _generator_rooted(self, v: Value) -> bool:
        p = self.defs.get(self.root(v))
        return p is not None and OPS[p.op].has("generator")

    def place_generator_cats(self) -> None:
        """A cat of generators (the per-piece factors of passes/simplify.py) is index arithmetic,
        free like a generator: it is replicated into every kernel that reads it, when each of
        those is a pointwise kernel over the cat's shape reading it directly; otherwise it is
        materialized by a pointwise kernel of its own."""
        escaping = set(self.graph.outputs) | {new for _, new in self.graph.mutations}
        for n in self.generator_cats:
            out = n.outputs[0]
            users = self.graph.users(out)
            targets = [self.group_of.get(u) for u in users]
            if out not in escaping and users and all(
                    g is not None and g.kind == "pointwise" and g.space == out.type.shape and u.op != "cat"
                    and u.outputs[0].type.shape == g.space and u.outputs[0] not in g.reshaped
                    and _cat_regions(g.space, [m for m in g.nodes if m.op == "cat"] + [n]) <= MAX_CAT_REGIONS
                    for u, g in zip(users, targets, strict=True)) \
                    and self.ctx.take_fuel(lambda n=n: f"fuse: replicated {describe(n)} into its consumers"):
                self.replicated.add(n)
                continue
            g = self.new("pointwise", out.type.shape)
            self.add(g, n)
            for u in users:
                h = self.group_of.get(u)
                if h is not None and h is not g:
                    self.depend(h, g)

    def sink_tails(self) -> None:
        """Move an elementwise tail of a group into the one group that consumes it, when that
        costs no extra memory traffic (its inputs are no larger than its output): e.g. the
        SiLU of Llama's gate projection moves into the up projection's epilogue, making the
        SiLU gate one kernel, and the exp(log_softmax) that cross-entropy's backward reads moves
        out of the forward's log_softmax kernel into the backward's reduction (one vocabulary-
        sized buffer less)."""
        escaping = set(self.graph.outputs) | {new for _, new in self.graph.mutations}
        for g in list(self.groups):
            if g.kind == "single":
                continue
            for n in list(reversed(g.nodes)):
                out = n.outputs[0]
                cat = n.op == "cat"
                if not (OPS[n.op].has("elementwise") or cat) or out in escaping:
                    continue
                users = self.graph.users(out)
                if not users or any(_is_free(u.op) or self.group_of.get(u) is None or u.op == "cat" for u in users):
                    continue  # (a cat's inputs are loads: never computed by its own kernel)
                targets = {self.group_of[u] for u in users}
                if len(targets) != 1 or g in targets:
                    continue
                b = targets.pop()
                if cat:
                    if b.kind != "pointwise" or out.type.shape != b.space or out in g.reshaped \
                            or any(self._root_group(v) is b for v in n.inputs) \
                            or _cat_regions(b.space, [m for m in b.nodes if m.op == "cat"] + [n]) > MAX_CAT_REGIONS:
                        continue
                elif b.kind not in ("pointwise", "matmul", "reduction") or not self._sinkable_into(b, n, users):
                    continue
                if not self.acyclic(b, n):
                    continue
                in_bytes = sum(v.type.nbytes for v in set(n.inputs) if v.type.rank and self._root_group(v) is g)
                if in_bytes > out.type.nbytes or not self.join(b, n, "moved the tail"):
                    continue
                g.nodes.remove(n)
                g.reshaped.pop(out, None)
                if out.type.shape != b.space:
                    b.reshaped[out] = out.type.shape
                first = min(b.nodes.index(u) for u in users)
                b.nodes.insert(first, n)
                self.group_of[n] = b
                for h in self.source_groups(n):
                    if h is not b:
                        self.depend(b, h)

    def sink_groups(self) -> None:
        """Move a whole pointwise group into the one group that reads its outputs, when that group
        then reads no more bytes than before: the chain that recomputes GELU's derivative from the
        forward's pre-activation (x^2, tanh and their combinations) becomes the epilogue of the dX
        GEMM that multiplies it, which then reads the pre-activation instead of the derivative.
        `sink_tails` moves node by node and stops at a node that reads two values of its group.
        Repeated until nothing moves: a group read by two groups moves once those two are one."""
        escaping = set(self.graph.outputs) | {new for _, new in self.graph.mutations}
        moved = True
        while moved:
            moved = False
            for g in self.groups:
                b = self._group_sink_target(g, escaping)
                if b is not None and self.ctx.take_fuel(
                        lambda g=g, b=b: f"fuse: moved group {g.index} [{' '.join(m.op for m in g.nodes[:8])}] "
                                         f"into group {b.index} [{b.kind}]"):
                    self._move_group(g, b)
                    moved = True

    def _outer_users(self, g: Group) -> dict[Node, list[Node]]:
        member = set(g.nodes)
        return {n: [u for u in self.graph.users(n.outputs[0]) if u not in member] for n in g.nodes}

    def _group_sink_target(self, g: Group, escaping: set) -> Group | None:
        """The group that can compute all of pointwise group g in its own space, reading no more
        bytes than g's stored outputs; None when there is none."""
        if g.kind != "pointwise" or not g.nodes or g.reshaped or any(
                not OPS[n.op].has("elementwise") or len(n.outputs) != 1 or n.outputs[0] in escaping for n in g.nodes):
            return None
        outer = self._outer_users(g)
        users = [u for us in outer.values() for u in us]
        targets = {self.group_of.get(u) for u in users}
        if len(targets) != 1 or any(_is_free(u.op) or not OPS[u.op].has("elementwise") for u in users):
            return None
        b = targets.pop()
        if b is None or b.kind not in ("pointwise", "matmul", "reduction") \
                or not all(self._sinkable_into(b, n, us) for n, us in outer.items()):
            return None
        if any(self.reaches(h, b) for h in self._sources(g) - {b}):
            return None
        ext = {self.root(v) for n in g.nodes for v in n.inputs if v.type.rank and self._root_group(v) is not g}
        ext -= {self.root(v) for n in b.nodes for v in n.inputs}
        stored = [n.outputs[0] for n, us in outer.items() if us]
        return b if sum(v.type.nbytes for v in ext) <= sum(v.type.nbytes for v in stored) else None

    def _sources(self, g: Group) -> set[Group]:
        return {h for n in g.nodes for h in self.source_groups(n)} - {g}

    def _move_group(self, g: Group, b: Group) -> None:
        users = [u for us in self._outer_users(g).values() for u in us]
        sources = self._sources(g) - {b}
        first = min(b.nodes.index(u) for u in users)
        b.nodes[first:first] = g.nodes
        for n in g.nodes:
            self.group_of[n] = b
            if g.space != b.space:
                b.reshaped[n.outputs[0]] = g.space
        b.deps.discard(g)
        for h in sources:
            self.depend(b, h)
        g.nodes, g.deps = [], set()

    def _root_group(self, v: Value) -> Group | None:
        p = self.defs.get(self.root(v))
        return self.group_of.get(p) if p is not None else None

    def _sinkable_into(self, b: Group, n: Node, users: list[Node]) -> bool:
        """Can b compute n in its space, reading n's inputs as external values?"""
        shape = n.outputs[0].type.shape
        if any(self._root_group(v) is b for v in n.inputs):
            return False
        if shape == b.space:
            return all(_broadcasts_to(v.type.shape, shape) for v in n.inputs)
        if _numel(shape) != _numel(b.space) or not all(b.reshaped.get(u.outputs[0]) == shape for u in users):
            return False
        return all(_broadcasts_to(v.type.shape, shape)
                   and (v.type.rank == 0 or _reviewable(v.type.shape, shape, b.space)) for v in n.inputs)

    def far_from(self, g: Group, n: Node) -> bool:
        """Does n stay out of g? When n comes more than passes/remat.FAR nodes after all of g and
        every value it reads from g is also read near g (a forward activation that the backward
        reads again), joining would compute n in the forward and keep its output until the
        backward besides: a value the backward recomputes (passes/remat.py), or GELU's
        derivative from the forward's pre-activation, stays a late kernel. A gradient read only
        late (an optimizer update after its weight-gradient GEMM) still joins."""
        from .remat import FAR

        last = max(self.pos[m] for m in g.nodes)
        if self.pos[n] - last <= FAR:
            return False
        from_g = [v for v in n.inputs if self._root_group(v) is g]
        graph = self.graph
        return bool(from_g) and all(
            any(self.pos[u] - last <= FAR for u, _ in readers_through_views(graph, self.root(v))) for v in from_g)

    def place_reduction(self, n: Node) -> None:
        x = n.inputs[0]
        axes = tuple(n.attrs["axes"])
        p = self.defs.get(x)
        g = self.group_of.get(p) if p is not None else None
        if (g is not None and x not in g.reshaped and x.type.shape == g.space and n.attrs["keepdim"]
                and ((g.kind == "pointwise" and not any(m.op == "cat" for m in g.nodes))
                     or (g.kind == "reduction" and g.axes == axes))
                and self.acyclic(g, n) and self.join(g, n, "joined the reduction")):
            g.kind, g.axes = "reduction", axes
            self.add(g, n)
            return
        kind = "reduction" if n.attrs["keepdim"] and x.type.rank > 0 else "single"
        self.add(self.new(kind, x.type.shape, axes if kind == "reduction" else ()), n)

    def _stored_permuted(self, n: Node) -> Group | None:
        """The attention group whose output n = copy(permute(out)) materializes in another
        layout (the [B, H, L, D] -> [B, L, H, D] transpose before the output projection): the
        kernel then stores its tiles through the permute instead of a separate copy kernel."""
        pc = permuted_copy(self.defs.get, n.outputs[0]) if n.outputs else None
        if pc is None or len(self.graph.users(n.inputs[0])) != 1:
            return None
        q = self.defs.get(pc[0])
        g = self.group_of.get(q) if q is not None else None
        if g is None or g.kind != "attention" or q.op != "attention" or len(g.nodes) != 1:
            return None
        if len(self.graph.users(q.outputs[0])) != 1:
            return None
        return g

    def place_elementwise(self, n: Node) -> None:
        g = self._stored_permuted(n)
        if g is not None and self.join(g, n, "stored through the permute"):
            self.add(g, n)
            return
        candidates = []
        for v in n.inputs:
            root = v
            p = self.defs.get(v)
            if p is not None and p.op == "reshape":
                root = p.inputs[0]
            q = self.defs.get(root)
            g = self.group_of.get(q) if q is not None else None
            if g is not None and g not in candidates:
                candidates.append(g)
        order = {"matmul": 0, "attention": 0, "reduction": 1, "pointwise": 2}
        candidates.sort(key=lambda g: (order.get(g.kind, 9), -g.index))
        for g in candidates:
            if g.kind == "single" or self.far_from(g, n):
                continue
            if self.fits(g, n) and self.acyclic(g, n):
                if not self.join(g, n, "joined"):
                    break
                shape = n.outputs[0].type.shape
                if shape != g.space and g.kind != "reduction":
                    g.reshaped[n.outputs[0]] = shape
                self.add(g, n)
                return
        self.add(self.new("pointwise", n.outputs[0].type.shape), n)


def is_cat_load(n: Node) -> bool:
    """Can this node be a cat load (see the module docstring)? Its inputs, whatever produces
    them, are read as buffers or generators: the cat starts its own group, so none is computed
    by the kernel that reads it."""
    if n.op != "cat" or not n.outputs or n.outputs[0].type.rank == 0:
        return False
    ax = n.attrs["axis"]
    pieces = sum(1 for v in n.inputs if v.type.shape[ax] > 0)
    return pieces <= MAX_CAT_PIECES and _cat_regions(n.outputs[0].type.shape, [n]) <= MAX_CAT_REGIONS


def _cat_regions(space: tuple[int, ...], cats: list[Node]) -> int:
    """Number of boxes the cats' piece boundaries cut `space` into (cats have the space's shape)."""
    cuts: dict[int, set[int]] = {}
    for n in cats:
        ax = n.attrs["axis"]
        pos = 0
        for v in n.inputs:
            pos += v.type.shape[ax]
            if 0 < pos < space[ax]:
                cuts.setdefault(ax, set()).add(pos)
    out = 1
    for c in cuts.values():
        out *= len(c) + 1
    return out


def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _broadcasts_to(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    off = len(target) - len(shape)
    return all(s in (1, target[off + i]) for i, s in enumerate(shape))


def _reviewable(shape, out_shape, space) -> bool:
    """Can a tensor of `shape`, broadcast to out_shape, be viewed in `space` with strides?"""
    lay = Strided.contiguous(shape)
    from ..ir import Attrs

    lay = apply_view(lay, "expand", Attrs(shape=tuple(out_shape)))
    return lay is not None and apply_view(lay, "reshape", Attrs(shape=tuple(space))) is not None


def _group_order(groups: list[Group]) -> list[Group]:
    """Topological order of the group DAG, earliest-created first among ready groups."""
    import heapq

    users: dict[int, list[Group]] = {g.index: [] for g in groups}
    indeg = {g.index: 0 for g in groups}
    for g in groups:
        for d in g.deps:
            users[d.index].append(g)
            indeg[g.index] += 1
    ready = [(g.index, g) for g in groups if indeg[g.index] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(g)
        for u in users[g.index]:
            indeg[u.index] -= 1
            if indeg[u.index] == 0:
                heapq.heappush(ready, (u.index, u))
    if len(out) != len(groups):
        raise AssertionError("fusion produced a cyclic group graph")
    return out


def fuse(graph: Graph, ctx: PassContext | None = None) -> Graph:
    from .fuse_body import make_kernel

    ctx = ctx or PassContext()
    graph = legalize_views(graph, ctx)
    grouper = _Grouper(graph, ctx)
    groups = _group_order(grouper.run())
    defs = grouper.defs
    escaping = set(graph.outputs) | {new for _, new in graph.mutations}
    nodes: list[Node] = []
    for g in groups:
        member = set(g.nodes)
        outs = []
        for n in g.nodes:
            for o in n.outputs:
                if o in escaping or any(u not in member and not _is_free(u.op) for u in graph.users(o)) \
                        or _used_by_free_outside(graph, o, member, grouper):
                    outs.append(o)
        if not outs:
            continue
        kernel, inputs = make_kernel(g, outs, defs, grouper, graph)
        nodes.append(make_node("kernel", inputs, {"kernel": kernel}, meta={"source": g.nodes[0].meta.get("source", "")},
                               out_types=[o.type for o in outs]))
        # kernel outputs are the original values
        nodes[-1] = Node("kernel", nodes[-1].inputs, nodes[-1].attrs, outs, nodes[-1].meta)
        ctx.count(f"kernels_{g.kind}")
    # views of graph inputs that are returned stay at the top level
    keep_views = _escaping_views(graph, escaping, defs)
    top = [n for n in graph.nodes if n in keep_views]
    ctx.count("kernels", len(nodes))
    return Graph(graph.inputs, top + nodes if not top else _merge_order(graph, top, nodes), graph.outputs,
                 graph.mutations, graph.meta)


def _used_by_free_outside(graph: Graph, v: Value, member: set, grouper: _Grouper) -> bool:
    """Is v read, through views, by a node outside its group (or escaping)?"""
    for u in graph.users(v):
        if u in member:
            continue
        if _is_free(u.op):
            for o in u.outputs:
                if o in graph.outputs or any(new is o for _, new in graph.mutations):
                    return True
                if any(w not in member and not _is_free(w.op) for w in graph.users(o)):
                    return True
                if _used_by_free_outside(graph, o, member, grouper):
                    return True
    return False


def _escaping_views(graph: Graph, escaping: set, defs: dict) -> set:
    keep = set()
    stack = [v for v in escaping]
    while stack:
        v = stack.pop()
        p = defs.get(v)
        if p is not None and OPS[p.op].has("view") and p not in keep:
            keep.add(p)
            stack.append(p.inputs[0])
    return keep


def _merge_order(graph: Graph, top: list[Node], kernels: list[Node]) -> list[Node]:
    """Top-level views only view graph inputs, so they can all go first."""
    return top + kernels
