"""Activations written out as arithmetic, recognized as the fused op they compute.

GPT-2's `NewGELUActivation` (transformers' "gelu_new", also OpenAI GPT, GPT-J, CodeGen, ...)
spells the tanh approximation of GELU as eight ATen ops:

    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))

which is exactly `gelu(x, approximate="tanh")`'s formula. As one `gelu` node it becomes the GEMM
library's register epilogue when it follows a matrix product (instead of a tile pass over C that
re-reads and re-writes it), one exp-free vector op elsewhere, and one VJP rule in training.

The rule matches the formula in any operand order (products and sums commute), with `x^3` as
`x * x * x` in either association (simplify turns `pow(x, 3)` into that) and the constants within
1e-6 relative. Only float32: the op rounds once where eager's eight ops round eight times, a
difference of a few ulp (max 2.4e-7 relative over [-10, 10] measured against the eager formula);
in bfloat16 eager rounds every step to 8 bits, so the fused op would differ from it visibly.

Invariant: a rewritten value computes the same function as the matched formula up to float32
rounding; nothing else changes (unused pieces of the formula are left to dce).
"""

from __future__ import annotations

import math

import torch

from ..ir import Graph, Node, Value
from .context import PassContext
from .rules import Match, RuleTable
from .simplify import apply_rules, scalar_value

RECOGNIZE = RuleTable("recognize_activations")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _near(x, value: float) -> bool:
    return isinstance(x, float | int) and not isinstance(x, bool) and abs(x - value) <= 1e-6 * abs(value)


def _binary(defs: dict[Value, Node], v: Value, op: str) -> list[tuple[Value, Value]]:
    """The (a, b) operand pairs of v = op(a, b) in both orders (for a commutative op), or []."""
    n = defs.get(v)
    if n is None or n.op != op or len(n.inputs) != 2:
        return []
    a, b = n.inputs
    return [(a, b), (b, a)]


def _scaled(defs: dict[Value, Node], v: Value, k: float) -> list[Value]:
    """The values y with v == y * k (k a scalar constant, either side)."""
    return [y for y, c in _binary(defs, v, "mul") if _near(scalar_value(defs, c), k)]


def _is_cube_of(defs: dict[Value, Node], v: Value, x: Value) -> bool:
    for a, b in _binary(defs, v, "mul"):
        if b is x and any(p is x and q is x for p, q in _binary(defs, a, "mul")):
            return True
    return False


def _tanh_gelu_input(defs: dict[Value, Node], half_x: Value, one_plus_tanh: Value) -> Value | None:
    """x when half_x == 0.5 * x and one_plus_tanh == 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))."""
    for x in _scaled(defs, half_x, 0.5):
        for t, one in _binary(defs, one_plus_tanh, "add"):
            tn = defs.get(t)
            if tn is None or tn.op != "tanh" or not _near(scalar_value(defs, one), 1.0):
                continue
            for inner in _scaled(defs, tn.inputs[0], _SQRT_2_OVER_PI):
                for y, k in _binary(defs, inner, "add"):
                    if y is x and any(_is_cube_of(defs, c, x) for c in _scaled(defs, k, 0.044715)):
                        return x
    return None


@RECOGNIZE.rule("mul", when=lambda m: m.out.type.dtype == torch.float32)
def tanh_gelu(m: Match) -> Value | None:  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    for a, b in ((m.ins[0], m.ins[1]), (m.ins[1], m.ins[0])):
        x = _tanh_gelu_input(m.defs, a, b)
        if x is not None and x.type == m.out.type:
            return m.emit("gelu", [x], approximate="tanh")
    return None


def recognize_activations(graph: Graph, ctx: PassContext | None = None) -> Graph:
    return apply_rules(graph, RECOGNIZE, ctx or PassContext())
