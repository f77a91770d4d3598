"""User kernels (`novaforge.register_kernel`): a registered pattern becomes one call of the
user's kernel wherever it matches and its cost wins.

The registry holds one `PatternKernel` per registration. The entry layer
(`novaforge/user_kernels.py`) traces the pattern, builds the callable (a torch custom op
`novaforge_user::<name>`, so the replacement is an ordinary `extern` node every backend and the
interpreter run) and gives this layer what it may not import itself: `trace(types)`, the pattern
traced at other input types, and `estimate_ns(flops, bytes, target)`, the analytical roofline of
the compile's target (schedule/).

Matching, per registered kernel and per node of the graph whose op is the pattern's root op:

1. structurally (ops, arity, output positions; commutative binary ops in either order; each
   pattern input a wildcard bound to one graph value of the same dtype and rank);
2. exactly, against the pattern traced at the bound values' types (shapes enter attributes:
   slice bounds, fill shapes), comparing attributes and shapes;
3. on a device the kernel runs on (C++: the CPU; Triton: CUDA, and the CPU in Triton's interpreter).

A matched node other than the root may be read outside the match only when it is free (a view,
generator, literal) or reads no wildcard (a constant part of the pattern, like the sign vector
rotate_half's `cat` of fills becomes): it stays for its other readers and nothing is computed twice.
Symbolic sizes are not matched.

Cost: what novaforge would generate for the match is the match as a graph of its own, fused
(`passes/fuse.py`); each resulting kernel costs `estimate_ns(its FLOPs, the bytes it reads and
writes)`. The user's kernel costs `estimate_ns` of its declared FLOPs and bytes (or the ns it
declares). The user's kernel replaces the match when it costs no more. Replaced matches do not
overlap: a node they compute (the root, and what reads a wildcard) belongs to at most one of them.

Invariants: with no kernel registered the pass returns its input graph; the replacement computes
what the match computed (the entry layer checks the kernel against the pattern's reference on
first use); `registry_digest()` changes with every registration, and enters the
optimized-graph cache key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ir import OPS, Graph, GraphInput, Node, Rewriter, Value
from ..ir.extern import encode
from ..ir.ops import node_flops
from ..ir.types import TensorType
from .context import PassContext, describe
from .dce import dce

USER_OP_NAMESPACE = "novaforge_user"  # extern targets of user kernels: novaforge_user.<op>.default


@dataclass(eq=False)
class PatternKernel:
    """One registration: the pattern at its example types, and what the pass needs to match,
    cost and call it."""

    name: str
    target: str  # the extern target ("novaforge_user.<op>.default")
    language: str  # "C++" | "Triton"
    pattern: Graph  # one output; every input a wildcard (a user input of the pattern)
    trace: Callable[[tuple[TensorType, ...]], Graph | None]  # the pattern at other input types
    cost: Callable[[tuple[TensorType, ...], TensorType], tuple[float, float] | float]  # (flops, bytes) | ns
    estimate_ns: Callable[[float, float, Any], float]  # (flops, bytes, target) -> ns
    digest: str
    devices: tuple[str, ...] = ("cpu",)  # device types the kernel runs on (C++: the CPU)
    _traced: dict[tuple, Graph | None] = field(default_factory=dict)

    def pattern_at(self, types: tuple[TensorType, ...]) -> Graph | None:
        """The pattern traced at `types` (cached; None where it does not trace)."""
        key = tuple((t.shape, t.dtype) for t in types)
        if _signature(self.pattern) == key:
            return self.pattern
        if key not in self._traced:
            try:
                self._traced[key] = self.trace(types)
            except Exception:  # (a pattern that does not trace at these sizes: no match)
                self._traced[key] = None
        return self._traced[key]


REGISTRY: dict[str, PatternKernel] = {}


def register(kernel: PatternKernel) -> None:
    if kernel.name in REGISTRY:
        raise ValueError(f"a user kernel named {kernel.name!r} is registered already (unregister it first)")
    REGISTRY[kernel.name] = kernel


def unregister(name: str) -> PatternKernel | None:
    return REGISTRY.pop(name, None)


def registry_digest() -> str:
    """'' with nothing registered, else a digest of every registration (enters cache keys)."""
    if not REGISTRY:
        return ""
    return hashlib.sha256("\0".join(sorted(k.digest for k in REGISTRY.values())).encode()).hexdigest()[:16]


def is_user_target(target: str) -> bool:
    return target.startswith(USER_OP_NAMESPACE + ".")


def user_kernel_name(body: Graph) -> str | None:
    """The name of the user kernel a kernel body calls, if it calls one (for reports)."""
    for n in body.nodes:
        if n.op == "extern" and is_user_target(n.attrs["target"]):
            return next((k.name for k in REGISTRY.values() if k.target == n.attrs["target"]),
                        n.attrs["target"].split(".")[1])
    return None


def _signature(g: Graph) -> tuple:
    return tuple((gi.value.type.shape, gi.value.type.dtype) for gi in g.inputs)


def _static(t: TensorType) -> bool:
    return all(isinstance(d, int) for d in t.shape)


def _attrs(a) -> dict:
    return {k: v for k, v in a.items() if k != "device"}  # (the pattern is traced on the CPU)


# ------------------------------------------------------------------ matching
def _unify(p: Graph, g: Graph, pv: Value, gv: Value, bind: dict, exact: bool) -> dict | None:
    """Extend `bind` (pattern value or node -> graph value or node) so that pattern value `pv`
    is graph value `gv`, or None."""
    if pv in bind:
        return bind if bind[pv] is gv else None
    pn = p.producer(pv)
    if pn is None:  # a wildcard
        if gv.type.dtype != pv.type.dtype or gv.type.rank != pv.type.rank:
            return None
        return {**bind, pv: gv}
    gn = g.producer(gv)
    if gn is None or gn.op != pn.op or len(gn.inputs) != len(pn.inputs) or len(gn.outputs) != len(pn.outputs):
        return None
    if gn.outputs.index(gv) != pn.outputs.index(pv) or bind.get(pn, gn) is not gn:
        return None
    if exact and (gv.type.shape != pv.type.shape or gv.type.dtype != pv.type.dtype
                  or _attrs(gn.attrs) != _attrs(pn.attrs)):
        return None
    bind = {**bind, pv: gv, pn: gn}
    orders = [gn.inputs]
    if len(gn.inputs) == 2 and OPS[gn.op].has("commutative"):
        orders.append(gn.inputs[::-1])
    for order in orders:
        b: dict | None = bind
        for pi, gi in zip(pn.inputs, order, strict=True):
            b = _unify(p, g, pi, gi, b, exact)
            if b is None:
                break
        if b is not None:
            return b
    return None


@dataclass
class Match:
    kernel: PatternKernel
    root: Node
    args: list[Value]  # graph values bound to the pattern's inputs, in order
    nodes: list[Node]  # matched graph nodes, in graph order
    owned: set[Node]  # the matched nodes that read a wildcard and only the match reads (replaced with it)


def _reads_no_wildcard(p: Graph) -> set[Node]:
    """Pattern nodes that read no pattern input, directly or through other nodes."""
    tainted = {gi.value for gi in p.inputs}
    const: set[Node] = set()
    for n in p.nodes:
        if any(v in tainted for v in n.inputs):
            tainted.update(n.outputs)
        else:
            const.add(n)
    return const


def match_at(kernel: PatternKernel, graph: Graph, root: Node) -> Match | None:
    """The match of `kernel`'s pattern rooted at `root` (both steps), or None."""
    p = kernel.pattern
    bind = _unify(p, graph, p.outputs[0], root.outputs[0], {}, exact=False) if len(root.outputs) == 1 else None
    if bind is None or any(gi.value not in bind for gi in p.inputs):
        return None
    types = tuple(bind[gi.value].type for gi in p.inputs)
    if not all(_static(t) for t in types) or not _static(root.outputs[0].type):
        return None
    if any(str(t.device).split(":")[0] not in kernel.devices for t in (*types, root.outputs[0].type)):
        return None
    exact = kernel.pattern_at(types)
    if exact is None:
        return None
    bind = _unify(exact, graph, exact.outputs[0], root.outputs[0], {}, exact=True)
    if bind is None or any(gi.value not in bind for gi in exact.inputs):
        return None
    matched = {bind[n] for n in exact.nodes if n in bind}
    free = {bind[n] for n in _reads_no_wildcard(exact) if n in bind}
    owned: set[Node] = set()
    for n in matched:
        if n is not root and (n in free or any(OPS[n.op].has(f) for f in ("view", "generator", "literal"))):
            continue  # (left for other readers, or to dce)
        if n is not root and any(graph.is_output(o) or any(u not in matched for u in graph.users(o))
                                 for o in n.outputs):
            return None  # an intermediate the rest of the graph needs: it would be computed twice
        owned.add(n)
    order = {n: i for i, n in enumerate(graph.nodes)}
    return Match(kernel, root, [bind[gi.value] for gi in exact.inputs], sorted(matched, key=order.__getitem__),
                 owned)


