"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, `where`, `copy`, `cast`.

Each op is one record (`core.define`), its direct ATen lowering rules beside it
(`OpDef.lowers`). The tables below are the records of the regular ops, one line each:
adding a unary float op is one line in `UNARY_FLOAT` (plus one line per backend rendering,
codegen/cpu/cexpr.py and codegen/triton/exprs.py).

Lowering dtype rule: binary IR ops take operands of one dtype. Arithmetic computes in the ATen
result dtype (from the FX node's fake value); comparisons compute in the promoted operand dtype
(`torch.result_type`) and return bool. Python scalars become 0-d `scalar` values of the
compute dtype. A rule receives the frontend's `LowerCtx` (frontend/lower.py) and the ATen
call's arguments.

Invariant: every op here has the `elementwise` flag and one output; binary ops broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..types import TensorType, broadcast_shapes, is_float, opmath_dtype
from .core import OPS, REQUIRED, bound_of, define, device_of, elementwise_infer, same_dtype

aten = torch.ops.aten
FAMILY = "elementwise"


def _unary_impl(f: Callable) -> Callable:
    return lambda xs, a: f(xs[0])


def _binary_impl(f: Callable) -> Callable:
    return lambda xs, a: f(xs[0], xs[1])


# --------------------------------------------------------------------- lowering helpers
def promote(ctx: Any, a: Any, b: Any) -> torch.dtype:
    """ATen's promoted dtype of two operands (0-d tensors and Python numbers promote weakly)."""

    def meta(x: Any) -> Any:
        f = ctx.fake(x)
        if isinstance(f, torch.Tensor):
            return torch.empty((1,) if f.dim() else (), dtype=f.dtype, device="meta")
        return f

    return torch.result_type(meta(a), meta(b))


def as_bool(ctx: Any, a: Any):
    """A tensor argument or Python number as a bool IR value (`x != 0` for other dtypes)."""
    if isinstance(a, bool | int | float):
        return ctx.scalar(bool(a), torch.bool)
    v = ctx.val(a)
    if v.type.dtype == torch.bool:
        return v
    return ctx.emit("ne", [v, ctx.scalar(0, v.type.dtype, v.type.device)])


ROUNDING = frozenset({"floor", "ceil", "round", "trunc"})


def lower_unary(op: str):
    """The rule of a unary ATen op that is this IR op in the result dtype."""

    def lower(ctx, x, *args, **kwargs):
        dt = ctx.out_type.dtype
        if op in ROUNDING and not is_float(dt):  # integers are already whole
            return ctx.tensor(x, dt)
        return ctx.emit(op, [ctx.tensor(x, dt)])

    return lower


def lower_binary(op: str):
    """`a op b` (`a op alpha * b` rounding once in the opmath dtype) in the result dtype."""

    def lower(ctx, a, b, *, alpha=1):
        dt = ctx.out_type.dtype
        if alpha == 1:
            return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])
        acc = opmath_dtype(dt)  # a op alpha * b rounds once, as in ATen
        y = ctx.emit("mul", [ctx.tensor(b, acc), ctx.scalar(alpha, acc)])
        return ctx.cast(ctx.emit(op, [ctx.tensor(a, acc), y]), dt)

    return lower


def lower_compare(op: str):
    def lower(ctx, a, b):
        dt = promote(ctx, a, b)
        return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])

    return lower


def lower_logical(op: str):
    def lower(ctx, a, b):
        return ctx.emit(op, [as_bool(ctx, a), as_bool(ctx, b)])

    return lower


def lower_bitwise(op: str, logical: str):
    def lower(ctx, a, b):
        dt = ctx.out_type.dtype
        if dt == torch.bool:
            return ctx.emit(logical, [as_bool(ctx, a), as_bool(ctx, b)])
        return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])

    return lower


# ----------------------------------------------------------------------- unary records
def _gelu(x, a):
    return torch.nn.functional.gelu(x, approximate=a["approximate"])


class Unary(NamedTuple):
    fn: Callable  # the torch function (reference implementation)
    flops: float  # FLOPs per element
    transcendental: bool
    deriv: Callable | None  # deriv(b, x, y) -> dy/dx as IR (x, y in float32 for 16-bit floats); None: 0


