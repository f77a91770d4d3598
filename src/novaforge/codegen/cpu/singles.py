"""Generated single-node kernels: embedding gathers (`take`), `gather`, `scatter_add`, `cat`.

* take(x, idx, axis): out[o, j, e] = x[o, idx[j], e] (idx a buffer, or an iota computed in
  place); rows of contiguous elements are copied with memcpy; indices are checked (out of
  range makes the kernel return 1, which the runtime raises as an IndexError, as torch does),
  rows in parallel when the copy is large.
* cat(x0, x1, ..., axis): one strided copy loop per input into its slice of the output
  (rendered by the pointwise loop renderer with an output offset).

* scatter_add(x, idx, src, axis): out = x, then each src element added at its index, the
  threads owning distinct output elements (see `plan_scatter_add`).
* argmax / argmin over one axis (`plan_arg_reduction`: torch's first index, NaN first).
* index_copy_ of a mutated input on its own buffer (`plan_index_copy_inplace`: a KV cache's
  rows; the rest of the buffer is not touched).

Invariant: the functions write every element of their output exactly once from the element
torch would select (scatter_add: x's element plus, in index order, every src element scattered
to it), or report an out-of-range index without writing garbage silently.
"""

from __future__ import annotations

import math

import torch

from ...ir import OPS, Kernel, Value
from ...ir.symbolic import hint
from ...ir.types import TensorType, contiguous_strides
from ...ir.views import Strided
from ...schedule.cpu import KernelShape, configure
from ...schedule.target import CpuTarget
from .analysis import BodyInfo, Leaf, Store, Unsupported, operand
from .cexpr import check_dtype, literal, load_expr, storage_type, store_expr
from .loops import Code, GenKernel, coalesce, function_name, pointwise_loops, render_pointwise, signature


def _node(kernel: Kernel, op: str):
    nodes = [n for n in kernel.body.nodes if not OPS[n.op].has("view") and not OPS[n.op].has("generator")]
    if len(nodes) != 1 or nodes[0].op != op:
        raise Unsupported(f"{op} kernel with extra nodes")
    if kernel.body.outputs != (nodes[0].outputs[0],) and list(kernel.body.outputs) != [nodes[0].outputs[0]]:
        raise Unsupported(f"{op} kernel output is a view")
    return nodes[0]


def _iota_index(body, v: Value) -> tuple | None:
    """(start, step) when `v` is an integer `iota` seen through reshapes (element j of its flat
    order is start + step * j: `take(table, arange(n))`, the position embeddings of a graph
    with symbolic sizes), else None."""
    producer = {o: m for m in body.nodes for o in m.outputs}
    while v in producer and producer[v].op == "reshape":
        v = producer[v].inputs[0]
    m = producer.get(v)
    if m is None or m.op != "iota" or m.attrs["dtype"] not in (torch.int64, torch.int32):
        return None
    return m.attrs["start"], m.attrs["step"]


