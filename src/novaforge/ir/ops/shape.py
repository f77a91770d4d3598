"""Shape ops: the four views (reshape, permute, expand, slice) and data movement (cat, pad,
scatter_slice).

Every ATen view becomes one of the four IR views with normalized attributes; the ATen output
shape from the FX node's fake value is the authority for shapes with -1 or omitted
dimensions. Slices are normalized to 0 <= start <= stop <= length, step >= 1.

Invariant: views compute nothing (`view` flag): a kernel folds them into its indexing
(ir/views.py gives their strided form); cat, pad and scatter_slice copy data.
"""

from __future__ import annotations

import math

import torch

from ..symbolic import provably, size_arg
from ..types import TensorType
from .core import REQUIRED, bound_of, define, device_of, same_dtype

aten = torch.ops.aten
FAMILY = "shape"


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


def _same_shape(n) -> bool:
    return n.inputs[0].type.shape == n.outputs[0].type.shape


_first = bound_of(0)


reshape = define("reshape", 1, _reshape_infer, lambda xs, a: xs[0].reshape(a["shape"]), attrs={"shape": REQUIRED},
                 flags={"view"}, flops=0, family=FAMILY, returns_input=_same_shape, abs_bound=_first)


@reshape.lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
                aten.unflatten.int, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
                aten.unsqueeze.default, aten.view_as.default, aten.reshape_as.default)
def _lower_to_out_shape(ctx, x, *args, **kwargs):
    return ctx.reshape(ctx.val(x), ctx.out_type.shape)


permute = define("permute", 1, _permute_infer, lambda xs, a: xs[0].permute(a["perm"]), attrs={"perm": REQUIRED},
                 flags={"view"}, flops=0, family=FAMILY, abs_bound=_first,
                 returns_input=lambda n: tuple(n.attrs["perm"]) == tuple(range(len(n.attrs["perm"]))))


@permute.lowers(aten.permute.default)
def _lower_permute(ctx, x, dims):
    v = ctx.val(x)
    return ctx.permute(v, [ctx.axis(d, v.type.rank) for d in dims])


