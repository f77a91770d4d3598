"""Loop-nest rendering of pointwise and reduction kernels (C++ with OpenMP).

Pointwise: the space's dimensions are coalesced (two dims merge when every access's strides
chain), the last one is the vectorized inner loop (`#pragma omp simd`), the others are
flattened into one parallel loop (`omp parallel for`, when the schedule has threads > 1); a
long inner loop may be split into blocks shared by the threads.

Reduction ("row" order): kept dims form the parallel row loop; each row makes one pass over
its reduced elements per dependent reduction level (softmax: max, then sum of exp, then the
normalized store), recomputing row values from loads in each pass, or keeping one expensive
row value in a stack buffer (`row_cache`). Row summaries (keepdim values) are scalars of the
row. ("column" order, when the innermost dim is kept: rows are processed in vector-wide groups
with per-lane accumulators; see `render_reduction`.)

Invariant: the rendered function computes, for every element of the space, the body's values
in body order from loads, literals and earlier values, and stores each body output exactly at
its strided location; with numel 0 it touches no memory.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ...ir import OPS, Graph, Node, Value
from ...ir.ops import extreme
from ...ir.symbolic import Sym, provably
from ...schedule.cpu import CpuSchedule
from .analysis import BodyInfo, Leaf, Unsupported
from .cexpr import FLOATS, compute_type, literal, load_expr, op_expr, storage_type, store_expr


@dataclass
class GenKernel:
    fn: str  # C function name
    n_args: int
    render_fn: Callable[[], str]  # the function's source (plus helpers it needs)
    schedule: CpuSchedule
    key: str  # structural key + schedule: equal keys render equal functions
    info: BodyInfo | None = None  # the loop analysis (pointwise and reduction kernels)
    mask_arg: int | None = None  # flash attention: the argument holding the mask (null: causal)

    def render(self) -> str:
        """The source, each function declaring the size symbols it names."""
        return declare_symbols(self.render_fn())


def function_name(kernel_key: str, sched: CpuSchedule, tag: str = "k") -> str:
    h = hashlib.sha256(f"{kernel_key}|{sched.key()}".encode()).hexdigest()[:16]
    return f"nf_{tag}_{h}"


class Code:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def open(self, line: str) -> None:
        self(line + " {")
        self.depth += 1

    def close(self, tail: str = "") -> None:
        self.depth -= 1
        self("}" + tail)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class Access:
    name: str  # base-offset variable
    strides: tuple[int, ...]  # per space dim
    offset: int


def coalesce(dims: list[int], extents: tuple[int, ...], accesses: list[tuple[int, ...]]) -> list[tuple[int, list[int]]]:
    """Merge dims (outer to inner) whose strides chain for every access; drop unit dims.
    Returns [(extent, [stride per access])]."""
    out: list[tuple[int, list[int]]] = []
    for d in dims:
        n = extents[d]
        if n == 1:
            continue
        st = [a[d] for a in accesses]
        if out:
            pn, pst = out[-1]
            if all(ps == s * n for ps, s in zip(pst, st, strict=True)):
                out[-1] = (pn * n, st)
                continue
        out.append((n, st))
    return out


def signature(n: int) -> str:
    """A kernel's parameters: its buffers, then the call's symbol values (`nf_sym[i]` is the
    size of symbol `si`; unused by kernels of static sizes)."""
    return ", ".join([f"void* p{i}" for i in range(n)] + ["const int64_t* nf_sym"])


_SYMBOL = re.compile(r"\bs(\d+)\b")
# where the sizes arrive: a kernel's opening line, or a tile epilogue's `nf_sym` from its context
_OPENING = re.compile(r"^(\s*)((static |NF_KERNEL )?int nf_\w+\(.*const int64_t\* nf_sym\) \{"
                      r"|const int64_t\* nf_sym = .*;)$")


def declare_symbols(text: str) -> str:
    """Insert `const int64_t s0 = nf_sym[0];` (each symbol the text names, as `Sym.__format__`
    prints them) at the top of every function that takes `nf_sym`. A generated variable may not
    be named like a symbol: that raises."""
    used = sorted({int(m) for m in _SYMBOL.findall(text)})
    if not used:
        return text
    if re.search(r"\b(int64_t|int|long|float|double|auto)\s+s\d+\b", text):
        raise AssertionError("a generated variable is named like a size symbol (s<digits>)")
    lines = text.split("\n")
    out = []
    for line in lines:
        out.append(line)
        m = _OPENING.match(line)
        if m:
            pad = m.group(1) + ("  " if line.endswith("{") else "")
            out.extend(f"{pad}const int64_t s{i} = nf_sym[{i}];" for i in used)
    if len(out) == len(lines):
        raise AssertionError("a function names size symbols but takes no nf_sym")
    return "\n".join(out)


def _prologue(code: Code, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype]) -> None:
    for i, dt in enumerate(in_dtypes):
        st = storage_type(dt)
        code(f"const {st}* in{i} = (const {st}*)p{i};")
    for j, dt in enumerate(out_dtypes):
        st = storage_type(dt)
        code(f"{st}* out{j} = ({st}*)p{len(in_dtypes) + j};")


def open_kernel(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype],
                empty: bool) -> tuple[Code, str | None]:
    """The function's opening and typed pointers; with `empty` (nothing to compute) the whole
    function, `return 0;`, as the second item (the caller returns it)."""
    code = Code()
    code.open(f"static int {name}({signature(len(in_dtypes) + len(out_dtypes))})")
    _prologue(code, in_dtypes, out_dtypes)
    if not empty:
        return code, None
    code("return 0;")
    code.close()
    return code, code.text()


def body_dtypes(body: Graph) -> tuple[list[torch.dtype], list[torch.dtype]]:
    return [gi.value.type.dtype for gi in body.inputs], [o.type.dtype for o in body.outputs]


def _pointwise_accesses(info: BodyInfo) -> tuple[list[Value], list[tuple[str, tuple[int, ...], int]]]:
    roots = [s.value for s in info.stores]
    leaves = [v for v in _leaves_in(info, roots, lambda v: False) if info.leaves[v].kind != "const"]
    accesses = [(f"a{k}", info.leaves[v].strides, info.leaves[v].offset) for k, v in enumerate(leaves)]
    for s in info.stores:
        accesses.append((f"a{len(accesses)}", s.strides, s.offset))
    return leaves, accesses


def pointwise_loops(info: BodyInfo) -> tuple[int, int]:
    """(outer iterations, inner trip count) of a pointwise loop nest after coalescing."""
    _, accesses = _pointwise_accesses(info)
    dims = coalesce(list(range(len(info.space))), info.space, [a[1] for a in accesses])
    if not dims:
        return 1, 1
    return math.prod(d[0] for d in dims[:-1]), dims[-1][0]


def reduction_loops(info: BodyInfo) -> tuple[int, int, int, bool]:
    """(rows, innermost reduced trip count, elements per row, is the innermost space dim reduced)."""
    kept = [d for d in range(len(info.space)) if d not in info.axes]
    rows = math.prod(info.space[d] for d in kept)
    red = math.prod(info.space[a] for a in info.axes)
    strides = [lf.strides for lf in info.leaves.values() if lf.kind != "const"] + [s.strides for s in info.stores]
    rdims = coalesce(list(info.axes), info.space, strides)
    inner = rdims[-1][0] if rdims else 1
    nontrivial = [d for d in range(len(info.space)) if info.space[d] != 1]
    inner_reduced = not nontrivial or nontrivial[-1] in info.axes
    return rows, inner, red, inner_reduced


def index_expr(base: str, stride: int, ivar: str = "i") -> str:
    if stride == 0:
        return base
    return f"{base} + {ivar}" if stride == 1 else f"{base} + {ivar} * {stride}"


class _Values:
    """Names and expressions of body values inside the generated loops."""

    def __init__(self, info: BodyInfo, code: Code) -> None:
        self.info = info
        self.code = code
        self.names: dict[Value, str] = {}
        self.node_index: dict[Value, int] = {}
        self.counter = 0

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def leaf_expr(self, v: Value, leaf: Leaf, base: str, inner_stride: int, ivar: str) -> str:
        if leaf.kind == "const":
            return literal(leaf.value, leaf.dtype)
        idx = index_expr(base, inner_stride, ivar)
        if leaf.kind == "load":
            return load_expr(f"in{leaf.buf}[{idx}]", leaf.dtype)
        # iota: start + step * element offset, computed like the interpreter (float64 then cast)
        if leaf.dtype in FLOATS:
            return f"(float)({float(leaf.start)!r} + {float(leaf.step)!r} * (double)({idx}))"
        return f"({compute_type(leaf.dtype)})({int(leaf.start)}LL + {int(leaf.step)}LL * ({idx}))"

    def emit_node(self, n: Node) -> str:
        args = [self.names[self.info.resolve(v)] for v in n.inputs]
        dts = [v.type.dtype for v in n.inputs]
        expr = op_expr(n, args, dts)
        name = self.fresh()
        self.code(f"const {compute_type(n.outputs[0].type.dtype)} {name} = {expr};")
        self.names[n.outputs[0]] = name
        return name


def _cone(info: BodyInfo, roots: list[Value], stop) -> list[Node]:
    """Computed nodes needed for `roots`, in body order, not descending into `stop(v)` values."""
    producer = {n.outputs[0]: n for n in info.computed}
    need: set[Value] = set()
    stack = [info.resolve(r) for r in roots]
    while stack:
        v = stack.pop()
        if v in need or stop(v):
            continue
        need.add(v)
        n = producer.get(v)
        if n is not None:
            stack.extend(info.resolve(x) for x in n.inputs)
    return [n for n in info.computed if n.outputs[0] in need]


def _leaves_in(info: BodyInfo, roots: list[Value], stop) -> list[Value]:
    producer = {n.outputs[0]: n for n in info.computed}
    out: list[Value] = []
    seen: set[Value] = set()
    stack = [info.resolve(r) for r in roots]
    while stack:
        v = stack.pop()
        if v in seen or stop(v):
            continue
        seen.add(v)
        if v in info.leaves:
            out.append(v)
        n = producer.get(v)
        if n is not None:
            stack.extend(info.resolve(x) for x in n.inputs)
    return out


def _decompose(code: Code, var: str, dims: list[tuple[int, list[int]]], accesses: list[Access], prefix: str) -> None:
    """Emit base offsets of every access for flat index `var` over `dims` (outer to inner)."""
    idx_names = []
    rest = var
    for k in range(len(dims) - 1, -1, -1):
        n = dims[k][0]
        nm = f"{prefix}{k}"
        if k == 0:
            code(f"const int64_t {nm} = {rest};")
        else:
            code(f"const int64_t {nm} = {rest} % {n};")
            code(f"const int64_t {prefix}r{k} = {rest} / {n};")
            rest = f"{prefix}r{k}"
        idx_names.append((k, nm))
    for a_i, acc in enumerate(accesses):
        terms = [str(acc.offset)] if acc.offset else []
        for k, nm in idx_names:
            s = dims[k][1][a_i]
            if s:
                terms.append(nm if s == 1 else f"{nm} * {s}")
        code(f"const int64_t {acc.name} = {' + '.join(terms) or '0'};")


def _parallel_for(code: Code, sched: CpuSchedule, var: str, count: int) -> None:
    if sched.threads > 1 and count > 1:
        code(f"#pragma omp parallel for num_threads({sched.threads}) schedule(static)")
    code.open(f"for (int64_t {var} = 0; {var} < {count}; {var}++)")


def render_pointwise(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype], info: BodyInfo,
                     sched: CpuSchedule) -> str:
    code, done = open_kernel(name, in_dtypes, out_dtypes, info.numel == 0)
    if done is not None:
        return done
    vals = _Values(info, code)
    roots = [s.value for s in info.stores]
    leaves, accesses = _pointwise_accesses(info)
    dims = coalesce(list(range(len(info.space))), info.space, [a[1] for a in accesses])
    if not dims:
        dims = [(1, [0] * len(accesses))]
    inner_n, inner_st = dims[-1]
    outer = dims[:-1]
    outer_count = math.prod(d[0] for d in outer)
    # a block shorter than the loop splits it; with a symbolic loop, blocks are correct at any size
    block = sched.block if sched.block > 0 and (isinstance(inner_n, Sym) or sched.block < inner_n) else 0
    nblocks = -(-inner_n // block) if block else 1
    acc_objs = [Access(a[0], a[1], a[2]) for a in accesses]
    total = outer_count * nblocks
    _parallel_for(code, sched, "t", total)
    if block:
        code(f"const int64_t lo = (t % {nblocks}) * {block};")
        code(f"const int64_t hi = lo + {block} < {inner_n} ? lo + {block} : {inner_n};")
        code(f"const int64_t to = t / {nblocks};")
        flat = "to"
    else:
        code(f"const int64_t lo = 0, hi = {inner_n};")
        flat = "t"
    outer_dims_only = [(n, st) for n, st in outer]
    if outer_dims_only:
        _decompose(code, flat, outer_dims_only, acc_objs, "o")
    else:
        for a in acc_objs:
            code(f"const int64_t {a.name} = {a.offset};")
    code("#pragma omp simd")
    code.open("for (int64_t i = lo; i < hi; i++)")
    for k, v in enumerate(leaves):
        lf = info.leaves[v]
        expr = vals.leaf_expr(v, lf, acc_objs[k].name, inner_st[k], "i")
        nm = vals.fresh("l")
        code(f"const {compute_type(lf.dtype)} {nm} = {expr};")
        vals.names[v] = nm
    for v, lf in info.leaves.items():
        if lf.kind == "const":
            vals.names[v] = literal(lf.value, lf.dtype)
    for n in _cone(info, roots, lambda v: v in info.leaves):
        vals.emit_node(n)
    for k, s in enumerate(info.stores):
        a = acc_objs[len(leaves) + k]
        st = inner_st[len(leaves) + k]
        idx = index_expr(a.name, st)
        code(f"out{s.buf}[{idx}] = {store_expr(vals.names[s.value], s.dtype)};")
    code.close()
    code.close()
    code("return 0;")
    code.close()
    return code.text()


# ------------------------------------------------------------------------------ reductions
def _acc_init(op: str, dtype: torch.dtype) -> str:
    """The accumulator's start value: the reduction's identity (its record) as C++."""
    red = OPS[op].reduce
    value = red.identity(dtype)
    ct = compute_type(dtype)
    if ct == "float":
        if math.isinf(value):
            return "(-__builtin_inff())" if value < 0 else "__builtin_inff()"
        return f"{float(value)!r}f"
    if red.combine in ("maximum", "minimum"):  # the dtype's extreme
        return f"std::numeric_limits<{ct}>::{'max' if value == extreme(dtype, high=True) else 'lowest'}()"
    return str(int(value))


# the C++ of each combine op (the reductions' records name it): update statement, OpenMP clause
_UPDATE = {"add": "{acc} += {x};", "mul": "{acc} *= {x};", "maximum": "{acc} = {x} > {acc} ? {x} : {acc};",
           "minimum": "{acc} = {x} < {acc} ? {x} : {acc};"}
_OMP_CLAUSE = {"add": "+", "mul": "*", "maximum": "max", "minimum": "min"}


def _acc_update(op: str, acc: str, x: str) -> str:
    return _UPDATE[OPS[op].reduce.combine].format(acc=acc, x=x)


def _clause(op: str) -> str:
    return _OMP_CLAUSE[OPS[op].reduce.combine]


def summary_deps(info: BodyInfo, is_row: Callable[[Value], bool], v: Value) -> set[Value]:
    """The summary values (computed once per row, outside the reduced loops) that value `v` needs."""
    out: set[Value] = set()
    for n in _cone(info, [v], lambda x: not is_row(x)):
        out.update(info.resolve(x) for x in n.inputs if not is_row(x))
    v = info.resolve(v)
    if not is_row(v):
        out.add(v)
    return out


def reduction_waves(info: BodyInfo, reductions: list[Node], is_row: Callable[[Value], bool],
                    emitted: set[Value]) -> Iterator[list[Node]]:
    """The reductions in dependency order, one wave at a time: every reduction of a wave needs only
    summaries already in `emitted`, which the caller extends while it emits the wave."""
    pending = list(reductions)
    while pending:
        ready = [r for r in pending if summary_deps(info, is_row, r.inputs[0]) <= emitted]
        if not ready:
            raise Unsupported("reduction dependencies do not resolve")
        yield ready
        pending = [r for r in pending if r not in ready]


def render_reduction(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype], info: BodyInfo,
                     sched: CpuSchedule) -> str:
    kept = [d for d in range(len(info.space)) if d not in info.axes]
    kept_count = math.prod(info.space[d] for d in kept)
    code, done = open_kernel(name, in_dtypes, out_dtypes, kept_count == 0)
    if done is not None:
        return done
    vals = _Values(info, code)
    is_row = info.is_row
    leaves = [v for v, lf in info.leaves.items() if lf.kind != "const"]
    accesses = [(f"a{i}", info.leaves[v].strides, info.leaves[v].offset) for i, v in enumerate(leaves)]
    for s in info.stores:
        accesses.append((f"a{len(accesses)}", s.strides, s.offset))
    strides = [a[1] for a in accesses]
    kdims = coalesce(kept, info.space, strides)
    rdims = coalesce(list(info.axes), info.space, strides)
    for v, lf in info.leaves.items():
        if lf.kind == "const":
            vals.names[v] = literal(lf.value, lf.dtype)
    base = [Access(a[0], a[1], a[2]) for a in accesses]
    rows = math.prod(d[0] for d in kdims)
    _parallel_for(code, sched, "t", rows)
    if kdims:
        _decompose(code, "t", kdims, base, "o")
    else:
        for a in base:
            code(f"const int64_t {a.name} = {a.offset};")
    leaf_index = {v: i for i, v in enumerate(leaves)}
    emitted: set[Value] = set(v for v, lf in info.leaves.items() if lf.kind == "const")
    # summary leaves: loaded once per row
    for v in leaves:
        if not is_row(v):
            nm = vals.fresh("sv")
            code(f"const {compute_type(info.leaves[v].dtype)} {nm} = "
                 f"{vals.leaf_expr(v, info.leaves[v], base[leaf_index[v]].name, 0, 'i')};")
            vals.names[v] = nm
            emitted.add(v)
    producer = {n.outputs[0]: n for n in info.computed}
    reductions = [n for n in info.computed if OPS[n.op].has("reduction")]
    summaries = [n for n in info.computed if not OPS[n.op].has("reduction") and not is_row(n.outputs[0])]

    def inputs_ready(vs) -> bool:
        return all(info.resolve(x) in emitted for x in vs)

    def emit_summaries() -> None:
        progress = True
        while progress:
            progress = False
            for n in summaries:
                if n.outputs[0] not in emitted and inputs_ready(n.inputs):
                    vals.emit_node(n)
                    emitted.add(n.outputs[0])
                    progress = True

    cache = _choose_row_cache(info, reductions, sched, rdims)
    if cache is not None:  # (a symbolic row: a buffer for the longest row of the range)
        code(f"alignas(64) float rc[{rdims[0][0] if isinstance(rdims[0][0], int) else sched.row_cache}];")
    emit_summaries()
    for ready in reduction_waves(info, reductions, is_row, emitted):
        row_red = [r for r in ready if is_row(r.inputs[0])]
        for r in ready:
            if not is_row(r.inputs[0]):  # reduced extent 1: the reduction is its input
                vals.names[r.outputs[0]] = vals.names[info.resolve(r.inputs[0])]
                emitted.add(r.outputs[0])
        if row_red:
            accs = []
            for r in row_red:
                acc = vals.fresh("acc")
                accs.append(acc)
                ct = compute_type(r.outputs[0].type.dtype)
                code(f"{ct} {acc} = {_acc_init(r.op, r.outputs[0].type.dtype)};")
            clauses = " ".join(f"reduction({_clause(r.op)}:{a})" for r, a in zip(row_red, accs, strict=True))
            _row_pass(code, info, vals, rdims, base, leaves, leaf_index, [r.inputs[0] for r in row_red], clauses,
                      lambda xs, accs=accs, row_red=row_red: [
                          _acc_update(r.op, a, x) for r, a, x in zip(row_red, accs, xs, strict=True)], cache=cache)
            for r, a in zip(row_red, accs, strict=True):
                vals.names[r.outputs[0]] = a
                emitted.add(r.outputs[0])
        emit_summaries()
    # stores: row summaries now, row values in a final pass
    row_stores = [(k, s) for k, s in enumerate(info.stores) if is_row(s.value)]
    for k, s in enumerate(info.stores):
        if not is_row(s.value):
            v = info.resolve(s.value)
            if v not in vals.names:
                raise Unsupported("row summary output not computed")
            code(f"out{s.buf}[{base[len(leaves) + k].name}] = {store_expr(vals.names[v], s.dtype)};")
    if row_stores:
        def stores(xs, row_stores=row_stores):
            lines = []
            for (k, s), x in zip(row_stores, xs, strict=True):
                st = _inner_stride(rdims, len(leaves) + k)
                nm = base_name_inner(len(leaves) + k)
                idx = index_expr(nm, st)
                lines.append(f"out{s.buf}[{idx}] = {store_expr(x, s.dtype)};")
            return lines

        def base_name_inner(k: int) -> str:
            return f"c{k}" if len(rdims) > 1 else base[k].name

        _row_pass(code, info, vals, rdims, base, leaves, leaf_index, [s.value for _, s in row_stores], "", stores,
                  extra_accesses=[len(leaves) + k for k, _ in row_stores], cache=cache)
    del producer
    code.close()
    code("return 0;")
    code.close()
    return code.text()


def _choose_row_cache(info: BodyInfo, reductions: list[Node], sched: CpuSchedule, rdims) -> dict | None:
    """The row value to keep across passes: a float row value with a transcendental in its cone
    that two or more passes read (softmax's exp(x - max)); only when the schedule allots a row
    buffer and the reduced dims form one loop."""
    if not sched.row_cache or len(rdims) != 1 or not provably(lambda: rdims[0][0] <= sched.row_cache):
        return None
    is_row = info.is_row
    pass_roots = [[r.inputs[0]] for r in reductions if is_row(r.inputs[0])]
    pass_roots.append([s.value for s in info.stores if is_row(s.value)])
    cones = [{n.outputs[0] for n in _cone(info, roots, lambda v: not is_row(v) or v in info.leaves)}
             for roots in pass_roots if roots]
    best = None
    for n in info.computed:
        o = n.outputs[0]
        if OPS[n.op].has("reduction") or not is_row(o) or compute_type(o.type.dtype) != "float":
            continue
        if sum(1 for c in cones if o in c) < 2:
            continue
        if any(OPS[m.op].transcendental for m in _cone(info, [o], lambda v: not is_row(v) or v in info.leaves)):
            best = o  # the latest such value covers the most work
    return {"value": best, "stored": False} if best is not None else None


def _inner_stride(rdims, k: int) -> int:
    return rdims[-1][1][k] if rdims else 0


def _row_pass(code: Code, info: BodyInfo, vals: _Values, rdims, base: list[Access], leaves: list[Value],
              leaf_index: dict[Value, int], roots: list[Value], clauses: str, finish, extra_accesses=(),
              cache: dict | None = None) -> None:
    """One pass over a row: loops over the reduced dims (the innermost vectorized), evaluating
    the row values `roots` and emitting `finish(root names)` lines inside the inner loop.
    `cache` ({"value": v, "stored": bool}): the first pass that computes v keeps it in the row
    buffer `rc`, later passes read it back instead of recomputing its cone."""
    is_row = info.is_row
    cached = cache["value"] if cache is not None and cache["stored"] else None
    cone = _cone(info, roots, lambda v: not is_row(v) or v in info.leaves or v is cached)
    row_leaves = [v for v in _leaves_in(info, roots, lambda v: not is_row(v) or v is cached) if v in leaf_index]
    used = [leaf_index[v] for v in row_leaves] + list(extra_accesses)
    outer_r = rdims[:-1]
    inner_n = rdims[-1][0] if rdims else 1
    depth0 = code.depth
    for k, (n, _) in enumerate(outer_r):
        code.open(f"for (int64_t r{k} = 0; r{k} < {n}; r{k}++)")
    if outer_r:
        for a in used:
            terms = [base[a].name] + [f"r{k} * {st[a]}" for k, (_, st) in enumerate(outer_r) if st[a]]
            code(f"const int64_t c{a} = {' + '.join(terms)};")
    code(f"#pragma omp simd {clauses}".rstrip())
    code.open(f"for (int64_t i = 0; i < {inner_n}; i++)")
    saved = dict(vals.names)
    for v in row_leaves:
        a = leaf_index[v]
        nm = f"c{a}" if outer_r else base[a].name
        lf = info.leaves[v]
        expr = vals.leaf_expr(v, lf, nm, _inner_stride(rdims, a), "i")
        ln = vals.fresh("l")
        code(f"const {compute_type(lf.dtype)} {ln} = {expr};")
        vals.names[v] = ln
    if cached is not None and (any(info.resolve(x) is cached for n in cone for x in n.inputs)
                               or any(info.resolve(r) is cached for r in roots)):
        vals.names[cached] = vals.fresh("rcv")
        code(f"const float {vals.names[cached]} = rc[i];")
    for n in cone:
        vals.emit_node(n)
        if cache is not None and not cache["stored"] and n.outputs[0] is cache["value"]:
            code(f"rc[i] = {vals.names[n.outputs[0]]};")
            cache["stored"] = True
    for line in finish([vals.names[info.resolve(r)] for r in roots]):
        code(line)
    vals.names = saved
    while code.depth > depth0:
        code.close()


# ------------------------------------------------------------------ GEMM tile epilogues
@dataclass(frozen=True)
class TileMap:
    """An access seen as (batch, row, col) strides of the GEMM output tile grid."""

    offset: int
    bs: int
    rs: int
    cs: int


def tile_maps(info: BodyInfo, batch_dims: list[int], row_dims: list[int], col_dim: int,
              accesses: list[tuple[tuple[int, ...], int]]) -> list[TileMap]:
    """Map each access (strides over the space, offset) to (batch, row, col) strides; raises
    Unsupported when the batch or row dims do not coalesce for an access."""
    out = []
    for strides, offset in accesses:
        b = coalesce(batch_dims, info.space, [strides])
        r = coalesce(row_dims, info.space, [strides])
        if len(b) > 1 or len(r) > 1:
            raise Unsupported("epilogue access does not coalesce onto the GEMM tile grid")
        out.append(TileMap(offset, b[0][1][0] if b else 0, r[0][1][0] if r else 0,
                           strides[col_dim] if info.space[col_dim] != 1 else 0))
    return out


def _tile_accesses(info: BodyInfo, batch_dims: list[int], row_dims: list[int],
                   col_dim: int) -> tuple[list[Value], list[TileMap]]:
    """The non-constant leaves an epilogue reads and the (batch, row, col) maps of those leaves
    and then of its stores."""
    roots = [s.value for s in info.stores]
    leaves = [v for v in _leaves_in(info, roots, lambda v: False) if info.leaves[v].kind != "const"]
    accesses = [(info.leaves[v].strides, info.leaves[v].offset) for v in leaves]
    accesses += [(s.strides, s.offset) for s in info.stores]
    return leaves, tile_maps(info, batch_dims, row_dims, col_dim, accesses)


def _tile_header(code: Code, name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype],
                 n_args: int) -> None:
    code.open(f"static void {name}(void* ctx, long batch, float* c, long ldc, long row0, long col0, long rows, "
              "long cols)")
    code("void** p = (void**)ctx;")
    code(f"const int64_t* nf_sym = (const int64_t*)p[{n_args}];")
    for i, dt in enumerate(in_dtypes):
        if i:
            st = storage_type(dt)
            code(f"const {st}* in{i} = (const {st}*)p[{i}];")
    for j, dt in enumerate(out_dtypes):
        st = storage_type(dt)
        code(f"{st}* out{j} = ({st}*)p[{len(in_dtypes) + j}];")


def _row_offsets(code: Code, maps: list[TileMap]) -> None:
    code("const int64_t row = row0 + r;")
    for k, m in enumerate(maps):
        terms = [str(m.offset)] + ([f"batch * {m.bs}"] if m.bs else []) + ([f"row * {m.rs}"] if m.rs else []) + (
            [f"col0 * {m.cs}"] if m.cs else [])
        code(f"const int64_t a{k} = {' + '.join(terms)};")


def render_tile_epilogue(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype], info: BodyInfo,
                         batch_dims: list[int], row_dims: list[int], col_dim: int, n_args: int) -> str:
    """`void name(ctx, batch, c, ldc, row0, col0, rows, cols)`: the epilogue applied to one
    finished GEMM tile while it is in L1. Input 0 (the matmul result) is read from the tile `c`
    (as float32); ctx holds the kernel's `n_args` argument pointers (p0 = the C buffer), then
    the sizes (`nf_sym`)."""
    code = Code()
    _tile_header(code, name, in_dtypes, out_dtypes, n_args)
    vals = _Values(info, code)
    roots = [s.value for s in info.stores]
    for v, lf in info.leaves.items():
        if lf.kind == "const":
            vals.names[v] = literal(lf.value, lf.dtype)
    leaves, maps = _tile_accesses(info, batch_dims, row_dims, col_dim)
    code.open("for (long r = 0; r < rows; r++)")
    _row_offsets(code, maps)
    code("#pragma omp simd")
    code.open("for (long j = 0; j < cols; j++)")
    for k, v in enumerate(leaves):
        lf = info.leaves[v]
        nm = vals.fresh("l")
        if lf.kind == "load" and lf.buf == 0:
            code(f"const float {nm} = c[r * ldc + j];")
        else:
            code(f"const {compute_type(lf.dtype)} {nm} = {vals.leaf_expr(v, lf, f'a{k}', maps[k].cs, 'j')};")
        vals.names[v] = nm
    for n in _cone(info, roots, lambda v: v in info.leaves):
        vals.emit_node(n)
    for k, s in enumerate(info.stores):
        m = maps[len(leaves) + k]
        idx = index_expr(f"a{len(leaves) + k}", m.cs, "j")
        code(f"out{s.buf}[{idx}] = {store_expr(vals.names[s.value], s.dtype)};")
    code.close()
    code.close()
    code.close()
    return code.text()


def render_tile_prefetch(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype], info: BodyInfo,
                         batch_dims: list[int], row_dims: list[int], col_dim: int, n_args: int,
                         c_output: int | None = None) -> str | None:
    """`void name(ctx, batch, c, ldc, row0, col0, rows, cols)` (c unused): prefetches into L2 the
    rows of every tensor the tile epilogue `render_tile_epilogue` reads or writes along the tile's
    rows and columns (an optimizer update's parameter and moments), so that they arrive while the
    GEMM computes the tile before. A store to the buffer and place of a load is not prefetched
    twice, nor the output `c_output` that holds C itself (the tile, just computed). None when the
    epilogue reads nothing but the tile and per-column vectors (cache resident: nothing to
    prefetch)."""
    leaves, maps = _tile_accesses(info, batch_dims, row_dims, col_dim)
    lines: list[str] = []
    loaded: list[tuple[str, TileMap]] = []
    for k, v in enumerate(leaves):
        lf = info.leaves[v]
        m = maps[k]
        if lf.kind != "load" or lf.buf == 0 or m.cs != 1 or not m.rs:
            continue
        base = f"in{lf.buf}"
        loaded.append((base, m))
        lines.append(f"nf_pf_row((const char*)({base} + a{k}), cols * {lf.dtype.itemsize}, 0);")
    for k, s in enumerate(info.stores):
        m = maps[len(leaves) + k]
        if m.cs != 1 or not m.rs or s.buf == c_output:
            continue
        base = f"out{s.buf}"
        same = [f"(const void*){base} != (const void*){b}" for b, lm in loaded if lm == m]
        stmt = f"nf_pf_row((const char*)({base} + a{len(leaves) + k}), cols * {s.dtype.itemsize}, 1);"
        lines.append(f"if ({' && '.join(same)}) {stmt}" if same else stmt)
    if not lines:
        return None
    code = Code()
    _tile_header(code, name, in_dtypes, out_dtypes, n_args)
    code("(void)c; (void)ldc;")
    code.open("for (long r = 0; r < rows; r++)")
    _row_offsets(code, maps)
    for line in lines:
        code(line)
    code.close()
    code.close()
    return code.text()