def plan_take(kernel: Kernel, target: CpuTarget) -> GenKernel:
    body = kernel.body
    n = _node(kernel, "take")
    x = operand(body, n.inputs[0])
    iota = _iota_index(body, n.inputs[1])
    idx = operand(body, n.inputs[1]) if iota is None else _IotaOperand(n.inputs[1].type.shape)
    check_dtype(x.dtype)
    ax = n.attrs["axis"]
    xs, xst = x.layout.shape, x.layout.strides
    outer_dims = coalesce(list(range(ax)), xs, [xst])
    inner_dims = coalesce(list(range(ax + 1, len(xs))), xs, [xst])
    idx_dims = coalesce(list(range(len(idx.layout.shape))), idx.layout.shape, [idx.layout.strides])
    outer = math.prod(n for n, _ in outer_dims)
    inner = math.prod(n for n, _ in inner_dims)
    nidx = math.prod(idx.layout.shape)
    n_args = len(body.inputs) + 1
    itemsize = TensorType((), x.dtype).itemsize
    nbytes = 2.0 * hint(outer * nidx * inner) * itemsize
    sched = configure(KernelShape("pointwise", outer=outer * nidx, inner=inner, bytes=nbytes), target)
    name = function_name(kernel.structural_key, sched, "g")
    xa = xs[ax]
    st = storage_type(x.dtype)
    it = storage_type(idx.dtype)
    out_p = f"p{len(body.inputs)}"

    def offset_expr(code: Code, var: str, dims, base: int, name: str) -> None:
        """name = base + the strided offset of flat index `var` over dims (outer to inner)."""
        code(f"int64_t {name} = {base};")
        if dims:
            code.open("")
            code(f"int64_t r_ = {var};")
            for n, (st0,) in reversed(dims):
                code(f"{name} += (r_ % {n}) * {st0}; r_ /= {n};")
            code.close()

    def render() -> str:
        code = Code()
        code.open(f"static int {name}({signature(n_args)})")
        code(f"const {st}* x = (const {st}*)p{x.buf};")
        if iota is None:
            code(f"const {it}* ix = (const {it}*)p{idx.buf};")
        code(f"{st}* out = ({st}*){out_p};")
        total = outer * nidx
        if total == 0 or inner == 0:
            return _finish(code, "0")
        code("int err = 0;")
        if sched.threads > 1:
            code(f"#pragma omp parallel for num_threads({sched.threads}) schedule(static) reduction(|:err)")
        code.open(f"for (int64_t t = 0; t < {total}; t++)")
        code(f"const int64_t o = t / {nidx}, j = t % {nidx};")
        if iota is None:
            offset_expr(code, "j", [(n, tuple(sts)) for n, sts in idx_dims], idx.layout.offset, "io")
            code("const int64_t k = (int64_t)ix[io];")
        else:  # an iota index, computed
            code(f"const int64_t k = {iota[0]} + {iota[1]} * j;")
        code.open(f"if (k < 0 || k >= {xa})")
        code("err = 1;")
        code("continue;")
        code.close()
        offset_expr(code, "o", [(n, tuple(sts)) for n, sts in outer_dims], x.layout.offset, "xo")
        code(f"const {st}* src = x + xo + k * {xst[ax]};")
        code(f"{st}* dst = out + t * {inner};")
        if not inner_dims or (len(inner_dims) == 1 and inner_dims[0][1][0] == 1):
            code(f"std::memcpy(dst, src, {inner * itemsize});")
        else:
            code("int64_t e = 0;")
            for d, (n, _) in enumerate(inner_dims):
                code.open(f"for (int64_t e{d} = 0; e{d} < {n}; e{d}++)")
            terms = " + ".join(f"e{d} * {sts[0]}" for d, (_, sts) in enumerate(inner_dims))
            code(f"dst[e++] = src[{terms}];")
            for _ in inner_dims:
                code.close()
        code.close()
        return _finish(code, "err")

    return GenKernel(name, n_args, render, sched, f"{kernel.structural_key}|{sched.key()}")


def plan_cat(kernel: Kernel, target: CpuTarget) -> GenKernel:
    body = kernel.body
    n = _node(kernel, "cat")
    out_t = n.outputs[0].type
    check_dtype(out_t.dtype)
    ax = n.attrs["axis"]
    out_strides = contiguous_strides(out_t.shape)
    parts = []
    start = 0
    for v in n.inputs:
        op = operand(body, v)
        shape = op.layout.shape
        leaf_v = Value(TensorType(shape, op.dtype))
        info = BodyInfo(tuple(shape), ())
        info.leaves[leaf_v] = Leaf("load", op.dtype, buf=0,
                                   strides=tuple(0 if s == 1 else st for s, st in zip(shape, op.layout.strides,
                                                                                        strict=True)),
                                   offset=op.layout.offset)
        info.shapes[leaf_v] = tuple(shape)
        info.stores.append(Store(0, leaf_v, tuple(0 if s == 1 else st for s, st in zip(shape, out_strides,
                                                                                        strict=True)),
                                 out_t.dtype, offset=start * out_strides[ax] if math.prod(shape) else 0))
        outer, inner = pointwise_loops(info)
        nbytes = 2.0 * hint(math.prod(shape)) * out_t.itemsize
        sched = configure(KernelShape("pointwise", outer=outer, inner=inner, bytes=nbytes), target)
        parts.append((op.buf, info, sched))
        start += shape[ax]
    key = kernel.structural_key + "|" + ";".join(s.key() for _, _, s in parts)
    name = function_name(key, parts[0][2], "c")
    n_args = len(body.inputs) + 1

    def render() -> str:
        chunks = []
        calls = Code()
        calls.open(f"static int {name}({signature(n_args)})")
        calls("int rc;")
        for i, (buf, info, sched) in enumerate(parts):
            pname = f"{name}_part{i}"
            chunks.append(render_pointwise(pname, [out_t.dtype], [out_t.dtype], info, sched))
            calls(f"if ((rc = {pname}(p{buf}, p{n_args - 1}, nf_sym))) return rc;")
        calls("return 0;")
        calls.close()
        return "".join(chunks) + calls.text()

    return GenKernel(name, n_args, render, parts[0][2], key)


