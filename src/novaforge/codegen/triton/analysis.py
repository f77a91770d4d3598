"""Kernel-body analysis for the Triton backend: every body value in terms of the kernel's space.

Invariant: `analyze(kernel)` either returns a `BodyInfo` in which
* every leaf value (a body input or a generator, seen through its chain of views) has a `Leaf`:
  its strided layout over the source buffer (inputs are contiguous buffers of their IR type,
  or, when the backend pre-transposed a constant weight, of its last-two-dims transpose);
* every computed value (elementwise op, reduction, anchor) broadcasts to the kernel space
  (pointwise: the output shape; reduction: the reduced input shape; matmul/attention: the
  anchor's output shape), and every elementwise op has a Triton rendering;
* every body output is a computed value stored contiguously, directly or through a reshape of a
  space-shaped value (a store view: same element order);
* every `cat` of a pointwise body reads leaves only and spans the space along its axis: it is
  a load with piecewise addressing (`cat_pieces`: one masked load per piece, selected by the
  coordinate along the cat's space dim);
or it raises `Unsupported` with the reason, and the backend runs that kernel through torch.
This is what the body contract of passes/fuse_body.py promises; anything else falls back.
"""

from __future__ import annotations

import math

import torch

from ...ir import OPS, Kernel, Node, Value
from ...ir.views import Strided, permuted_copy
from ..body import (
    BodyInfo,
    CatPiece,
    Leaf,
    Store,
    Unsupported,
    broadcast_strides,
    broadcasts_to,
    cat_pieces,
    generator_leaf,
    input_leaf,
    view_leaf,
)
from .exprs import NOT_RENDERED, not_rendered, supports

__all__ = ["BodyInfo", "CatPiece", "Leaf", "Unsupported", "analyze", "broadcast_strides", "cat_pieces",
           "transposed_strides"]

