"""Algebraic simplification: a table of local rewrites (`SIMPLIFY`, see rules.py), one rule each.

Local rewrites, each exact in floating point (no reassociation): x+0, x-0, x*1, x/1 -> x;
x / 2^k -> x * 2^-k; pow(x, 1 | 2 | 3 | 0.5 | -0.5 | -1) -> x, x*x, x*x*x, sqrt, rsqrt,
reciprocal; neg(neg x), logical_not(logical_not x) -> x; where(c, x, x) -> x;
cast(cast(x, wide), narrow) -> cast(x, narrow) when the first cast is lossless; casts to the
value's own dtype removed; a take at `start + step * arange(n)` (a position embedding's rows)
-> a strided slice, a view, when every index is provably in range. When a rewrite would
change the shape through broadcasting, the result is an `expand` of the simpler value, so
types never change.

Scaled pieces of a cat: cat(neg(a), b, mul(c, k)) -> mul(cat(a, b, c), cat(fill(-1), fill(1),
fill(k))) when each negation / scalar multiple feeds only the cat (RoPE's rotate_half,
cat(-x2, x1), is the common case). x * -1 == -x and the per-piece product are exact, so the
result is bit-identical; the data cat then gathers views of buffers only and the sign is a cat
of fills, both of which fusion turns into loads of one pointwise kernel (passes/fuse.py)
instead of a negation kernel plus a cat. Counted as `cat_pieces_factored`.
"""

from __future__ import annotations

import math

import torch

from ..ir import Graph, Node, Rewriter, Value
from ..ir.symbolic import provably
from ..ir.types import is_float, is_int
from .context import PassContext, describe
from .rules import Match, RuleTable

