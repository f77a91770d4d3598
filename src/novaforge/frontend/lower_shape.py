"""Lowering rules for views, data movement and indexing.

Every view becomes one of the four IR views (reshape, permute, expand, slice) with normalized
attributes; the ATen output shape from the FX node's fake value is the authority for shapes
with -1 or omitted dimensions. Slices are normalized to 0 <= start <= stop <= length.
"""

from __future__ import annotations

import torch

from .lower import LowerCtx, UnsupportedError
from .lower_elementwise import rule

aten = torch.ops.aten


def _to_out_shape(ctx: LowerCtx, x, *args, **kwargs):
    return ctx.reshape(ctx.val(x), ctx.out_type.shape)


for _t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
           aten.unflatten.int, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
           aten.unsqueeze.default, aten.view_as.default, aten.reshape_as.default):
    rule(_t)(_to_out_shape)


@rule(aten.permute.default)
def _permute(ctx, x, dims):
    v = ctx.val(x)
    return ctx.permute(v, [ctx.axis(d, v.type.rank) for d in dims])


@rule(aten.transpose.int, aten.swapaxes.default)
def _transpose(ctx, x, d0, d1):
    v = ctx.val(x)
    r = v.type.rank
    if r < 2:
        return v
    perm = list(range(r))
    a, b = ctx.axis(d0, r), ctx.axis(d1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.permute(v, perm)


@rule(aten.t.default, aten.numpy_T.default)
def _t(ctx, x):
    v = ctx.val(x)
    return ctx.permute(v, list(range(v.type.rank))[::-1])


@rule(aten.movedim.int)
def _movedim(ctx, x, src, dst):
    v = ctx.val(x)
    r = v.type.rank
    perm = [i for i in range(r) if i != ctx.axis(src, r)]
    perm.insert(ctx.axis(dst, r), ctx.axis(src, r))
    return ctx.permute(v, perm)


@rule(aten.diagonal.default)
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    """The diagonal as a strided view: move dim1, dim2 last, flatten them, and slice with step
    n2 + 1 from the first diagonal element."""
    v = ctx.val(x)
    r = v.type.rank
    a, b = ctx.axis(dim1, r), ctx.axis(dim2, r)
    rest = [i for i in range(r) if i not in (a, b)]
    v = ctx.permute(v, rest + [a, b])
    n1, n2 = v.type.shape[-2], v.type.shape[-1]
    length = ctx.out_type.shape[-1]
    start = offset if offset >= 0 else -offset * n2
    flat = ctx.reshape(v, v.type.shape[:-2] + (n1 * n2,))
    out = slice_value(ctx, flat, flat.type.rank - 1, start, start + (length - 1) * (n2 + 1) + 1, n2 + 1)
    return ctx.reshape(out, ctx.out_type.shape)


@rule(aten.flip.default)
def _flip(ctx, x, dims):
    """Each flipped axis gathers with the reversed index n-1, ..., 0."""
    v = ctx.val(x)
    for d in sorted({ctx.axis(d, v.type.rank) for d in dims}):
        n = v.type.shape[d]
        if n > 1:
            rev = ctx.emit("iota", (), length=n, start=n - 1, step=-1, dtype=torch.int64, device=v.type.device)
            v = ctx.emit("take", [v, rev], axis=d)
    return v


@rule(aten.expand.default, aten.expand_as.default, aten.broadcast_to.default)
def _expand(ctx, x, *args, **kwargs):
    return ctx.expand(ctx.val(x), ctx.out_type.shape)


def slice_value(ctx: LowerCtx, v, axis: int, start: int | None, end: int | None, step: int = 1):
    n = v.type.shape[axis]
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    if step < 1:
        raise UnsupportedError(ctx.describe(f"slice step {step} must be positive"))
    if start == 0 and end == n and step == 1:
        return v
    return ctx.emit("slice", [v], axis=axis, start=start, stop=end, step=int(step))


@rule(aten.slice.Tensor)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    v = ctx.val(x)
    return slice_value(ctx, v, ctx.axis(dim, v.type.rank), start, end, step)


@rule(aten.narrow.default)
def _narrow(ctx, x, dim, start, length):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    if start < 0:
        start += v.type.shape[ax]
    return slice_value(ctx, v, ax, start, start + length)


def select_value(ctx: LowerCtx, v, axis: int, index: int):
    n = v.type.shape[axis]
    if index < 0:
        index += n
    s = slice_value(ctx, v, axis, index, index + 1)
    shape = v.type.shape[:axis] + v.type.shape[axis + 1:]
    return ctx.reshape(s, shape)


@rule(aten.select.int)
def _select(ctx, x, dim, index):
    v = ctx.val(x)
    return select_value(ctx, v, ctx.axis(dim, v.type.rank), index)


def _split_sizes(ctx: LowerCtx, v, axis: int, sizes: list[int]):
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_value(ctx, v, axis, start, start + s))
        start += s
    return tuple(outs)


