"""Split reductions (Triton backend): a long sum with few outputs becomes two sums.

A GPU runs a reduction kernel with one program per output (or per small group of outputs). A
sum with few outputs and a long reduced extent -- a bias or LayerNorm-weight gradient (the sum
over 16384 tokens of a [tokens, features] value: 512 outputs), a global gradient norm (one
output) -- then runs on a few hundred programs of long serial loops, on a GPU of 132
multiprocessors: stop 37's H200 profile had these column sums at 5.4 ms of a 24 ms training step,
several times their bandwidth bound. As Inductor's split reductions do, this pass cuts the
reduced extent R into S chunks:

    sum(x, reduced block)  ->  sum(sum(reshape(x, [P, S, R/S, Q]), axis of R/S), axis of S)

(P, R, Q: the sizes of the kept axes before the reduced block, of the reduced block, and of the
kept axes after it; axes of size 1 are dropped from the reshape). The first sum has S times as
many outputs (partial sums, S * P * Q of them, each over R/S elements), the second is short.
Elementwise producers of the sum's input that nothing else reads are re-emitted on the reshaped
operands, so they still fuse into the first sum's kernel (a bias gradient's cast, a LayerNorm
weight gradient's product) instead of being written out whole; their broadcast operands are
reshaped alike. A 16-bit sum accumulates its partials in float32 and rounds once, as the
unsplit IR sum does.

Applies when: the backend is Triton, the option `split_reductions` is on, no op over the sum's
input shape reads the sum again (a LayerNorm's or softmax's normalization stays one kernel with
its reductions), the sum's input is a
floating-point value of static shape whose reduced axes are one contiguous block, R >= SPLIT_MIN_R
and a power of two S >= SPLIT_MIN_S divides R (S as large as allowed by R / S >= SPLIT_CHUNK and
S * P * Q <= SPLIT_PARTIALS), and P * Q <= SPLIT_MAX_KEPT (more outputs are parallel enough).

Invariant: the graph computes the same values up to the order of floating-point additions.
"""

from __future__ import annotations

import math

import torch

from ..ir import OPS, Graph, Node, Rewriter, Value
from ..ir.symbolic import is_symbolic
from .context import PassContext, describe

