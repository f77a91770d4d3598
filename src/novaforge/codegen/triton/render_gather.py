"""Rendering `take` (embedding lookups, index_select), `gather` and `cat` single kernels.

Invariant: the kernel is pointwise over the node's output space; each lane computes its own
coordinates, reads the index (take; an arange index is computed from the coordinates) or picks
the input whose slice along the axis holds its coordinate (cat), and loads one element through
the operand's view strides. Indices are assumed in range, as the IR's `take` specifies; every
load is masked to the lane's own input.
"""

from __future__ import annotations

import math

import torch

from ...schedule.gpu import PointwiseSchedule, cdiv
from .analysis import BodyInfo, Leaf, Unsupported
from .emit import BodyEmitter, Lane
from .exprs import linear_offset
from .render import KernelSource, assemble, params, wide_index


def _coord(space: tuple[int, ...], d: int) -> str:
    return linear_offset("x", [(n, 1 if i == d else 0) for i, n in enumerate(space)])


def _lane_offset(em: BodyEmitter, strides: tuple[int, ...], base: int) -> tuple[str, set]:
    """em.offset, as a block over the lane even where it does not depend on it (size-1 spaces),
    so that a block mask can guard the load."""
    off, used = em.offset(strides, base)
    return (off if used else f"{off} + 0 * x"), used


def _emit_index(em: BodyEmitter, li: Leaf, off: str, mask: str | None) -> None:
    """`ix`: the index at each lane, read from its buffer, or computed where it is an arange
    (positions of a symbolic length)."""
    if li.kind == "iota":
        em.line(f"ix = ({off}).to(tl.int64) * {li.step!r} + {li.start!r}")
    else:
        em.line(f"ix = tl.load({em.ptrs[li.buf]} + {off}" + (f", mask={mask}, other=0)" if mask else ")"))


def _emit_take(em: BodyEmitter, info: BodyInfo, mask: str | None) -> str:
    node = info.anchor
    x, idx = node.inputs
    lx, li = info.leaves[x], info.leaves[idx]
    ax = node.attrs["axis"]
    space = info.space
    ri = idx.type.rank
    i_strides = (0,) * ax + tuple(0 if n == 1 else s for n, s in zip(li.layout.shape, li.layout.strides, strict=True))
    i_strides += (0,) * (len(space) - ax - ri)
    off_i, used_i = _lane_offset(em, i_strides, li.layout.offset)
    _emit_index(em, li, off_i, em.mask_for(used_i))
    x_strides = tuple(lx.layout.strides[:ax]) + (0,) * ri + tuple(lx.layout.strides[ax + 1:])
    off_x, _ = em.offset(x_strides, lx.layout.offset)
    text = f"tl.load({em.ptrs[lx.buf]} + {off_x} + ix * {lx.layout.strides[ax]}" + (
        f", mask={mask}, other=0)" if mask else ")")
    if x.type.dtype in (torch.float16, torch.bfloat16):
        text += ".to(tl.float32)"
    em.line(f"g = {text}")
    return "g"


def _emit_gather(em: BodyEmitter, info: BodyInfo, mask: str | None) -> str:
    """torch.gather: out[i] = x[i with coordinate `axis` replaced by idx[i]] (idx has out's shape)."""
    node = info.anchor
    x, idx = node.inputs
    lx, li = info.leaves[x], info.leaves[idx]
    ax = node.attrs["axis"]
    i_strides = tuple(0 if n == 1 else s for n, s in zip(li.layout.shape, li.layout.strides, strict=True))
    off_i, used_i = _lane_offset(em, i_strides, li.layout.offset)
    _emit_index(em, li, off_i, em.mask_for(used_i))
    x_strides = tuple(0 if d == ax else s for d, s in enumerate(lx.layout.strides))
    off_x, _ = em.offset(x_strides, lx.layout.offset)
    text = f"tl.load({em.ptrs[lx.buf]} + {off_x} + ix * {lx.layout.strides[ax]}" + (
        f", mask={mask}, other=0)" if mask else ")")
    if x.type.dtype in (torch.float16, torch.bfloat16):
        text += ".to(tl.float32)"
    em.line(f"g = {text}")
    return "g"


def _emit_cat(em: BodyEmitter, info: BodyInfo, mask: str | None) -> str:
    node = info.anchor
    ax = node.attrs["axis"]
    space = info.space
    em.line(f"ca = {_coord(space, ax)}")
    start = 0
    have = False
    for v in node.inputs:
        n = v.type.shape[ax]
        if n == 0:
            continue
        leaf = info.leaves[v]
        strides = tuple(0 if size == 1 and d != ax else st
                        for d, (size, st) in enumerate(zip(leaf.layout.shape, leaf.layout.strides, strict=True)))
        off, _ = _lane_offset(em, strides, leaf.layout.offset - start * strides[ax])
        sel = f"(ca >= {start}) & (ca < {start + n})"
        m = f"{sel} & {mask}" if mask else sel
        text = f"tl.load({em.ptrs[leaf.buf]} + {off}, mask={m}, other=0)"
        if v.type.dtype in (torch.float16, torch.bfloat16):
            text += ".to(tl.float32)"
        em.line(f"g = {text}" if not have else f"g = tl.where({sel}, {text}, g)")
        have = True
        start += n
    if not have:
        raise Unsupported("cat of empty inputs")
    return "g"


def render_gather(info: BodyInfo, sched: PointwiseSchedule) -> KernelSource:
    space = info.space
    numel = math.prod(space)
    block = sched.block
    wide = wide_index(info)
    ins, outs = params(info)
    mask = None if numel % block == 0 else "xmask"
    em = BodyEmitter(info, [Lane("x", tuple(range(len(space))), mask)], ins)
    em.line("pid = tl.program_id(0)")
    em.line(f"x = {'pid.to(tl.int64)' if wide else 'pid'} * {block} + tl.arange(0, {block})")
    if mask:
        em.line(f"xmask = x < {numel}")
    emit = {"take": _emit_take, "gather": _emit_gather, "cat": _emit_cat}[info.anchor.op]
    name = emit(em, info, mask)
    em.preset(info.anchor.out, name, {"x"})
    for st in info.stores:
        i, c, strides = st.buf, st.value, st.strides
        em.store(outs[i], c, strides, info.outputs[i].dtype)
    src = assemble(info, em, f"{info.anchor.op} over {list(space)}", sched)
    return KernelSource(info.kernel.name, "gather", src, (cdiv(numel, block),), sched.num_warps, 1,
                        len(ins), len(outs), sched)
