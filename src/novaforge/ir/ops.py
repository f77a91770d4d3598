"""The op table: every IR primitive, defined once with its rules beside it.

Each `OpDef` gives the op's name, arity, attribute schema (with defaults), shape/dtype
inference, reference semantics through torch (`impl`, used by the interpreter and by constant
folding) and flags. Passes read flags, never lists of op names:

* ``elementwise``  one output element depends on the same-index element of each (broadcast)
                   input; all inputs share one dtype except where noted (`where`'s condition).
* ``reduction``    reduces `axes` of its single input (`keepdim` keeps them as size 1).
* ``view``         reindexes its input without computing (reshape, permute, expand, slice):
                   free when folded into a consumer's indexing.
* ``generator``    has no tensor inputs (scalars, fills, iota).
* ``anchor``       a compute-heavy op that fusion builds kernels around (matmul, attention).
* ``random``       draws random numbers (never merged by CSE, never folded).
* ``side_effect``  must run even if unused; never merged or removed.
* ``extern``       an ATen call the compiler does not generate code for; placed and counted.
* ``fused``        a kernel produced by the fuse pass (its body is a Graph).

Invariant: `infer` is total for valid inputs and raises `TypeError`/`ValueError` otherwise;
`impl(inputs, attrs)` on tensors of the inferred input types returns tensors of the inferred
output types (a single tensor or a tuple).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .types import TensorType, broadcast_shapes, is_float, normalize_axis

REQUIRED = object()
Infer = Callable[[Sequence[TensorType], Any], list[TensorType]]
Impl = Callable[[Sequence[torch.Tensor], Any], Any]


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: tuple[int, int | None]
    infer: Infer
    impl: Impl | None
    attrs: dict[str, Any] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()
    flops_per_elem: float = 1.0
    doc: str = ""

    def check_attrs(self, given: dict[str, Any]):  # -> Attrs
        from .graph import Attrs

        unknown = set(given) - set(self.attrs)
        if unknown:
            raise TypeError(f"{self.name}: unknown attributes {sorted(unknown)}")
        out = {}
        for k, default in self.attrs.items():
            if k in given:
                out[k] = given[k]
            elif default is REQUIRED:
                raise TypeError(f"{self.name}: missing attribute {k!r}")
            else:
                out[k] = default
        return Attrs(out)

    def has(self, flag: str) -> bool:
        return flag in self.flags


OPS: dict[str, OpDef] = {}


def _def(name: str, arity, infer: Infer, impl: Impl | None, attrs=None, flags=(), flops=1.0, doc=""):
    if isinstance(arity, int):
        arity = (arity, arity)
    OPS[name] = OpDef(name, arity, infer, impl, dict(attrs or {}), frozenset(flags), flops, doc)


# ----------------------------------------------------------------------------- helpers
def _same_dtype(name: str, ts: Sequence[TensorType]) -> torch.dtype:
    dt = ts[0].dtype
    for t in ts[1:]:
        if t.dtype != dt:
            raise TypeError(f"{name}: operand dtypes differ ({', '.join(str(t) for t in ts)})")
    return dt


def _device(name: str, ts: Sequence[TensorType]) -> str:
    devs = {t.device for t in ts if t.rank > 0} or {t.device for t in ts}
    if len(devs) > 1:
        raise TypeError(f"{name}: operands on different devices {sorted(devs)}")
    return devs.pop()


def _elementwise_infer(name: str, out_dtype: torch.dtype | None = None, float_only: bool = False) -> Infer:
    def infer(ts, a):
        dt = _same_dtype(name, ts)
        if float_only and not is_float(dt):
            raise TypeError(f"{name}: needs a floating-point operand, got {dt}")
        shape = broadcast_shapes(*(t.shape for t in ts))
        return [TensorType(shape, out_dtype or dt, _device(name, ts))]

    return infer


# ------------------------------------------------------------------------- elementwise
def _gelu(x, a):
    return torch.nn.functional.gelu(x, approximate=a["approximate"])


UNARY_FLOAT: dict[str, tuple[Callable, float]] = {
    "exp": (torch.exp, 4), "exp2": (torch.exp2, 4), "log": (torch.log, 4), "log1p": (torch.log1p, 4),
    "log2": (torch.log2, 4), "expm1": (torch.expm1, 4), "sqrt": (torch.sqrt, 2), "rsqrt": (torch.rsqrt, 2),
    "sin": (torch.sin, 8), "cos": (torch.cos, 8), "tan": (torch.tan, 8), "tanh": (torch.tanh, 6),
    "asin": (torch.asin, 8), "acos": (torch.acos, 8), "atan": (torch.atan, 8), "sinh": (torch.sinh, 8),
    "cosh": (torch.cosh, 8), "sigmoid": (torch.sigmoid, 5), "erf": (torch.erf, 8),
    "reciprocal": (torch.reciprocal, 1), "floor": (torch.floor, 1), "ceil": (torch.ceil, 1),
    "round": (torch.round, 1), "trunc": (torch.trunc, 1), "silu": (torch.nn.functional.silu, 6),
}
for _n, (_f, _c) in UNARY_FLOAT.items():
    _def(_n, 1, _elementwise_infer(_n, float_only=True), (lambda f: lambda xs, a: f(xs[0]))(_f),
         flags={"elementwise"}, flops=_c)

_def("gelu", 1, _elementwise_infer("gelu", float_only=True), lambda xs, a: _gelu(xs[0], a),
     attrs={"approximate": "none"}, flags={"elementwise"}, flops=10,
     doc="approximate='none' (erf) or 'tanh'")

UNARY_ANY: dict[str, Callable] = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "relu": torch.relu,
    "bitwise_not": torch.bitwise_not,
}
for _n, _f in UNARY_ANY.items():
    _def(_n, 1, _elementwise_infer(_n), (lambda f: lambda xs, a: f(xs[0]))(_f), flags={"elementwise"})

for _n, _f in {"isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite}.items():
    _def(_n, 1, _elementwise_infer(_n, out_dtype=torch.bool), (lambda f: lambda xs, a: f(xs[0]))(_f),
         flags={"elementwise"})


def _logical_infer(name):
    def infer(ts, a):
        for t in ts:
            if t.dtype != torch.bool:
                raise TypeError(f"{name}: operands must be bool, got {t}")
        return [TensorType(broadcast_shapes(*(t.shape for t in ts)), torch.bool, _device(name, ts))]

    return infer


_def("logical_not", 1, _logical_infer("logical_not"), lambda xs, a: torch.logical_not(xs[0]),
     flags={"elementwise"})

BINARY: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "remainder": torch.remainder,
    "floor_divide": torch.floor_divide, "atan2": torch.atan2,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
}
COMMUTATIVE = {"add", "mul", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
               "eq", "ne", "logical_and", "logical_or", "logical_xor"}
for _n, _f in BINARY.items():
    _fl = {"elementwise"} | ({"commutative"} if _n in COMMUTATIVE else set())
    _def(_n, 2, _elementwise_infer(_n, float_only=_n in ("div", "atan2")),
         (lambda f: lambda xs, a: f(xs[0], xs[1]))(_f), flags=_fl, flops=4 if _n == "pow" else 1)

COMPARE: dict[str, Callable] = {
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}
for _n, _f in COMPARE.items():
    _def(_n, 2, _elementwise_infer(_n, out_dtype=torch.bool), (lambda f: lambda xs, a: f(xs[0], xs[1]))(_f),
         flags={"elementwise"} | ({"commutative"} if _n in COMMUTATIVE else set()))

for _n, _f in {"logical_and": torch.logical_and, "logical_or": torch.logical_or,
               "logical_xor": torch.logical_xor}.items():
    _def(_n, 2, _logical_infer(_n), (lambda f: lambda xs, a: f(xs[0], xs[1]))(_f),
         flags={"elementwise", "commutative"})


def _where_infer(ts, a):
    c, x, y = ts
    if c.dtype != torch.bool:
        raise TypeError(f"where: condition must be bool, got {c}")
    dt = _same_dtype("where", [x, y])
    return [TensorType(broadcast_shapes(c.shape, x.shape, y.shape), dt, _device("where", ts))]


_def("where", 3, _where_infer, lambda xs, a: torch.where(xs[0], xs[1], xs[2]), flags={"elementwise"})


_def("copy", 1, _elementwise_infer("copy"), lambda xs, a: xs[0].clone(memory_format=torch.contiguous_format),
     flags={"elementwise"}, flops=0, doc="materializes its input (a contiguous copy); inserted by fusion")


def _cast_infer(ts, a):
    return [ts[0].with_dtype(a["dtype"])]


_def("cast", 1, _cast_infer, lambda xs, a: xs[0].to(a["dtype"]), attrs={"dtype": REQUIRED},
     flags={"elementwise"}, flops=0)


# -------------------------------------------------------------------------- generators
def _scalar_infer(ts, a):
    return [TensorType((), a["dtype"], a["device"])]


_def("scalar", 0, _scalar_infer,
     lambda xs, a: torch.tensor(a["value"], dtype=a["dtype"], device=a["device"]),
     attrs={"value": REQUIRED, "dtype": REQUIRED, "device": "cpu"}, flags={"generator"}, flops=0,
     doc="a 0-d constant; codegen emits it as a literal")
_def("full", 0, lambda ts, a: [TensorType(tuple(a["shape"]), a["dtype"], a["device"])],
     lambda xs, a: torch.full(a["shape"], a["value"], dtype=a["dtype"], device=a["device"]),
     attrs={"shape": REQUIRED, "value": REQUIRED, "dtype": REQUIRED, "device": "cpu"},
     flags={"generator"}, flops=0)
_def("iota", 0, lambda ts, a: [TensorType((a["length"],), a["dtype"], a["device"])],
     lambda xs, a: (torch.arange(a["length"], dtype=torch.float64 if is_float(a["dtype"]) else torch.int64,
                                 device=a["device"]) * a["step"] + a["start"]).to(a["dtype"]),
     attrs={"length": REQUIRED, "start": 0, "step": 1, "dtype": torch.int64, "device": "cpu"},
     flags={"generator"}, flops=0, doc="start + step * arange(length)")


# -------------------------------------------------------------------------- reductions
def _norm_axes(axes, rank) -> tuple[int, ...]:
    return tuple(sorted({normalize_axis(x, rank) for x in axes}))


def _reduce_infer(name, out_dtype=None):
    def infer(ts, a):
        (t,) = ts
        axes = a["axes"]
        if axes != _norm_axes(axes, t.rank):
            raise ValueError(f"{name}: axes {axes} must be sorted, unique and non-negative")
        if t.rank == 0:
            shape: tuple[int, ...] = ()
        elif a["keepdim"]:
            shape = tuple(1 if i in axes else s for i, s in enumerate(t.shape))
        else:
            shape = tuple(s for i, s in enumerate(t.shape) if i not in axes)
        return [TensorType(shape, out_dtype or t.dtype, t.device)]

    return infer


def _reduce_impl(fn):
    def impl(xs, a):
        x = xs[0]
        axes = a["axes"]
        if x.dim() == 0:
            return x.clone()
        return fn(x, axes, a["keepdim"])

    return impl


def _amax(x, axes, keepdim):  # torch raises only when a reduced axis is empty
    return torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, axes, keepdim):
    return torch.amin(x, dim=axes, keepdim=keepdim)


def _prod(x, axes, keepdim):
    for ax in sorted(axes, reverse=True):
        x = torch.prod(x, dim=ax, keepdim=keepdim, dtype=x.dtype)
    return x


def _sum(x, axes, keepdim):
    return torch.sum(x, dim=axes, keepdim=keepdim, dtype=x.dtype)


REDUCE_ATTRS = {"axes": REQUIRED, "keepdim": False}
_def("sum", 1, _reduce_infer("sum"), _reduce_impl(_sum), attrs=REDUCE_ATTRS, flags={"reduction"},
     doc="accumulates in float32 for 16-bit floats; the output has the input dtype")
_def("prod", 1, _reduce_infer("prod"), _reduce_impl(_prod), attrs=REDUCE_ATTRS, flags={"reduction"})
_def("max", 1, _reduce_infer("max"), _reduce_impl(_amax), attrs=REDUCE_ATTRS, flags={"reduction"})
_def("min", 1, _reduce_infer("min"), _reduce_impl(_amin), attrs=REDUCE_ATTRS, flags={"reduction"})


def _arg_infer(name):
    def infer(ts, a):
        (t,) = ts
        if len(a["axes"]) != 1:
            raise ValueError(f"{name}: exactly one axis")
        return _reduce_infer(name, torch.int64)(ts, a)

    return infer


_def("argmax", 1, _arg_infer("argmax"), lambda xs, a: torch.argmax(xs[0], dim=a["axes"][0], keepdim=a["keepdim"]),
     attrs=REDUCE_ATTRS, flags={"reduction"})
_def("argmin", 1, _arg_infer("argmin"), lambda xs, a: torch.argmin(xs[0], dim=a["axes"][0], keepdim=a["keepdim"]),
     attrs=REDUCE_ATTRS, flags={"reduction"})


def _cumsum_infer(ts, a):
    normalize_axis(a["axis"], ts[0].rank)
    return [ts[0]]


_def("cumsum", 1, _cumsum_infer, lambda xs, a: torch.cumsum(xs[0], a["axis"], dtype=xs[0].dtype),
     attrs={"axis": REQUIRED}, flags={"scan"})


# ------------------------------------------------------------------------------- views
def _reshape_infer(ts, a):
    (t,) = ts
    shape = tuple(a["shape"])
    if math.prod(shape) != t.numel or any(s < 0 for s in shape):
        raise ValueError(f"reshape: {t} cannot be viewed as {shape}")
    return [t.with_shape(shape)]


def _permute_infer(ts, a):
    (t,) = ts
    perm = tuple(a["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise ValueError(f"permute: {perm} is not a permutation of rank {t.rank}")
    return [t.with_shape(tuple(t.shape[p] for p in perm))]


def _expand_infer(ts, a):
    (t,) = ts
    shape = tuple(a["shape"])
    if len(shape) < t.rank:
        raise ValueError(f"expand: {shape} has lower rank than {t}")
    off = len(shape) - t.rank
    for i, s in enumerate(t.shape):
        if s != 1 and s != shape[off + i]:
            raise ValueError(f"expand: {t} to {shape}")
    return [t.with_shape(shape)]


def _slice_len(n: int, start: int, stop: int, step: int) -> int:
    return max(0, (min(stop, n) - start + step - 1) // step) if start < n else 0


def _slice_infer(ts, a):
    (t,) = ts
    ax, start, stop, step = a["axis"], a["start"], a["stop"], a["step"]
    if not (0 <= ax < t.rank and start >= 0 and step >= 1 and start <= max(stop, start)):
        raise ValueError(f"slice: bad attributes {a!r} for {t}")
    shape = list(t.shape)
    shape[ax] = _slice_len(t.shape[ax], start, stop, step)
    return [t.with_shape(tuple(shape))]


def _slice_impl(xs, a):
    idx = [slice(None)] * xs[0].dim()
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return xs[0][tuple(idx)]


_def("reshape", 1, _reshape_infer, lambda xs, a: xs[0].reshape(a["shape"]), attrs={"shape": REQUIRED},
     flags={"view"}, flops=0)
_def("permute", 1, _permute_infer, lambda xs, a: xs[0].permute(a["perm"]), attrs={"perm": REQUIRED},
     flags={"view"}, flops=0)
_def("expand", 1, _expand_infer, lambda xs, a: xs[0].expand(a["shape"]), attrs={"shape": REQUIRED},
     flags={"view"}, flops=0)
_def("slice", 1, _slice_infer, _slice_impl, attrs={"axis": REQUIRED, "start": 0, "stop": REQUIRED, "step": 1},
     flags={"view"}, flops=0, doc="normalized: 0 <= start, stop clamped to the axis length, step >= 1")


# ---------------------------------------------------------------------- data movement
def _cat_infer(ts, a):
    ax = a["axis"]
    base = ts[0]
    dt = _same_dtype("cat", ts)
    total = 0
    for t in ts:
        if t.rank != base.rank or any(t.shape[i] != base.shape[i] for i in range(t.rank) if i != ax):
            raise ValueError(f"cat: incompatible shapes {[str(x) for x in ts]}")
        total += t.shape[ax]
    shape = list(base.shape)
    shape[ax] = total
    return [TensorType(tuple(shape), dt, _device("cat", ts))]


_def("cat", (1, None), _cat_infer, lambda xs, a: torch.cat(list(xs), a["axis"]), attrs={"axis": REQUIRED},
     flops=0)


def _pad_infer(ts, a):
    (t,) = ts
    pads = a["pads"]
    if len(pads) != t.rank:
        raise ValueError("pad: one (before, after) pair per axis")
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(t.shape, pads, strict=True))
    if any(s < 0 for s in shape):
        raise ValueError(f"pad: negative size {shape}")
    return [t.with_shape(shape)]


def _pad_impl(xs, a):
    flat = []
    for lo, hi in reversed(a["pads"]):
        flat += [lo, hi]
    return torch.nn.functional.pad(xs[0], flat, value=a["value"])


_def("pad", 1, _pad_infer, _pad_impl, attrs={"pads": REQUIRED, "value": 0.0}, flops=0,
     doc="constant padding; negative pads crop")


def _scatter_slice_infer(ts, a):
    x, src = ts
    _same_dtype("scatter_slice", ts)
    (expect,) = _slice_infer([x], a)
    if expect.shape != src.shape:
        raise ValueError(f"scatter_slice: source {src} does not match the slice {expect}")
    return [x]


def _scatter_slice_impl(xs, a):
    out = xs[0].clone()
    _slice_impl([out], a).copy_(xs[1])
    return out


_def("scatter_slice", 2, _scatter_slice_infer, _scatter_slice_impl,
     attrs={"axis": REQUIRED, "start": 0, "stop": REQUIRED, "step": 1}, flops=0,
     doc="x with x[..., start:stop:step, ...] (on `axis`) replaced by src (functional slice assignment)")


# ---------------------------------------------------------------------------- indexing
def _check_index(name, t):
    if t.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name}: indices must be int64 or int32, got {t}")


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


_def("take", 2, _take_infer, _take_impl, attrs={"axis": REQUIRED}, flags={"index"}, flops=0,
     doc="x.index_select(axis, idx) with idx of any shape (embedding is take on axis 0); "
         "indices are in range [0, x.shape[axis])")


def _gather_infer(ts, a):
    x, idx = ts
    _check_index("gather", idx)
    if idx.rank != x.rank:
        raise ValueError("gather: index rank must equal input rank")
    return [TensorType(idx.shape, x.dtype, x.device)]


_def("gather", 2, _gather_infer, lambda xs, a: torch.gather(xs[0], a["axis"], xs[1]), attrs={"axis": REQUIRED},
     flags={"index"}, flops=0, doc="torch.gather")


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


_def("index", (2, None), _index_infer, _index_impl, attrs={"axes": REQUIRED}, flags={"index"}, flops=0,
     doc="advanced indexing x[..., i0, ..., i1, ...] with index tensors on `axes` (numpy placement rules)")


def _scatter_add_infer(ts, a):
    x, idx, src = ts
    _check_index("scatter_add", idx)
    _same_dtype("scatter_add", [x, src])
    return [x]


_def("scatter_add", 3, _scatter_add_infer,
     lambda xs, a: torch.scatter_add(xs[0], a["axis"], xs[1], xs[2]), attrs={"axis": REQUIRED},
     flags={"index"}, doc="torch.scatter_add")


# ----------------------------------------------------------------------------- anchors
def _matmul_infer(ts, a):
    x, y = ts
    dt = _same_dtype("matmul", ts)
    if x.rank < 2 or y.rank < 2:
        raise ValueError(f"matmul: operands need rank >= 2, got {x} and {y}")
    if x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {x} @ {y}")
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return [TensorType(batch + (x.shape[-2], y.shape[-1]), dt, _device("matmul", ts))]


def _matmul_flops(ins: Sequence[TensorType], outs: Sequence[TensorType]) -> float:
    return 2.0 * outs[0].numel * ins[0].shape[-1]


_def("matmul", 2, _matmul_infer, lambda xs, a: torch.matmul(xs[0], xs[1]), flags={"anchor"},
     doc="batched matmul [..., M, K] @ [..., K, N] with broadcast batch dimensions")


def _attention_infer(ts, a):
    q, k, v = ts[:3]
    dt = _same_dtype("attention", [q, k, v])
    if not is_float(dt) or q.rank < 3 or k.rank != q.rank or v.rank != q.rank:
        raise TypeError(f"attention: q, k, v must be float tensors of equal rank >= 3: {q}, {k}, {v}")
    hq, hk = q.shape[-3], k.shape[-3]
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or hk != v.shape[-3] or hk == 0 or hq % hk:
        raise ValueError(f"attention: incompatible shapes q={q} k={k} v={v}")
    out = TensorType(q.shape[:-1] + (v.shape[-1],), dt, q.device)
    if len(ts) == 4:
        m = ts[3]
        if m.dtype != torch.bool and m.dtype != dt:
            raise TypeError(f"attention: mask must be bool or {dt}, got {m}")
        broadcast_shapes(m.shape, q.shape[:-1] + (k.shape[-2],))
    if a["causal"] and len(ts) == 4:
        raise ValueError("attention: causal and an explicit mask are exclusive")
    return [out]


def _attention_impl(xs, a):
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) == 4 else None
    gqa = q.shape[-3] != k.shape[-3]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=a["causal"], scale=a["scale"], enable_gqa=gqa)


_def("attention", (3, 4), _attention_infer, _attention_impl, attrs={"scale": REQUIRED, "causal": False},
     flags={"anchor"},
     doc="softmax(q k^T * scale + mask) v; q [..., Hq, L, E], k [..., Hk, S, E], v [..., Hk, S, Ev], "
         "Hq % Hk == 0 (grouped-query heads); mask bool (True keeps) or additive float, broadcast to "
         "[..., Hq, L, S]; causal uses the top-left aligned lower triangle")


def attention_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], causal: bool) -> float:
    q, k, v = ins[:3]
    f = 2.0 * q.numel * k.shape[-2] + 2.0 * outs[0].numel * k.shape[-2]
    return f / 2 if causal else f


# ------------------------------------------------------------------------------ extern
def _extern_infer(ts, a):
    return list(a["out_types"])


def _extern_impl(xs, a):
    from .extern import call_extern

    return call_extern(a["target"], a["spec"], xs)


_def("extern", (0, None), _extern_infer, _extern_impl,
     attrs={"target": REQUIRED, "spec": REQUIRED, "out_types": REQUIRED, "reason": ""},
     flags={"extern"}, doc="an ATen call kept as is (see ir/extern.py); counted and reported")
_def("extern_effect", (0, None), _extern_infer, _extern_impl,
     attrs={"target": REQUIRED, "spec": REQUIRED, "out_types": REQUIRED, "reason": ""},
     flags={"extern", "side_effect", "random"},
     doc="an ATen call with randomness or side effects: never merged, folded or removed")


# ------------------------------------------------------------------------------- fused
def _kernel_infer(ts, a):
    k = a["kernel"]
    want = [gi.value.type for gi in k.body.inputs]
    if list(ts) != want:
        raise TypeError(f"kernel {k.name}: input types {[str(t) for t in ts]} != {[str(t) for t in want]}")
    return [v.type for v in k.body.outputs]


_def("kernel", (0, None), _kernel_infer, None, attrs={"kernel": REQUIRED}, flags={"fused"}, flops=0,
     doc="a fused group from the fuse pass; attrs['kernel'] is an ir.kernel.Kernel")


def node_flops(op: str, ins: Sequence[TensorType], outs: Sequence[TensorType], attrs) -> float:
    """Floating-point work of one op (pointwise ops count `flops_per_elem` per output element)."""
    if op == "matmul":
        return _matmul_flops(ins, outs)
    if op == "attention":
        return attention_flops(ins, outs, attrs["causal"])
    d = OPS[op]
    if d.has("reduction"):
        return float(ins[0].numel)
    return d.flops_per_elem * sum(t.numel for t in outs)