@rule(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.tensor_split.sections,
      aten.unsafe_split.Tensor)
def _split(ctx, x, *args, **kwargs):
    v = ctx.val(x)
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ax = ctx.axis(dim, v.type.rank)
    sizes = [t.shape[ax] for t in ctx.out_types]
    return _split_sizes(ctx, v, ax, sizes)


@rule(aten.unbind.int)
def _unbind(ctx, x, dim=0):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    return tuple(select_value(ctx, v, ax, i) for i in range(v.type.shape[ax]))


@rule(aten.cat.default, aten.concat.default, aten.concatenate.default)
def _cat(ctx, tensors, dim=0):
    t = ctx.out_type
    vals = [ctx.cast(ctx.val(a), t.dtype) for a in tensors]
    vals = [v for v in vals if not (v.type.rank == 1 and v.type.shape[0] == 0 and t.rank != 1)]
    ax = ctx.axis(dim, t.rank)
    vals = [v for v in vals if v.type.shape[ax] > 0] or vals[:1]
    if len(vals) == 1:
        return ctx.reshape(vals[0], t.shape)
    return ctx.emit("cat", vals, axis=ax)


@rule(aten.stack.default)
def _stack(ctx, tensors, dim=0):
    t = ctx.out_type
    ax = ctx.axis(dim, t.rank)
    vals = []
    for a in tensors:
        v = ctx.cast(ctx.val(a), t.dtype)
        vals.append(ctx.reshape(v, v.type.shape[:ax] + (1,) + v.type.shape[ax:]))
    return vals[0] if len(vals) == 1 else ctx.emit("cat", vals, axis=ax)


