"""Indexing ops: take (index_select / embedding), gather, index (advanced indexing), scatter_add.

Invariant: index tensors are int64 or int32 and in range (negative indices are wrapped by
the lowering, as ATen does); every op here has the `index` flag and runs as a single kernel
(backends may generate it as a gather over its output space).
"""

from __future__ import annotations

from typing import Any

import torch

from ..types import TensorType, broadcast_shapes
from .core import REQUIRED, define, same_dtype

aten = torch.ops.aten
FAMILY = "indexing"


def _check_index(name, t):
    if t.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name}: indices must be int64 or int32, got {t}")


def wrap_index(ctx, idx, n: int):
    """Negative indices count from the end, as in ATen."""
    dt = idx.type.dtype
    neg = ctx.emit("lt", [idx, ctx.scalar(0, dt, idx.type.device)])
    return ctx.emit("where", [neg, ctx.emit("add", [idx, ctx.scalar(n, dt, idx.type.device)]), idx])


def _take_infer(ts, a):
    x, idx = ts
    _check_index("take", idx)
    ax = a["axis"]
    return [TensorType(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype, x.device)]


def _take_impl(xs, a):
    x, idx = xs
    ax = a["axis"]
    out = torch.index_select(x, ax, idx.reshape(-1))
    return out.reshape(x.shape[:ax] + idx.shape + x.shape[ax + 1:])


take = define("take", 2, _take_infer, _take_impl, attrs={"axis": REQUIRED}, flags={"index"}, flops=0,
              doc="x.index_select(axis, idx) with idx of any shape (embedding is take on axis 0); "
                  "indices are in range [0, x.shape[axis])", family=FAMILY)


@take.lowers(aten.embedding.default)
def _lower_embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ctx.emit("take", [ctx.val(weight), ctx.val(indices)], axis=0)


@take.lowers(aten.index_select.default)
def _lower_index_select(ctx, x, dim, index):
    v = ctx.val(x)
    if v.type.rank == 0:  # a 0-d input takes its only element (index shape [1]) and stays 0-d
        return ctx.reshape(ctx.emit("take", [ctx.reshape(v, (1,)), ctx.val(index)], axis=0), ())
    return ctx.emit("take", [v, ctx.val(index)], axis=ctx.axis(dim, v.type.rank))


def _gather_infer(ts, a):
    x, idx = ts
    _check_index("gather", idx)
    if idx.rank != x.rank:
        raise ValueError("gather: index rank must equal input rank")
    return [TensorType(idx.shape, x.dtype, x.device)]


gather = define("gather", 2, _gather_infer, lambda xs, a: torch.gather(xs[0], a["axis"], xs[1]),
                attrs={"axis": REQUIRED}, flags={"index"}, flops=0, doc="torch.gather", family=FAMILY)


@gather.lowers(aten.gather.default)
def _lower_gather(ctx, x, dim, index, sparse_grad=False):
    v = ctx.val(x)
    return ctx.emit("gather", [v, ctx.val(index)], axis=ctx.axis(dim, v.type.rank))


def _index_infer(ts, a):
    x, *idx = ts
    for t in idx:
        _check_index("index", t)
    axes = a["axes"]
    if len(axes) != len(idx) or list(axes) != sorted(set(axes)):
        raise ValueError("index: one sorted axis per index tensor")
    bshape = broadcast_shapes(*(t.shape for t in idx))
    rest = [s for i, s in enumerate(x.shape) if i not in axes]
    adjacent = list(axes) == list(range(axes[0], axes[0] + len(axes)))
    if adjacent:
        first = axes[0]
        shape = tuple(x.shape[:first]) + bshape + tuple(x.shape[axes[-1] + 1:])
    else:
        shape = bshape + tuple(rest)
    return [TensorType(shape, x.dtype, x.device)]


def _index_impl(xs, a):
    x, *idx = xs
    key: list[Any] = [slice(None)] * x.dim()
    for ax, t in zip(a["axes"], idx, strict=True):
        key[ax] = t
    return x[tuple(key)]


index = define("index", (2, None), _index_infer, _index_impl, attrs={"axes": REQUIRED}, flags={"index"}, flops=0,
               doc="advanced indexing x[..., i0, ..., i1, ...] with index tensors on `axes` (numpy placement rules)",
               family=FAMILY)


@index.lowers(aten.index.Tensor)
def _lower_index(ctx, x, indices):
    v = ctx.val(x)
    axes, idx = [], []
    for ax, a in enumerate(indices):
        if a is None:
            continue
        iv = ctx.val(a)
        if iv.type.dtype in (torch.bool, torch.uint8):
            raise ctx.unsupported("boolean-mask indexing has a data-dependent shape", data_dependent=True)
        axes.append(ax)
        idx.append(wrap_index(ctx, iv, v.type.shape[ax]))
    if len(idx) == 1:
        return ctx.emit("take", [v, idx[0]], axis=axes[0])
    flat = _flat_take(ctx, v, axes, idx)
    if flat is not None:
        return flat
    return ctx.emit("index", [v, *idx], axes=tuple(axes))