LN2 = math.log(2.0)
# one line per op: the record (torch function, cost) and its derivative; the ATen op is aten.<name>.default
UNARY_FLOAT: dict[str, Unary] = {
    "exp": Unary(torch.exp, 4, True, lambda b, x, y: y),
    "exp2": Unary(torch.exp2, 4, True, lambda b, x, y: b.mul(y, LN2)),
    "log": Unary(torch.log, 4, True, lambda b, x, y: b.div(1.0, x)),
    "log1p": Unary(torch.log1p, 4, True, lambda b, x, y: b.div(1.0, b.add(x, 1.0))),
    "log2": Unary(torch.log2, 4, True, lambda b, x, y: b.div(1.0, b.mul(x, LN2))),
    "expm1": Unary(torch.expm1, 4, True, lambda b, x, y: b.add(y, 1.0)),
    "sqrt": Unary(torch.sqrt, 2, False, lambda b, x, y: b.div(0.5, y)),
    "rsqrt": Unary(torch.rsqrt, 2, False, lambda b, x, y: b.mul(b.mul(b.mul(y, y), y), -0.5)),
    "sin": Unary(torch.sin, 8, True, lambda b, x, y: b.emit("cos", [x])),
    "cos": Unary(torch.cos, 8, True, lambda b, x, y: b.neg(b.emit("sin", [x]))),
    "tan": Unary(torch.tan, 8, True, lambda b, x, y: b.add(b.mul(y, y), 1.0)),
    "tanh": Unary(torch.tanh, 6, True, lambda b, x, y: b.sub(1.0, b.mul(y, y))),
    "asin": Unary(torch.asin, 8, True, lambda b, x, y: b.emit("rsqrt", [b.sub(1.0, b.mul(x, x))])),
    "acos": Unary(torch.acos, 8, True, lambda b, x, y: b.neg(b.emit("rsqrt", [b.sub(1.0, b.mul(x, x))]))),
    "atan": Unary(torch.atan, 8, True, lambda b, x, y: b.div(1.0, b.add(b.mul(x, x), 1.0))),
    "sinh": Unary(torch.sinh, 8, True, lambda b, x, y: b.emit("cosh", [x])),
    "cosh": Unary(torch.cosh, 8, True, lambda b, x, y: b.emit("sinh", [x])),
    "sigmoid": Unary(torch.sigmoid, 5, True, lambda b, x, y: b.mul(y, b.sub(1.0, y))),
    "erf": Unary(torch.erf, 8, True, lambda b, x, y: b.mul(b.emit("exp", [b.neg(b.mul(x, x))]),
                                                          2.0 / math.sqrt(math.pi))),
    "reciprocal": Unary(torch.reciprocal, 1, False, lambda b, x, y: b.neg(b.mul(y, y))),
    "floor": Unary(torch.floor, 1, False, None), "ceil": Unary(torch.ceil, 1, False, None),
    "round": Unary(torch.round, 1, False, None), "trunc": Unary(torch.trunc, 1, False, None),
    "silu": Unary(torch.nn.functional.silu, 6, True, lambda b, x, y: _silu_deriv(b, x)),
}


def _silu_deriv(b, x):
    s = b.emit("sigmoid", [x])
    return b.mul(s, b.add(b.mul(x, b.sub(1.0, s)), 1.0))


def vjp_of_deriv(deriv: Callable | None) -> Callable:
    """The VJP of y = f(x) from dy/dx: g * f'(x), computed in float32 for 16-bit floats."""

    def vjp(b, n, cts):
        if deriv is None:
            return [None]
        x = n.inputs[0]
        d = deriv(b, b.opmath(x), b.opmath(n.outputs[0]))
        return [b.cast(b.mul(b.opmath(cts[0]), d), x.type.dtype)]

    return vjp


for _n, _u in UNARY_FLOAT.items():
    _d = define(_n, 1, elementwise_infer(_n, float_only=True), _unary_impl(_u.fn), flags={"elementwise"},
                flops=_u.flops, family=FAMILY, transcendental=_u.transcendental)
    _d.lowers(getattr(aten, _n).default)(lower_unary(_n))
    _d.defvjp(vjp_of_deriv(_u.deriv))

