"""Matchers for attention fusion: the layers of softmax(Q K^T * scale + mask) V, as traced.

`fuse_attention` reads an attention computation from its output back to its inputs, one layer
at a time; each matcher here recognizes one layer and returns what it found (or None). Nothing
is rewritten here: replacement inputs that need new nodes (a view, a boolean mask built from a
`where`) are returned as `Deferred` expressions, emitted only when the whole match is committed.

Invariants the matchers keep:

* Only forms whose replacement computes the same values are recognized. Where a form differs
  only in rounding (a scale applied to q instead of to the scores, a division by c instead of a
  multiplication by 1/c) the docstring says so; no form changes which elements are masked.
* "Flat batch order": a reshape that keeps the last two (matrix) axes only regroups the batch
  axes of a row-major tensor, so the matrix at flat batch index i is unchanged. Matchers peel
  such reshapes freely and re-view the result in the attention's own batch shape.
* A masked entry given as a huge finite negative (HF's finfo.min) is read like -inf: for scores
  below 2**100 in magnitude, score + finfo.min rounds to finfo.min and exp() of it minus the
  row maximum is exactly 0, as for -inf (`is_huge_negative`).
* Constant evaluation (`Facts.const_value`) runs an op's reference implementation on constant
  inputs only, bounded in size and depth; it never touches user inputs or parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import OPS, Graph, Node, Rewriter, TensorType, Value
from ..ir.symbolic import is_symbolic

CONST_EVAL_MAX_ELEMENTS = 1 << 22
CONST_EVAL_MAX_DEPTH = 64


# --------------------------------------------------------------------------- graph facts
class Facts:
    """Read-only questions about one graph: producers, users, constant values."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._const: dict[Value, torch.Tensor | None] = {}
        self.memo: dict[tuple, Any] = {}  # per-value analysis results (masks are shared by layers)

    def producer(self, v: Any, *ops: str) -> Node | None:
        """The node defining `v` if its op is one of `ops` (any op when none are given)."""
        if not isinstance(v, Value):
            return None
        n = self.graph.producer(v)
        if n is None or (ops and n.op not in ops):
            return None
        return n

    def used_only_by(self, v: Value, allowed: set[Node]) -> bool:
        """True when `v` is not a graph output and every user of `v` is in `allowed`."""
        if self.graph.is_output(v):
            return False
        return all(u in allowed for u in self.graph.users(v))

    def const_value(self, v: Value, depth: int = 0) -> torch.Tensor | None:
        """The value of `v` when it is computable from constants alone (const inputs,
        generators, and foldable ops on them), else None."""
        if v in self._const:
            return self._const[v]
        t = self.graph.const_tensor(v)
        if t is None and depth < CONST_EVAL_MAX_DEPTH and not is_symbolic(v.type) \
                and v.type.numel <= CONST_EVAL_MAX_ELEMENTS:
            n = self.graph.producer(v)
            if n is not None and _evaluable(n) and not is_symbolic(n.attrs):
                args = [self.const_value(i, depth + 1) for i in n.inputs]
                if all(a is not None for a in args):
                    t = OPS[n.op].evaluate(args, n.attrs)[n.outputs.index(v)]
        self._const[v] = t
        return t

    def scalar(self, v: Any) -> float | None:
        """The number a uniform value holds: a one-element constant, or an expand/reshape of one
        (`full`, `scalar`, a folded 0-d tensor). None when `v` is not such a value."""
        cur = v
        while isinstance(cur, Value) and cur.type.numel != 1:
            n = self.producer(cur, "expand", "reshape")
            if n is None:
                return None
            cur = n.inputs[0]
        if not isinstance(cur, Value):
            return None
        t = self.const_value(cur)
        if t is None or t.numel() != 1 or t.dtype == torch.bool:
            return None
        return float(t.reshape(()).item())


def _evaluable(n: Node) -> bool:
    d = OPS[n.op]
    return d.evaluable and not d.has("extern")  # (an ATen call may be costly: masks are built from IR ops)


