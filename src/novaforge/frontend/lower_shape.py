"""Composite lowering rules for views, data movement and indexing.

The rules of ATen ops that are one IR view or data-movement op (view, permute, slice, cat,
pad, index_select, gather, ...) stand beside that op's record (ir/ops/shape.py,
ir/ops/indexing.py); this file holds the ATen ops built from several IR ops (diagonal, flip,
repeat, tril/triu).

Every view becomes one of the four IR views (reshape, permute, expand, slice) with normalized
attributes; the ATen output shape from the FX node's fake value is the authority for shapes
with -1 or omitted dimensions. Slices are normalized to 0 <= start <= stop <= length.
"""

from __future__ import annotations

import torch

from ..ir.ops.shape import select_value, slice_value
from .lower_ctx import LowerCtx
from .lower_elementwise import rule

__all__ = ["select_value", "slice_value"]

aten = torch.ops.aten


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