def plan_gather(kernel: Kernel, target: CpuTarget) -> GenKernel:
    """torch.gather: out[i] = x[i with i[axis] := idx[i]] over idx's shape (flat loop, div/mod indexing)."""
    body = kernel.body
    n = _node(kernel, "gather")
    x, idx = operand(body, n.inputs[0]), operand(body, n.inputs[1])
    check_dtype(x.dtype)
    ax = n.attrs["axis"]
    shape = idx.layout.shape
    numel = math.prod(shape)
    itemsize = TensorType((), x.dtype).itemsize
    sched = configure(KernelShape("pointwise", outer=1, inner=numel, bytes=3.0 * hint(numel) * itemsize), target)
    name = function_name(kernel.structural_key, sched, "g")
    n_args = len(body.inputs) + 1
    st, it = storage_type(x.dtype), storage_type(idx.dtype)

    def render() -> str:
        code = Code()
        code.open(f"static int {name}({signature(n_args)})")
        code(f"const {st}* x = (const {st}*)p{x.buf};")
        code(f"const {it}* ix = (const {it}*)p{idx.buf};")
        code(f"{st}* out = ({st}*)p{n_args - 1};")
        if numel == 0:
            return _finish(code, "0")
        code("int err = 0;")
        if sched.threads > 1:
            code(f"#pragma omp parallel for num_threads({sched.threads}) schedule(static) reduction(|:err)")
        code.open(f"for (int64_t t = 0; t < {numel}; t++)")
        code("int64_t r_ = t;")
        code(f"int64_t io = {idx.layout.offset}, xo = {x.layout.offset};")
        for d in range(len(shape) - 1, -1, -1):
            code(f"const int64_t i{d} = r_ % {shape[d]}; r_ /= {shape[d]};")
            code(f"io += i{d} * {idx.layout.strides[d]};")
            if d != ax:
                code(f"xo += i{d} * {x.layout.strides[d]};")
        code("const int64_t k = (int64_t)ix[io];")
        code.open(f"if (k < 0 || k >= {x.layout.shape[ax]})")
        code("err = 1;")
        code("continue;")
        code.close()
        code(f"out[t] = x[xo + k * {x.layout.strides[ax]}];")
        code.close()
        return _finish(code, "err")

    return GenKernel(name, n_args, render, sched, f"{kernel.structural_key}|{sched.key()}")