# ------------------------------------------------------------------ deferred expressions
@dataclass(frozen=True, eq=False)
class Deferred:
    """A node to emit when a match is committed; its type is inferred when it is built, so an
    invalid replacement is rejected while matching, never while rewriting."""

    op: str
    inputs: tuple[Expr, ...]
    attrs: tuple[tuple[str, Any], ...]
    type: TensorType


Expr = Value | Deferred


def deferred(op: str, inputs: Sequence[Expr], **attrs: Any) -> Deferred:
    """Build a Deferred node; raises TypeError/ValueError when the op rejects its operands."""
    opdef = OPS[op]
    a = opdef.check_attrs(attrs)
    (t,) = opdef.infer([e.type for e in inputs], a)
    return Deferred(op, tuple(inputs), tuple(attrs.items()), t)


def emit_expr(rw: Rewriter, e: Expr, meta: dict[str, Any] | None = None) -> Value:
    if isinstance(e, Value):
        return rw.get(e)
    ins = [emit_expr(rw, i, meta) for i in e.inputs]
    return rw.emit(e.op, ins, dict(e.attrs), meta=dict(meta or {})).out


def eval_expr(facts: Facts, e: Expr) -> torch.Tensor | None:
    """The constant value of an expression, or None."""
    if isinstance(e, Value):
        return facts.const_value(e)
    args = [eval_expr(facts, i) for i in e.inputs]
    if any(a is None for a in args):
        return None
    return OPS[e.op].evaluate(args, dict(e.attrs))[0]


# ------------------------------------------------------------------------------- views
def keeps_matrix(n: Node) -> bool:
    """A reshape that regroups only batch axes (flat batch order is unchanged)."""
    src, out = n.inputs[0].type.shape, n.outputs[0].type.shape
    return len(src) >= 2 and len(out) >= 2 and src[-2:] == out[-2:]


def reshape_base(facts: Facts, v: Value) -> Value:
    """The deepest value of a chain of reshapes ending at `v` (same elements, same order)."""
    while (n := facts.producer(v, "reshape")) is not None:
        v = n.inputs[0]
    return v


def view_as(facts: Facts, e: Expr, shape: tuple[int, ...]) -> Expr:
    """`e` reshaped (row-major, so same element order) to `shape`, reusing a value of that
    shape from e's reshape chain when there is one."""
    if e.type.shape == shape:
        return e
    if isinstance(e, Value):
        cur = e
        while (n := facts.producer(cur, "reshape")) is not None:
            cur = n.inputs[0]
            if cur.type.shape == shape:
                return cur
        e = cur
    elif e.op == "reshape":
        e = e.inputs[0]
        if e.type.shape == shape:
            return e
    return deferred("reshape", [e], shape=shape)


def untranspose(facts: Facts, kt: Value) -> Expr:
    """k given k^T: the permute producing k^T with its last two axes swapped back."""
    r = kt.type.rank
    n = facts.producer(kt, "permute")
    if n is not None:
        perm = tuple(n.attrs["perm"])
        back = perm[:-2] + (perm[-1], perm[-2])
        src = n.inputs[0]
        return src if back == tuple(range(r)) else deferred("permute", [src], perm=back)
    return deferred("permute", [kt], perm=tuple(range(r - 2)) + (r - 1, r - 2))


def scaled_operand(facts: Facts, n: Node) -> tuple[Value, float] | None:
    """For `mul(x, c)`, `mul(c, x)` or `div(x, c)` with a uniform number c that does not
    broadcast x: (x, factor). Division becomes a factor 1/c (equal up to rounding)."""
    out = n.outputs[0].type
    if n.op == "mul":
        for x, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            s = facts.scalar(c)
            if s is not None and x.type == out and math.isfinite(s) and s != 0:
                return x, s
    elif n.op == "div":
        x, c = n.inputs
        s = facts.scalar(c)
        if s is not None and x.type == out and math.isfinite(s) and s != 0:
            return x, 1.0 / s
    return None