gelu = define("gelu", 1, elementwise_infer("gelu", float_only=True), lambda xs, a: _gelu(xs[0], a),
              attrs={"approximate": "none"}, flags={"elementwise"}, flops=10, doc="approximate='none' (erf) or 'tanh'",
              family=FAMILY, transcendental=True)


@gelu.lowers(aten.gelu.default)
def _lower_gelu(ctx, x, approximate="none"):
    return ctx.emit("gelu", [ctx.val(x)], approximate=approximate)


@gelu.defvjp
def _gelu_vjp(b, n, cts):
    x = b.opmath(n.inputs[0])
    if n.attrs["approximate"] == "tanh":  # 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3))
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        x2 = b.mul(x, x)
        t = b.emit("tanh", [b.mul(b.add(x, b.mul(b.mul(x2, x), c)), k)])
        d = b.add(b.mul(b.add(t, 1.0), 0.5),
                  b.mul(b.mul(b.mul(x, b.sub(1.0, b.mul(t, t))), 0.5 * k), b.add(b.mul(x2, 3 * c), 1.0)))
    else:  # Phi(x) + x phi(x)
        cdf = b.mul(b.add(b.emit("erf", [b.mul(x, 1.0 / math.sqrt(2.0))]), 1.0), 0.5)
        pdf = b.mul(b.emit("exp", [b.mul(b.mul(x, x), -0.5)]), 1.0 / math.sqrt(2.0 * math.pi))
        d = b.add(cdf, b.mul(x, pdf))
    return [b.cast(b.mul(b.opmath(cts[0]), d), n.inputs[0].type.dtype)]


UNARY_ANY: dict[str, Callable] = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "relu": torch.relu,
    "bitwise_not": torch.bitwise_not,
}
for _n, _f in UNARY_ANY.items():
    define(_n, 1, elementwise_infer(_n), _unary_impl(_f), flags={"elementwise"},
           family=FAMILY).lowers(getattr(aten, _n).default)(lower_unary(_n))
# |output| <= bound from the inputs' bounds (attention mask analysis, passes/attention_patterns.py)
OPS["neg"].abs_bound = OPS["abs"].abs_bound = bound_of(0)
OPS["neg"].defvjp(lambda b, n, cts: [b.neg(cts[0])])
OPS["abs"].defvjp(lambda b, n, cts: [b.mul(cts[0], b.emit("sign", [n.inputs[0]]))])
OPS["sign"].defvjp(lambda b, n, cts: [None])
OPS["relu"].defvjp(lambda b, n, cts: [b.where(b.emit("gt", [n.outputs[0], b.const(0, n.outputs[0])]), cts[0], 0.0)])


def _lower_isx(op: str):
    def lower(ctx, x):
        return ctx.emit(op, [ctx.val(x)])

    return lower


for _n, _f in {"isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite}.items():
    define(_n, 1, elementwise_infer(_n, out_dtype=torch.bool), _unary_impl(_f), flags={"elementwise"},
           family=FAMILY).lowers(getattr(aten, _n).default)(_lower_isx(_n))


def _logical_infer(name):
    def infer(ts, a):
        for t in ts:
            if t.dtype != torch.bool:
                raise TypeError(f"{name}: operands must be bool, got {t}")
        return [TensorType(broadcast_shapes(*(t.shape for t in ts)), torch.bool, device_of(name, ts))]

    return infer


logical_not = define("logical_not", 1, _logical_infer("logical_not"), lambda xs, a: torch.logical_not(xs[0]),
                     flags={"elementwise"}, family=FAMILY)


@logical_not.lowers(aten.logical_not.default)
def _lower_lnot(ctx, x):
    return ctx.emit("logical_not", [as_bool(ctx, x)])


# ---------------------------------------------------------------------- binary records
BINARY: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "remainder": torch.remainder,
    "floor_divide": torch.floor_divide, "atan2": torch.atan2,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
}
COMMUTATIVE = {"add", "mul", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
               "eq", "ne", "logical_and", "logical_or", "logical_xor"}
