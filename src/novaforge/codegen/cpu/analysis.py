"""Body analysis for the CPU code generator: a kernel body as loops over one iteration space.

`analyze_body(body, space, axes)` maps every value of a pointwise or reduction body onto the
kernel's iteration space:

* a *leaf* is a body input seen through its chain of views (a strided load with one stride per
  space dimension, 0 where it broadcasts), a generator (a literal, or `iota` as a virtual
  strided buffer) or a view of one; with `pieces=True` (pointwise kernels) also a `cat` of
  leaves: a piecewise leaf whose `Piece`s cover disjoint ranges of one space dim, each a plain
  leaf with strides and offset relative to its range's start (rendered by pieces.py);
* a *computed* value is a non-view node evaluated per element of the space; a view of a
  computed value is allowed only when it reads the same element at every space index (an
  expand, or a reshape that only adds or drops leading unit dimensions): it aliases its source;
* each body output is stored at a strided location over the space: contiguous in the space
  (a "store view" reshape keeps the element order) or, for row summaries of a reduction, at
  the kept indices (stride 0 along reduced axes).

Invariant: when `analyze_body` returns, generated code that evaluates computed nodes in body
order from these accesses computes what the interpreter computes; when a body has a form this
model cannot express, it raises `Unsupported` and the kernel runs through torch instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...ir import OPS, Graph, Node, Value
from ...ir.types import broadcast_shapes, contiguous_strides
from ...ir.views import Strided, apply_view
from ..body import (
    BodyInfo,
    CatPiece,
    Leaf,
    LeafKind,
    Store,
    Unsupported,
    cat_pieces,
    fits,
    generator_leaf,
    input_leaf,
    right_aligned,
    view_leaf,
)

__all__ = ["BodyInfo", "CatPiece", "Leaf", "Operand", "Store", "Unsupported", "analyze_body", "body_space", "operand"]
Piece = CatPiece


def _same_elements(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """Does a reshape src -> dst only add or drop leading unit dims (same element per index)?"""
    a, b = list(src), list(dst)
    while a and a[0] == 1:
        a.pop(0)
    while b and b[0] == 1:
        b.pop(0)
    return a == b


def analyze_body(body: Graph, space: tuple[int, ...], axes: tuple[int, ...] = (), pieces: bool = False) -> BodyInfo:
    info = BodyInfo(tuple(space), tuple(axes))
    cats: dict[Value, Node] = {}  # cat leaves -> their node
    for i, gi in enumerate(body.inputs):
        info.leaves[gi.value] = input_leaf(i, gi.value)
    for n in body.nodes:
        d = OPS[n.op]
        if d.has("generator"):
            info.leaves[n.outputs[0]] = generator_leaf(n)
            continue
        if d.has("view"):
            src, out = n.inputs[0], n.outputs[0]
            if src in info.store_views:
                raise Unsupported(f"{n.op} of a reshaped computed value")
            leaf = info.leaves.get(src)
            if leaf is not None:
                info.leaves[out] = view_leaf(leaf, n)
            elif n.op == "expand" or (n.op == "reshape" and _same_elements(src.type.shape, out.type.shape)):
                info.alias[out] = info.resolve(src)
            elif n.op == "reshape":
                info.store_views[out] = info.resolve(src)
            else:
                raise Unsupported(f"{n.op} of a computed value")
            continue
        if n.op == "cat":
            if not pieces or axes:
                raise Unsupported("cat inside a reduction or an epilogue")
            if any(info.leaves.get(v) is None or info.leaves[v].kind == "cat" for v in n.inputs):
                raise Unsupported("cat of computed values")
            cats[n.outputs[0]] = n
            info.leaves[n.outputs[0]] = Leaf(LeafKind.CAT, n.outputs[0].type.dtype)
            continue
        if len(n.outputs) != 1:
            raise Unsupported(f"{n.op} with {len(n.outputs)} outputs")
        if not (d.has("elementwise") or d.reduce is not None):
            raise Unsupported(f"op {n.op} in a generated loop")
        if any(v in info.store_views for v in n.inputs):
            raise Unsupported(f"{n.op} reads a reshaped computed value")
        info.computed.append(n)
    used = {info.resolve(v) for n in info.computed for v in n.inputs}
    used |= {info.store_views.get(w, info.resolve(w)) for w in body.outputs}
    all_leaves = dict(info.leaves)
    for v, leaf in list(info.leaves.items()):
        if v not in used:
            del info.leaves[v]
            continue
        if leaf.kind == LeafKind.CAT:
            info.leaves[v] = _cat_leaf(cats[v], all_leaves, info.space)
            info.shapes[v] = right_aligned(v.type.shape, info.space)
            continue
        if leaf.kind == LeafKind.CONST:
            info.shapes[v] = (1,) * len(info.space)
            continue
        info.leaves[v] = leaf.place(info.space)
        info.shapes[v] = right_aligned(leaf.layout.shape, info.space)
    for n in info.computed:
        o = n.outputs[0]
        if OPS[n.op].has("reduction"):
            if not n.attrs["keepdim"] or tuple(n.attrs["axes"]) != info.axes:
                raise Unsupported("reduction over other axes than the kernel's")
            if n.inputs[0].type.shape != info.space:
                raise Unsupported("reduction input is not the space")
            shp = right_aligned(o.type.shape, info.space)
        else:
            try:
                shp = tuple(broadcast_shapes(*(info.shapes[info.resolve(v)] for v in n.inputs),
                                             right_aligned(o.type.shape, info.space)))
            except ValueError as e:
                raise Unsupported(f"{n.op}: {e}") from None
        if not fits(shp, info.space):
            raise Unsupported(f"{n.op} output {o.type} does not broadcast to the space {info.space}")
        info.shapes[o] = shp
    for j, w in enumerate(body.outputs):
        base = info.store_views.get(w, info.resolve(w))
        shp = info.shapes.get(base)
        if shp is None:
            raise Unsupported("output is not computed in the space")
        if w.type.numel != math.prod(shp):
            raise Unsupported(f"output {w.type} does not cover its value of shape {shp}")
        if info.axes:
            if any(shp[a] != 1 for a in info.axes) and shp != info.space:
                raise Unsupported("row-level output narrower than the space")
            if all(shp[a] == 1 for a in info.axes) and any(
                    s != t for i, (s, t) in enumerate(zip(shp, info.space, strict=True)) if i not in info.axes):
                raise Unsupported("row summary output narrower than the kept dims")
        elif shp != info.space:
            raise Unsupported("pointwise output narrower than the space")
        cs = contiguous_strides(shp)
        strides = tuple(0 if shp[d] == 1 else cs[d] for d in range(len(shp)))
        info.stores.append(Store(j, base, strides, w.type.dtype))
    return info


def _cat_leaf(n: Node, leaves: dict[Value, Leaf], space: tuple[int, ...]) -> Leaf:
    """The piecewise leaf of cat node n over `space` (its inputs are leaves)."""
    out = n.outputs[0].type
    if not fits(right_aligned(out.shape, space), space):
        raise Unsupported(f"cat of shape {out.shape} does not broadcast to the space {space}")
    dim, pieces = cat_pieces(n, leaves, space, single_may_broadcast=True)
    if len(pieces) == 1:  # one non-empty input (or a broadcast size-1 cat dim): a plain leaf
        return pieces[0].leaf
    if not pieces:  # an empty space: never read
        return Leaf(LeafKind.CONST, out.dtype, value=0)
    return Leaf(LeafKind.CAT, out.dtype, dim=dim, pieces=tuple(pieces))


def body_space(body: Graph, kind: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(space, reduced axes) of a pointwise or reduction body."""
    shapes = []
    axes: tuple[int, ...] = ()
    space: tuple[int, ...] | None = None
    for n in body.nodes:
        d = OPS[n.op]
        if d.has("view") or d.has("generator"):
            continue
        if d.has("reduction") and kind == "reduction":
            space = n.inputs[0].type.shape
            axes = tuple(n.attrs["axes"])
        shapes.extend(o.type.shape for o in n.outputs)
    if space is not None:
        return tuple(space), axes
    if not shapes:
        shapes = [o.type.shape for o in body.outputs]
    try:
        return tuple(broadcast_shapes(*shapes)), ()
    except ValueError as e:
        raise Unsupported(f"computed shapes do not broadcast: {e}") from None


@dataclass
class Operand:
    """A library-call operand: body input `buf` seen through strides."""

    buf: int
    layout: Strided
    dtype: torch.dtype


def operand(body: Graph, v: Value) -> Operand:
    """The strided view of a body input that reaches `v` through views only."""
    chain: list[Node] = []
    producer = {o: n for n in body.nodes for o in n.outputs}
    while v in producer:
        n = producer[v]
        if not OPS[n.op].has("view"):
            raise Unsupported(f"anchor operand computed by {n.op} inside the kernel")
        chain.append(n)
        v = n.inputs[0]
    idx = next((i for i, gi in enumerate(body.inputs) if gi.value is v), None)
    if idx is None:
        raise Unsupported("anchor operand is not a kernel input")
    lay = Strided.contiguous(v.type.shape)
    for n in reversed(chain):
        lay = apply_view(lay, n.op, n.attrs)
        if lay is None:
            raise Unsupported(f"anchor operand view {n.op} is not strided")
    return Operand(idx, lay, v.type.dtype)
