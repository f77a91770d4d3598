"""Lowering rules for elementwise ATen ops, tensor creation and copies.

Dtype rule: binary IR ops take operands of one dtype. Arithmetic computes in the ATen result
dtype (from the FX node's fake value); comparisons compute in the promoted operand dtype
(`torch.result_type`) and return bool. Python scalars become 0-d `scalar` values of the compute
dtype. Composite rules (several IR ops for one ATen op) compute 16-bit floats in float32 and
cast back once (`LowerCtx.opmath`), as ATen's kernels do, so they round like eager. Fills are
`expand`s of a scalar, so they cost no memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.types import is_float
from .lower import LowerCtx, UnsupportedError, opmath_dtype

aten = torch.ops.aten
RULES: dict[Any, Any] = {}


def rule(*targets):
    def deco(fn):
        for t in targets:
            RULES[t] = fn
        return fn

    return deco


def _promote(ctx: LowerCtx, a: Any, b: Any) -> torch.dtype:
    """ATen's promoted dtype of two operands (0-d tensors and Python numbers promote weakly)."""

    def meta(x: Any) -> Any:
        f = ctx.fake(x)
        if isinstance(f, torch.Tensor):
            return torch.empty((1,) if f.dim() else (), dtype=f.dtype, device="meta")
        return f

    return torch.result_type(meta(a), meta(b))


def _binary(op: str):
    def lower(ctx: LowerCtx, a, b, *, alpha=1):
        dt = ctx.out_type.dtype
        if alpha == 1:
            return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])
        acc = opmath_dtype(dt)  # a op alpha * b rounds once, as in ATen
        y = ctx.emit("mul", [ctx.tensor(b, acc), ctx.scalar(alpha, acc)])
        return ctx.cast(ctx.emit(op, [ctx.tensor(a, acc), y]), dt)

    return lower


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
    for _t in _targets:
        RULES[_t] = _binary(_op)


@rule(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, a, b, *, alpha=1):
    return _binary("sub")(ctx, b, a, alpha=alpha)


