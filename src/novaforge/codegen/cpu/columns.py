"""Reductions in "column" order: vectorize across neighbouring rows.

When the innermost space dimension is kept (a sum over the batch of a [N, C] tensor, a
LayerNorm over a leading axis), the row order would read each row with a large stride. Here the
innermost kept dim is the lane dim: rows are processed in blocks of `LANES` neighbours, every
row summary (an accumulator, a mean, an rsqrt) is an array over the block, and each pass walks
the reduced elements with an `omp simd` loop over the lanes, which reads contiguous memory.
The parallel loop runs over (other kept dims) x (lane blocks).

Invariant: same values as the row-order rendering (`loops.render_reduction`) of the same body,
up to the order of floating-point accumulation.
"""

from __future__ import annotations

import math

import torch

from ...ir import OPS, Node, Value
from ...schedule.cpu import CpuSchedule
from .analysis import BodyInfo, Unsupported
from .cexpr import compute_type, literal, op_expr, store_expr
from .loops import (
    Access,
    _acc_init,
    _acc_update,
    _cone,
    _decompose,
    _leaves_in,
    _parallel_for,
    coalesce,
    index_expr,
    open_kernel,
    reduction_waves,
)

LANES = 64


def lane_dim(info: BodyInfo) -> int | None:
    """The innermost non-unit space dim when it is kept (column order applies), else None."""
    nontrivial = [d for d in range(len(info.space)) if info.space[d] != 1]
    if not nontrivial or nontrivial[-1] in info.axes:
        return None
    return nontrivial[-1]


