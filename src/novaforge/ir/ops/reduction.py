"""Reductions (sum, prod, max, min, argmax, argmin) and the scan (cumsum).

The combining reductions carry their `Reduction`: the binary op that folds two partial results
(sum: add, prod: mul, max: maximum, min: minimum) and the identity an empty reduction returns
(0, 1, the dtype's lowest / highest value). They are the reductions kernels fuse; the fuse
pass and both backends read `OpDef.reduce`, never a list of names. argmax/argmin return
positions and are not combining (they run as single kernels).

Invariant: `axes` are sorted, unique and non-negative; a 0-d input is returned unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..types import TensorType, normalize_axis
from .core import REQUIRED, Reduction, define, extreme

aten = torch.ops.aten
FAMILY = "reduction"


def _norm_axes(axes, rank) -> tuple[int, ...]:
    return tuple(sorted({normalize_axis(x, rank) for x in axes}))


def _reduce_infer(name, out_dtype=None):
    def infer(ts, a):
        (t,) = ts
        axes = a["axes"]
        if axes != _norm_axes(axes, t.rank):
            raise ValueError(f"{name}: axes {axes} must be sorted, unique and non-negative")
        if t.rank == 0:
            shape: tuple[int, ...] = ()
        elif a["keepdim"]:
            shape = tuple(1 if i in axes else s for i, s in enumerate(t.shape))
        else:
            shape = tuple(s for i, s in enumerate(t.shape) if i not in axes)
        return [TensorType(shape, out_dtype or t.dtype, t.device)]

    return infer


def _reduce_impl(fn):
    def impl(xs, a):
        x = xs[0]
        axes = a["axes"]
        if x.dim() == 0:
            return x.clone()
        return fn(x, axes, a["keepdim"])

    return impl


def _amax(x, axes, keepdim):  # torch raises only when a reduced axis is empty
    return torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, axes, keepdim):
    return torch.amin(x, dim=axes, keepdim=keepdim)


def _prod(x, axes, keepdim):
    for ax in sorted(axes, reverse=True):
        x = torch.prod(x, dim=ax, keepdim=keepdim, dtype=x.dtype)
    return x


def _sum(x, axes, keepdim):
    return torch.sum(x, dim=axes, keepdim=keepdim, dtype=x.dtype)


# ---------------------------------------------------------------------- lowering helpers
def reduce_axes(ctx, v, dim) -> tuple[int, ...]:
    """ATen's `dim` argument (None, [], an int or a list) as sorted non-negative axes."""
    r = v.type.rank
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return tuple(range(r))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({ctx.axis(d, r) for d in dim}))


def reduced_size(v, axes: Sequence[int]) -> int:
    return math.prod(v.type.shape[a] for a in axes) if v.type.rank else 1


def reduce(ctx, op: str, v, axes: Sequence[int], keepdim: bool):
    """One reduction node (a 0-d value is its own reduction)."""
    if v.type.rank == 0:
        return v
    return ctx.emit(op, [v], axes=tuple(axes), keepdim=keepdim)


def arg_reduce(ctx, v, axes, keepdim, op):
    if v.type.rank == 0:
        return ctx.scalar(0, torch.int64, v.type.device)
    return ctx.emit(op, [v], axes=tuple(axes), keepdim=keepdim)


# ------------------------------------------------------------------------------ records
REDUCE_ATTRS = {"axes": REQUIRED, "keepdim": False}
sum_ = define("sum", 1, _reduce_infer("sum"), _reduce_impl(_sum), attrs=REDUCE_ATTRS, flags={"reduction"},
              doc="accumulates in float32 for 16-bit floats; the output has the input dtype", family=FAMILY,
              reduce=Reduction("add", lambda dt: 0))


@sum_.lowers(aten.sum.default, aten.sum.dim_IntList)
def _lower_sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    t = ctx.out_type  # the IR sum accumulates 16-bit floats in float32, as ATen does
    v = ctx.cast(ctx.val(x), t.dtype)
    return reduce(ctx, "sum", v, reduce_axes(ctx, v, dim), keepdim)


prod = define("prod", 1, _reduce_infer("prod"), _reduce_impl(_prod), attrs=REDUCE_ATTRS, flags={"reduction"},
              family=FAMILY, reduce=Reduction("mul", lambda dt: 1))


@prod.lowers(aten.prod.default, aten.prod.dim_int)
def _lower_prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    t = ctx.out_type
    v = ctx.cast(ctx.val(x), t.dtype)
    return reduce(ctx, "prod", v, reduce_axes(ctx, v, dim), keepdim)


max_ = define("max", 1, _reduce_infer("max"), _reduce_impl(_amax), attrs=REDUCE_ATTRS, flags={"reduction"},
              family=FAMILY, reduce=Reduction("maximum", lambda dt: extreme(dt, high=False)))
