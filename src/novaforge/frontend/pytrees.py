"""Flatten a call's arguments and results to tensors, including cache objects.

`torch.utils._pytree` flattens containers (tuples, lists, dicts, namedtuples, transformers'
ModelOutputs) but treats a transformers cache (`DynamicCache`, `StaticCache`, their layers)
as an opaque leaf. Here such objects are flattened too: their attributes (`__dict__`) become
children, so the tensors inside become inputs or outputs of the compiled graph and the other
attributes become part of the spec (and so of the program's guard).

A `Spec` is a tree of nodes:

* `tensor`: a leaf tensor, numbered in flattening order;
* `const`: any other leaf (None, numbers, dtypes...), kept by value;
* `tree`: a pytree container (one level of torch's pytree: its type, context, children);
* `obj`: a cache-like object (its class, attribute names, children), numbered in order;
* `ref`: an object already seen in this flattening (the same object twice);
* `in_obj` / `in_tensor` (outputs only): the result *is* an input object or input tensor of the
  call (eager returned what it was given, e.g. the cache it updated in place);
* `in_view` (outputs only): the result is a view of input tensor `index` with the size, stride
  and storage offset in `value` (eager returned a view of its input: rebuilt by `as_strided`);
* `out_ref` / `out_view` (outputs only): the result is the same tensor as result leaf `index`,
  or a view of it (`value`: the view's and its base's layouts in eager, `view_of_result`):
  eager's results alias each other.

Invariants: `unflatten(spec, flatten(x).leaves)` rebuilds a structure equal to `x` (objects
as fresh instances of their classes, or the caller's own objects for `in_obj` nodes, updated
in place exactly as eager updates them); `spec.key` is hashable and equal for two calls
exactly when their structure and non-tensor values are equal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.memory_format,
          torch.layout, type, slice, type(Ellipsis))


@dataclass(frozen=True)
class Spec:
    kind: str  # tensor | const | tree | obj | ref | in_obj | in_tensor | in_view | out_ref | out_view
    type: Any = None
    context: Any = None
    children: tuple[Spec, ...] = ()
    value: Any = None
    index: int = -1  # tensor: leaf number; obj/ref/in_obj: object number; in_tensor: input leaf number
    # (in_obj: `value` is the input object's number)
    key: Any = field(default=None, compare=False)

    def is_leaf(self) -> bool:
        return self.kind == "tensor"


def is_cache_object(x: Any) -> bool:
    """A transformers cache or cache layer (flattened by attributes), judged by class without
    importing transformers: a `Cache` / `CacheLayerMixin` / `LinearAttentionCacheLayerMixin`
    subclass, or a class named '*Cache'."""
    cls = type(x)
    if not hasattr(x, "__dict__") or isinstance(x, torch.Tensor | torch.nn.Module):
        return False
    if cls.__name__.endswith("Cache"):
        return True
    cu = sys.modules.get("transformers.cache_utils")
    if cu is None:
        return False
    names = ("Cache", "CacheLayerMixin", "LinearAttentionCacheLayerMixin")  # (the last: Mamba's state layers)
    bases = tuple(b for b in (getattr(cu, n, None) for n in names) if b is not None)
    return bool(bases) and isinstance(x, bases)


def _hashable(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


@dataclass
class Flat:
    leaves: list[torch.Tensor]
    objs: list[Any]
    spec: Spec


def flatten(x: Any, *, inputs_objs: dict[int, int] | None = None,
            inputs_tensors: dict[int, int] | None = None,
            tensor_alias: Callable[[torch.Tensor, list[torch.Tensor]], Spec | None] | None = None) -> Flat:
    """Flatten `x`. For results, `inputs_objs` / `inputs_tensors` map id() of the call's input
    objects / tensors to their numbers: a result that is one of them becomes an `in_obj` /
    `in_tensor` node instead of a new object or leaf. `tensor_alias(t, leaves_so_far)` may
    classify any other result tensor as an alias (`in_view`, `out_ref`, `out_view`)."""
    leaves: list[torch.Tensor] = []
    objs: list[Any] = []
    seen: dict[int, int] = {}

    def go(v: Any) -> Spec:
        if isinstance(v, torch.Tensor):
            if inputs_tensors is not None and id(v) in inputs_tensors:
                i = inputs_tensors[id(v)]
                return Spec("in_tensor", index=i, key=("in_tensor", i))
            alias = tensor_alias(v, leaves) if tensor_alias is not None else None
            if alias is not None:
                return alias
            leaves.append(v)
            return Spec("tensor", index=len(leaves) - 1, key="T")
        if is_cache_object(v):
            if id(v) in seen:
                i = seen[id(v)]
                return Spec("ref", index=i, key=("ref", i))
            seen[id(v)] = len(objs)
            objs.append(v)
            names = tuple(vars(v))
            kids = tuple(go(getattr(v, n)) for n in names)
            alias = inputs_objs.get(id(v)) if inputs_objs is not None else None
            kind = "obj" if alias is None else "in_obj"
            return Spec(kind, type(v), names, kids, value=alias, index=seen[id(v)],
                        key=(kind, type(v), names, tuple(k.key for k in kids), alias))
        node_type = pytree._get_node_type(v)
        if node_type in pytree.SUPPORTED_NODES and not isinstance(v, _PLAIN):
            children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(v)
            kids = tuple(go(c) for c in children)
            return Spec("tree", node_type, context, kids,
                        key=("tree", node_type, _hashable(context), tuple(k.key for k in kids)))
        return Spec("const", value=v, key=("const", type(v).__name__, _hashable(v)))

    spec = go(x)
    return Flat(leaves, objs, spec)


def unflatten(spec: Spec, leaves: list[Any], *, inputs_objs: list[Any] | None = None,
              inputs_tensors: list[Any] | None = None, objs_out: list[Any] | None = None) -> Any:
    """Rebuild the structure of `spec` from `leaves`. `in_obj` nodes reuse the caller's objects
    (`inputs_objs`), whose attributes are set to the rebuilt values; `in_tensor` nodes are the
    caller's tensors. `objs_out`, when given, receives every object rebuilt, by number."""
    built: dict[int, Any] = {}
    views: dict[int, torch.Tensor] = {}
    leaves = _laid_out_for_views(spec, leaves)

    def _view(s: Spec) -> torch.Tensor:
        if s.kind == "in_view":
            assert inputs_tensors is not None
            return inputs_tensors[s.index].as_strided(*s.value)
        view = view_of_result(leaves[s.index], *s.value)
        assert view is not None, "a result base not re-laid out for its view"
        return view

    def go(s: Spec) -> Any:
        if s.kind == "tensor":
            return leaves[s.index]
        if s.kind == "const":
            return s.value
        if s.kind == "in_tensor":
            assert inputs_tensors is not None
            return inputs_tensors[s.index]
        if s.kind in ("in_view", "out_view"):  # one Spec object met twice is one tensor twice
            if id(s) not in views:
                views[id(s)] = _view(s)
            return views[id(s)]
        if s.kind == "out_ref":
            return leaves[s.index]
        if s.kind == "ref":
            return built[s.index]
        if s.kind in ("obj", "in_obj"):
            if s.kind == "in_obj":
                assert inputs_objs is not None
                obj = inputs_objs[s.value]
            else:
                obj = s.type.__new__(s.type)
            built[s.index] = obj
            if objs_out is not None:
                objs_out.append(obj)
            for name, kid in zip(s.context, s.children, strict=True):
                obj.__dict__[name] = go(kid)
            return obj
        assert s.kind == "tree"
        return pytree.SUPPORTED_NODES[s.type].unflatten_fn([go(k) for k in s.children], s.context)

    return go(spec)