def render_reduction_columns(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype],
                             info: BodyInfo, sched: CpuSchedule) -> str:
    lane = lane_dim(info)
    if lane is None:
        raise Unsupported("column order needs a kept innermost dim")
    kept = [d for d in range(len(info.space)) if d not in info.axes and d != lane]
    empty = math.prod(info.space[d] for d in kept) * info.space[lane] == 0
    code, done = open_kernel(name, in_dtypes, out_dtypes, empty)
    if done is not None:
        return done
    is_row = info.is_row
    leaves = [v for v, lf in info.leaves.items() if lf.kind != "const"]
    accesses = [(f"a{i}", info.leaves[v].strides, info.leaves[v].offset) for i, v in enumerate(leaves)]
    accesses += [(f"a{len(leaves) + k}", s.strides, s.offset) for k, s in enumerate(info.stores)]
    strides = [a[1] for a in accesses]
    kdims = coalesce(kept, info.space, strides)
    rdims = coalesce(list(info.axes), info.space, strides)
    lane_st = [st[lane] for st in strides]
    C = info.space[lane]
    nb = -(-C // LANES)
    base = [Access(a[0], a[1], a[2]) for a in accesses]
    names: dict[Value, str] = {}
    for v, lf in info.leaves.items():
        if lf.kind == "const":
            names[v] = literal(lf.value, lf.dtype)
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    rows = math.prod(d[0] for d in kdims) * nb
    _parallel_for(code, sched, "t", rows)
    code(f"const int64_t jb = (t % {nb}) * {LANES};")
    code(f"const int64_t jn = {C} - jb < {LANES} ? {C} - jb : {LANES};")
    code(f"const int64_t to = t / {nb};")
    if kdims:
        _decompose(code, "to", kdims, base, "o")
    else:
        for a in base:
            code(f"const int64_t {a.name} = {a.offset};")
    for k, a in enumerate(base):  # move every access to its lane block
        if lane_st[k]:
            code(f"const int64_t {a.name}b = {a.name} + jb * {lane_st[k]};")
        else:
            code(f"const int64_t {a.name}b = {a.name};")

    def lane_loop(lines: list[str]) -> None:
        code("#pragma omp simd")
        code.open("for (int64_t j = 0; j < jn; j++)")
        for ln in lines:
            code(ln)
        code.close()

    def load(v: Value, base_name: str) -> str:
        lf = info.leaves[v]
        k = leaves.index(v)
        idx = index_expr(base_name, lane_st[k], "j")
        if lf.kind == "load":
            from .cexpr import load_expr

            return load_expr(f"in{lf.buf}[{idx}]", lf.dtype)
        if lf.dtype.is_floating_point:
            return f"(float)({float(lf.start)!r} + {float(lf.step)!r} * (double)({idx}))"
        return f"({compute_type(lf.dtype)})({int(lf.start)}LL + {int(lf.step)}LL * ({idx}))"

    def expr(n: Node) -> str:
        return op_expr(n, [names[info.resolve(x)] for x in n.inputs], [x.type.dtype for x in n.inputs])

    emitted: set[Value] = {v for v, lf in info.leaves.items() if lf.kind == "const"}
    for v in leaves:  # per-lane summary leaves
        if not is_row(v):
            arr = fresh("sa")
            code(f"{compute_type(info.leaves[v].dtype)} {arr}[{LANES}];")
            lane_loop([f"{arr}[j] = {load(v, base[leaves.index(v)].name + 'b')};"])
            names[v] = f"{arr}[j]"
            emitted.add(v)
    reductions = [n for n in info.computed if OPS[n.op].has("reduction")]
    summaries = [n for n in info.computed if not OPS[n.op].has("reduction") and not is_row(n.outputs[0])]

    def emit_summaries() -> None:
        progress = True
        while progress:
            progress = False
            for n in summaries:
                o = n.outputs[0]
                if o not in emitted and all(info.resolve(x) in emitted for x in n.inputs):
                    arr = fresh("sa")
                    code(f"{compute_type(o.type.dtype)} {arr}[{LANES}];")
                    lane_loop([f"{arr}[j] = {expr(n)};"])
                    names[o] = f"{arr}[j]"
                    emitted.add(o)
                    progress = True

    def row_pass(roots: list[Value], finish, store_accesses: list[int]) -> None:
        """Loops over the reduced elements; per element, a lane loop evaluating `roots`."""
        cone = _cone(info, roots, lambda v: not is_row(v) or v in info.leaves)
        row_leaves = [v for v in _leaves_in(info, roots, lambda v: not is_row(v)) if v in info.leaves
                      and info.leaves[v].kind != "const"]
        depth0 = code.depth
        for k, (n, _) in enumerate(rdims):
            code.open(f"for (int64_t r{k} = 0; r{k} < {n}; r{k}++)")
        used = [leaves.index(v) for v in row_leaves] + store_accesses
        for a in used:
            terms = [base[a].name + "b"] + [f"r{k} * {st[a]}" for k, (_, st) in enumerate(rdims) if st[a]]
            code(f"const int64_t c{a} = {' + '.join(terms)};")
        saved = dict(names)
        body = []
        for v in row_leaves:
            nm = fresh("l")
            body.append(f"const {compute_type(info.leaves[v].dtype)} {nm} = {load(v, f'c{leaves.index(v)}')};")
            names[v] = nm
        for n in cone:
            nm = fresh("v")
            body.append(f"const {compute_type(n.outputs[0].type.dtype)} {nm} = {expr(n)};")
            names[n.outputs[0]] = nm
        body += finish([names[info.resolve(r)] for r in roots])
        lane_loop(body)
        names.clear()
        names.update(saved)
        while code.depth > depth0:
            code.close()

    emit_summaries()
    for ready in reduction_waves(info, reductions, is_row, emitted):
        row_red = [r for r in ready if is_row(r.inputs[0])]
        for r in ready:
            if not is_row(r.inputs[0]):
                names[r.outputs[0]] = names[info.resolve(r.inputs[0])]
                emitted.add(r.outputs[0])
        if row_red:
            accs = []
            for r in row_red:
                acc = fresh("acc")
                accs.append(acc)
                code(f"{compute_type(r.outputs[0].type.dtype)} {acc}[{LANES}];")
                lane_loop([f"{acc}[j] = {_acc_init(r.op, r.outputs[0].type.dtype)};"])

            def finish(xs, accs=accs, row_red=row_red):
                return [_acc_update(r.op, f"{a}[j]", x) for r, a, x in zip(row_red, accs, xs, strict=True)]

            row_pass([r.inputs[0] for r in row_red], finish, [])
            for r, a in zip(row_red, accs, strict=True):
                names[r.outputs[0]] = f"{a}[j]"
                emitted.add(r.outputs[0])
        emit_summaries()
    row_stores = [(k, s) for k, s in enumerate(info.stores) if is_row(s.value)]
    lines = []
    for k, s in enumerate(info.stores):
        if not is_row(s.value):
            a = len(leaves) + k
            lines.append(f"out{s.buf}[{index_expr(base[a].name + 'b', lane_st[a], 'j')}] = "
                         f"{store_expr(names[info.resolve(s.value)], s.dtype)};")
    if lines:
        lane_loop(lines)
    if row_stores:
        def stores(xs):
            out = []
            for (k, s), x in zip(row_stores, xs, strict=True):
                a = len(leaves) + k
                out.append(f"out{s.buf}[{index_expr(f'c{a}', lane_st[a], 'j')}] = {store_expr(x, s.dtype)};")
            return out

        row_pass([s.value for _, s in row_stores], stores, [len(leaves) + k for k, _ in row_stores])
    code.close()
    code("return 0;")
    code.close()
    return code.text()