TRANSCENDENTAL_BINARY = {"pow", "atan2"}
for _n, _f in BINARY.items():
    _fl = {"elementwise"} | ({"commutative"} if _n in COMMUTATIVE else set())
    define(_n, 2, elementwise_infer(_n, float_only=_n in ("div", "atan2")), _binary_impl(_f), flags=_fl,
           flops=4 if _n == "pow" else 1, family=FAMILY, transcendental=_n in TRANSCENDENTAL_BINARY)

OPS["add"].abs_bound = OPS["sub"].abs_bound = bound_of(0, 1, combine=lambda x, y: x + y)
OPS["mul"].abs_bound = bound_of(0, 1, combine=lambda x, y: x * y)
OPS["maximum"].abs_bound = OPS["minimum"].abs_bound = bound_of(0, 1)



# VJPs of the binary ops: one cotangent per operand (broadcast operands are summed back by autodiff)
def _binary_vjp(fn):
    def vjp(b, n, cts):
        a, c = n.inputs
        dt = n.outputs[0].type.dtype
        return [None if g is None else b.cast(g, dt) for g in fn(b, b.opmath(cts[0]), b.opmath(a), b.opmath(c),
                                                                  b.opmath(n.outputs[0]))]

    return vjp


def _pow_vjp(b, g, x, e, y):
    ga = b.where(b.emit("eq", [e, b.const(0, e)]), 0.0, b.mul(b.mul(g, e), b.emit("pow", [x, b.sub(e, 1.0)])))
    keep = b.emit("logical_and", [b.emit("eq", [x, b.const(0, x)]), b.emit("ge", [e, b.const(0, e)])])
    gb = b.where(keep, 0.0, b.mul(b.mul(g, y), b.emit("log", [x])))
    return [ga, gb]


def _extreme_vjp(first_wins: str):  # maximum: "gt"; minimum: "lt" (ties split the gradient, as in torch)
    def fn(b, g, x, e, y):
        half = b.where(b.emit("eq", [x, e]), b.mul(g, 0.5), g)
        loses = "lt" if first_wins == "gt" else "gt"
        return [b.where(b.emit(loses, [x, e]), 0.0, half), b.where(b.emit(first_wins, [x, e]), 0.0, half)]

    return fn


def _atan2_vjp(b, g, y, x, out):
    r = b.add(b.mul(x, x), b.mul(y, y))
    return [b.div(b.mul(g, x), r), b.div(b.neg(b.mul(g, y)), r)]


for _op, _fn in {
    "add": lambda b, g, x, e, y: [g, g],
    "sub": lambda b, g, x, e, y: [g, b.neg(g)],
    "mul": lambda b, g, x, e, y: [b.mul(g, e), b.mul(g, x)],
    "div": lambda b, g, x, e, y: [b.div(g, e), b.div(b.neg(b.mul(g, x)), b.mul(e, e))],
    "pow": _pow_vjp,
    "maximum": _extreme_vjp("gt"), "minimum": _extreme_vjp("lt"),
    "remainder": lambda b, g, x, e, y: [g, b.neg(b.mul(g, b.emit("floor_divide", [x, e])))],
    "floor_divide": lambda b, g, x, e, y: [None, None],
    "atan2": _atan2_vjp,
}.items():
    OPS[_op].defvjp(_binary_vjp(_fn))

# ATen ops that are `a op b` (with alpha) in the result dtype
for _op, _targets in {
    "add": (aten.add.Tensor, aten.add.Scalar),
    "sub": (aten.sub.Tensor, aten.sub.Scalar),
    "mul": (aten.mul.Tensor, aten.mul.Scalar),
    "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,),
    "remainder": (aten.remainder.Tensor, aten.remainder.Scalar),
    "atan2": (aten.atan2.default,),
    "pow": (aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar),
}.items():
    OPS[_op].lowers(*_targets)(lower_binary(_op))


@OPS["sub"].lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def _lower_rsub(ctx, a, b, *, alpha=1):
    return lower_binary("sub")(ctx, b, a, alpha=alpha)


