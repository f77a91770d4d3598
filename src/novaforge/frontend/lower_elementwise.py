"""Composite lowering rules for elementwise ATen ops, tensor creation and copies.

The rules of ATen ops that are one IR op (exp, add, eq, where, cast, ...) stand beside that
op's record in ir/ops/elementwise.py; this file holds the ATen ops built from several IR ops
(clamp, the composite activations, lerp, division modes, fills, copies, dropout at p=0).

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

from ..ir.ops import random
from ..ir.ops.elementwise import UNARY_ANY, UNARY_FLOAT, as_bool, lower_div, lower_floordiv
from ..ir.types import is_float
from .lower_ctx import LowerCtx, opmath_dtype

aten = torch.ops.aten
RULES: dict[Any, Any] = {}
UNARY_TARGETS = {name: name for name in (*UNARY_FLOAT, *UNARY_ANY)}  # ATen op -> IR op (rules in ir/ops)
__all__ = ["RULES", "UNARY_TARGETS", "as_bool", "composite", "fill", "fill_like", "rule"]


def rule(*targets):
    def deco(fn):
        for t in targets:
            RULES[t] = fn
        return fn

    return deco


@rule(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return lower_div(ctx, a, b)
    if rounding_mode == "floor":
        return lower_floordiv(ctx, a, b)
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
    from ..ir.ops.shape import slice_value

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


@rule(aten.fill.Scalar)
def _fill_scalar(ctx, x, value):
    return fill(ctx, value)


@rule(aten.fill.Tensor)
def _fill_tensor(ctx, x, value):
    t = ctx.out_type
    return ctx.expand(ctx.cast(ctx.val(value), t.dtype), t.shape)


# ------------------------------------------------------------------------------ copies
def identity(ctx: LowerCtx, x, *args, **kwargs):
    return ctx.val(x)


for _t in (aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
           aten.lift_fresh_copy.default, aten.lift_fresh.default, aten.resolve_conj.default,
           aten.resolve_neg.default, aten.positive.default):
    RULES[_t] = identity


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
    if ctx.target is aten.dropout.default and random.counter_mode():
        return random.dropout(ctx, x, p)[0]
    return ctx.extern("random")


@rule(aten.native_dropout.default)
def _native_dropout(ctx, x, p, train):
    if train is False or p == 0:  # train=None means training, as in ATen
        v = ctx.val(x)
        return v, fill_like(ctx, v, True)
    if random.counter_mode():
        return random.dropout(ctx, x, p)
    return ctx.extern("random")


def fill_like(ctx: LowerCtx, v, value):
    dt = torch.bool if isinstance(value, bool) else v.type.dtype
    return ctx.expand(ctx.scalar(value, dt, v.type.device), v.type.shape)