@permute.lowers(aten.transpose.int, aten.swapaxes.default)
def _lower_transpose(ctx, x, d0, d1):
    v = ctx.val(x)
    r = v.type.rank
    if r < 2:
        return v
    perm = list(range(r))
    a, b = ctx.axis(d0, r), ctx.axis(d1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.permute(v, perm)


@permute.lowers(aten.t.default, aten.numpy_T.default)
def _lower_t(ctx, x):
    v = ctx.val(x)
    return ctx.permute(v, list(range(v.type.rank))[::-1])


@permute.lowers(aten.movedim.int)
def _lower_movedim(ctx, x, src, dst):
    v = ctx.val(x)
    r = v.type.rank
    perm = [i for i in range(r) if i != ctx.axis(src, r)]
    perm.insert(ctx.axis(dst, r), ctx.axis(src, r))
    return ctx.permute(v, perm)


expand = define("expand", 1, _expand_infer, lambda xs, a: xs[0].expand(a["shape"]), attrs={"shape": REQUIRED},
                flags={"view"}, flops=0, family=FAMILY, returns_input=_same_shape, abs_bound=_first)


@expand.lowers(aten.expand.default, aten.expand_as.default, aten.broadcast_to.default)
def _lower_expand(ctx, x, *args, **kwargs):
    return ctx.expand(ctx.val(x), ctx.out_type.shape)


slice_ = define("slice", 1, _slice_infer, _slice_impl,
                attrs={"axis": REQUIRED, "start": 0, "stop": REQUIRED, "step": 1}, flags={"view"}, flops=0,
                doc="normalized: 0 <= start, stop clamped to the axis length, step >= 1", family=FAMILY,
                abs_bound=_first, returns_input=lambda n: n.attrs["start"] == 0 and n.attrs["step"] == 1
                and provably(lambda: n.attrs["stop"] >= n.inputs[0].type.shape[n.attrs["axis"]]))


def slice_value(ctx, v, axis: int, start: int | None, end: int | None, step: int = 1):
    """v[..., start:end:step, ...] along `axis` with ATen's clamping of start and end."""
    n = v.type.shape[axis]
    start = 0 if start is None else size_arg(start)
    end = n if end is None else size_arg(end)
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    if step < 1:
        raise ctx.unsupported(f"slice step {step} must be positive")
    if start == 0 and step == 1 and provably(lambda: end == n):
        return v
    return ctx.emit("slice", [v], axis=axis, start=start, stop=end, step=int(step))


def select_value(ctx, v, axis: int, index: int):
    n = v.type.shape[axis]
    if index < 0:
        index += n
    s = slice_value(ctx, v, axis, index, index + 1)
    shape = v.type.shape[:axis] + v.type.shape[axis + 1:]
    return ctx.reshape(s, shape)


@slice_.lowers(aten.slice.Tensor)
def _lower_slice(ctx, x, dim=0, start=None, end=None, step=1):
    v = ctx.val(x)
    return slice_value(ctx, v, ctx.axis(dim, v.type.rank), start, end, step)


@slice_.lowers(aten.narrow.default)
def _lower_narrow(ctx, x, dim, start, length):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    if start < 0:
        start += v.type.shape[ax]
    return slice_value(ctx, v, ax, start, start + length)


@slice_.lowers(aten.select.int)
def _lower_select(ctx, x, dim, index):
    v = ctx.val(x)
    return select_value(ctx, v, ctx.axis(dim, v.type.rank), index)


@slice_.lowers(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.tensor_split.sections,
               aten.unsafe_split.Tensor)
def _lower_split(ctx, x, *args, **kwargs):
    v = ctx.val(x)
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ax = ctx.axis(dim, v.type.rank)
    outs, start = [], 0
    for s in [t.shape[ax] for t in ctx.out_types]:
        outs.append(slice_value(ctx, v, ax, start, start + s))
        start += s
    return tuple(outs)


@slice_.lowers(aten.unbind.int)
def _lower_unbind(ctx, x, dim=0):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    return tuple(select_value(ctx, v, ax, i) for i in range(v.type.shape[ax]))


# ---------------------------------------------------------------------- data movement
def _cat_infer(ts, a):
    ax = a["axis"]
    base = ts[0]
    dt = same_dtype("cat", ts)
    total = 0
    for t in ts:
        if t.rank != base.rank or any(t.shape[i] != base.shape[i] for i in range(t.rank) if i != ax):
            raise ValueError(f"cat: incompatible shapes {[str(x) for x in ts]}")
        total += t.shape[ax]
    shape = list(base.shape)
    shape[ax] = total
    return [TensorType(tuple(shape), dt, device_of("cat", ts))]


cat = define("cat", (1, None), _cat_infer, lambda xs, a: torch.cat(list(xs), a["axis"]), attrs={"axis": REQUIRED},
             flops=0, family=FAMILY, returns_input=lambda n: len(n.inputs) == 1)


@cat.lowers(aten.cat.default, aten.concat.default, aten.concatenate.default)
def _lower_cat(ctx, tensors, dim=0):
    t = ctx.out_type
    vals = [ctx.cast(ctx.val(a), t.dtype) for a in tensors]
    vals = [v for v in vals if not (v.type.rank == 1 and v.type.shape[0] == 0 and t.rank != 1)]
    ax = ctx.axis(dim, t.rank)
    vals = [v for v in vals if v.type.shape[ax] > 0] or vals[:1]
    if len(vals) == 1:
        return ctx.reshape(vals[0], t.shape)
    return ctx.emit("cat", vals, axis=ax)


@cat.lowers(aten.stack.default)
def _lower_stack(ctx, tensors, dim=0):
    t = ctx.out_type
    ax = ctx.axis(dim, t.rank)
    vals = []
    for a in tensors:
        v = ctx.cast(ctx.val(a), t.dtype)
        vals.append(ctx.reshape(v, v.type.shape[:ax] + (1,) + v.type.shape[ax:]))
    return vals[0] if len(vals) == 1 else ctx.emit("cat", vals, axis=ax)


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


pad = define("pad", 1, _pad_infer, _pad_impl, attrs={"pads": REQUIRED, "value": 0.0}, flops=0,
             doc="constant padding; negative pads crop", family=FAMILY)


@pad.lowers(aten.constant_pad_nd.default)
def _lower_constant_pad(ctx, x, pad, value=0):
    v = ctx.val(x)
    r = v.type.rank
    pairs = [(0, 0)] * r
    for i in range(len(pad) // 2):
        pairs[r - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if all(p == (0, 0) for p in pairs):
        return v
    return ctx.emit("pad", [v], pads=tuple(pairs), value=float(value))


@pad.lowers(aten.pad.default)
def _lower_pad(ctx, x, pad, mode="constant", value=None):
    if mode != "constant":
        return ctx.extern(f"{mode} padding")
    return _lower_constant_pad(ctx, x, pad, 0 if value is None else value)


def _scatter_slice_infer(ts, a):
    x, src = ts
    same_dtype("scatter_slice", ts)
    (expect,) = _slice_infer([x], a)
    if expect.shape != src.shape:
        raise ValueError(f"scatter_slice: source {src} does not match the slice {expect}")
    return [x]


def _scatter_slice_impl(xs, a):
    out = xs[0].clone()
    _slice_impl([out], a).copy_(xs[1])
    return out


scatter_slice = define("scatter_slice", 2, _scatter_slice_infer, _scatter_slice_impl,
                       attrs={"axis": REQUIRED, "start": 0, "stop": REQUIRED, "step": 1}, flops=0,
                       doc="x with x[..., start:stop:step, ...] (on `axis`) replaced by src (functional slice "
                           "assignment)", family=FAMILY)


@scatter_slice.lowers(aten.slice_scatter.default)
def _lower_slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    n = v.type.shape[ax]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    end = max(end, start)
    s = ctx.cast(ctx.val(src), v.type.dtype)
    return ctx.emit("scatter_slice", [v, s], axis=ax, start=start, stop=end, step=step)


@scatter_slice.lowers(aten.select_scatter.default)
def _lower_select_scatter(ctx, x, src, dim, index):
    v = ctx.val(x)
    ax = ctx.axis(dim, v.type.rank)
    n = v.type.shape[ax]
    index = index + n if index < 0 else index
    s = ctx.cast(ctx.val(src), v.type.dtype)
    s = ctx.reshape(s, v.type.shape[:ax] + (1,) + v.type.shape[ax + 1:])
    return ctx.emit("scatter_slice", [v, s], axis=ax, start=index, stop=index + 1, step=1)


# ---------------------------------------------------------------------------- VJP rules
reshape.defvjp(lambda b, n, cts: [b.reshape(cts[0], n.inputs[0].type.shape)])
expand.defvjp(lambda b, n, cts: [b.unbroadcast(cts[0], n.inputs[0].type.shape)])


@permute.defvjp
def _permute_vjp(b, n, cts):
    perm = n.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [b.emit("permute", [cts[0]], perm=tuple(inverse))]


def _slice_attrs(n):
    return {k: n.attrs[k] for k in ("axis", "start", "stop", "step")}


@slice_.defvjp
def _slice_vjp(b, n, cts):  # the cotangent scattered into zeros
    return [b.emit("scatter_slice", [b.zeros(n.inputs[0].type), cts[0]], **_slice_attrs(n))]


@cat.defvjp
def _cat_vjp(b, n, cts):
    ax = n.attrs["axis"]
    out, lo = [], 0
    for v in n.inputs:
        hi = lo + v.type.shape[ax]
        out.append(b.emit("slice", [cts[0]], axis=ax, start=lo, stop=hi, step=1))
        lo = hi
    return out


@pad.defvjp
def _pad_vjp(b, n, cts):  # padding by the negated pads crops what was padded and pads what was cropped
    return [b.emit("pad", [cts[0]], pads=tuple((-lo, -hi) for lo, hi in n.attrs["pads"]), value=0.0)]


@scatter_slice.defvjp
def _scatter_slice_vjp(b, n, cts):
    (g,) = cts
    src = n.inputs[1]
    return [b.emit("scatter_slice", [g, b.zeros(src.type)], **_slice_attrs(n)),
            b.emit("slice", [g], **_slice_attrs(n))]