# dtype -> dtypes it converts to without loss
_LOSSLESS = {
    torch.bfloat16: {torch.float32, torch.float64},
    torch.float16: {torch.float32, torch.float64},
    torch.float32: {torch.float64},
    torch.bool: {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64},
    torch.int32: {torch.int64, torch.float64},
    torch.int16: {torch.int32, torch.int64, torch.float32, torch.float64},
    torch.int8: {torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.uint8: {torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64},
}


def scalar_value(graph_defs: dict, v: Value):
    """The Python value of a 0-d `scalar` node's output (or of an expand of one), else None."""
    n = graph_defs.get(v)
    while n is not None and n.op == "expand":
        n = graph_defs.get(n.inputs[0])
    if n is not None and n.op == "scalar":
        return n.attrs["value"]
    return None


# ------------------------------------------------------------------------ the rule table
SIMPLIFY = RuleTable("simplify")


def _scalar(m: Match, i: int):
    return scalar_value(m.defs, m.ins[i])


def _is_number(x, value) -> bool:
    return x == value and not isinstance(x, bool)


@SIMPLIFY.rule("add", "sub", when=lambda m: _is_number(_scalar(m, 1), 0))
def x_plus_zero(m: Match) -> Value | None:  # x + 0, x - 0 -> x
    return m.same_as(m.ins[0])


@SIMPLIFY.rule("add", when=lambda m: _is_number(_scalar(m, 0), 0))
def zero_plus_x(m: Match) -> Value | None:  # 0 + x -> x
    return m.same_as(m.ins[1])


@SIMPLIFY.rule("mul", "div", when=lambda m: _scalar(m, 1) == 1)
def x_times_one(m: Match) -> Value | None:  # x * 1, x / 1 -> x
    return m.same_as(m.ins[0])


@SIMPLIFY.rule("mul", when=lambda m: _scalar(m, 0) == 1)
def one_times_x(m: Match) -> Value | None:  # 1 * x -> x
    return m.same_as(m.ins[1])


@SIMPLIFY.rule("div", when=lambda m: is_float(m.ins[0].type.dtype) and isinstance(_scalar(m, 1), float)
               and _scalar(m, 1) != 0 and math.frexp(abs(_scalar(m, 1)))[0] == 0.5)
def divide_by_power_of_two(m: Match) -> Value | None:  # x / 2^k -> x * 2^-k (exact)
    k = m.ins[1]
    s = m.emit("scalar", [], value=1.0 / _scalar(m, 1), dtype=k.type.dtype, device=k.type.device)
    return m.emit("mul", [m.ins[0], s])


@SIMPLIFY.rule("pow", when=lambda m: _scalar(m, 1) is not None and is_float(m.ins[0].type.dtype))
def small_powers(m: Match) -> Value | None:  # pow(x, 1 | 2 | 3 | 0.5 | -0.5 | -1)
    return _pow(m.rw, m.node, m.ins[0], float(_scalar(m, 1)), m.same_as)


@SIMPLIFY.rule("neg", "logical_not", when=lambda m: m.src() is not None and m.src().op == m.op)
def involution(m: Match) -> Value | None:  # neg(neg x), not(not x) -> x
    return m.same_as(m.src().inputs[0])


@SIMPLIFY.rule("where", when=lambda m: m.ins[1] is m.ins[2])
def where_same(m: Match) -> Value | None:  # where(c, x, x) -> x
    return m.same_as(m.ins[1])


@SIMPLIFY.rule("cat")
def cat_of_scaled_pieces(m: Match) -> Value | None:  # see the module docstring
    return _factor_cat_scales(m.rw, m.graph, m.node, m.ins, m.defs)


@SIMPLIFY.rule("cast", when=lambda m: m.ins[0].type.dtype == m.attrs["dtype"])
def cast_to_own_dtype(m: Match) -> Value | None:
    return m.ins[0]


@SIMPLIFY.rule("cast", when=lambda m: m.src() is not None and m.src().op == "cast")
def cast_of_lossless_cast(m: Match) -> Value | None:  # cast(cast(x, wide), narrow) -> cast(x, narrow)
    src = m.src()
    orig = src.inputs[0]
    if src.attrs["dtype"] not in _LOSSLESS.get(orig.type.dtype, ()):
        return None
    return orig if orig.type.dtype == m.attrs["dtype"] else m.emit("cast", [orig], dtype=m.attrs["dtype"])


@SIMPLIFY.rule("take", when=lambda m: m.src(1) is not None and m.src(1).op == "iota")
def take_of_a_range(m: Match) -> Value | None:  # x.take(start + step * arange(n), axis) -> a strided slice
    it, ax = m.src(1).attrs, m.attrs["axis"]
    start, step, n = it["start"], it["step"], it["length"]
    if not (isinstance(start, int) and isinstance(step, int)) or start < 0 or step < 1:
        return None
    stop = start + step * (n - 1) + 1
    if not provably(lambda: stop <= m.ins[0].type.shape[ax]):  # an index out of range raises, as eager's take
        return None
    return m.emit("slice", [m.ins[0]], axis=ax, start=start, stop=stop, step=step)


def simplify(graph: Graph, ctx: PassContext | None = None) -> Graph:
    return apply_rules(graph, SIMPLIFY, ctx or PassContext(), {"cat_of_scaled_pieces": "cat_pieces_factored"})


def apply_rules(graph: Graph, table: RuleTable, ctx: PassContext, rule_counters: dict[str, str] | None = None) -> Graph:
    """Walk the graph once, replacing each node by what the first matching rule of `table`
    returns (a value of the node's exact type); counts `rewrites`, and the rewrites of each rule
    named in `rule_counters` under its counter. Shared by the passes written as rule tables."""
    rw = Rewriter(graph)
    defs: dict[Value, Node] = {}
    changed = 0
    per_rule: dict[str, int] = {}
    for n in graph.nodes:
        first_new = len(rw.nodes)
        m = Match(n, [rw.get(v) for v in n.inputs], defs, rw, graph)
        rule, repl = table.apply(m)
        if repl is not None and repl.type == n.outputs[0].type \
                and not ctx.take_fuel(lambda n=n: f"{table.name}: rewrote {describe(n)}"):
            del rw.nodes[first_new:]  # without fuel: the node stays as it was
            repl = None
        if repl is not None and repl.type == n.outputs[0].type:
            rw.replace(n.outputs[0], repl)
            changed += 1
            per_rule[rule.name] = per_rule.get(rule.name, 0) + 1
            for node in rw.nodes[first_new:]:
                for o in node.outputs:
                    defs.setdefault(o, node)
            continue
        node = rw.keep(n)
        for o in node.outputs:
            defs[o] = node
    for node in rw.nodes:
        for o in node.outputs:
            defs.setdefault(o, node)
    ctx.count("rewrites", changed)
    for name, counter in (rule_counters or {}).items():
        if per_rule.get(name):
            ctx.count(counter, per_rule[name])
    return rw.finish() if changed else graph


def _pow(rw: Rewriter, n, x: Value, e: float, same_as) -> Value | None:
    if n.outputs[0].type != x.type:
        return None
    if e == 1.0:
        return x
    if e == 2.0:
        return rw.emit("mul", [x, x]).out
    if e == 3.0:
        return rw.emit("mul", [rw.emit("mul", [x, x]).out, x]).out
    if e == 0.5:
        return rw.emit("sqrt", [x]).out
    if e == -0.5:
        return rw.emit("rsqrt", [x]).out
    if e == -1.0:
        return rw.emit("reciprocal", [x]).out
    return None


def _piece_scale(graph: Graph, orig: Value, v: Value, defs: dict) -> tuple[Value, object]:
    """(base, factor) with v == base * factor, when v is a negation or a scalar multiple that
    only the cat reads; else (v, 1)."""
    p = defs.get(v)
    if p is None or v is not orig or graph.is_output(orig) or len(graph.users(orig)) != 1:
        return v, 1
    if p.op == "neg":
        return p.inputs[0], -1.0 if is_float(v.type.dtype) else -1
    if p.op == "mul":
        for i in (0, 1):
            k = scalar_value(defs, p.inputs[i])
            other = p.inputs[1 - i]
            if k is not None and not isinstance(k, bool) and other.type == v.type:
                return other, k
    return v, 1


def _factor_cat_scales(rw: Rewriter, graph: Graph, n: Node, ins: list[Value], defs: dict) -> Value | None:
    """cat of scaled pieces -> mul(cat of the bases, cat of per-piece fills); see the module doc."""
    out = n.outputs[0].type
    dt = out.dtype
    if not (is_float(dt) or (is_int(dt) and dt != torch.uint8)) or out.rank == 0:
        return None
    scaled = [_piece_scale(graph, o, v, defs) for o, v in zip(n.inputs, ins, strict=True)]
    if all(f == 1 for _, f in scaled):
        return None
    ax = n.attrs["axis"]
    data = rw.emit("cat", [b for b, _ in scaled], n.attrs, meta=n.meta).out
    # adjacent pieces with equal factors share one fill
    runs: list[list] = []
    for v, (_, f) in zip(ins, scaled, strict=True):
        if runs and runs[-1][1] == f:
            runs[-1][0] += v.type.shape[ax]
        else:
            runs.append([v.type.shape[ax], f])
    if len(runs) == 1:
        sign = rw.emit("scalar", [], value=runs[0][1], dtype=dt, device=out.device).out
    else:
        fills = []
        for length, f in runs:
            shape = list(out.shape)
            shape[ax] = length
            fills.append(rw.emit("full", [], shape=tuple(shape), value=f, dtype=dt, device=out.device).out)
        sign = rw.emit("cat", fills, n.attrs, meta=n.meta).out
    return rw.emit("mul", [data, sign], meta=n.meta).out