@rule(aten.constant_pad_nd.default)
def _constant_pad(ctx, x, pad, value=0):
    v = ctx.val(x)
    r = v.type.rank
    pairs = [(0, 0)] * r
    for i in range(len(pad) // 2):
        pairs[r - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if all(p == (0, 0) for p in pairs):
        return v
    return ctx.emit("pad", [v], pads=tuple(pairs), value=float(value))


@rule(aten.pad.default)
def _pad(ctx, x, pad, mode="constant", value=None):
    if mode != "constant":
        return ctx.extern(f"{mode} padding")
    return _constant_pad(ctx, x, pad, 0 if value is None else value)


@rule(aten.repeat.default)
def _repeat(ctx, x, repeats):
    v = ctx.val(x)
    reps = list(repeats)
    shape = (1,) * (len(reps) - v.type.rank) + v.type.shape
    v = ctx.reshape(v, shape)
    inter, expanded = [], []
    for r, s in zip(reps, shape, strict=True):
        inter += [1, s]
        expanded += [r, s]
    v = ctx.reshape(v, inter)
    v = ctx.expand(v, expanded)
    return ctx.reshape(v, ctx.out_type.shape)


def _tri(ctx: LowerCtx, x, diagonal: int, lower: bool):
    v = ctx.val(x)
    rows, cols = v.type.shape[-2], v.type.shape[-1]
    dev = v.type.device
    r = ctx.reshape(ctx.emit("iota", (), length=rows, dtype=torch.int64, device=dev), (rows, 1))
    c = ctx.reshape(ctx.emit("iota", (), length=cols, dtype=torch.int64, device=dev), (1, cols))
    d = ctx.emit("sub", [c, r])
    keep = ctx.emit("le" if lower else "ge", [d, ctx.scalar(diagonal, torch.int64, dev)])
    zero = ctx.scalar(0, v.type.dtype, dev)
    return ctx.emit("where", [keep, v, zero])


@rule(aten.tril.default)
def _tril(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, True)


@rule(aten.triu.default)
def _triu(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, False)


# ---------------------------------------------------------------------------- indexing
def wrap_index(ctx: LowerCtx, idx, n: int):
    """Negative indices count from the end, as in ATen."""
    dt = idx.type.dtype
    neg = ctx.emit("lt", [idx, ctx.scalar(0, dt, idx.type.device)])
    return ctx.emit("where", [neg, ctx.emit("add", [idx, ctx.scalar(n, dt, idx.type.device)]), idx])


@rule(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ctx.emit("take", [ctx.val(weight), ctx.val(indices)], axis=0)


@rule(aten.index_select.default)
def _index_select(ctx, x, dim, index):
    v = ctx.val(x)
    if v.type.rank == 0:  # a 0-d input takes its only element (index shape [1]) and stays 0-d
        return ctx.reshape(ctx.emit("take", [ctx.reshape(v, (1,)), ctx.val(index)], axis=0), ())
    return ctx.emit("take", [v, ctx.val(index)], axis=ctx.axis(dim, v.type.rank))


@rule(aten.gather.default)
def _gather(ctx, x, dim, index, sparse_grad=False):
    v = ctx.val(x)
    return ctx.emit("gather", [v, ctx.val(index)], axis=ctx.axis(dim, v.type.rank))


@rule(aten.index.Tensor)
def _index(ctx, x, indices):
    v = ctx.val(x)
    axes, idx = [], []
    for ax, a in enumerate(indices):
        if a is None:
            continue
        iv = ctx.val(a)
        if iv.type.dtype in (torch.bool, torch.uint8):
            raise UnsupportedError(ctx.describe("boolean-mask indexing has a data-dependent shape"))
        axes.append(ax)
        idx.append(wrap_index(ctx, iv, v.type.shape[ax]))
    if len(idx) == 1:
        return ctx.emit("take", [v, idx[0]], axis=axes[0])
    return ctx.emit("index", [v, *idx], axes=tuple(axes))


@rule(aten.slice_scatter.default)
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    n = v.type.shape[ax]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    end = max(end, start)
    s = ctx.cast(ctx.val(src), v.type.dtype)
    return ctx.emit("scatter_slice", [v, s], axis=ax, start=start, stop=end, step=step)


@rule(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    n = v.type.shape[ax]
    index = index + n if index < 0 else index
    s = ctx.cast(ctx.val(src), v.type.dtype)
    s = ctx.reshape(s, v.type.shape[:ax] + (1,) + v.type.shape[ax + 1:])
    return ctx.emit("scatter_slice", [v, s], axis=ax, start=index, stop=index + 1, step=1)


@rule(aten.scatter_add.default)
def _scatter_add(ctx, x, dim, index, src):
    v = ctx.val(x)
    return ctx.emit("scatter_add", [v, ctx.val(index), ctx.cast(ctx.val(src), v.type.dtype)],
                    axis=ctx.axis(dim, v.type.rank))


@rule(aten.cumsum.default)
def _cumsum(ctx, x, dim, dtype=None):
    t = ctx.out_type
    v = ctx.cast(ctx.val(x), t.dtype)
    return ctx.emit("cumsum", [v], axis=ctx.axis(dim, v.type.rank))
