"""The kernel-body model both backends consume: leaves, strides over the space, cat pieces,
stores, and the analysis result (`BodyInfo`).

A kernel body (passes/fuse_body.py states its contract) is analysed against one iteration
*space* (pointwise: the output shape; reduction: the reduced input's shape; matmul/attention:
the anchor's output shape). Every body value is either

* a *leaf*, read without computing: a body input seen through its chain of views (`LOAD`: a
  strided layout over the input buffer), a literal (`CONST`: scalar and full), an arithmetic
  sequence (`IOTA`, a virtual strided buffer), or a cat of leaves (`CAT`: `CatPiece`s over
  disjoint ranges of one space dim); placed in the space, a leaf has one stride per space dim
  (0 where it broadcasts) and an element offset;
* a *computed* value (an elementwise op, a combining reduction, an anchor), evaluated per
  element of the space; or
* a view of a computed value, which each backend accepts in the forms its templates handle
  (an alias of the same element, a store view, the permuted attention store).

Each body output is a `Store`: the value written and its strides over the space.

The rules that do not depend on the backend are here, once: how a leaf follows a view
(`view_leaf`), what a generator is as a leaf (`generator_leaf`), how a layout broadcasts to the
space (`broadcast_strides`), how a cat splits into pieces (`cat_pieces`) and which stores go
through the attention permute (`ir.views.permuted_copy`). The backends' analyses
(codegen/cpu/analysis.py, codegen/triton/analysis.py) walk a body with these and keep only
what their kernel templates support.

Invariant: a `Leaf` with kind LOAD or IOTA has a `layout` of the value's own shape over its
source; after `place` it also has `strides` (one per space dim) and `offset`; everything a
backend cannot express raises `Unsupported`, and that kernel runs through torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import torch

from ..ir import Graph, Kernel, Node, Value
from ..ir.types import TensorType, broadcasts_to
from ..ir.views import Strided, apply_view, permuted_copy

__all__ = ["BodyInfo", "CatPiece", "Leaf", "LeafKind", "Store", "Unsupported", "broadcast_strides", "broadcasts_to",
           "cat_pieces", "fits", "generator_leaf", "input_leaf", "permuted_copy", "right_aligned", "view_leaf"]


class Unsupported(Exception):
    """A backend cannot express this kernel (the message says why); it runs through torch."""


# IR ops that no backend generates yet, with the reason (each backend's NOT_RENDERED starts from it)
NOT_GENERATED: dict[str, str] = {
    "argmax": "index reductions are not generated yet", "argmin": "index reductions are not generated yet",
    "cumsum": "scans are not generated yet", "pad": "not generated yet", "scatter_slice": "not generated yet",
    "index": "multi-axis indexing is not generated yet",
    "extern": "an ATen call (by definition)", "extern_effect": "an ATen call (by definition)",
}


class LeafKind(StrEnum):
    LOAD = "load"
    CONST = "const"
    IOTA = "iota"
    CAT = "cat"


@dataclass(frozen=True)
class Leaf:
    kind: LeafKind
    dtype: torch.dtype
    layout: Strided | None = None  # LOAD / IOTA / CONST: the value's shape, strides, offset over the source
    buf: int | None = None  # LOAD: the body input index
    value: Any = None  # CONST: the literal
    start: float = 0  # IOTA: start + step * element offset
    step: float = 1
    strides: tuple[int, ...] = ()  # placed in a space: per space dim (0 where it broadcasts)
    offset: int = 0
    dim: int = -1  # CAT: the space dim the pieces split
    pieces: tuple[CatPiece, ...] = ()  # CAT: in order along `dim`

    def place(self, space: tuple[int, ...]) -> Leaf:
        """This leaf with strides and offset over `space` (CONST leaves need none)."""
        if self.kind == LeafKind.CONST or self.layout is None:
            return self
        return replace(self, strides=broadcast_strides(self.layout, space), offset=self.layout.offset)


@dataclass(frozen=True)
class CatPiece:
    """One input of a cat: space indices lo <= i[dim] < hi read `leaf` (placed in its part of
    the space, strides relative to the part's start) at i[dim] - lo."""

    lo: int
    hi: int
    leaf: Leaf


@dataclass(frozen=True)
class Store:
    buf: int  # body output index
    value: Value  # the computed (or leaf) value stored
    strides: tuple[int, ...]  # per space dim (0 along reduced axes for row summaries)
    dtype: torch.dtype
    offset: int = 0


# ------------------------------------------------------------------------- leaf rules
def input_leaf(i: int, v: Value, layout: Strided | None = None) -> Leaf:
    """Body input i, stored contiguously unless `layout` says otherwise."""
    return Leaf(LeafKind.LOAD, v.type.dtype, layout or Strided.contiguous(v.type.shape), buf=i)


def generator_leaf(n: Node) -> Leaf:
    """A generator as a leaf: `literal` ops (scalar, full) are CONST, iota an IOTA sequence."""
    out = n.outputs[0]
    lay = Strided.contiguous(out.type.shape)
    if n.op == "iota":
        return Leaf(LeafKind.IOTA, out.type.dtype, lay, start=n.attrs["start"], step=n.attrs["step"])
    if "value" in n.attrs:
        return Leaf(LeafKind.CONST, out.type.dtype, lay, value=n.attrs["value"])
    raise Unsupported(f"generator {n.op}")


def view_leaf(leaf: Leaf, n: Node) -> Leaf:
    """The leaf seen through view node `n`; raises Unsupported when strides cannot express it.
    A literal is the same literal through any view."""
    out = n.outputs[0].type
    if leaf.kind == LeafKind.CONST:
        lay = apply_view(leaf.layout, n.op, n.attrs) if leaf.layout is not None else None
        return replace(leaf, layout=lay or Strided.contiguous(out.shape))
    if leaf.kind == LeafKind.CAT:
        raise Unsupported(f"{n.op} of a cat")
    lay = apply_view(leaf.layout, n.op, n.attrs)
    if lay is None:
        raise Unsupported(f"{n.op} of an input is not strided")
    return replace(leaf, layout=lay)


# ------------------------------------------------------------------------------ spaces
def broadcast_strides(layout: Strided, space: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a layout right-aligned and broadcast into `space` (0 where it broadcasts);
    raises Unsupported when its shape does not broadcast to the space."""
    off = len(space) - len(layout.shape)
    if off < 0:
        raise Unsupported(f"value of shape {layout.shape} has a higher rank than the space {space}")
    out = []
    for d, size in enumerate(space):
        j = d - off
        if j < 0 or layout.shape[j] == 1:
            out.append(0)
        elif layout.shape[j] == size:
            out.append(layout.strides[j])
        else:
            raise Unsupported(f"value of shape {layout.shape} does not broadcast to the space {space}")
    return tuple(out)


def right_aligned(shape: tuple[int, ...], space: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with leading unit dims up to the space's rank."""
    if len(shape) > len(space):
        raise Unsupported(f"value of shape {shape} has a higher rank than the space {space}")
    return (1,) * (len(space) - len(shape)) + tuple(shape)


def fits(shape: tuple[int, ...], space: tuple[int, ...]) -> bool:
    """Same rank as the space and broadcasts to it."""
    return len(shape) == len(space) and broadcasts_to(shape, space)


def cat_pieces(n: Node, leaves: dict[Value, Leaf], space: tuple[int, ...],
               single_may_broadcast: bool = False) -> tuple[int, list[CatPiece]]:
    """(the space dim cat node `n` splits, its non-empty pieces, each placed in its part of the
    space). The cat must span the space along that dim, except that with `single_may_broadcast`
    a cat with one non-empty input may be broadcast along it; its inputs must be leaves."""
    out = n.outputs[0].type
    ax = n.attrs["axis"]
    dim = ax + len(space) - out.rank
    if dim < 0 or not broadcasts_to(out.shape, space):
        raise Unsupported(f"cat of shape {out.shape} does not broadcast to the space {space}")
    parts = []
    lo = 0
    for v in n.inputs:
        length = v.type.shape[ax]
        if length:
            parts.append((lo, lo + length, v))
        lo += length
    if out.shape[ax] != space[dim] and not (single_may_broadcast and len(parts) == 1):
        raise Unsupported(f"cat of shape {out.shape} does not span the space {space}")
    pieces = []
    for lo, hi, v in parts:
        leaf = leaves.get(v)
        if leaf is None or leaf.kind == LeafKind.CAT:
            raise Unsupported("cat of computed values")
        sub = space if len(parts) == 1 else space[:dim] + (hi - lo,) + space[dim + 1:]
        pieces.append(CatPiece(lo, hi, leaf.place(sub)))
    return dim, pieces


# ---------------------------------------------------------------------------- results
@dataclass
class BodyInfo:
    """A body analysed in its space (fields a backend does not use stay empty)."""

    space: tuple[int, ...]
    axes: tuple[int, ...] = ()  # reduced axes
    leaves: dict[Value, Leaf] = field(default_factory=dict)
    alias: dict[Value, Value] = field(default_factory=dict)  # views reading the same element at every index
    store_views: dict[Value, Value] = field(default_factory=dict)  # reshapes only valid as outputs
    computed: list[Node] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    shapes: dict[Value, tuple[int, ...]] = field(default_factory=dict)  # right-aligned to the space
    kernel: Kernel | None = None
    body: Graph | None = None
    kind: str = ""  # the template: pointwise | reduction | matmul | attention | gather
    anchor: Node | None = None
    producer: dict[Value, Node] = field(default_factory=dict)
    reductions: list[Node] = field(default_factory=list)

    @property
    def red_axes(self) -> tuple[int, ...]:
        return self.axes

    @property
    def numel(self) -> int:
        return math.prod(self.space)

    @property
    def inputs(self) -> list[TensorType]:
        return [gi.value.type for gi in self.body.inputs] if self.body is not None else []

    @property
    def outputs(self) -> list[TensorType]:
        return [v.type for v in self.body.outputs] if self.body is not None else []

    def resolve(self, v: Value) -> Value:
        while v in self.alias:
            v = self.alias[v]
        return v

    def is_row(self, v: Value) -> bool:
        """Does v vary along a reduced axis (else it is a per-row summary)?"""
        shape = self.shapes[self.resolve(v)]
        return any(shape[a] != 1 for a in self.axes)

    def space_strides(self, leaf: Leaf) -> tuple[int, ...]:
        return broadcast_strides(leaf.layout, self.space)

    def used_leaves(self) -> dict[Value, Leaf]:
        """Leaves read by the elementwise and reduction code (not the anchor's own operands); a
        cat counts as one leaf over its output shape (one element read per element)."""
        out = {}
        for n in self.computed:
            if n is self.anchor:
                continue
            if n.op == "cat":
                pieces = [self.leaves[v] for v in n.inputs]
                mem = next((p for p in pieces if p.kind == LeafKind.LOAD), pieces[0])
                out[n.outputs[0]] = replace(mem, layout=Strided.contiguous(n.outputs[0].type.shape),
                                            dtype=n.outputs[0].type.dtype)
                continue
            for v in n.inputs:
                if v in self.leaves:
                    out[v] = self.leaves[v]
        return out

    def max_span(self) -> int:
        """Largest element count of any buffer the kernel touches (decides 32- vs 64-bit indexing)."""
        sizes = [t.numel for t in self.inputs] + [t.numel for t in self.outputs] + [math.prod(self.space)]
        return max(sizes, default=0)