def _flat_take(ctx, v, axes: list[int], idx: list):
    """x[..., i0, i1, ...] on adjacent axes of static sizes as one `take` over those axes merged:
    the flat index sum_j i_j * stride_j (i_j already wrapped), or the merged extent (out of range:
    take raises, as eager does) where any i_j is outside [0, size_j). None where it does not apply
    (axes not adjacent, a symbolic size, an extent past int64)."""
    shape = v.type.shape
    sizes = [shape[a] for a in axes]
    if axes != list(range(axes[0], axes[0] + len(axes))) or not all(isinstance(n, int) for n in sizes):
        return None
    total = 1
    for n in sizes:
        total *= n
    if total >= 2**62:
        return None
    dt, dev = torch.int64, idx[0].type.device
    idx = [ctx.cast(i, dt) for i in idx]  # (an int32 index times a stride could overflow)
    flat = valid = None
    stride = total
    for i, n in zip(idx, sizes, strict=True):
        stride //= n
        term = i if stride == 1 else ctx.emit("mul", [i, ctx.scalar(stride, dt, dev)])
        flat = term if flat is None else ctx.emit("add", [flat, term])
        ok = ctx.emit("logical_and", [ctx.emit("ge", [i, ctx.scalar(0, dt, dev)]),
                                      ctx.emit("lt", [i, ctx.scalar(n, dt, dev)])])
        valid = ok if valid is None else ctx.emit("logical_and", [valid, ok])
    flat = ctx.emit("where", [valid, flat, ctx.scalar(total, dt, dev)])
    merged = ctx.reshape(v, tuple(shape[:axes[0]]) + (total,) + tuple(shape[axes[-1] + 1:]))
    return ctx.emit("take", [merged, flat], axis=axes[0])


def _scatter_add_infer(ts, a):
    x, idx, src = ts
    _check_index("scatter_add", idx)
    same_dtype("scatter_add", [x, src])
    ax = a["axis"]
    if not (idx.rank == x.rank == src.rank) or any(
            not (idx.shape[d] <= src.shape[d] and (d == ax or idx.shape[d] <= x.shape[d])) for d in range(idx.rank)):
        raise ValueError(f"scatter_add: index {idx} must fit in src {src} and, off axis {ax}, in {x}")
    return [x]


scatter_add = define("scatter_add", 3, _scatter_add_infer,
                     lambda xs, a: torch.scatter_add(xs[0], a["axis"], xs[1], xs[2]), attrs={"axis": REQUIRED},
                     flags={"index"}, doc="torch.scatter_add", family=FAMILY)


@scatter_add.lowers(aten.scatter_add.default)
def _lower_scatter_add(ctx, x, dim, index, src):
    v = ctx.val(x)
    return ctx.emit("scatter_add", [v, ctx.val(index), ctx.cast(ctx.val(src), v.type.dtype)],
                    axis=ctx.axis(dim, v.type.rank))


@scatter_add.lowers(aten.index_put.default, aten._unsafe_index_put.default)
def _lower_index_put(ctx, x, indices, values, accumulate=False):
    return _index_put_rows(ctx, x, indices, values, None, accumulate)


@scatter_add.lowers(aten._unsafe_masked_index_put_accumulate.default)
def _lower_masked_index_put(ctx, x, mask, indices, values):
    return _index_put_rows(ctx, x, indices, values, mask, True)


def _index_put_rows(ctx, x, indices, values, mask, accumulate):
    """`x.index_put((i,), values, accumulate=True)`, one integer index on the first axis (the
    embedding gradient: rows of values added at their token ids) as a scatter_add over the
    flattened index; with `mask` (`_unsafe_masked_index_put_accumulate`), masked-out values add
    zero at a clamped index, as ATen's decomposition does. Any other index_put stays an ATen
    call, which raises where eager raises (mismatched dtypes, unbroadcastable values)."""
    v = ctx.val(x)
    if not accumulate or len(indices) != 1 or indices[0] is None or v.type.rank == 0:
        return ctx.extern("index_put other than accumulating rows at one index tensor")
    iv, vals = ctx.val(indices[0]), ctx.val(values)
    row = v.type.shape[1:]
    try:
        fits = broadcast_shapes(vals.type.shape, iv.type.shape + row) == iv.type.shape + row
    except (ValueError, RuntimeError, TypeError):
        fits = False
    if iv.type.dtype not in (torch.int64, torch.int32) or vals.type.dtype != v.type.dtype or not fits:
        return ctx.extern("index_put with a mask index, mixed dtypes or values of another shape")
    rows, dt, dev, full = v.type.shape[0], iv.type.dtype, iv.type.device, iv.type.shape + row
    vals = ctx.expand(ctx.reshape(vals, (1,) * (len(full) - vals.type.rank) + vals.type.shape), full)
    if mask is not None:  # values.masked_fill(~mask, 0): the mask broadcasts against the values
        m = ctx.val(mask)
        if m.type.rank > len(full) or broadcast_shapes(m.type.shape, full) != full:
            return ctx.extern("a mask of another shape")
        m = ctx.expand(ctx.reshape(m, (1,) * (len(full) - m.type.rank) + m.type.shape), full)
        vals = ctx.emit("where", [m, vals, ctx.scalar(0, v.type.dtype, v.type.device)])
        iv = ctx.emit("minimum", [ctx.emit("maximum", [iv, ctx.scalar(-rows, dt, dev)]), ctx.scalar(rows - 1, dt, dev)])
    n = iv.type.numel
    idx = ctx.reshape(wrap_index(ctx, iv, rows), (n,) + (1,) * len(row))
    flat = (n,) + row
    return ctx.emit("scatter_add", [v, ctx.expand(idx, flat), ctx.reshape(vals, flat)], axis=0)


