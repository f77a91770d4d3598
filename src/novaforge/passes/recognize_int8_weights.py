"""Weight-only int8 products, recognized: `A @ views(cast(int8 W))` becomes `A @ views(W)`.

A torchao `Int8WeightOnlyConfig` linear (and `aten._weight_int8pack_mm`) decomposes to

    matmul(x, cast(permute(W_int8), float32)) * scale[N] (+ bias)

where eager converts the whole int8 weight to a float32 copy on every call (4x its bytes, read
and written once more), and constant folding under `freeze=True` would keep that copy instead of
the int8 weight. As `matmul(x, permute(W_int8))` (a float A times an int8 B, ir/ops/matmul.py)
the CPU backend calls nf_gemm's int8 entry (`nf_gemm_i8w`): the weight stays int8 in memory and
is converted in registers (decode GEMV) or while packing a block; the scale multiply and the bias
stay in the kernel's epilogue.

Applies when: the backend is the CPU (or the IR interpreter), A is float32 and the cast goes from
int8 to float32, with any chain of views between the cast and the matmul or below the cast (they
are dtype-agnostic and re-emitted on the int8 value).

Invariant: the rewritten product computes the same values: int8 -> float32 is exact, and
the product is the same float32 sum (the int8 kernel accumulates in float32 like the float one).
"""

from __future__ import annotations

import torch

from ..ir import OPS, Graph, Node, Value
from .context import PassContext
from .rules import Match, RuleTable
from .simplify import apply_rules

RECOGNIZE = RuleTable("recognize_int8_weights")


def _int8_source(defs: dict[Value, Node], v: Value) -> tuple[Value, list[Node]] | None:
    """(the int8 value, the view nodes from the cast up to v, outermost last) when
    v == views(cast(int8 value, float32)); else None."""
    chain: list[Node] = []
    n = defs.get(v)
    while n is not None and OPS[n.op].has("view") and len(n.inputs) == 1:
        chain.append(n)
        n = defs.get(n.inputs[0])
    if n is None or n.op != "cast" or n.inputs[0].type.dtype != torch.int8:
        return None
    if n.outputs[0].type.dtype != torch.float32:
        return None
    return n.inputs[0], chain[::-1]


@RECOGNIZE.rule("matmul", when=lambda m: m.ins[0].type.dtype == torch.float32)
def int8_weight_matmul(m: Match) -> Value | None:
    found = _int8_source(m.defs, m.ins[1])
    if found is None:
        return None
    w, chain = found
    for view in chain:
        w = m.emit(view.op, [w], **dict(view.attrs))
    return m.emit("matmul", [m.ins[0], w])


def recognize_int8_weights(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if getattr(ctx.backend, "name", "cpu") not in ("cpu", "interpret"):
        return graph  # (the Triton backend has no int8-operand matmul)
    return apply_rules(graph, RECOGNIZE, ctx, {"int8_weight_matmul": "int8_weight_matmuls"})