@OPS["div"].lowers(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def lower_div(ctx, a, b):
    dt = ctx.out_type.dtype
    return ctx.emit("div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


@OPS["floor_divide"].lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def lower_floordiv(ctx, a, b):
    """`floor_divide` for every dtype: for floats it is ATen's fmod-based floor division, which
    differs from floor(a / b) when the rounded quotient lands on an integer (1 // 0.1 == 9)."""
    dt = ctx.out_type.dtype
    return ctx.emit("floor_divide", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


for _op, _lop, _dunder in (("bitwise_and", "logical_and", "__and__"), ("bitwise_or", "logical_or", "__or__"),
                           ("bitwise_xor", "logical_xor", "__xor__")):
    OPS[_op].lowers(getattr(aten, _op).Tensor, getattr(aten, _op).Scalar, getattr(aten, _dunder).Tensor,
                    getattr(aten, _dunder).Scalar)(lower_bitwise(_op, _lop))

COMPARE: dict[str, Callable] = {
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}
for _n, _f in COMPARE.items():
    define(_n, 2, elementwise_infer(_n, out_dtype=torch.bool), _binary_impl(_f),
           flags={"elementwise"} | ({"commutative"} if _n in COMMUTATIVE else set()),
           family=FAMILY).lowers(getattr(aten, _n).Tensor, getattr(aten, _n).Scalar)(lower_compare(_n))

for _n, _f in {"logical_and": torch.logical_and, "logical_or": torch.logical_or,
               "logical_xor": torch.logical_xor}.items():
    define(_n, 2, _logical_infer(_n), _binary_impl(_f), flags={"elementwise", "commutative"},
           family=FAMILY).lowers(getattr(aten, _n).default)(lower_logical(_n))


# ------------------------------------------------------------------- where, copy, cast
def _where_infer(ts, a):
    c, x, y = ts
    if c.dtype != torch.bool:
        raise TypeError(f"where: condition must be bool, got {c}")
    dt = same_dtype("where", [x, y])
    return [TensorType(broadcast_shapes(c.shape, x.shape, y.shape), dt, device_of("where", ts))]


where = define("where", 3, _where_infer, lambda xs, a: torch.where(xs[0], xs[1], xs[2]), flags={"elementwise"},
               family=FAMILY, abs_bound=bound_of(1, 2))


@where.lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _lower_where(ctx, c, a, b):
    dt = ctx.out_type.dtype
    return ctx.emit("where", [as_bool(ctx, c), ctx.tensor(a, dt), ctx.tensor(b, dt)])


@where.defvjp
def _where_vjp(b, n, cts):
    c, (g,) = n.inputs[0], cts
    return [None, b.where(c, g, 0.0), b.where(c, 0.0, g)]


@where.lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _lower_masked_fill(ctx, x, mask, value):
    dt = ctx.out_type.dtype
    return ctx.emit("where", [as_bool(ctx, mask), ctx.tensor(value, dt), ctx.tensor(x, dt)])


define("copy", 1, elementwise_infer("copy"), lambda xs, a: xs[0].clone(memory_format=torch.contiguous_format),
       flags={"elementwise"}, flops=0, doc="materializes its input (a contiguous copy); inserted by fusion",
       family=FAMILY, abs_bound=bound_of(0))


def _cast_infer(ts, a):
    return [ts[0].with_dtype(a["dtype"])]


OPS["copy"].defvjp(lambda b, n, cts: [cts[0]])

cast = define("cast", 1, _cast_infer, lambda xs, a: xs[0].to(a["dtype"]), attrs={"dtype": REQUIRED},
              flags={"elementwise"}, flops=0, family=FAMILY, abs_bound=bound_of(0))


@cast.defvjp
def _cast_vjp(b, n, cts):
    src = n.inputs[0].type.dtype
    return [b.cast(cts[0], src) if is_float(src) else None]


@cast.lowers(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other,
             aten.type_as.default, torch.ops.prims.convert_element_type.default)
def _lower_to(ctx, x, *args, **kwargs):
    t = ctx.out_type
    v = ctx.val(x)
    if v.type.device != t.device:
        return ctx.extern("device copy")
    return ctx.cast(v, t.dtype)