# ------------------------------------------------------------------ cost
def generated_ns(m: Match, ctx: PassContext) -> float:
    """What novaforge would generate for the match: its fused kernels' roofline estimates."""
    from .fuse import fuse

    args = list(dict.fromkeys(m.args))
    sub = Graph([GraphInput(v, "user", f"in{i}") for i, v in enumerate(args)], m.nodes, [m.root.outputs[0]])
    fused = fuse(sub, PassContext(options=ctx.options, target=ctx.target, backend=ctx.backend))
    total = 0.0
    for n in fused.nodes:
        if n.op != "kernel":
            continue
        body = n.attrs["kernel"].body
        flops = sum(node_flops(b.op, [v.type for v in b.inputs], [o.type for o in b.outputs], b.attrs)
                    for b in body.nodes if not (OPS[b.op].has("view") or OPS[b.op].has("generator")))
        nbytes = sum(v.type.nbytes for v in n.inputs) + sum(o.type.nbytes for o in n.outputs)
        total += m.kernel.estimate_ns(float(flops), float(nbytes), ctx.target)
    return total


def user_ns(m: Match, ctx: PassContext) -> float:
    c = m.kernel.cost(tuple(v.type for v in m.args), m.root.outputs[0].type)
    if isinstance(c, tuple):
        return m.kernel.estimate_ns(float(c[0]), float(c[1]), ctx.target)
    return float(c)


