"""Exact int8 x int8 products off the CPU: `matmul(x_i8, w_i8, out_dtype=int32)` becomes float32 math.

`aten._int_mm` lowers to one int8 `matmul` with `out_dtype=torch.int32` (ir/ops/matmul.py), which the CPU
backend runs on nf_gemm's int8 x int8 kernel (and the interpreter evaluates exactly). The Triton backend
has no integer matmul, so there it becomes

    sum over chunks of K of at most INT_MM_EXACT_K:  cast(matmul(cast(x, f32), cast(w, f32)), int32)

(with a symbolic K, one float64 product: its sums stay below 2^53 up to K = 2^39).

Applies when: the backend is neither the CPU nor the IR interpreter.

Invariant: the same int32 values: each chunk's float32 sums are integers of magnitude <= 2^24 whatever
the summation order (exact), and the chunks are added in int32 as eager's accumulator adds (the float64
form converts its exact sum once; it differs from eager's wrapping int32 sum only beyond 2^31, which needs
K > 131072).
"""

from __future__ import annotations

import torch

from ..ir import Graph
from ..ir.ops.matmul import INT_MM_EXACT_K
from .context import PassContext
from .rules import Match, RuleTable
from .simplify import apply_rules

EXPAND = RuleTable("expand_int_matmul")


@EXPAND.rule("matmul", when=lambda m: m.attrs.get("out_dtype") is not None)
def int_matmul_as_float(m: Match):
    x, w = m.ins
    K = x.type.shape[-1]
    if not isinstance(K, int):
        prod = m.emit("matmul", [m.emit("cast", [x], dtype=torch.float64), m.emit("cast", [w], dtype=torch.float64)])
        return m.emit("cast", [prod], dtype=torch.int32)
    out = None
    for k0 in range(0, max(K, 1), INT_MM_EXACT_K):
        k1 = min(K, k0 + INT_MM_EXACT_K)
        xs, ws = x, w
        if k1 - k0 != K:
            xs = m.emit("slice", [x], axis=x.type.rank - 1, start=k0, stop=k1, step=1)
            ws = m.emit("slice", [w], axis=w.type.rank - 2, start=k0, stop=k1, step=1)
        prod = m.emit("matmul", [m.emit("cast", [xs], dtype=torch.float32), m.emit("cast", [ws], dtype=torch.float32)])
        part = m.emit("cast", [prod], dtype=torch.int32)
        out = part if out is None else m.emit("add", [out, part])
    return out


def expand_int_matmul(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if getattr(ctx.backend, "name", "cpu") in ("cpu", "interpret"):
        return graph
    return apply_rules(graph, EXPAND, ctx, {"int_matmul_as_float": "int_matmuls_expanded"})
