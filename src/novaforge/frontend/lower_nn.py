"""Composite lowering rules for reductions, normalizations, softmax, matmul and attention.

The rules of ATen ops that are one IR op (sum, amax, argmax, mm, linear, sdpa, ...) stand
beside that op's record (ir/ops/reduction.py, ir/ops/matmul.py); this file holds the ATen ops
built from several IR ops.

Composite ops (mean, var, softmax, layer/RMS/batch/group norm, logsumexp, cross-entropy) are
decomposed into IR primitives here, so that the fuse pass rebuilds each of them as one kernel
with the same machinery that fuses user-written math. They compute 16-bit floats in float32
(`LowerCtx.opmath`) and cast the results back, as ATen's kernels do. Matmul-like ops become
`matmul` (plus pointwise bias); scaled-dot-product attention becomes one `attention` node.

Reductions over a zero-size axis produce their identity (sum 0, prod 1, any False, all True,
logsumexp -inf) as a fill, since there is nothing to reduce; max/min/argmax over one is an
error in eager too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..ir.ops.matmul import operands
from ..ir.ops.reduction import arg_reduce, reduce, reduce_axes, reduced_size
from ..ir.symbolic import Sym
from .lower_ctx import ARG_CHECKS, LowerCtx, UnsupportedError
from .lower_elementwise import as_bool, fill, rule

__all__ = ["layer_norm", "logsumexp", "mean", "reduce", "reduced_size", "softmax", "variance"]

aten = torch.ops.aten


_axes = reduce_axes


def mean(ctx: LowerCtx, v, axes: Sequence[int], keepdim: bool):
    s = reduce(ctx, "sum", v, axes, keepdim)
    return ctx.emit("div", [s, ctx.scalar(reduced_size(v, axes), v.type.dtype, v.type.device)])


def variance(ctx: LowerCtx, v, axes, keepdim: bool, correction: float = 0.0):
    """(var, mean keepdim=True) by two passes: sum((x - mean)^2) / max(n - correction, 0)."""
    m = mean(ctx, v, axes, True)
    d = ctx.emit("sub", [v, m])
    ss = reduce(ctx, "sum", ctx.emit("mul", [d, d]), axes, keepdim)
    n = reduced_size(v, axes)
    if isinstance(n, Sym) and float(correction) in (0.0, 1.0):  # (n >= 1: n - correction >= 0)
        return ctx.emit("div", [ss, ctx.scalar(n - int(correction), v.type.dtype, v.type.device)]), m
    return ctx.emit("div", [ss, ctx.scalar(max(n - correction, 0), v.type.dtype, v.type.device)]), m


@rule(aten.mean.default, aten.mean.dim)
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    t = ctx.out_type
    v = ctx.opmath(ctx.cast(ctx.val(x), t.dtype))
    return ctx.cast(mean(ctx, v, _axes(ctx, v, dim), keepdim), t.dtype)


@rule(aten.max.dim, aten.min.dim)
def _max_dim(ctx, x, dim, keepdim=False):
    v = ctx.val(x)
    is_max = ctx.target is aten.max.dim
    axes = _axes(ctx, v, dim)
    return (reduce(ctx, "max" if is_max else "min", v, axes, keepdim),
            arg_reduce(ctx, v, axes, keepdim, "argmax" if is_max else "argmin"))


@rule(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any(ctx, x, dim=None, keepdim=False):
    """max / min over bools; the result has ATen's dtype (uint8 for uint8 input)."""
    v = as_bool(ctx, x)
    is_any = ctx.target._overloadpacket is aten.any
    axes = _axes(ctx, v, dim)
    if reduced_size(v, axes) == 0:
        return fill(ctx, not is_any)
    return ctx.cast(reduce(ctx, "max" if is_any else "min", v, axes, keepdim), ctx.out_type.dtype)