def peel_operand(facts: Facts, v: Value) -> tuple[Value, float]:
    """Strip scalar scales and batch-regrouping reshapes from a matmul operand: (base, factor)
    with operand == factor * base in flat batch order."""
    factor = 1.0
    while True:
        n = facts.producer(v)
        if n is None:
            return v, factor
        if n.op == "reshape" and keeps_matrix(n):
            v = n.inputs[0]
            continue
        if n.op in ("mul", "div") and (sc := scaled_operand(facts, n)) is not None:
            v, f = sc
            factor *= f
            continue
        return v, factor


# ------------------------------------------------------------------ GQA head repetition
def _repeat_source(facts: Facts, rep: Value, block: int) -> tuple[Value, int] | None:
    """If `rep` (flat) repeats each consecutive block of `block` elements of a source n times
    in a row, (source, n): an expand of one size-1 axis whose trailing axes hold one block, as
    HF's repeat_kv and the lowering of repeat_interleave produce."""
    n = facts.producer(rep, "expand")
    if n is not None:
        src = n.inputs[0]
        if src.type.rank != rep.type.rank:
            return None
        diff = [i for i, (a, b) in enumerate(zip(src.type.shape, rep.type.shape, strict=True)) if a != b]
        if len(diff) != 1 or src.type.shape[diff[0]] != 1:
            return None
        j = diff[0]
        if math.prod(rep.type.shape[j + 1:]) != block:
            return None
        return src, rep.type.shape[j]
    return None