min_ = define("min", 1, _reduce_infer("min"), _reduce_impl(_amin), attrs=REDUCE_ATTRS, flags={"reduction"},
              family=FAMILY, reduce=Reduction("minimum", lambda dt: extreme(dt, high=True)))


@max_.lowers(aten.amax.default)
@min_.lowers(aten.amin.default)
def _lower_amax(ctx, x, dim=(), keepdim=False):
    v = ctx.val(x)
    op = "max" if ctx.target is aten.amax.default else "min"
    return reduce(ctx, op, v, reduce_axes(ctx, v, dim), keepdim)


@max_.lowers(aten.max.default)
@min_.lowers(aten.min.default)
def _lower_max_all(ctx, x):
    v = ctx.val(x)
    op = "max" if ctx.target is aten.max.default else "min"
    return reduce(ctx, op, v, reduce_axes(ctx, v, None), False)


def _arg_infer(name):
    def infer(ts, a):
        (t,) = ts
        if len(a["axes"]) != 1:
            raise ValueError(f"{name}: exactly one axis")
        return _reduce_infer(name, torch.int64)(ts, a)

    return infer


argmax = define("argmax", 1, _arg_infer("argmax"),
                lambda xs, a: torch.argmax(xs[0], dim=a["axes"][0], keepdim=a["keepdim"]),
                attrs=REDUCE_ATTRS, flags={"reduction"}, family=FAMILY)
argmin = define("argmin", 1, _arg_infer("argmin"),
                lambda xs, a: torch.argmin(xs[0], dim=a["axes"][0], keepdim=a["keepdim"]),
                attrs=REDUCE_ATTRS, flags={"reduction"}, family=FAMILY)


@argmax.lowers(aten.argmax.default)
@argmin.lowers(aten.argmin.default)
def _lower_argmax(ctx, x, dim=None, keepdim=False):
    v = ctx.val(x)
    op = "argmax" if ctx.target is aten.argmax.default else "argmin"
    if dim is None:
        flat = ctx.reshape(v, (v.type.numel,))
        out = arg_reduce(ctx, flat, (0,), False, op)
        return ctx.reshape(out, ctx.out_type.shape)
    return arg_reduce(ctx, v, reduce_axes(ctx, v, dim), keepdim, op)


def _cumsum_infer(ts, a):
    normalize_axis(a["axis"], ts[0].rank)
    return [ts[0]]


cumsum = define("cumsum", 1, _cumsum_infer, lambda xs, a: torch.cumsum(xs[0], a["axis"], dtype=xs[0].dtype),
                attrs={"axis": REQUIRED}, flags={"scan"}, family=FAMILY)


@cumsum.lowers(aten.cumsum.default)
def _lower_cumsum(ctx, x, dim, dtype=None):
    t = ctx.out_type
    v = ctx.cast(ctx.val(x), t.dtype)
    return ctx.emit("cumsum", [v], axis=ctx.axis(dim, v.type.rank))


# ---------------------------------------------------------------------------- VJP rules
def _kept(b, n, v):
    """A reduction's output (or its cotangent) as the keepdim shape, broadcastable to the input."""
    x = n.inputs[0]
    if x.type.rank == 0:
        return v
    shape = tuple(1 if i in n.attrs["axes"] else s for i, s in enumerate(x.type.shape))
    return b.reshape(v, shape)


@sum_.defvjp
def _sum_vjp(b, n, cts):
    return [b.expand(_kept(b, n, cts[0]), n.inputs[0].type.shape)]


@prod.defvjp
def _prod_vjp(b, n, cts):  # g * prod / x (inputs without zeros)
    x = n.inputs[0]
    return [b.div(b.mul(_kept(b, n, cts[0]), _kept(b, n, n.outputs[0])), x)]


def _extreme_vjp(b, n, cts):  # the gradient is shared evenly among the extreme elements (as in torch)
    x = n.inputs[0]
    if x.type.rank == 0:
        return [cts[0]]
    hit = b.cast(b.emit("eq", [x, _kept(b, n, n.outputs[0])]), x.type.dtype)
    count = b.sum(hit, n.attrs["axes"], keepdim=True)
    return [b.div(b.mul(_kept(b, n, cts[0]), hit), count)]


max_.defvjp(_extreme_vjp)
min_.defvjp(_extreme_vjp)


@cumsum.defvjp
def _cumsum_vjp(b, n, cts):  # the reversed cumulative sum: total - cumsum(g) + g
    (g,) = cts
    ax = n.attrs["axis"]
    if g.type.rank == 0:
        return [g]
    total = b.sum(g, (ax,), keepdim=True)
    return [b.add(b.sub(total, b.emit("cumsum", [g], axis=ax)), g)]