# ------------------------------------------------------------------ the pass
def user_kernels(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if not REGISTRY:
        return graph
    taken: dict[Node, Match] = {}
    claimed: set[Node] = set()
    for kernel in list(REGISTRY.values()):
        root_op = kernel.pattern.producer(kernel.pattern.outputs[0]).op
        for n in graph.nodes:
            if n.op != root_op or n in claimed:
                continue
            m = match_at(kernel, graph, n)
            if m is None or m.owned & claimed:
                continue
            try:
                gen = generated_ns(m, ctx)
            except Exception as e:  # (fusion of the match alone failed: keep what novaforge does)
                ctx.notes.append(f"user kernel {kernel.name}: no estimate for {describe(n)} ({type(e).__name__}: {e})")
                ctx.count("user_kernel_no_estimate")
                continue
            mine = user_ns(m, ctx)
            if mine > gen:
                ctx.count("user_kernel_loses")
                ctx.notes.append(f"user kernel {kernel.name}: {mine:.0f} ns > generated {gen:.0f} ns at {describe(n)}")
                continue
            if not ctx.take_fuel(lambda k=kernel, n=n, a=mine, b=gen:
                                 f"user_kernels: {k.name} ({a:.0f} ns <= generated {b:.0f} ns) at {describe(n)}"):
                continue
            taken[n] = m
            claimed |= m.owned
            ctx.count("user_kernel_used")
    if not taken:
        return graph
    rw = Rewriter(graph)
    for n in graph.nodes:
        m = taken.get(n)
        if m is None:
            rw.keep(n)
            continue
        tensors: list[Value] = []
        spec = encode((list(m.args), {}), tensors, lambda x: isinstance(x, Value))
        out_t = n.outputs[0].type
        new = rw.emit("extern", tensors, {"target": m.kernel.target, "spec": spec, "out_types": (out_t,),
                                          "reason": f"user kernel {m.kernel.name} ({m.kernel.language})",
                                          "keep": None},
                      meta={**n.meta, "user_kernel": m.kernel.name}, out_types=[out_t])
        rw.replace(n.outputs[0], new.outputs[0])
    return dce(rw.finish())