def unrepeat_heads(facts: Facts, e: Expr, batch: tuple[int, ...]) -> tuple[Expr, int] | None:
    """View a k or v operand [..., S, E] as `batch + (S, E)` (batch ends with the head axis H),
    removing a head repetition: returns (k0, n) with k0 of shape batch[:-1] + (H // n, S, E)
    and operand == repeat_interleave(k0, n, dim=-3); n == 1 when there is no repetition.

    Why this is exact: a repetition of consecutive [S, E] blocks, each n times, maps flat
    block i to source block i // n; in `batch` order i = b * H + h, and i // n = b * (H/n) +
    h // n when n divides H, which is the attention op's grouped-query head mapping."""
    s, d = e.type.shape[-2:]
    if e.type.numel != math.prod(batch) * s * d or not batch:
        return None
    if isinstance(e, Value):
        found = _repeat_source(facts, reshape_base(facts, e), s * d)
        if found is not None:
            src, n = found
            h = batch[-1]
            if n > 1 and h % n == 0:
                return view_as(facts, src, batch[:-1] + (h // n, s, d)), n
    return view_as(facts, e, batch + (s, d)), 1


# ------------------------------------------------------------------------------ softmax
@dataclass
class SoftmaxMatch:
    x: Value                 # softmax input
    axis: int
    nodes: list[Node]        # max, sub, exp, sum, div and the full-row fix-up, if any
    safe: bool               # rows that are entirely -inf give 0 (the fix-up was matched)


def _last_axis_reduction(n: Node) -> int | None:
    axes = tuple(n.attrs["axes"])
    if len(axes) != 1 or not n.attrs["keepdim"]:
        return None
    return axes[0]


def match_full_row_fixup(facts: Facts, v: Value) -> tuple[Value, Value, list[Node]] | None:
    """where(all(x == -inf, axis), 0, p): torch's _safe_softmax, lowered either as
    min(eq(x, -inf)) or as its core-ATen form logical_not(any(logical_not(eq(x, -inf)))).
    Returns (p, x, nodes)."""
    w = facts.producer(v, "where")
    if w is None:
        return None
    cond, zero, p = w.inputs
    if facts.scalar(zero) != 0.0 or p.type != v.type:
        return None
    nodes = [w]
    red = facts.producer(cond, "min")
    if red is not None:
        nodes.append(red)
        ninf = red.inputs[0]
    else:
        outer = facts.producer(cond, "logical_not")
        red = facts.producer(outer.inputs[0], "max") if outer is not None else None
        inner = facts.producer(red.inputs[0], "logical_not") if red is not None else None
        if inner is None:
            return None
        nodes += [outer, red, inner]
        ninf = inner.inputs[0]
    if _last_axis_reduction(red) != p.type.rank - 1:
        return None
    eq = facts.producer(ninf, "eq")
    if eq is None:
        return None
    a, b = eq.inputs
    x = a if facts.scalar(b) == float("-inf") else b if facts.scalar(a) == float("-inf") else None
    if x is None:
        return None
    nodes.append(eq)
    return p, x, nodes


def match_softmax(facts: Facts, v: Value) -> SoftmaxMatch | None:
    """exp(x - max(x)) / sum(exp(x - max(x))) over one axis (lower_nn.softmax), optionally
    wrapped in the full-row fix-up."""
    fix = match_full_row_fixup(facts, v)
    p, fixed_x, fix_nodes = fix if fix is not None else (v, None, [])
    div = facts.producer(p, "div")
    if div is None:
        return None
    e, s = div.inputs
    total = facts.producer(s, "sum")
    ex = facts.producer(e, "exp")
    if total is None or ex is None or total.inputs[0] is not e:
        return None
    sub = facts.producer(ex.inputs[0], "sub")
    if sub is None:
        return None
    x, m = sub.inputs
    mx = facts.producer(m, "max")
    if mx is None or mx.inputs[0] is not x or x.type != p.type:
        return None
    axis = _last_axis_reduction(mx)
    if axis is None or axis != _last_axis_reduction(total):
        return None
    if fix is not None and fixed_x is not x:
        return None
    return SoftmaxMatch(x, axis, [mx, sub, ex, total, div] + fix_nodes, fix is not None)


# --------------------------------------------------------------------------------- masks
@dataclass
class MaskMatch:
    """One way the scores meet a mask: `scores` continues the chain, `mask` is the attention
    op's mask input (bool keep-mask, or additive float of the scores' dtype), `node` is the
    node applying it."""

    form: str
    scores: Value
    mask: Expr
    node: Node
    may_mask_full_row: bool  # some row might be entirely -inf (eager gives NaN there, attention 0)


def is_huge_negative(x: float, dtype: torch.dtype) -> bool:
    """-inf or a finite fill so negative that x + score == x for every score below 2**100
    in magnitude (HF uses finfo.min): adding it or substituting it gives equal softmaxes."""
    return x == float("-inf") or (math.isfinite(x) and x <= torch.finfo(dtype).min / 2)


_INT_BOUND = {torch.bool: 1.0, torch.uint8: 255.0, torch.int8: 2.0**7, torch.int16: 2.0**15,
              torch.int32: 2.0**31, torch.int64: 2.0**63}


def abs_bound(facts: Facts, v: Value, depth: int = 0) -> float | None:
    """An upper bound on |v| that holds for every input (interval arithmetic over integers,
    constants, views, casts, where, add/sub/mul, neg), or None when there is none: a float
    value whose bound exceeds its dtype's largest finite number could overflow to inf."""
    key = ("abs_bound", v)
    if key not in facts.memo:
        b = _abs_bound(facts, v, depth)
        if b is not None and v.type.dtype.is_floating_point and b > torch.finfo(v.type.dtype).max:
            b = None
        facts.memo[key] = b
    return facts.memo[key]


def _abs_bound(facts: Facts, v: Value, depth: int) -> float | None:
    if v.type.dtype in _INT_BOUND:
        return _INT_BOUND[v.type.dtype]
    t = facts.const_value(v)
    if t is not None:
        if t.numel() == 0:
            return 0.0
        b = float(t.abs().max()) if t.is_floating_point() else float(t.abs().max().double())
        return b if math.isfinite(b) else None
    n = facts.producer(v)
    if n is None or depth >= CONST_EVAL_MAX_DEPTH:
        return None
    rule = OPS[n.op].abs_bound  # the op's record says how |output| follows from |inputs|
    return None if rule is None else rule(lambda i: abs_bound(facts, n.inputs[i], depth + 1))


def is_finite_mask(facts: Facts, m: Value) -> bool:
    """Every value of m is finite, so scores + m has no -inf entries (for scores below 2**100
    in magnitude, the assumption `is_huge_negative` makes too)."""
    return abs_bound(facts, m) is not None


def additive_mask(facts: Facts, m: Value) -> tuple[Expr, str, bool]:
    """Classify an additive float mask: (mask expr, form, may_mask_full_row)."""
    w = facts.producer(m, "where")
    if w is not None and w.inputs[0].type.dtype == torch.bool:
        c, a, b = w.inputs
        if facts.scalar(a) == 0.0 and facts.scalar(b) == float("-inf"):
            # exactly how scaled_dot_product_attention applies a boolean mask
            return c, "where_bool_additive", True
    if is_finite_mask(facts, m):
        return m, "additive_finite", False
    return m, "additive", True


def mask_candidates(facts: Facts, x: Value):
    """The ways `x` (the softmax input) may be scores with a mask applied, most specific
    first; each yields (scores, MaskMatch | None). The caller takes the first whose scores
    lead to Q K^T. Forms:

    * add(scores, m) / add(m, scores)  additive mask m (float, scores' dtype)
    * where(c, scores, fill)           keep where c; fill -inf -> bool mask c
    * where(c, fill, scores)           masked_fill(c, fill) -> bool mask not(c)
      (a finite fill of at most finfo.min/2 becomes the additive mask where(c, 0, fill))
    * no mask
    """
    n = facts.producer(x)
    out = x.type
    if n is not None and n.op == "add":
        for s, m in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            if s.type == out and m.type.dtype == out.dtype:
                mask, form, full = additive_mask(facts, m)
                yield s, MaskMatch(form, s, mask, n, full)
    if n is not None and n.op == "where" and n.inputs[0].type.dtype == torch.bool:
        c, a, b = n.inputs
        for s, fill_v, keep_when_true in ((a, b, True), (b, a, False)):
            fill = facts.scalar(fill_v)
            if s.type != out or fill is None or not is_huge_negative(fill, out.dtype):
                continue
            if fill == float("-inf"):
                mask: Expr = c if keep_when_true else deferred("logical_not", [c])
                yield s, MaskMatch("where_fill_neg_inf", s, mask, n, True)
            else:
                zero = deferred("scalar", [], value=0.0, dtype=out.dtype, device=out.device)
                val = deferred("scalar", [], value=fill, dtype=out.dtype, device=out.device)
                add = deferred("where", [c, zero, val] if keep_when_true else [c, val, zero])
                yield s, MaskMatch("where_fill_finite", s, add, n, False)
    yield x, None


def full_row_masked(keep: torch.Tensor, s: int) -> bool:
    """Whether some row of a keep-mask (broadcast to [..., L, S]) keeps nothing."""
    if keep.dim() == 0:
        return not bool(keep)
    k = keep.expand(*keep.shape[:-1], s) if keep.shape[-1] == 1 else keep
    return bool((~k).all(dim=-1).any())


def keep_pattern(t: torch.Tensor) -> torch.Tensor | None:
    """The keep-mask of a constant mask: a bool mask itself; for an additive float mask, its
    zeros, when every other entry masks completely (-inf or a huge negative fill)."""
    if t.dtype == torch.bool:
        return t
    keep = t == 0
    if not bool((keep | (t <= torch.finfo(t.dtype).min / 2)).all()):  # -inf included
        return None
    return keep


def classify_const_mask(t: torch.Tensor, q_len: int, k_len: int) -> str | None:
    """'keep_all' (the mask changes nothing), 'causal' (exactly the top-left aligned lower
    triangle of is_causal, on every batch and head), or None."""
    keep = keep_pattern(t)
    if keep is None:
        return None
    if bool(keep.all()):
        return "keep_all"
    if keep.dim() < 2:
        return None
    tril = torch.ones(q_len, k_len, dtype=torch.bool).tril()
    try:
        same = bool((keep == tril).all())
    except RuntimeError:
        return None
    return "causal" if same and keep.shape[-2] == q_len and keep.shape[-1] == k_len else None
