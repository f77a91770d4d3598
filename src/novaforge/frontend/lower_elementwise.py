"""Lowering rules for elementwise ATen ops, tensor creation and copies.

Dtype rule: binary IR ops take operands of one dtype. Arithmetic computes in the ATen result
dtype (from the FX node's fake value); comparisons compute in the promoted operand dtype
(`torch.result_type`) and return bool. Python scalars become 0-d `scalar` values of the compute
dtype. Fills are `expand`s of a scalar, so they cost no memory.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir.types import is_float
from .lower import LowerCtx, UnsupportedError

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
        x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
        if alpha != 1:
            y = ctx.emit("mul", [y, ctx.scalar(alpha, dt)])
        return ctx.emit(op, [x, y])

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
    return _binary("sub")(ctx, b, a, alpha=1) if alpha == 1 else _binary("sub")(
        ctx, b, _scaled(ctx, a, alpha))


def _scaled(ctx, a, alpha):
    dt = ctx.out_type.dtype
    return ctx.emit("mul", [ctx.tensor(a, dt), ctx.scalar(alpha, dt)])


@rule(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def _div(ctx, a, b):
    dt = ctx.out_type.dtype
    return ctx.emit("div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


@rule(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    dt = ctx.out_type.dtype
    if rounding_mode is None:
        return _div(ctx, a, b)
    x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
    if is_float(dt):
        q = ctx.emit("div", [x, y])
        return ctx.emit("floor" if rounding_mode == "floor" else "trunc", [q])
    if rounding_mode == "floor":
        return ctx.emit("floor_divide", [x, y])
    return ctx.extern("integer division with truncation")


@rule(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floordiv(ctx, a, b):
    dt = ctx.out_type.dtype
    x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
    return ctx.emit("floor", [ctx.emit("div", [x, y])]) if is_float(dt) else ctx.emit("floor_divide", [x, y])


def _compare(op: str):
    def lower(ctx: LowerCtx, a, b):
        dt = _promote(ctx, a, b)
        return ctx.emit(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])

    return lower


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        RULES[getattr(getattr(aten, _op), _ov)] = _compare(_op)


def _unary(op: str):
    def lower(ctx: LowerCtx, x, *args, **kwargs):
        dt = ctx.out_type.dtype
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
    name = ctx.fx_node.target._overloadpacket.__name__
    return ctx.emit(name, [ctx.val(x)])


def _as_bool(ctx: LowerCtx, a: Any):
    if isinstance(a, bool | int | float):
        return ctx.scalar(bool(a), torch.bool)
    v = ctx.val(a)
    if v.type.dtype == torch.bool:
        return v
    return ctx.emit("ne", [v, ctx.scalar(0, v.type.dtype, v.type.device)])


@rule(aten.logical_not.default)
def _lnot(ctx, x):
    return ctx.emit("logical_not", [_as_bool(ctx, x)])


def _logical(op: str):
    def lower(ctx, a, b):
        return ctx.emit(op, [_as_bool(ctx, a), _as_bool(ctx, b)])

    return lower


for _op in ("logical_and", "logical_or", "logical_xor"):
    RULES[getattr(aten, _op).default] = _logical(_op)


def _bitwise(op: str, logical: str):
    def lower(ctx, a, b):
        dt = ctx.out_type.dtype
        if dt == torch.bool:
            return ctx.emit(logical, [_as_bool(ctx, a), _as_bool(ctx, b)])
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
    return ctx.emit("where", [_as_bool(ctx, c), ctx.tensor(a, dt), ctx.tensor(b, dt)])


@rule(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    dt = ctx.out_type.dtype
    return ctx.emit("where", [_as_bool(ctx, mask), ctx.tensor(value, dt), ctx.tensor(x, dt)])


@rule(aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.hardtanh.default)
def _clamp(ctx, x, min=None, max=None):
    dt = ctx.out_type.dtype
    v = ctx.tensor(x, dt)
    if min is not None:
        v = ctx.emit("maximum", [v, ctx.tensor(min, dt)])
    if max is not None:
        v = ctx.emit("minimum", [v, ctx.tensor(max, dt)])
    return v


@rule(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx, x, m):
    return _clamp(ctx, x, min=m)


@rule(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx, x, m):
    return _clamp(ctx, x, max=m)


@rule(aten.leaky_relu.default)
def _leaky_relu(ctx, x, slope=0.01):
    v = ctx.val(x)
    dt = v.type.dtype
    pos = ctx.emit("gt", [v, ctx.scalar(0, dt)])
    return ctx.emit("where", [pos, v, ctx.emit("mul", [v, ctx.scalar(slope, dt)])])


@rule(aten.hardsigmoid.default)
def _hardsigmoid(ctx, x):
    v = ctx.val(x)
    dt = v.type.dtype
    y = ctx.emit("add", [ctx.emit("div", [v, ctx.scalar(6.0, dt)]), ctx.scalar(0.5, dt)])
    return ctx.emit("minimum", [ctx.emit("maximum", [y, ctx.scalar(0.0, dt)]), ctx.scalar(1.0, dt)])


@rule(aten.hardswish.default)
def _hardswish(ctx, x):
    return ctx.emit("mul", [ctx.val(x), _hardsigmoid(ctx, x)])


@rule(aten.softplus.default)
def _softplus(ctx, x, beta=1, threshold=20):
    v = ctx.val(x)
    dt = v.type.dtype
    bx = ctx.emit("mul", [v, ctx.scalar(beta, dt)])
    soft = ctx.emit("div", [ctx.emit("log1p", [ctx.emit("exp", [bx])]), ctx.scalar(beta, dt)])
    return ctx.emit("where", [ctx.emit("gt", [bx, ctx.scalar(threshold, dt)]), v, soft])


@rule(aten.mish.default)
def _mish(ctx, x):
    return ctx.emit("mul", [ctx.val(x), ctx.emit("tanh", [_softplus(ctx, x)])])


@rule(aten.elu.default)
def _elu(ctx, x, alpha=1, scale=1, input_scale=1):
    v = ctx.val(x)
    dt = v.type.dtype
    neg = ctx.emit("mul", [ctx.emit("expm1", [ctx.emit("mul", [v, ctx.scalar(input_scale, dt)])]),
                           ctx.scalar(alpha, dt)])
    y = ctx.emit("where", [ctx.emit("gt", [v, ctx.scalar(0, dt)]), v, neg])
    return y if scale == 1 else ctx.emit("mul", [y, ctx.scalar(scale, dt)])


@rule(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, a, b, w):
    dt = ctx.out_type.dtype
    x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
    return ctx.emit("add", [x, ctx.emit("mul", [ctx.tensor(w, dt), ctx.emit("sub", [y, x])])])


@rule(aten.addcmul.default)
def _addcmul(ctx, x, a, b, *, value=1):
    dt = ctx.out_type.dtype
    p = ctx.emit("mul", [ctx.tensor(a, dt), ctx.tensor(b, dt)])
    if value != 1:
        p = ctx.emit("mul", [p, ctx.scalar(value, dt)])
    return ctx.emit("add", [ctx.tensor(x, dt), p])


@rule(aten.addcdiv.default)
def _addcdiv(ctx, x, a, b, *, value=1):
    dt = ctx.out_type.dtype
    p = ctx.emit("div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])
    if value != 1:
        p = ctx.emit("mul", [p, ctx.scalar(value, dt)])
    return ctx.emit("add", [ctx.tensor(x, dt), p])


# ---------------------------------------------------------------------------- creation
def fill(ctx: LowerCtx, value: Any):
    t = ctx.out_type
    return ctx.expand(ctx.scalar(value, t.dtype, t.device), t.shape)


@rule(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(ctx, *args, **kwargs):
    value = args[1] if len(args) > 1 else kwargs["fill_value"]
    return fill(ctx, value)


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
    if not train or p == 0:
        v = ctx.val(x)
        return v, fill_like(ctx, v, True)
    return ctx.extern("random")


def fill_like(ctx: LowerCtx, v, value):
    dt = torch.bool if isinstance(value, bool) else v.type.dtype
    return ctx.expand(ctx.scalar(value, dt, v.type.device), v.type.shape)
