"""Algebraic simplification.

Local rewrites, each exact in floating point (no reassociation): x+0, x-0, x*1, x/1 -> x;
x / 2^k -> x * 2^-k; pow(x, 1 | 2 | 3 | 0.5 | -0.5 | -1) -> x, x*x, x*x*x, sqrt, rsqrt,
reciprocal; neg(neg x), logical_not(logical_not x) -> x; where(c, x, x) -> x;
cast(cast(x, wide), narrow) -> cast(x, narrow) when the first cast is lossless; casts to the
value's own dtype removed. When a rewrite would change the shape through broadcasting, the
result is an `expand` of the simpler value, so types never change.

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
from ..ir.types import is_float, is_int
from .context import PassContext, describe

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


def simplify(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    rw = Rewriter(graph)
    defs: dict[Value, object] = {}
    changed = 0
    factored = 0

    def same_as(n, v: Value) -> Value | None:
        out = n.outputs[0]
        if v.type == out.type:
            return v
        if v.type.dtype == out.type.dtype and v.type.device == out.type.device:
            try:
                return rw.emit("expand", [v], shape=out.type.shape).outputs[0]
            except ValueError:
                return None
        return None

    for n in graph.nodes:
        first_new = len(rw.nodes)
        ins = [rw.get(v) for v in n.inputs]
        repl: Value | None = None
        sv = [scalar_value(defs, v) for v in ins]
        op = n.op
        if op in ("add", "sub") and sv[1] == 0 and not isinstance(sv[1], bool):
            repl = same_as(n, ins[0])
        elif op == "add" and sv[0] == 0 and not isinstance(sv[0], bool):
            repl = same_as(n, ins[1])
        elif op in ("mul", "div") and sv[1] == 1:
            repl = same_as(n, ins[0])
        elif op == "mul" and sv[0] == 1:
            repl = same_as(n, ins[1])
        elif op == "div" and is_float(ins[0].type.dtype) and isinstance(sv[1], float) and sv[1] != 0 \
                and math.frexp(abs(sv[1]))[0] == 0.5:
            s = rw.emit("scalar", [], value=1.0 / sv[1], dtype=ins[1].type.dtype, device=ins[1].type.device)
            repl = rw.emit("mul", [ins[0], s.out]).out
        elif op == "pow" and sv[1] is not None and is_float(ins[0].type.dtype):
            repl = _pow(rw, n, ins[0], float(sv[1]), same_as)
        elif op in ("neg", "logical_not") and defs.get(ins[0]) is not None and defs[ins[0]].op == op:
            repl = same_as(n, defs[ins[0]].inputs[0])
        elif op == "where" and ins[1] is ins[2]:
            repl = same_as(n, ins[1])
        elif op == "cat":
            repl = _factor_cat_scales(rw, graph, n, ins, defs)
            factored += repl is not None
        elif op == "cast":
            src = defs.get(ins[0])
            if ins[0].type.dtype == n.attrs["dtype"]:
                repl = ins[0]
            elif src is not None and src.op == "cast":
                orig = src.inputs[0]
                if src.attrs["dtype"] in _LOSSLESS.get(orig.type.dtype, ()):
                    repl = orig if orig.type.dtype == n.attrs["dtype"] else rw.emit(
                        "cast", [orig], dtype=n.attrs["dtype"]).out
        if repl is not None and repl.type == n.outputs[0].type \
                and not ctx.take_fuel(lambda n=n: f"simplify: rewrote {describe(n)}"):
            del rw.nodes[first_new:]  # without fuel: the node stays as it was
            factored -= op == "cat"
            repl = None
        if repl is not None and repl.type == n.outputs[0].type:
            rw.replace(n.outputs[0], repl)
            changed += 1
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
    if factored:
        ctx.count("cat_pieces_factored", factored)
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