@rule(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def _div(ctx, a, b):
    dt = ctx.out_type.dtype
    return ctx.emit("div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


@rule(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return _div(ctx, a, b)
    if rounding_mode == "floor":
        return _floordiv(ctx, a, b)
    dt = ctx.out_type.dtype
    if is_float(dt):  # trunc(a / b), the quotient taken in float32 for 16-bit floats
        acc = opmath_dtype(dt)
        return ctx.cast(ctx.emit("trunc", [ctx.emit("div", [ctx.tensor(a, acc), ctx.tensor(b, acc)])]), dt)
    x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
    return trunc_divide(ctx, x, y)


def trunc_divide(ctx: LowerCtx, x, y):
    """Integer division rounding toward zero: the floor quotient, plus one where the division
    is inexact and the operands' signs differ."""
    dt, dev = x.type.dtype, x.type.device
    q = ctx.emit("floor_divide", [x, y])
    zero = ctx.scalar(0, dt, dev)
    inexact = ctx.emit("ne", [ctx.emit("remainder", [x, y]), zero])
    signs_differ = ctx.emit("ne", [ctx.emit("lt", [x, zero]), ctx.emit("lt", [y, zero])])
    fix = ctx.emit("logical_and", [inexact, signs_differ])
    return ctx.emit("where", [fix, ctx.emit("add", [q, ctx.scalar(1, dt, dev)]), q])


@rule(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floordiv(ctx, a, b):
    """`floor_divide` for every dtype: for floats it is ATen's fmod-based floor division, which
    differs from floor(a / b) when the rounded quotient lands on an integer (1 // 0.1 == 9)."""
    dt = ctx.out_type.dtype
    return ctx.emit("floor_divide", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


def _compare(op: str):
    def lower(ctx: LowerCtx, a, b):
        dt = _promote(ctx, a, b)
        return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])

    return lower


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        RULES[getattr(getattr(aten, _op), _ov)] = _compare(_op)


ROUNDING = frozenset({"floor", "ceil", "round", "trunc"})


def _unary(op: str):
    def lower(ctx: LowerCtx, x, *args, **kwargs):
        dt = ctx.out_type.dtype
        if op in ROUNDING and not is_float(dt):  # integers are already whole
            return ctx.tensor(x, dt)
        return ctx.emit(op, [ctx.tensor(x, dt)])

    return lower


UNARY_TARGETS = {
    "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p", "log2": "log2", "expm1": "expm1",
    "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "sigmoid": "sigmoid", "erf": "erf", "reciprocal": "reciprocal", "floor": "floor", "ceil": "ceil",
    "round": "round", "trunc": "trunc", "silu": "silu", "neg": "neg", "abs": "abs", "sign": "sign",
    "relu": "relu", "bitwise_not": "bitwise_not",
}
for _name, _op in UNARY_TARGETS.items():
    RULES[getattr(aten, _name).default] = _unary(_op)


@rule(aten.gelu.default)
def _gelu(ctx, x, approximate="none"):
    return ctx.emit("gelu", [ctx.val(x)], approximate=approximate)


@rule(aten.isnan.default, aten.isinf.default, aten.isfinite.default)
def _isx(ctx, x):
    op = {aten.isnan.default: "isnan", aten.isinf.default: "isinf", aten.isfinite.default: "isfinite"}[ctx.target]
    return ctx.emit(op, [ctx.val(x)])


def as_bool(ctx: LowerCtx, a: Any):
    if isinstance(a, bool | int | float):
        return ctx.scalar(bool(a), torch.bool)
    v = ctx.val(a)
    if v.type.dtype == torch.bool:
        return v
    return ctx.emit("ne", [v, ctx.scalar(0, v.type.dtype, v.type.device)])


@rule(aten.logical_not.default)
def _lnot(ctx, x):
    return ctx.emit("logical_not", [as_bool(ctx, x)])


def _logical(op: str):
    def lower(ctx, a, b):
        return ctx.emit(op, [as_bool(ctx, a), as_bool(ctx, b)])

    return lower


for _op in ("logical_and", "logical_or", "logical_xor"):
    RULES[getattr(aten, _op).default] = _logical(_op)


def _bitwise(op: str, logical: str):
    def lower(ctx, a, b):
        dt = ctx.out_type.dtype
        if dt == torch.bool:
            return ctx.emit(logical, [as_bool(ctx, a), as_bool(ctx, b)])
        return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])

    return lower


for _op, _lop, _dunder in (("bitwise_and", "logical_and", "__and__"), ("bitwise_or", "logical_or", "__or__"),
                           ("bitwise_xor", "logical_xor", "__xor__")):
    for _tgt in (getattr(aten, _op).Tensor, getattr(aten, _op).Scalar, getattr(aten, _dunder).Tensor,
                 getattr(aten, _dunder).Scalar):
        RULES[_tgt] = _bitwise(_op, _lop)


@rule(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, c, a, b):
    dt = ctx.out_type.dtype
    return ctx.emit("where", [as_bool(ctx, c), ctx.tensor(a, dt), ctx.tensor(b, dt)])


@rule(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    dt = ctx.out_type.dtype
    return ctx.emit("where", [as_bool(ctx, mask), ctx.tensor(value, dt), ctx.tensor(x, dt)])


@rule(aten.clamp.default, aten.clamp.Tensor, aten.clip.default)
def _clamp(ctx, x, min=None, max=None):
    dt = ctx.out_type.dtype
    v = ctx.tensor(x, dt)
    if min is not None:
        v = ctx.emit("maximum", [v, ctx.tensor(min, dt)])
    if max is not None:
        v = ctx.emit("minimum", [v, ctx.tensor(max, dt)])
    return v


@rule(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clamp(ctx, x, min_val, max_val)


@rule(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx, x, m):
    return _clamp(ctx, x, min=m)


@rule(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx, x, m):
    return _clamp(ctx, x, max=m)


def composite(fn):
    """A float activation built from several IR ops: `fn(ctx, v, *args)` gets the input in
    its opmath dtype (float32 for 16-bit floats); the result is cast back to the ATen dtype."""

    def lower(ctx: LowerCtx, x, *args, **kwargs):
        return ctx.cast(fn(ctx, ctx.opmath(ctx.val(x)), *args, **kwargs), ctx.out_type.dtype)

    lower.__name__ = fn.__name__
    lower.__doc__ = fn.__doc__
    return lower


def _s(ctx: LowerCtx, value, v):
    """A Python number as a scalar of `v`'s dtype and device."""
    return ctx.scalar(value, v.type.dtype, v.type.device)


@rule(aten.leaky_relu.default)
@composite
def _leaky_relu(ctx, v, slope=0.01):
    pos = ctx.emit("gt", [v, _s(ctx, 0, v)])
    return ctx.emit("where", [pos, v, ctx.emit("mul", [v, _s(ctx, slope, v)])])


def hardsigmoid(ctx: LowerCtx, v):
    y = ctx.emit("add", [ctx.emit("div", [v, _s(ctx, 6.0, v)]), _s(ctx, 0.5, v)])
    return ctx.emit("minimum", [ctx.emit("maximum", [y, _s(ctx, 0.0, v)]), _s(ctx, 1.0, v)])


@rule(aten.hardsigmoid.default)
@composite
def _hardsigmoid(ctx, v):
    return hardsigmoid(ctx, v)


@rule(aten.hardswish.default)
@composite
def _hardswish(ctx, v):
    return ctx.emit("mul", [v, hardsigmoid(ctx, v)])


def softplus(ctx: LowerCtx, v, beta=1, threshold=20):
    bx = ctx.emit("mul", [v, _s(ctx, beta, v)])
    soft = ctx.emit("div", [ctx.emit("log1p", [ctx.emit("exp", [bx])]), _s(ctx, beta, v)])
    return ctx.emit("where", [ctx.emit("gt", [bx, _s(ctx, threshold, v)]), v, soft])


@rule(aten.softplus.default)
@composite
def _softplus(ctx, v, beta=1, threshold=20):
    return softplus(ctx, v, beta, threshold)


@rule(aten.mish.default)
@composite
def _mish(ctx, v):
    return ctx.emit("mul", [v, ctx.emit("tanh", [softplus(ctx, v)])])


def elu(ctx: LowerCtx, v, alpha=1, scale=1, input_scale=1):
    """x * scale where x > 0, else expm1(x * input_scale) * alpha * scale (ATen's coefficients)."""
    neg = ctx.emit("mul", [ctx.emit("expm1", [ctx.emit("mul", [v, _s(ctx, input_scale, v)])]),
                           _s(ctx, float(alpha) * float(scale), v)])
    pos = v if scale == 1 else ctx.emit("mul", [v, _s(ctx, scale, v)])
    return ctx.emit("where", [ctx.emit("gt", [v, _s(ctx, 0, v)]), pos, neg])


@rule(aten.elu.default)
@composite
def _elu(ctx, v, alpha=1, scale=1, input_scale=1):
    return elu(ctx, v, alpha, scale, input_scale)


@rule(aten.celu.default)
@composite
def _celu(ctx, v, alpha=1.0):
    """elu with input_scale 1 / alpha, as ATen defines it."""
    return elu(ctx, v, alpha, 1, 1.0 / float(alpha))


@rule(aten.glu.default)
def _glu(ctx, x, dim=-1):
    """first half * sigmoid(second half) along `dim`, in the opmath dtype."""
    from .lower_shape import slice_value

    v = ctx.opmath(ctx.val(x))
    ax = ctx.axis(dim, v.type.rank)
    h = v.type.shape[ax] // 2
    a, b = slice_value(ctx, v, ax, 0, h), slice_value(ctx, v, ax, h, 2 * h)
    return ctx.cast(ctx.emit("mul", [a, ctx.emit("sigmoid", [b])]), ctx.out_type.dtype)


@rule(aten.frac.default)
def _frac(ctx, x):
    v = ctx.val(x)
    return ctx.emit("sub", [v, ctx.emit("trunc", [v])])


@rule(aten.log10.default)
def _log10(ctx, x):
    """log(x) / ln(10) in the opmath dtype (within 2 ulp of a direct log10)."""
    dt = ctx.out_type.dtype
    v = ctx.tensor(x, opmath_dtype(dt))
    return ctx.cast(ctx.emit("div", [ctx.emit("log", [v]), _s(ctx, math.log(10.0), v)]), dt)


@rule(aten.round.decimals)
def _round_decimals(ctx, x, *, decimals=0):
    """ATen's formula: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for negative d."""
    v = ctx.opmath(ctx.val(x))
    if decimals == 0:
        return ctx.cast(ctx.emit("round", [v]), ctx.out_type.dtype)
    p = _s(ctx, 10.0 ** abs(decimals), v)
    if decimals > 0:
        out = ctx.emit("div", [ctx.emit("round", [ctx.emit("mul", [v, p])]), p])
    else:
        out = ctx.emit("mul", [ctx.emit("round", [ctx.emit("div", [v, p])]), p])
    return ctx.cast(out, ctx.out_type.dtype)


@rule(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, a, b, w):
    """ATen's two-sided formula: start + w * (end - start) for |w| < 0.5, else
    end - (end - start) * (1 - w), so that w == 1 gives `end` exactly."""
    dt = ctx.out_type.dtype
    acc = opmath_dtype(dt)
    x, y, wt = ctx.tensor(a, acc), ctx.tensor(b, acc), ctx.tensor(w, acc)
    d = ctx.emit("sub", [y, x])
    low = ctx.emit("add", [x, ctx.emit("mul", [wt, d])])
    high = ctx.emit("sub", [y, ctx.emit("mul", [d, ctx.emit("sub", [ctx.scalar(1.0, acc), wt])])])
    if isinstance(w, int | float):
        out = low if abs(w) < 0.5 else high
    else:
        small = ctx.emit("lt", [ctx.emit("abs", [wt]), ctx.scalar(0.5, acc)])
        out = ctx.emit("where", [small, low, high])
    return ctx.cast(out, dt)


@rule(aten.addcmul.default)
def _addcmul(ctx, x, a, b, *, value=1):
    """x + value * a * b, in ATen's order, in the opmath dtype."""
    dt = ctx.out_type.dtype
    acc = opmath_dtype(dt)
    p = ctx.tensor(a, acc)
    if value != 1:
        p = ctx.emit("mul", [p, ctx.scalar(value, acc)])
    p = ctx.emit("mul", [p, ctx.tensor(b, acc)])
    return ctx.cast(ctx.emit("add", [ctx.tensor(x, acc), p]), dt)


@rule(aten.addcdiv.default)
def _addcdiv(ctx, x, a, b, *, value=1):
    """x + value * a / b, in ATen's order, in the opmath dtype."""
    dt = ctx.out_type.dtype
    acc = opmath_dtype(dt)
    p = ctx.tensor(a, acc)
    if value != 1:
        p = ctx.emit("mul", [p, ctx.scalar(value, acc)])
    p = ctx.emit("div", [p, ctx.tensor(b, acc)])
    return ctx.cast(ctx.emit("add", [ctx.tensor(x, acc), p]), dt)


# ---------------------------------------------------------------------------- creation
def fill(ctx: LowerCtx, value: Any):
    t = ctx.out_type
    return ctx.expand(ctx.scalar(value, t.dtype, t.device), t.shape)


@rule(aten.full.default, aten.full_like.default)
def _full(ctx, size_or_like, fill_value, **kwargs):
    return fill(ctx, fill_value)


@rule(aten.new_full.default)
def _new_full(ctx, x, size, fill_value, **kwargs):
    return fill(ctx, fill_value)


@rule(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
      aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default)
def _zeros(ctx, *args, **kwargs):
    return fill(ctx, 0)


@rule(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx, *args, **kwargs):
    return fill(ctx, 1)


@rule(aten.scalar_tensor.default)
def _scalar_tensor(ctx, value, **kwargs):
    t = ctx.out_type
    return ctx.scalar(value, t.dtype, t.device)


@rule(aten.fill.Scalar)
def _fill_scalar(ctx, x, value):
    return fill(ctx, value)


@rule(aten.fill.Tensor)
def _fill_tensor(ctx, x, value):
    t = ctx.out_type
    return ctx.expand(ctx.cast(ctx.val(value), t.dtype), t.shape)


@rule(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(ctx, *args, **kwargs):
    nums = [a for a in args]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    t = ctx.out_type
    if not all(isinstance(x, int | float) for x in (start, step)):
        raise UnsupportedError(ctx.describe("arange with tensor bounds"))
    return ctx.emit("iota", (), length=t.shape[0], start=start, step=step, dtype=t.dtype, device=t.device)


# ------------------------------------------------------------------------------ copies
def identity(ctx: LowerCtx, x, *args, **kwargs):
    return ctx.val(x)


for _t in (aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
           aten.lift_fresh_copy.default, aten.lift_fresh.default, aten.resolve_conj.default,
           aten.resolve_neg.default, aten.positive.default):
    RULES[_t] = identity


@rule(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other,
      aten.type_as.default)
def _to(ctx, x, *args, **kwargs):
    t = ctx.out_type
    v = ctx.val(x)
    if v.type.device != t.device:
        return ctx.extern("device copy")
    return ctx.cast(v, t.dtype)


@rule(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    t = ctx.out_type
    return ctx.expand(ctx.cast(ctx.val(src), t.dtype), t.shape)


@rule(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
      aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default,
      aten._assert_async.msg)
def _drop(ctx, *args, **kwargs):
    return None


@rule(aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default)
def _dropout(ctx, x, p, train):
    if not train or p == 0:
        return ctx.val(x)
    return ctx.extern("random")


@rule(aten.native_dropout.default)
def _native_dropout(ctx, x, p, train):
    if train is False or p == 0:  # train=None means training, as in ATen
        v = ctx.val(x)
        return v, fill_like(ctx, v, True)
    return ctx.extern("random")


def fill_like(ctx: LowerCtx, v, value):
    dt = torch.bool if isinstance(value, bool) else v.type.dtype
    return ctx.expand(ctx.scalar(value, dt, v.type.device), v.type.shape)