def plan_scatter_add(kernel: Kernel, target: CpuTarget) -> GenKernel:
    """torch.scatter_add: out = x, then out[i with i[axis] := idx[i]] += src[i] for every i of
    idx's shape. The threads split idx's positions along its other axes: each owns distinct
    output elements (their coordinates off the axis are the index's own), so no two threads add
    into one element; each walks the axis in order. An index outside [0, x.shape[axis]) makes
    the kernel return 1 (raised as an IndexError)."""
    body = kernel.body
    producer = {o: m for m in body.nodes for o in m.outputs}
    nodes = [m for m in body.nodes if not OPS[m.op].has("view")]
    n = nodes[-1] if nodes else None
    if n is None or n.op != "scatter_add" or list(body.outputs) != [n.outputs[0]]:
        raise Unsupported("scatter_add kernel with extra nodes, or whose output is a view")
    fill, src_fill = _fill_of(producer, n.inputs[0]), _fill_of(producer, n.inputs[2])  # made in the kernel
    if any(all(f is None or m is not f[1] for f in (fill, src_fill)) for m in nodes[:-1]):
        raise Unsupported("scatter_add kernel with extra nodes")
    idx = operand(body, n.inputs[1])
    x = operand(body, n.inputs[0]) if fill is None else None
    src = operand(body, n.inputs[2]) if src_fill is None else None
    dtype = n.outputs[0].type.dtype
    if dtype == torch.bool:
        raise Unsupported("scatter_add of bool is not generated")
    check_dtype(dtype)
    ax = n.attrs["axis"]
    shape, out_shape = idx.layout.shape, n.outputs[0].type.shape
    if not shape or len(out_shape) != len(shape):
        raise Unsupported("scatter_add of a 0-d index")
    out_strides = contiguous_strides(out_shape)
    numel, out_numel = math.prod(shape), math.prod(out_shape)
    others = [d for d in range(len(shape)) if d != ax]
    positions = math.prod(shape[d] for d in others)
    along = shape[ax]
    itemsize = TensorType((), dtype).itemsize
    sched = configure(KernelShape("pointwise", outer=1, inner=max(hint(positions), hint(out_numel)),
                                  bytes=(2.0 * hint(out_numel) + 3.0 * hint(numel)) * itemsize), target)
    name = function_name(kernel.structural_key, sched, "s")
    n_args = len(body.inputs) + 1
    st, it = storage_type(dtype), storage_type(idx.dtype)
    par = f"#pragma omp parallel for num_threads({sched.threads}) schedule(static)" if sched.threads > 1 else ""

    def render() -> str:
        code = Code()
        code.open(f"static int {name}({signature(n_args)})")
        if x is not None:
            code(f"const {st}* x = (const {st}*)p{x.buf};")
        code(f"const {it}* ix = (const {it}*)p{idx.buf};")
        if src is not None:
            code(f"const {st}* src = (const {st}*)p{src.buf};")
        code(f"{st}* out = ({st}*)p{n_args - 1};")
        if out_numel == 0:
            return _finish(code, "0")
        if par:
            code(par)
        code.open(f"for (int64_t t = 0; t < {out_numel}; t++)")  # out = x (x in its own strides), or the fill
        if x is None:
            code(f"out[t] = {store_expr(literal(fill[0], dtype), dtype)};")
        else:
            code(f"int64_t r_ = t, xo = {x.layout.offset};")
            for d in range(len(out_shape) - 1, -1, -1):
                code(f"xo += (r_ % {out_shape[d]}) * {x.layout.strides[d]}; r_ /= {out_shape[d]};")
            code("out[t] = x[xo];")
        code.close()
        if numel == 0:
            return _finish(code, "0")
        code("int err = 0;")
        src_strides = src.layout.strides if src is not None else (0,) * len(shape)
        add_at = (load_expr(f"src[so + j * {src_strides[ax]}]", dtype) if src is not None
                  else literal(src_fill[0], dtype))
        if ax == 0 and len(shape) == 2:
            # rows outer, each thread's run of columns inner (an embedding's backward: idx [tokens, dim]
            # expanded along dim): contiguous rows of src and out, where the column-by-column walk
            # touched a new cache line per element; every element still adds in index order
            chunk = -(-hint(shape[1]) // max(1, sched.threads) // 16) * 16 or 16
            if par:
                code(par.replace("schedule(static)", "schedule(static) reduction(|:err)"))
            code.open(f"for (int64_t c0 = 0; c0 < {shape[1]}; c0 += {chunk})")
            code(f"const int64_t c1 = c0 + {chunk} < {shape[1]} ? c0 + {chunk} : {shape[1]};")
            code.open(f"for (int64_t j = 0; j < {along} && !err; j++)")
            code.open("for (int64_t c = c0; c < c1; c++)")
            code(f"const int64_t k = (int64_t)ix[{idx.layout.offset} + j * {idx.layout.strides[0]} + c * "
                 f"{idx.layout.strides[1]}];")
            code.open(f"if (k < 0 || k >= {out_shape[0]})")
            code("err = 1;")
            code("break;")
            code.close()
            code(f"const int64_t so = {src.layout.offset if src is not None else 0} + c * {src_strides[1]};")
            code(f"{st}& o_ = out[k * {out_strides[0]} + c];")
            total_at = f"{load_expr('o_', dtype)} + {add_at}"
            code(f"o_ = {store_expr(total_at, dtype)};")
            code.close()
            code.close()
            code.close()
            return _finish(code, "err")
        if par:
            code(par.replace("schedule(static)", "schedule(static) reduction(|:err)"))
        code.open(f"for (int64_t t = 0; t < {positions}; t++)")
        code(f"int64_t r_ = t, io = {idx.layout.offset}, so = {src.layout.offset if src is not None else 0}, oo = 0;")
        for d in reversed(others):
            code(f"const int64_t i{d} = r_ % {shape[d]}; r_ /= {shape[d]};")
            code(f"io += i{d} * {idx.layout.strides[d]}; so += i{d} * {src_strides[d]}; "
                 f"oo += i{d} * {out_strides[d]};")
        a_idx, a_src, a_out = idx.layout.strides[ax], src_strides[ax], out_strides[ax]
        code.open(f"for (int64_t j = 0; j < {along}; j++)")
        code(f"const int64_t k = (int64_t)ix[io + j * {a_idx}];")
        code.open(f"if (k < 0 || k >= {out_shape[ax]})")
        code("err = 1;")
        code("break;")
        code.close()
        add = load_expr(f"src[so + j * {a_src}]", dtype) if src is not None else literal(src_fill[0], dtype)
        # each addition rounds to the dtype, in index order, as ATen's CPU kernel adds
        code(f"{st}& o_ = out[oo + k * {a_out}];")
        total = f"{load_expr('o_', dtype)} + {add}"
        code(f"o_ = {store_expr(total, dtype)};")
        code.close()
        code.close()
        return _finish(code, "err")

    return GenKernel(name, n_args, render, sched, f"{kernel.structural_key}|{sched.key()}")


class _IotaOperand:
    """The index operand of a take whose indices are an iota (no buffer: see `_iota_index`)."""

    def __init__(self, shape: tuple) -> None:
        self.layout = Strided.contiguous(shape)
        self.dtype = torch.int64


def plan_index_copy_inplace(kernel: Kernel, target: CpuTarget, spec_args: tuple) -> GenKernel:
    """A mutated input's `index_copy_(dim, index, source)` on the input's own buffer (a KV
    cache's new rows; the backend picks it only where the kernel's output is that buffer):
    out[..., index[j], ...] = source[..., j, ...] along `dim`, nothing else written. Indices are
    checked first: one outside [0, x.shape[dim]) makes the kernel return 1 before any write
    (raised as an IndexError, as eager raises). `spec_args` are the extern's decoded arguments
    with each tensor operand as its position among the extern's inputs (ints)."""
    body = kernel.body
    ext = next(m for m in body.nodes if m.op in ("extern", "extern_effect"))
    if len(spec_args) != 4 or not all(isinstance(spec_args[k], int) for k in range(4)):
        raise Unsupported("index_copy with other arguments")
    x = operand(body, ext.inputs[spec_args[0]])
    idx = operand(body, ext.inputs[spec_args[2]])
    src = operand(body, ext.inputs[spec_args[3]])
    shape = ext.inputs[spec_args[0]].type.shape
    sshape = src.layout.shape
    if any(not isinstance(d, int) for d in (*shape, *sshape, *idx.layout.shape)):
        raise Unsupported("index_copy of symbolic sizes is not generated")
    dim = spec_args[1] % len(shape) if shape else 0
    if src.dtype != x.dtype or idx.dtype not in (torch.int64, torch.int32) or len(idx.layout.shape) > 1 \
            or len(sshape) != len(shape) or x.layout != Strided.contiguous(shape) \
            or sshape[dim] != math.prod(idx.layout.shape) \
            or any(sshape[d] != shape[d] for d in range(len(shape)) if d != dim):
        raise Unsupported("index_copy of other dtypes or shapes")
    check_dtype(x.dtype)
    n = sshape[dim] if shape else 0
    ist = idx.layout.strides[0] if idx.layout.shape else 0
    out_strides = contiguous_strides(shape)
    numel = math.prod(sshape)
    itemsize = TensorType((), x.dtype).itemsize
    sched = configure(KernelShape("pointwise", outer=1, inner=hint(numel), bytes=2.0 * numel * itemsize), target)
    name = function_name(kernel.structural_key + "|index_copy_", sched, "c")
    n_args = len(body.inputs) + 1
    st, it = storage_type(x.dtype), storage_type(idx.dtype)

    def render() -> str:
        code = Code()
        code.open(f"static int {name}({signature(n_args)})")
        code(f"const {it}* ix = (const {it}*)p{idx.buf} + {idx.layout.offset};")
        code(f"const {st}* src = (const {st}*)p{src.buf};")
        code(f"{st}* out = ({st}*)p{n_args - 1};  // the input's own buffer")
        code(f"for (int64_t j = 0; j < {n}; j++) if (ix[j * {ist}] < 0 || ix[j * {ist}] >= {shape[dim]}) return 1;")
        if numel == 0:
            return _finish(code, "0")
        code.open(f"for (int64_t t = 0; t < {numel}; t++)")
        code(f"int64_t r_ = t, so = {src.layout.offset}, oo = 0;")
        for d in range(len(sshape) - 1, -1, -1):
            code(f"const int64_t i{d} = r_ % {sshape[d]}; r_ /= {sshape[d]};")
            at = f"(int64_t)ix[i{d} * {ist}]" if d == dim else f"i{d}"
            code(f"so += i{d} * {src.layout.strides[d]}; oo += {at} * {out_strides[d]};")
        code("out[oo] = src[so];")
        code.close()
        return _finish(code, "0")

    return GenKernel(name, n_args, render, sched, name)


def plan_arg_reduction(kernel: Kernel, target: CpuTarget) -> GenKernel:
    """argmax / argmin over one axis, as torch: the first index of the extreme value, and the
    first NaN's where the row has one (torch's NaN counts as the extreme). Per output element,
    one vectorized pass finds the extreme (and whether a NaN is there), a second the first index
    holding it; rows split over the threads when there are several."""
    n = _node(kernel, kernel.body.nodes[-1].op)
    if n.op not in ("argmax", "argmin") or len(n.attrs["axes"]) != 1:
        raise Unsupported("an index reduction over several axes")
    x = operand(kernel.body, n.inputs[0])
    shape, strides = x.layout.shape, x.layout.strides
    if x.dtype not in (torch.float32, torch.bfloat16) or not shape or any(not isinstance(d, int) for d in shape):
        raise Unsupported("argmax/argmin other than of float32 or bfloat16 at static sizes is not generated")
    ax = n.attrs["axes"][0] % len(shape)
    along, sa = shape[ax], strides[ax]
    if along == 0:
        raise Unsupported("an index reduction over an empty axis")
    others = [d for d in range(len(shape)) if d != ax]
    rows = math.prod(shape[d] for d in others)
    sched = configure(KernelShape("reduction", outer=rows, inner=along, bytes=4.0 * rows * along), target)
    name = function_name(kernel.structural_key, sched, "r")
    n_args = len(kernel.body.inputs) + 1
    st = storage_type(x.dtype)
    better = ">" if n.op == "argmax" else "<"
    start = "-__builtin_inff()" if n.op == "argmax" else "__builtin_inff()"
    red = "max" if n.op == "argmax" else "min"
    par = (f"#pragma omp parallel for num_threads({sched.threads}) schedule(static)"
           if sched.threads > 1 and rows > 1 else "")

    def render() -> str:
        code = Code()
        code.open(f"static int {name}({signature(n_args)})")
        code(f"const {st}* x = (const {st}*)p{x.buf};")
        code(f"int64_t* out = (int64_t*)p{n_args - 1};")
        if par:
            code(par)
        code.open(f"for (int64_t t = 0; t < {rows}; t++)")
        code(f"int64_t r_ = t, xo = {x.layout.offset};")
        for d in reversed(others):
            code(f"xo += (r_ % {shape[d]}) * {strides[d]}; r_ /= {shape[d]};")
        code(f"const {st}* xr = x + xo;")
        ld = load_expr(f"xr[j * {sa}]", x.dtype)  # (bfloat16 compares as its exact float value)
        code(f"float m = {start};")
        code("int nan = 0;  // (an int: a bool reduction keeps GCC from vectorizing the loop)")
        code(f"#pragma omp simd reduction({red}:m) reduction(|:nan)")
        code(f"for (int64_t j = 0; j < {along}; j++) {{ const float v = {ld}; m = v {better} m ? v : m; "
             f"nan |= (v != v); }}")
        code("int64_t k = 0;")
        code(f"if (nan) {{ for (int64_t j = 0; j < {along}; j++, k++) {{ const float v = {ld}; "
             "if (v != v) break; } }")
        code(f"else {{ for (int64_t j = 0; j < {along}; j++, k++) if ({ld} == m) break; }}")
        code("out[t] = k;")
        code.close()
        return _finish(code, "0")

    return GenKernel(name, n_args, render, sched, name)


def _finish(code: Code, rc: str) -> str:
    """Close the function with `return rc;` and give its source."""
    code(f"return {rc};")
    code.close()
    return code.text()


def _fill_of(producer: dict, v: Value):
    """(value, node) when `v` is a `scalar` node seen through views (`zeros(...)` inside the
    kernel); else None."""
    while v in producer and OPS[producer[v].op].has("view"):
        v = producer[v].inputs[0]
    m = producer.get(v)
    return (m.attrs["value"], m) if m is not None and m.op == "scalar" else None