GATHER_OPS = ("take", "gather", "cat")  # single kernels generated as gathers over their output space
MATMUL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def transposed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a buffer of logical shape [..., K, N] stored as its last-two-dims transpose
    [..., N, K], contiguous (a pre-transposed weight: element (k, n) at n * K + k)."""
    if len(shape) < 2:
        raise Unsupported("a transposed input needs two dims")
    swapped = shape[:-2] + (shape[-1], shape[-2])
    st = Strided.contiguous(swapped).strides
    return st[:-2] + (st[-1], st[-2])


def analyze(kernel: Kernel, transposed: frozenset[int] = frozenset()) -> BodyInfo:
    """The body's analysis; body inputs are contiguous buffers of their IR types, except those
    in `transposed`, stored as the transpose of their last two dims (`transposed_strides`)."""
    body = kernel.body
    if kernel.kind not in ("pointwise", "reduction", "matmul", "attention", "single"):
        raise Unsupported(f"{kernel.kind} kernels run through torch")
    leaves: dict[Value, Leaf] = {}
    producer: dict[Value, Node] = {}
    computed: list[Node] = []
    views_of_computed: dict[Value, Value] = {}  # store-view value -> the computed value it reshapes
    # attention kernels may store their output transposed: copy(permute(anchor)) (see passes/fuse.py)
    permuted_stores: dict[Value, tuple[Value, tuple[int, ...]]] = {}
    anchor_out = kernel.anchor_node.outputs[0] if kernel.kind == "attention" and kernel.anchor_node else None
    for i, gi in enumerate(body.inputs):
        t = gi.value.type
        leaves[gi.value] = input_leaf(i, gi.value, Strided(t.shape, transposed_strides(t.shape))
                                      if i in transposed else None)
    for n in body.nodes:
        for o in n.outputs:
            producer[o] = n
        d = OPS[n.op]
        if d.has("generator"):
            leaves[n.out] = generator_leaf(n)
        elif d.has("view"):
            src = n.inputs[0]
            if src in leaves:
                leaves[n.out] = view_leaf(leaves[src], n)
            elif n.op == "reshape":
                views_of_computed[n.out] = views_of_computed.get(src, src)
            elif not (n.op == "permute" and anchor_out is not None and src is anchor_out):
                raise Unsupported(f"{n.op} of a computed value inside the body")
        else:
            pc = permuted_copy(producer.get, n.out) if anchor_out is not None else None
            if pc is not None and pc[0] is anchor_out:
                permuted_stores[n.out] = pc  # the store goes through the permute
                continue
            if len(n.outputs) != 1:
                raise Unsupported(f"{n.op} has {len(n.outputs)} outputs")
            for v in n.inputs:
                if v in views_of_computed:
                    raise Unsupported("a reshaped computed value feeds another op")
            computed.append(n)
    if not computed:
        raise Unsupported("the body computes nothing")
    anchor = kernel.anchor_node
    red_axes: tuple[int, ...] = ()
    reductions = [n for n in computed if OPS[n.op].has("reduction")]
    kind = kernel.kind
    lone_reduction = (kind == "single" and len(computed) == 1 and OPS[computed[0].op].reduce is not None
                      and computed[0].inputs[0].type.rank > 0)
    if lone_reduction:
        kind = "reduction"  # a keepdim=False reduction: stored in its keepdim layout (same element order)
    if kind == "single":
        if len(computed) != 1 or computed[0].op not in GATHER_OPS:
            op = computed[0].op
            raise Unsupported(not_rendered(op) if op in NOT_RENDERED else f"single {op} kernels run through torch")
        anchor = computed[0]
        for i, v in enumerate(anchor.inputs):
            iota_index = anchor.op == "take" and i == 1 and v in leaves and leaves[v].kind == "iota"
            if v not in leaves or (leaves[v].buf is None and not iota_index):  # (positions: an arange)
                raise Unsupported(f"{anchor.op} operand is not a view of a kernel input")
        if anchor.op in ("take", "gather") and anchor.inputs[1].type.dtype not in (torch.int64, torch.int32):
            raise Unsupported(f"{anchor.op} with non-integer indices")
        space = anchor.out.type.shape
        kind = "gather"
    elif kernel.kind in ("matmul", "attention"):
        if anchor is None or anchor.op != ("matmul" if kernel.kind == "matmul" else "attention"):
            raise Unsupported(f"{kernel.kind} kernel without its anchor")
        for v in anchor.inputs:
            if v not in leaves or leaves[v].buf is None:
                raise Unsupported(f"{anchor.op} operand is not a view of a kernel input")
        if anchor.inputs[0].type.dtype not in MATMUL_DTYPES:
            raise Unsupported(f"{anchor.op} on {anchor.inputs[0].type.dtype}")
        space = anchor.out.type.shape
        if reductions:
            raise Unsupported("reduction inside an anchored kernel")
    elif kind == "reduction":
        if not reductions:
            raise Unsupported("reduction kernel without a reduction")
        first = reductions[0]
        space = first.inputs[0].type.shape
        red_axes = tuple(first.attrs["axes"])
        for r in reductions:
            if OPS[r.op].reduce is None or not (r.attrs["keepdim"] or lone_reduction) \
                    or tuple(r.attrs["axes"]) != red_axes or r.inputs[0].type.shape != space:
                raise Unsupported(f"{r.op} over {r.attrs['axes']} differs from the kernel's row reduction")
        if not red_axes or any(space[a] == 0 for a in red_axes):
            raise Unsupported("empty or missing reduction axes")
    else:
        if reductions:
            raise Unsupported("reduction inside a pointwise kernel")
        shapes = [n.out.type.shape for n in computed]
        space = max(shapes, key=lambda s: (len(s), math.prod(s)))
    for n in computed:
        if n is anchor or n in reductions:
            continue
        if n.op == "cat" and kind == "pointwise":
            cat_pieces(n, leaves, space)  # raises Unsupported if it is not a load over the space
            continue
        if not OPS[n.op].has("elementwise") or not supports(n.op):
            raise Unsupported(not_rendered(n.op))
        if not broadcasts_to(n.out.type.shape, space):
            raise Unsupported(f"{n.op} of shape {n.out.type.shape} outside the space {space}")
    for n in computed:
        if n is not anchor and n.op != "cat":
            for v in n.inputs:
                if v in leaves:
                    broadcast_strides(leaves[v].layout, space)  # raises Unsupported if it does not fit
    computed_set = {n.out for n in computed}
    stores = []
    for i, o in enumerate(body.outputs):
        dt = o.type.dtype
        if o in computed_set and lone_reduction:
            kept = tuple(1 if d in red_axes else n for d, n in enumerate(space))
            stores.append(Store(i, o, broadcast_strides(Strided.contiguous(kept), space), dt))
        elif o in computed_set:
            stores.append(Store(i, o, broadcast_strides(Strided.contiguous(o.type.shape), space), dt))
        elif o in permuted_stores:
            c, perm = permuted_stores[o]
            out_strides = Strided.contiguous(o.type.shape).strides
            stores.append(Store(i, c, tuple(out_strides[perm.index(d)] for d in range(len(perm))), dt))
        elif o in views_of_computed:
            c = views_of_computed[o]
            if c.type.shape != space:
                raise Unsupported("store view of a value that does not span the space")
            stores.append(Store(i, c, Strided.contiguous(space).strides, dt))
        else:
            raise Unsupported("a kernel output is a view of an input or a constant")
    for st in stores:
        if kind not in ("reduction", "gather") and st.value.type.shape != space:
            raise Unsupported(f"output of shape {st.value.type.shape} smaller than the space {space}")
    return BodyInfo(tuple(space), red_axes, leaves, computed=computed, stores=stores, kernel=kernel, body=body,
                    kind=kind, anchor=anchor, producer=producer, reductions=reductions)