@rule(aten.linalg_vector_norm.default)
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """sum(|x|^ord)^(1/ord), with the special orders 0 (count of nonzeros), 1, 2 (sqrt of the
    sum of squares), inf (max |x|) and -inf (min |x|); in the opmath dtype."""
    t = ctx.out_type
    v = ctx.opmath(ctx.cast(ctx.val(x), t.dtype))
    acc, dev = v.type.dtype, v.type.device
    axes = _axes(ctx, v, dim)
    ord = float(ord)
    a = ctx.emit("abs", [v])
    if ord == math.inf or ord == -math.inf:
        out = reduce(ctx, "max" if ord > 0 else "min", a, axes, keepdim)
    elif ord == 0:
        out = reduce(ctx, "sum", ctx.cast(ctx.emit("ne", [v, ctx.scalar(0, acc, dev)]), acc), axes, keepdim)
    elif ord == 1:
        out = reduce(ctx, "sum", a, axes, keepdim)
    elif ord == 2:
        out = ctx.emit("sqrt", [reduce(ctx, "sum", ctx.emit("mul", [v, v]), axes, keepdim)])
    else:
        s = reduce(ctx, "sum", ctx.emit("pow", [a, ctx.scalar(ord, acc, dev)]), axes, keepdim)
        out = ctx.emit("pow", [s, ctx.scalar(1.0 / ord, acc, dev)])
    return ctx.cast(out, t.dtype)


@rule(aten.var.correction, aten.var.dim, aten.var.default, aten.std.correction, aten.std.dim,
      aten.std.default, aten.var_mean.correction, aten.var_mean.dim, aten.std_mean.correction)
def _var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    target = ctx.target
    name = target._overloadpacket.__name__
    if isinstance(dim, bool):  # var.default(x, unbiased)
        unbiased, dim = dim, None
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    t = ctx.out_types
    v = ctx.opmath(ctx.cast(ctx.val(x), t[0].dtype))
    axes = _axes(ctx, v, dim)
    var, m = variance(ctx, v, axes, keepdim, float(correction))
    out = ctx.cast(ctx.emit("sqrt", [var]) if name.startswith("std") else var, t[0].dtype)
    if name.endswith("_mean"):
        return out, ctx.cast(m if keepdim else ctx.reshape(m, out.type.shape), t[1].dtype)
    return out


@rule(aten.logsumexp.default)
def _logsumexp(ctx, x, dim, keepdim=False):
    t = ctx.out_type
    v = ctx.opmath(ctx.cast(ctx.val(x), t.dtype))
    axes = _axes(ctx, v, dim)
    if reduced_size(v, axes) == 0:
        return fill(ctx, float("-inf"))
    return ctx.cast(logsumexp(ctx, v, axes, keepdim), t.dtype)


def logsumexp(ctx: LowerCtx, v, axes, keepdim: bool):
    """max + log(sum(exp(x - max))), with the max replaced by 0 where it is infinite (all -inf
    gives -inf, any +inf gives +inf, as in ATen)."""
    dt, dev = v.type.dtype, v.type.device
    m = reduce(ctx, "max", v, axes, True)
    finite = ctx.emit("isfinite", [m])
    m = ctx.emit("where", [finite, m, ctx.scalar(0.0, dt, dev)])
    s = reduce(ctx, "sum", ctx.emit("exp", [ctx.emit("sub", [v, m])]), axes, True)
    out = ctx.emit("add", [ctx.emit("log", [s]), m])
    return out if keepdim else ctx.reshape(out, tuple(d for i, d in enumerate(v.type.shape) if i not in axes))


def softmax(ctx: LowerCtx, v, axis: int, log: bool = False):
    m = reduce(ctx, "max", v, (axis,), True)
    z = ctx.emit("sub", [v, m])
    e = ctx.emit("exp", [z])
    s = reduce(ctx, "sum", e, (axis,), True)
    if log:
        return ctx.emit("sub", [z, ctx.emit("log", [s])])
    return ctx.emit("div", [e, s])


def _softmax_of(ctx: LowerCtx, x, dim, log: bool):
    t = ctx.out_type
    v = ctx.opmath(ctx.cast(ctx.val(x), t.dtype))
    return ctx.cast(softmax(ctx, v, ctx.axis(dim, max(v.type.rank, 1)), log=log), t.dtype)