def view_of_result(base: torch.Tensor, view_layout: tuple, base_layout: tuple) -> torch.Tensor | None:
    """The view of `base` that eager's view (size, stride, offset `view_layout`) is of eager's
    base (`base_layout`, dense and non-overlapping at offset 0), whatever `base`'s own strides:
    each storage position maps to an index of the base, and the view's strides must each step
    along one base dimension without carrying into the next. None when they do not."""
    size, stride, offset = view_layout
    b_size, b_stride = base_layout[0], base_layout[1]
    if tuple(base.shape) == tuple(b_size) and all(n <= 1 or a == b for n, a, b in zip(
            b_size, base.stride(), b_stride, strict=True)):  # eager's layout (a size-1 dim's stride aside)
        return base.as_strided(size, stride, base.storage_offset() + offset)
    start = [(offset // st) % n if n > 1 else 0 for n, st in zip(b_size, b_stride, strict=True)]
    reach = list(start)
    new_stride = []
    for n, st in zip(size, stride, strict=True):
        if n <= 1:
            new_stride.append(0 if n == 1 else 1)
            continue
        dims = [d for d, (bn, bs) in enumerate(zip(b_size, b_stride, strict=True)) if bn > 1 and st % bs == 0
                and st // bs < bn]
        if not dims:
            return None
        d = max(dims, key=lambda d: b_stride[d])
        step = st // b_stride[d]
        reach[d] += (n - 1) * step
        new_stride.append(step * base.stride(d))
    if any(r >= n for r, n in zip(reach, b_size, strict=True) if n > 1):
        return None
    new_offset = base.storage_offset() + sum(i * base.stride(d) for d, i in enumerate(start))
    return base.as_strided(size, new_stride, new_offset)


def _laid_out_for_views(spec: Spec, leaves: list[Any]) -> list[Any]:
    """`leaves`, with each result base that one of its `out_view`s cannot follow (no view of the
    base's own layout has the view's elements, or that view is not contiguous where eager's is:
    a row of a transposed base) replaced by a copy laid out as eager's base. The base and all
    its views then share that copy's storage, as eager's do (one copy, only in this case)."""
    out = leaves
    for s in _out_views(spec):
        base = out[s.index]
        view = view_of_result(base, *s.value)
        if view is not None and (view.is_contiguous() or not _contiguous_layout(*s.value[0][:2])):
            continue
        size, stride = s.value[1][0], s.value[1][1]
        if out is leaves:
            out = list(leaves)
        out[s.index] = torch.empty_strided(size, stride, dtype=base.dtype, device=base.device).copy_(base)
    return out


def _out_views(spec: Spec) -> list[Spec]:
    found: list[Spec] = []

    def go(s: Spec) -> None:
        if s.kind == "out_view":
            found.append(s)
        for k in s.children:
            go(k)

    go(spec)
    return found


def _contiguous_layout(size: tuple, stride: tuple) -> bool:
    expected = 1
    for n, st in reversed(list(zip(size, stride, strict=True))):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def non_plain_consts(spec: Spec) -> list[Any]:
    """The `const` values of `spec` that are not plain Python values (a result of such a type
    cannot be returned by a compiled program: it may hold traced state)."""
    out: list[Any] = []

    def go(s: Spec) -> None:
        if s.kind == "const":
            v = s.value
            plain = isinstance(v, _PLAIN) or (isinstance(v, tuple | list) and all(isinstance(e, _PLAIN) for e in v))
            if not plain:
                out.append(v)
        for k in s.children:
            go(k)

    go(spec)
    return out
