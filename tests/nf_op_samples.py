"""Random inputs for every IR op, shared by the generated op tests (tests/codegen/test_op_matrix.py,
tests/passes/test_autodiff.py): `sample(op, dtype, seed) -> (input tensors, attrs)`.

Elementwise ops get inputs over their domain (`DOMAIN`, default [-3, 3]); other ops a sample in
`SPECIAL`. Integer-only and bool-only ops get inputs of their own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from novaforge.ir import OPS
from novaforge.ir.extern import TensorArg
from novaforge.ir.types import TensorType

f32, bf16 = torch.float32, torch.bfloat16
SHAPE = (5, 37)
# inputs of float elementwise ops that are not defined on all reals: (low, high) per operand
DOMAIN: dict[str, tuple[tuple[float, float], ...]] = {
    "log": ((0.05, 4.0),), "log2": ((0.05, 4.0),), "log1p": ((-0.9, 4.0),), "sqrt": ((0.0, 4.0),),
    "rsqrt": ((0.05, 4.0),), "asin": ((-0.99, 0.99),), "acos": ((-0.99, 0.99),), "tan": ((-1.4, 1.4),),
    "reciprocal": ((0.2, 3.0),), "div": ((-3.0, 3.0), (0.2, 3.0)), "pow": ((0.1, 3.0), (-2.0, 2.0)),
    "remainder": ((-6.0, 6.0), (0.5, 3.0)), "floor_divide": ((-6.0, 6.0), (0.5, 3.0)),
    "exp": ((-4.0, 4.0),), "exp2": ((-4.0, 4.0),), "expm1": ((-4.0, 4.0),), "sinh": ((-4.0, 4.0),),
    "cosh": ((-4.0, 4.0),),
}
INT_ONLY = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor"}
BOOL_ONLY = {"logical_not", "logical_and", "logical_or", "logical_xor"}


class Maker:
    def __init__(self, dtype: torch.dtype, seed: int) -> None:
        self.dtype = dtype
        self.g = torch.Generator().manual_seed(seed)

    def t(self, *shape: int, lo: float = -3.0, hi: float = 3.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        dt = dtype or self.dtype
        if dt == torch.bool:
            return torch.rand(shape, generator=self.g) < 0.5
        if not dt.is_floating_point:
            return torch.randint(-20, 21, shape, generator=self.g).to(dt)
        return (torch.rand(shape, generator=self.g) * (hi - lo) + lo).to(dt)

    def idx(self, n: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, n, shape, generator=self.g)


Sample = tuple[list[torch.Tensor], dict[str, Any]]


def _int_dtype(m: Maker) -> torch.dtype:
    return torch.int32 if m.dtype == f32 else torch.int64


SPECIAL: dict[str, Callable[[Maker], Sample]] = {
    "where": lambda m: ([m.t(*SHAPE, dtype=torch.bool), m.t(*SHAPE), m.t(1, SHAPE[1])], {}),
    "cast": lambda m: ([m.t(*SHAPE)], {"dtype": torch.int32 if m.dtype == f32 else f32}),
    "gelu": lambda m: ([m.t(*SHAPE)], {"approximate": "tanh" if m.dtype == bf16 else "none"}),
    "isnan": lambda m: ([_specials(m.t(*SHAPE))], {}), "isinf": lambda m: ([_specials(m.t(*SHAPE))], {}),
    "isfinite": lambda m: ([_specials(m.t(*SHAPE))], {}),
    "scalar": lambda m: ([], {"value": 1.5, "dtype": m.dtype}),
    "full": lambda m: ([], {"shape": SHAPE, "value": -2.25, "dtype": m.dtype}),
    "iota": lambda m: ([], {"length": 37, "start": 3, "step": 2, "dtype": m.dtype}),
    "counter_uniform": lambda m: ([torch.randint(-2**62, 2**62, SHAPE, generator=m.g),
                                   torch.randint(-2**62, 2**62, (), generator=m.g)], {"dtype": m.dtype}),
    **{op: (lambda m: ([m.t(4, 33)], {"axes": (1,), "keepdim": True})) for op in ("sum", "prod", "max", "min")},
    "argmax": lambda m: ([m.t(4, 33)], {"axes": (1,), "keepdim": False}),
    "argmin": lambda m: ([m.t(4, 33)], {"axes": (0,), "keepdim": True}),
    "cumsum": lambda m: ([m.t(4, 33)], {"axis": 1}),
    "reshape": lambda m: ([m.t(6, 10)], {"shape": (3, 20)}),
    "permute": lambda m: ([m.t(6, 10)], {"perm": (1, 0)}),
    "expand": lambda m: ([m.t(6, 1)], {"shape": (2, 6, 10)}),
    "slice": lambda m: ([m.t(6, 10)], {"axis": 1, "start": 1, "stop": 9, "step": 3}),
    "cat": lambda m: ([m.t(4, 3), m.t(4, 5)], {"axis": 1}),
    "pad": lambda m: ([m.t(4, 5)], {"pads": ((0, 0), (1, 2)), "value": 0.5}),
    "scatter_slice": lambda m: ([m.t(4, 8), m.t(4, 3)], {"axis": 1, "start": 2, "stop": 5, "step": 1}),
    "take": lambda m: ([m.t(10, 6), m.idx(10, 3, 4)], {"axis": 0}),
    "gather": lambda m: ([m.t(4, 6), m.idx(6, 4, 3)], {"axis": 1}),
    "index": lambda m: ([m.t(5, 6, 7), m.idx(5, 3), m.idx(7, 3)], {"axes": (0, 2)}),
    "scatter_add": lambda m: ([m.t(4, 6), m.idx(6, 4, 3), m.t(4, 3)], {"axis": 1}),
    "matmul": lambda m: ([m.t(16, 32), m.t(32, 24)], {}),
    "attention": lambda m: ([m.t(1, 2, 8, 16), m.t(1, 2, 8, 16), m.t(1, 2, 8, 16)],
                            {"scale": 0.25, "causal": m.dtype == bf16}),
    "attention_backward": lambda m: _attention_backward_sample(m),
    "attention_lse": lambda m: ([m.t(1, 2, 40, 16), m.t(1, 2, 40, 16), m.t(1, 2, 40, 16)],
                                {"scale": 0.25, "causal": m.dtype == f32}),
    **{op: (lambda m: ([m.t(4, 6)], {"target": "aten.cumprod.default",
                                     "spec": ("__list__", ("__list__", TensorArg(0), 1), ("__dict__",)),
                                     "out_types": (TensorType((4, 6), m.dtype),)}))
       for op in ("extern", "extern_effect")},
}


def _specials(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[:3] = torch.tensor([math.nan, math.inf, -math.inf])
    return x


def _attention_backward_sample(m: Maker) -> Sample:
    """(grad_out, q, k, v, out, logsumexp) with out and logsumexp from ATen's CPU flash forward."""
    q, k, v, g = (m.t(1, 2, 40, 16, lo=-1.0, hi=1.0) for _ in range(4))
    causal = m.dtype == bf16
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.25)
    return [g, q, k, v, o, lse], {"scale": 0.25, "causal": causal}


def sample(op: str, dtype: torch.dtype, seed: int) -> Sample:
    m = Maker(dtype, seed)
    if op in SPECIAL:
        return SPECIAL[op](m)
    d = OPS[op]
    assert d.has("elementwise"), f"{op}: add a sample to SPECIAL"
    n = d.arity[0]
    if op in BOOL_ONLY:
        return [m.t(*SHAPE, dtype=torch.bool) for _ in range(n)], {}
    if op in INT_ONLY:
        return [m.t(*SHAPE, dtype=_int_dtype(m)) for _ in range(n)], {}
    dom = DOMAIN.get(op, ((-3.0, 3.0),) * n)
    shapes = [SHAPE, (1, SHAPE[1])]  # a broadcast second operand
    return [m.t(*shapes[i % 2], lo=lo, hi=hi) for i, (lo, hi) in enumerate(dom[:n] + dom[-1:] * (n - len(dom)))], {}