@rule(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx, x, dim, half_to_float=False):
    return _softmax_of(ctx, x, dim, ctx.target is aten._log_softmax.default)


@rule(aten.softmax.int, aten.log_softmax.int)
def _softmax_int(ctx, x, dim, dtype=None):
    return _softmax_of(ctx, x, dim, ctx.target is aten.log_softmax.int)


@rule(aten._safe_softmax.default)
def _safe_softmax(ctx, x, dim, dtype=None):
    """Softmax whose fully masked (all -inf) rows give 0 instead of NaN."""
    t = ctx.out_type
    v = ctx.opmath(ctx.cast(ctx.val(x), t.dtype))
    acc = v.type.dtype
    ax = ctx.axis(dim, v.type.rank)
    sm = softmax(ctx, v, ax)
    ninf = ctx.emit("eq", [v, ctx.scalar(float("-inf"), acc)])
    allmasked = reduce(ctx, "min", ninf, (ax,), True)
    return ctx.cast(ctx.emit("where", [allmasked, ctx.scalar(0.0, acc), sm]), t.dtype)


# ------------------------------------------------------------------------------- norms
def _affine(ctx: LowerCtx, y, weight, bias, shape_tail: Sequence[int] | None = None):
    dt = y.type.dtype
    if weight is not None:
        w = ctx.cast(ctx.val(weight), dt)
        if shape_tail is not None:
            w = ctx.reshape(w, shape_tail)
        y = ctx.emit("mul", [y, w])
    if bias is not None:
        b = ctx.cast(ctx.val(bias), dt)
        if shape_tail is not None:
            b = ctx.reshape(b, shape_tail)
        y = ctx.emit("add", [y, b])
    return y


def check_norm_dtypes(ctx: LowerCtx, x, *params) -> None:
    """ATen's CPU layer/group norm rule: parameters of another dtype than the input are allowed
    only for a bfloat16/float16 input with float32 parameters; otherwise eager raises, so do we."""
    v = ctx.val(x)
    if v.type.device != "cpu":
        return
    dts = [ctx.val(p).type.dtype for p in params if p is not None]
    if all(d == v.type.dtype for d in dts):
        return
    if v.type.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError(ctx.describe("mixed dtype (CPU): all inputs must share same datatype."))
    if any(d != torch.float32 for d in dts):
        raise RuntimeError(ctx.describe("mixed dtype (CPU): expect parameter to have scalar type of Float"))


def _layer_norm_check(ctx: LowerCtx, x, shape, weight=None, bias=None, *args, **kwargs) -> None:
    check_norm_dtypes(ctx, x, weight, bias)


def _group_norm_check(ctx: LowerCtx, x, weight=None, bias=None, *args, **kwargs) -> None:
    check_norm_dtypes(ctx, x, weight, bias)


# eager's checks run before any lowering, zero-size inputs included (frontend/lower.py)
ARG_CHECKS[aten.native_layer_norm.default] = _layer_norm_check
ARG_CHECKS[aten.layer_norm.default] = _layer_norm_check
ARG_CHECKS[aten.native_group_norm.default] = _group_norm_check


def layer_norm(ctx: LowerCtx, x, normalized_shape, weight, bias, eps):
    v = ctx.val(x)
    vf = ctx.opmath(v)
    acc = vf.type.dtype
    axes = tuple(range(v.type.rank - len(normalized_shape), v.type.rank))
    var, m = variance(ctx, vf, axes, True)
    rstd = ctx.emit("rsqrt", [ctx.emit("add", [var, ctx.scalar(eps, acc)])])
    y = ctx.emit("mul", [ctx.emit("sub", [vf, m]), rstd])
    return ctx.cast(_affine(ctx, y, weight, bias), v.type.dtype), m, rstd


@rule(aten.native_layer_norm.default)
def _native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    y, m, rstd = layer_norm(ctx, x, normalized_shape, weight, bias, eps)
    t = ctx.out_types
    return y, ctx.cast(m, t[1].dtype), ctx.cast(rstd, t[2].dtype)


