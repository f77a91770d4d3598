"""Algebraic simplification.

Local rewrites, each exact in floating point (no reassociation): x+0, x-0, x*1, x/1 -> x;
x / 2^k -> x * 2^-k; pow(x, 1 | 2 | 3 | 0.5 | -0.5 | -1) -> x, x*x, x*x*x, sqrt, rsqrt,
reciprocal; neg(neg x), logical_not(logical_not x) -> x; where(c, x, x) -> x;
cast(cast(x, wide), narrow) -> cast(x, narrow) when the first cast is lossless; casts to the
value's own dtype removed. When a rewrite would change the shape through broadcasting, the
result is an `expand` of the simpler value, so types never change.
"""

from __future__ import annotations

import math

import torch

from ..ir import Graph, Rewriter, Value
from ..ir.types import is_float
from .context import PassContext

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
    rw = Rewriter(graph)
    defs: dict[Value, object] = {}
    changed = 0

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
        elif op == "cast":
            src = defs.get(ins[0])
            if ins[0].type.dtype == n.attrs["dtype"]:
                repl = ins[0]
            elif src is not None and src.op == "cast":
                orig = src.inputs[0]
                if src.attrs["dtype"] in _LOSSLESS.get(orig.type.dtype, ()):
                    repl = orig if orig.type.dtype == n.attrs["dtype"] else rw.emit(
                        "cast", [orig], dtype=n.attrs["dtype"]).out
        if repl is not None and repl.type == n.outputs[0].type:
            rw.replace(n.outputs[0], repl)
            changed += 1
            for node in rw.nodes[-2:]:
                for o in node.outputs:
                    defs.setdefault(o, node)
            continue
        node = rw.keep(n)
        for o in node.outputs:
            defs[o] = node
    for node in rw.nodes:
        for o in node.outputs:
            defs.setdefault(o, node)
    if ctx is not None:
        ctx.count("rewrites", changed)
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