@scatter_add.lowers(aten.scatter.value)
def _lower_scatter_value(ctx, x, dim, index, value):
    """x.scatter(dim, index, value) with one scalar value: every position an index hits gets the
    value, so duplicates do not matter and it is where(hit, value, x). With one index per row
    (NLL's gradient: the target of each row) the hits are a pointwise `one_hot`; otherwise they
    are counted by a scatter_add of ones (which checks the indices: out of range raises)."""
    v, iv = ctx.val(x), ctx.val(index)
    ax = ctx.axis(dim, max(v.type.rank, 1))
    if v.type.rank == 0 or iv.type.rank != v.type.rank or iv.type.dtype != torch.int64:
        return ctx.extern("scatter of a 0-d tensor or with an index of another rank or dtype")
    fill = ctx.expand(ctx.scalar(value, v.type.dtype, v.type.device), v.type.shape)
    if iv.type.shape[ax] == 1 and all(iv.type.shape[d] == v.type.shape[d] for d in range(v.type.rank) if d != ax):
        return ctx.emit("where", [one_hot(ctx, iv, ax, v.type.shape), fill, v])
    ones = ctx.expand(ctx.scalar(1.0, torch.float32, iv.type.device), iv.type.shape)
    zeros = ctx.expand(ctx.scalar(0.0, torch.float32, v.type.device), v.type.shape)
    hits = ctx.emit("scatter_add", [zeros, iv, ones], axis=ax)
    hit = ctx.emit("gt", [hits, ctx.scalar(0.0, torch.float32, v.type.device)])
    return ctx.emit("where", [hit, fill, v])


def one_hot(ctx, iv, ax: int, shape: tuple):
    """The bool mask `iota(shape[ax]) == iv` along `ax`, for an index with one position per row
    (`iv.shape[ax] == 1`, other dims as in `shape`): pointwise, no buffer of `shape`. The indices
    pass through a take from `iota(n)` first, which checks them (out of range raises, as the
    scatter it replaces does) and returns them unchanged; the iota is materialized (`copy`: n
    integers) because a take reads its source from a buffer."""
    n, dev, rank = shape[ax], iv.type.device, len(shape)
    positions = ctx.emit("copy", [ctx.emit("iota", (), length=n, dtype=torch.int64, device=dev)])  # a buffer
    checked = ctx.reshape(ctx.emit("take", [positions, ctx.reshape(iv, (iv.type.numel,))], axis=0), iv.type.shape)
    pos = ctx.reshape(ctx.emit("iota", (), length=n, dtype=torch.int64, device=dev),
                      (1,) * ax + (n,) + (1,) * (rank - ax - 1))
    return ctx.emit("eq", [ctx.expand(checked, shape), ctx.expand(pos, shape)])


# ---------------------------------------------------------------------------- VJP rules
@take.defvjp
def _take_vjp(b, n, cts):  # scatter-add the cotangent rows back to the positions they were taken from
    x, idx = n.inputs
    ax = n.attrs["axis"]
    k = idx.type.numel
    flat = x.type.shape[:ax] + (k,) + x.type.shape[ax + 1:]
    g = b.reshape(cts[0], flat)
    where = b.expand(b.reshape(idx, (1,) * ax + (k,) + (1,) * (x.type.rank - ax - 1)), flat)
    return [b.emit("scatter_add", [b.zeros(x.type), where, g], axis=ax), None]


@gather.defvjp
def _gather_vjp(b, n, cts):
    x, idx = n.inputs
    return [b.emit("scatter_add", [b.zeros(x.type), idx, cts[0]], axis=n.attrs["axis"]), None]


@scatter_add.defvjp
def _scatter_add_vjp(b, n, cts):
    (g,) = cts
    idx = n.inputs[1]
    return [g, None, b.emit("gather", [g, idx], axis=n.attrs["axis"])]