@rule(aten.layer_norm.default)
def _layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return layer_norm(ctx, x, normalized_shape, weight, bias, eps)[0]


@rule(aten.rms_norm.default)
def _rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    """ATen's composite: x * rsqrt(mean(x^2) + eps) in float32, cast back, then * weight; the
    default eps is float32's machine epsilon (the opmath type's), also for 16-bit inputs."""
    v = ctx.val(x)
    dt = v.type.dtype
    vf = ctx.opmath(v)
    acc = vf.type.dtype
    if eps is None:
        eps = torch.finfo(acc).eps
    axes = tuple(range(v.type.rank - len(normalized_shape), v.type.rank))
    ms = mean(ctx, ctx.emit("mul", [vf, vf]), axes, True)
    y = ctx.emit("mul", [vf, ctx.emit("rsqrt", [ctx.emit("add", [ms, ctx.scalar(eps, acc)])])])
    out = _affine(ctx, ctx.cast(y, dt), weight, None)
    return ctx.cast(out, ctx.out_type.dtype)


def _bn_shape(v) -> tuple[int, ...]:
    return (v.type.shape[1],) + (1,) * (v.type.rank - 2)


def _stat(ctx: LowerCtx, a, dtype, shape):
    return ctx.reshape(ctx.cast(ctx.val(a), dtype), shape)


def batch_norm(ctx: LowerCtx, x, weight, bias, running_mean, running_var, training: bool, momentum, eps):
    """-> y, save_mean [C], save_rstd [C], new running mean or None, new running var or None.
    Training uses the batch statistics (biased variance to normalize, unbiased for the running
    update); eval uses the running statistics. Math in the opmath dtype."""
    v = ctx.val(x)
    vf = ctx.opmath(v)
    acc = vf.type.dtype
    c = v.type.shape[1]
    shp = _bn_shape(v)
    if not training:
        m = _stat(ctx, running_mean, acc, shp)
        var = _stat(ctx, running_var, acc, shp)
    else:
        axes = tuple(i for i in range(v.type.rank) if i != 1)
        var, m = variance(ctx, vf, axes, True)
    rstd = ctx.emit("rsqrt", [ctx.emit("add", [var, ctx.scalar(eps, acc)])])
    y = _affine(ctx, ctx.emit("mul", [ctx.emit("sub", [vf, m]), rstd]), weight, bias, shp)
    y = ctx.cast(y, v.type.dtype)
    m1, rstd1 = ctx.reshape(m, (c,)), ctx.reshape(rstd, (c,))
    if not training or running_mean is None:
        return y, m1, rstd1, None, None
    n = v.type.numel // max(c, 1)
    unbiased = ctx.emit("mul", [ctx.reshape(var, (c,)), ctx.scalar(n / max(n - 1, 1), acc)])
    new = []
    for old, cur in ((running_mean, m1), (running_var, unbiased)):
        o = ctx.val(old)
        odt = o.type.dtype
        new.append(ctx.emit("add", [ctx.emit("mul", [o, ctx.scalar(1 - momentum, odt)]),
                                    ctx.emit("mul", [ctx.cast(cur, odt), ctx.scalar(momentum, odt)])]))
    return y, m1, rstd1, new[0], new[1]


def _bn_outputs(ctx: LowerCtx, y, m, rstd, new_rm, new_rv, running_mean, running_var):
    """ATen's output tuple: saved statistics are empty in eval mode; the functional variant
    also returns the (updated or unchanged) running statistics."""
    t = ctx.out_types
    saved = [ctx.cast(s, tt.dtype) if tt.shape == s.type.shape else ctx.expand(
        ctx.scalar(0, tt.dtype, tt.device), tt.shape) for s, tt in zip((m, rstd), t[1:3], strict=True)]
    outs = [y, *saved]
    if len(t) == 5:
        outs += [new_rm if new_rm is not None else ctx.val(running_mean),
                 new_rv if new_rv is not None else ctx.val(running_var)]
    return tuple(outs)


