"""Strided view algebra: what a chain of IR views does to a buffer's (shape, strides, offset).

`apply_view` returns the strided layout of a view of a strided layout, or None when the view
cannot be expressed with strides (a reshape that merges dimensions whose strides do not chain,
as after a transpose or an expand). Fusion uses this to decide whether a view folds into its
consumer's indexing or must be materialized; code generators use it to compute the strides
they read with. Invariant: for a layout L of tensor t, apply_view(L, v) describes v(t) over
the same storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .graph import Attrs, Graph, Node, Value
from .types import contiguous_strides


@dataclass(frozen=True)
class Strided:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(shape: Sequence[int]) -> Strided:
        shape = tuple(shape)
        return Strided(shape, contiguous_strides(shape), 0)

    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape) or any(s == 0 for s in self.shape)

    def span(self) -> int:
        """1 + the largest element offset reachable (0 for an empty view)."""
        if any(s == 0 for s in self.shape):
            return 0
        return self.offset + 1 + sum((n - 1) * st for n, st in zip(self.shape, self.strides, strict=True))


def reshape_strides(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> tuple[int, ...] | None:
    """ATen's computeStride: strides viewing (shape, strides) as new_shape, or None."""
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return contiguous_strides(tuple(new_shape))
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1] if strides else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def apply_view(s: Strided, op: str, attrs: Attrs) -> Strided | None:
    if op == "reshape":
        new_shape = tuple(attrs["shape"])
        if len(s.shape) == 0:
            return Strided(new_shape, contiguous_strides(new_shape), s.offset)
        st = reshape_strides(s.shape, s.strides, new_shape)
        return None if st is None else Strided(new_shape, st, s.offset)
    if op == "permute":
        perm = attrs["perm"]
        return Strided(tuple(s.shape[p] for p in perm), tuple(s.strides[p] for p in perm), s.offset)
    if op == "expand":
        shape = tuple(attrs["shape"])
        off = len(shape) - len(s.shape)
        strides = []
        for i, n in enumerate(shape):
            j = i - off
            if j < 0 or (s.shape[j] == 1 and n != 1):
                strides.append(0)
            else:
                strides.append(s.strides[j])
        return Strided(shape, tuple(strides), s.offset)
    if op == "slice":
        ax, start, step = attrs["axis"], attrs["start"], attrs["step"]
        stop = min(attrs["stop"], s.shape[ax])
        n = max(0, (stop - start + step - 1) // step) if start < s.shape[ax] else 0
        shape = list(s.shape)
        strides = list(s.strides)
        shape[ax] = n
        offset = s.offset + (start * s.strides[ax] if n else 0)
        strides[ax] = s.strides[ax] * step
        return Strided(tuple(shape), tuple(strides), offset)
    raise ValueError(f"{op} is not a view")


def permuted_copy(producer: Callable[[Value], Node | None], v: Value) -> tuple[Value, tuple[int, ...]] | None:
    """(x, perm) when v = copy(permute(x, perm)), else None: a transpose materialized by a copy.
    Fusion stores an attention kernel's output through such a permute ([B, H, L, D] ->
    [B, L, H, D] before the output projection) instead of running a copy kernel; fuse.py and
    both backends recognise it with this one function."""
    c = producer(v)
    if c is None or c.op != "copy":
        return None
    p = producer(c.inputs[0])
    if p is None or p.op != "permute":
        return None
    return p.inputs[0], tuple(p.attrs["perm"])


def heads_last(perm: Sequence[int]) -> bool:
    """Does `perm` swap the head and query axes of a [..., H, L, D] tensor (and nothing else)?"""
    r = len(perm)
    return r >= 3 and tuple(perm) == tuple(range(r - 3)) + (r - 2, r - 3, r - 1)


def view_roots(nodes: Sequence[Node]) -> dict[Value, Value]:
    """For each output of a top-level view node, the value whose memory it reads (through
    chains of views); values that are not views are absent."""
    from .ops import OPS

    root: dict[Value, Value] = {}
    for n in nodes:
        if OPS[n.op].has("view"):
            root[n.outputs[0]] = root.get(n.inputs[0], n.inputs[0])
    return root


def readers_through_views(graph: Graph, v: Value) -> list[tuple[Node, list[Node]]]:
    """(reader, the chain of view nodes from v to the value it reads) for every node that is not
    a view and reads v or a view of v (through chains of views)."""
    from .ops import OPS

    out: list[tuple[Node, list[Node]]] = []
    stack: list[tuple[Value, list[Node]]] = [(v, [])]
    while stack:
        x, chain = stack.pop()
        for u in graph.users(x):
            if OPS[u.op].has("view"):
                stack.append((u.outputs[0], chain + [u]))
            else:
                out.append((u, chain))
    return out