SPLIT_MIN_R = 4096  # reduced elements below which a sum is left whole
SPLIT_MIN_S = 8  # fewer chunks than this: left whole
SPLIT_CHUNK = 256  # reduced elements per partial sum, at least
SPLIT_PARTIALS = 1 << 15  # partial sums (S * P * Q), at most
SPLIT_MAX_KEPT = 1 << 14  # outputs (P * Q) above which a sum is parallel enough as it is
CHAIN_DEPTH = 8  # elementwise producers re-emitted on the reshaped operands, at most

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def split_reductions(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if getattr(ctx.backend, "name", None) != "triton" or not ctx.options.split_reductions:
        return graph
    outputs = set(graph.outputs) | {new for _, new in graph.mutations}
    rw = Rewriter(graph)
    for n in graph.nodes:
        plan = _plan(n) if n.op == "sum" and not _read_back_per_element(graph, n) else None
        if plan is None or not ctx.take_fuel(lambda n=n, p=plan: f"split_reductions: {describe(n)} in {p.s} chunks"):
            rw.keep(n)
            continue
        rw.replace(n.outputs[0], _Split(graph, rw, n, plan, outputs).emit())
        ctx.count("sums split")
    return rw.finish()


def _read_back_per_element(graph: Graph, n: Node) -> bool:
    """Is the sum read again, through views and elementwise ops on its own shape, by an op over
    its input's shape (a LayerNorm's or softmax's normalization: x - mean)? Then the reduction
    is one kernel with its normalization (one looped pass over the rows), which a split would
    cut into three."""
    shape = n.inputs[0].type.shape
    todo, seen = [n.outputs[0]], set()
    while todo:
        v = todo.pop()
        for u in graph.users(v):
            if u in seen:
                continue
            seen.add(u)
            if any(o.type.shape == shape for o in u.outputs):
                return True
            if OPS[u.op].has("view") or OPS[u.op].has("elementwise"):  # (through the row summaries: mean, rstd)
                todo.extend(u.outputs)
    return False


class _Plan:
    """Where the reduced block sits in the sum's input shape, and the chunks."""

    def __init__(self, shape: tuple[int, ...], a: int, b: int, s: int) -> None:
        self.shape, self.a, self.b, self.s = shape, a, b, s
        self.p, self.r, self.q = math.prod(shape[:a]), math.prod(shape[a:b]), math.prod(shape[b:])
        # the reshaped input: [P?, S, R/S, Q?] (a kept block of size 1 dropped)
        self.dims = ([self.p] if self.p > 1 else []) + [s, self.r // s] + ([self.q] if self.q > 1 else [])
        self.s_axis = 1 if self.p > 1 else 0

    def operand_shape(self, shape: tuple[int, ...]) -> list[int] | None:
        """The reshaped shape of an operand that broadcasts to the input's shape, or None when
        one of its three blocks is neither whole nor all ones (it cannot follow the reshape)."""
        full = self.shape
        if len(shape) > len(full):
            return None
        padded = (1,) * (len(full) - len(shape)) + tuple(shape)
        whole = []
        for lo, hi in ((0, self.a), (self.a, self.b), (self.b, len(full))):
            block, want = padded[lo:hi], full[lo:hi]
            if block == want:
                whole.append(True)
            elif all(d == 1 for d in block):
                whole.append(False)
            else:
                return None
        pre, red, post = whole
        return (([self.p if pre else 1] if self.p > 1 else []) + ([self.s, self.r // self.s] if red else [1, 1])
                + ([self.q if post else 1] if self.q > 1 else []))


def _plan(n: Node) -> _Plan | None:
    x = n.inputs[0]
    t = x.type
    if t.rank == 0 or is_symbolic(t.shape) or t.dtype not in FLOATS:
        return None
    axes = tuple(n.attrs["axes"])
    a, b = axes[0], axes[-1] + 1
    if axes != tuple(range(a, b)):
        return None
    shape = tuple(int(d) for d in t.shape)
    r, kept = math.prod(shape[a:b]), math.prod(shape[:a]) * math.prod(shape[b:])
    if r < SPLIT_MIN_R or kept > SPLIT_MAX_KEPT:
        return None
    s = 1 << ((r & -r).bit_length() - 1)  # the largest power of two dividing R
    while s > 1 and (r // s < SPLIT_CHUNK or s * kept > SPLIT_PARTIALS):
        s //= 2
    return _Plan(shape, a, b, s) if s >= SPLIT_MIN_S else None


class _Split:
    """Emits one split sum (see the module docstring) into `rw`."""

    def __init__(self, graph: Graph, rw: Rewriter, n: Node, plan: _Plan, outputs: set[Value]) -> None:
        self.graph, self.rw, self.n, self.plan, self.outputs = graph, rw, n, plan, outputs
        self.meta = dict(n.meta)
        self.budget = CHAIN_DEPTH

    def emit(self) -> Value:
        n, p = self.n, self.plan
        x = self.reshaped(n.inputs[0])
        dtype = n.outputs[0].type.dtype
        if dtype != torch.float64 and dtype != torch.float32:  # (16-bit: float32 partials, one rounding)
            x = self._emit("cast", [x], dtype=torch.float32)
        # (keepdim, as the fuse pass wants its reductions: [P?, S, 1, Q?], then [P?, 1, 1, Q?])
        partial = self._emit("sum", [x], axes=(p.s_axis + 1,), keepdim=True)
        total = self._emit("sum", [partial], axes=(p.s_axis,), keepdim=True)
        if total.type.dtype != dtype:
            total = self._emit("cast", [total], dtype=dtype)
        return self._emit("reshape", [total], shape=tuple(n.outputs[0].type.shape))

    def reshaped(self, v: Value) -> Value:
        """`v` (of the sum input's shape) reshaped to the split dims; an elementwise producer
        read by this sum alone is emitted again on its reshaped operands."""
        prod = self.graph.producer(v)
        if (prod is not None and self.budget > 0 and OPS[prod.op].has("elementwise") and not OPS[prod.op].has("random")
                and len(prod.outputs) == 1 and v not in self.outputs and len(self.graph.users(v)) == 1):
            shapes = [self.plan.operand_shape(tuple(u.type.shape)) for u in prod.inputs]
            if all(s is not None for s in shapes):
                self.budget -= 1
                ins = [self.reshaped(u) if tuple(u.type.shape) == self.plan.shape else self._view(u, s)
                       for u, s in zip(prod.inputs, shapes, strict=True)]
                return self._emit(prod.op, ins, meta=dict(prod.meta), **dict(prod.attrs))
        return self._view(v, self.plan.dims)

    def _view(self, v: Value, shape: list[int]) -> Value:
        v = self.rw.get(v)
        if all(d == 1 for d in shape):  # (a scalar operand: broadcast as a 0-d value)
            shape = []
        return v if list(v.type.shape) == shape else self._emit("reshape", [v], shape=tuple(shape))

    def _emit(self, op: str, inputs: list[Value], meta: dict | None = None, **attrs) -> Value:
        return self.rw.emit(op, inputs, attrs, meta=meta if meta is not None else dict(self.meta)).outputs[0]