@rule(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    y, m, rstd, _, _ = batch_norm(ctx, x, weight, bias, running_mean, running_var, False, momentum, eps)
    return _bn_outputs(ctx, y, m, rstd, None, None, running_mean, running_var)


@rule(aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default)
def _bn(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and running_mean is not None and ctx.target is aten.native_batch_norm.default:
        raise UnsupportedError(ctx.describe(
            "training-mode batch norm updates its running statistics in place; capture must "
            "functionalize it (_native_batch_norm_legit_functional)"))
    outs = batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps)
    return _bn_outputs(ctx, *outs, running_mean, running_var)


@rule(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(ctx, x, weight, bias, training, momentum, eps):
    if not training:
        raise UnsupportedError(ctx.describe("eval-mode batch norm without running statistics"))
    y, m, rstd, _, _ = batch_norm(ctx, x, weight, bias, None, None, True, momentum, eps)
    return _bn_outputs(ctx, y, m, rstd, None, None, None, None)


@rule(aten.native_group_norm.default)
def _group_norm(ctx, x, weight, bias, n, c, hw, group, eps):
    v = ctx.val(x)
    vf = ctx.opmath(v)
    acc = vf.type.dtype
    g = ctx.reshape(vf, (n, group, v.type.numel // max(n * group, 1)))
    var, m = variance(ctx, g, (2,), True)
    rstd = ctx.emit("rsqrt", [ctx.emit("add", [var, ctx.scalar(eps, acc)])])
    y = ctx.reshape(ctx.emit("mul", [ctx.emit("sub", [g, m]), rstd]), v.type.shape)
    y = ctx.cast(_affine(ctx, y, weight, bias, _bn_shape(v)), v.type.dtype)
    t = ctx.out_types
    return y, ctx.cast(ctx.reshape(m, (n, group)), t[1].dtype), ctx.cast(ctx.reshape(rstd, (n, group)), t[2].dtype)


# ------------------------------------------------------------------------------ matmul
@rule(aten.outer.default)
def _outer(ctx, a, b):
    x, y = operands(ctx, a, b)
    return ctx.emit("mul", [ctx.reshape(x, (x.type.shape[0], 1)), ctx.reshape(y, (1, y.type.shape[0]))])


@rule(aten.convolution.default, aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
      aten.conv_transpose2d.input)
def _conv(ctx, *args, **kwargs):
    return ctx.extern("convolution runs in the vendor library")


# ---------------------------------------------------------------------- cross-entropy
@rule(aten.nll_loss_forward.default)
def _nll_loss(ctx, logp, target, weight, reduction, ignore_index):
    if weight is not None:
        return ctx.extern("weighted NLL loss")
    lp = ctx.val(logp)
    tgt = ctx.val(target)
    dt, dev = lp.type.dtype, lp.type.device
    if lp.type.rank == 1:
        lp = ctx.reshape(lp, (1, lp.type.shape[0]))
        tgt = ctx.reshape(tgt, (1,))
    n = lp.type.shape[0]
    valid = ctx.emit("ne", [tgt, ctx.scalar(ignore_index, tgt.type.dtype, dev)])
    safe = ctx.emit("where", [valid, tgt, ctx.scalar(0, tgt.type.dtype, dev)])
    picked = ctx.emit("gather", [lp, ctx.reshape(safe, (n, 1))], axis=1)
    picked = ctx.reshape(picked, (n,))
    validf = ctx.cast(valid, dt)
    losses = ctx.emit("mul", [ctx.emit("neg", [picked]), validf])
    total = reduce(ctx, "sum", validf, (0,), False)
    if reduction == 0:  # ATen's total_weight is 0 without a reduction
        return ctx.reshape(losses, ctx.out_types[0].shape), ctx.scalar(0.0, dt, dev)
    s = reduce(ctx, "sum", losses, (0,), False)
    if reduction == 1:
        s = ctx.emit("div", [s, total])
    return s, total
