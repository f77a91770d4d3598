"""Piecewise loops: pointwise kernels that read `cat` leaves (see analysis.Piece).

A cat leaf reads a different strided input (or literal) in each range of one space dim. The
space is cut, along every dim some cat splits, at every piece boundary, into boxes; inside a
box every cat leaf is one plain leaf (its piece, offset to the box's origin), so each box is an
ordinary pointwise loop nest whose inner loop vectorizes (no per-element select, no gather).
Two layouts:

* inner split (the common case, e.g. RoPE's rotate_half, a cat along the head dim): the dims
  before the outermost cut dim form one parallel loop; inside it every box runs its own loops
  over the remaining dims, so each row is read and written once while it is in cache, with one
  fork/join;
* separate boxes (a cut on the outermost dim, or too few outer iterations for the threads):
  each box is a complete pointwise loop nest (`loops.render_pointwise`, with its own schedule),
  called in turn.

Invariant: the boxes partition the space, and in each box every leaf reads exactly the element
the cat selects there, so the rendered function computes what the interpreter computes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from ...ir.symbolic import hint
from ...schedule.cpu import CpuSchedule, KernelShape, configure
from ...schedule.target import CpuTarget
from .analysis import BodyInfo, Leaf, Unsupported
from .cexpr import compute_type, literal, store_expr
from .loops import (
    Code,
    GenKernel,
    _cone,
    _parallel_for,
    _pointwise_accesses,
    _Values,
    coalesce,
    function_name,
    index_expr,
    open_kernel,
    pointwise_loops,
    render_pointwise,
    signature,
)

MAX_BOXES = 64


def has_pieces(info: BodyInfo) -> bool:
    return any(lf.kind == "cat" for lf in info.leaves.values())


def cut_boxes(info: BodyInfo) -> tuple[int, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """(outermost cut dim, the boxes [(lo, hi)] that the cat leaves' piece boundaries cut the
    space into, in row-major order)."""
    cuts: dict[int, set[int]] = {}
    for lf in info.leaves.values():
        if lf.kind == "cat":
            cuts.setdefault(lf.dim, set()).update(p.lo for p in lf.pieces[1:])
    if not cuts:
        raise Unsupported("no cat leaf to cut the space")
    ranges = []
    for d, n in enumerate(info.space):
        points = sorted({0, n} | cuts.get(d, set()))
        ranges.append(list(zip(points, points[1:], strict=False)) if n else [(0, 0)])
    boxes = [(tuple(r[0] for r in combo), tuple(r[1] for r in combo)) for combo in itertools.product(*ranges)]
    if len(boxes) > MAX_BOXES:
        raise Unsupported(f"cat pieces cut the space into {len(boxes)} boxes")
    return min(cuts), boxes


def _shifted(leaf: Leaf, origin: tuple[int, ...]) -> Leaf:
    if leaf.kind == "const":
        return leaf
    return dataclasses.replace(leaf, offset=leaf.offset + sum(o * s for o, s in zip(origin, leaf.strides, strict=True)))


def box_info(info: BodyInfo, lo: tuple[int, ...], hi: tuple[int, ...]) -> BodyInfo:
    """The body over one box (its own space, origin at `lo`), every cat leaf resolved to the
    piece the box lies in."""
    leaves = {}
    for v, lf in info.leaves.items():
        if lf.kind == "cat":
            p = next(p for p in lf.pieces if p.lo <= lo[lf.dim] < p.hi)
            rel = tuple(x - p.lo if d == lf.dim else x for d, x in enumerate(lo))
            leaves[v] = _shifted(p.leaf, rel)
        else:
            leaves[v] = _shifted(lf, lo)
    stores = [dataclasses.replace(s, offset=s.offset + sum(o * st for o, st in zip(lo, s.strides, strict=True)))
              for s in info.stores]
    space = tuple(b - a for a, b in zip(lo, hi, strict=True))
    return BodyInfo(space, info.axes, leaves, info.alias, info.store_views, info.computed, stores, info.shapes)


def plan_pieces(key: str, info: BodyInfo, ins: list[torch.dtype], outs: list[torch.dtype], flops: float,
                nbytes: float, target: CpuTarget, tag: str = "k") -> GenKernel:
    """A generated function for a pointwise body with cat leaves (raises Unsupported)."""
    cut, boxes = cut_boxes(info)
    boxes = [b for b in boxes if math.prod(h - lo for lo, h in zip(*b, strict=True)) > 0]
    infos = [box_info(info, lo, hi) for lo, hi in boxes]
    n_args = len(ins) + len(outs)
    all_strides = [a[1] for bi in infos for a in _pointwise_accesses(bi)[1]]
    outer = coalesce(list(range(cut)), info.space, all_strides)
    outer_count = math.prod(n for n, _ in outer)
    inner = math.prod(info.space[cut:])
    sched = configure(KernelShape("pointwise", outer=outer_count, inner=inner, flops=flops, bytes=nbytes), target)
    if outer_count > 1 and sched.block == 0:
        name = function_name(key, sched, tag)
        return GenKernel(name, n_args, lambda: render_inner_split(name, ins, outs, info, infos, cut, sched), sched,
                         f"{key}|{sched.key()}", info)
    # separate boxes, each a pointwise loop nest with its own schedule
    parts: list[tuple[BodyInfo, CpuSchedule]] = []
    for bi in infos:
        frac = hint(bi.numel) / max(hint(info.numel), 1)
        o, i = pointwise_loops(bi)
        parts.append((bi, configure(KernelShape("pointwise", outer=o, inner=i, flops=flops * frac,
                                                bytes=nbytes * frac), target)))
    full_key = f"{key}|boxes|" + ";".join(s.key() for _, s in parts)
    first = parts[0][1] if parts else sched
    name = function_name(full_key, first, tag)

    def render() -> str:
        chunks = []
        calls = Code()
        calls.open(f"static int {name}({signature(n_args)})")
        args = ", ".join([f"p{i}" for i in range(n_args)] + ["nf_sym"])
        for k, (bi, s) in enumerate(parts):
            part = f"{name}_box{k}"
            chunks.append(render_pointwise(part, ins, outs, bi, s))
            calls(f"{part}({args});")
        calls("return 0;")
        calls.close()
        return "".join(chunks) + calls.text()

    return GenKernel(name, n_args, render, first, full_key, info)


def render_inner_split(name: str, in_dtypes: list[torch.dtype], out_dtypes: list[torch.dtype], info: BodyInfo,
                       infos: list[BodyInfo], cut: int, sched: CpuSchedule) -> str:
    """One parallel loop over the dims before `cut`; inside, each box's loops over the rest."""
    code, done = open_kernel(name, in_dtypes, out_dtypes, info.numel == 0)
    if done is not None:
        return done
    per_box = [(bi, *_pointwise_accesses(bi)) for bi in infos]
    all_strides = [a[1] for _, _, acc in per_box for a in acc]
    outer = coalesce(list(range(cut)), info.space, all_strides)
    _parallel_for(code, sched, "t", math.prod(n for n, _ in outer))
    coords = _coordinates(code, "t", [n for n, _ in outer])
    first = 0
    for k, (bi, leaves, accesses) in enumerate(per_box):
        code.open(f"/* box {k}: {list(bi.space)} */")
        names = []
        for j, (_, _, offset) in enumerate(accesses):
            terms = [str(offset)] if offset else []
            for c, (_, st) in zip(coords, outer, strict=True):
                s = st[first + j]
                if s:
                    terms.append(c if s == 1 else f"{c} * {s}")
            names.append(f"b{k}_{j}")
            code(f"const int64_t {names[-1]} = {' + '.join(terms) or '0'};")
        first += len(accesses)
        _box_loops(code, bi, leaves, [a[1] for a in accesses], names, cut, k)
        code.close()
    code.close()
    code("return 0;")
    code.close()
    return code.text()


def _coordinates(code: Code, var: str, extents: list[int]) -> list[str]:
    """Emit the coordinates of flat index `var` over `extents` (outer to inner); their names."""
    names: list[str] = []
    rest = var
    for k in range(len(extents) - 1, -1, -1):
        nm = f"o{k}"
        if k == 0:
            code(f"const int64_t {nm} = {rest};")
        else:
            code(f"const int64_t {nm} = {rest} % {extents[k]};")
            code(f"const int64_t or{k} = {rest} / {extents[k]};")
            rest = f"or{k}"
        names.append(nm)
    return list(reversed(names))


def _box_loops(code: Code, bi: BodyInfo, leaves: list, strides: list[tuple[int, ...]], names: list[str], cut: int,
               box: int) -> None:
    """The loops of one box over the dims from `cut` on: sequential loops, then the simd loop."""
    dims = coalesce(list(range(cut, len(bi.space))), bi.space, strides) or [(1, [0] * len(strides))]
    depth = code.depth
    for m, (n, st) in enumerate(dims[:-1]):
        var = f"j{box}_{m}"
        code.open(f"for (int64_t {var} = 0; {var} < {n}; {var}++)")
        nxt = []
        for j, nm in enumerate(names):
            if st[j]:
                nxt.append(f"c{box}_{m}_{j}")
                code(f"const int64_t {nxt[-1]} = {nm} + {var}" + (f" * {st[j]};" if st[j] != 1 else ";"))
            else:
                nxt.append(nm)
        names = nxt
    n_inner, inner_st = dims[-1]
    code("#pragma omp simd")
    code.open(f"for (int64_t i = 0; i < {n_inner}; i++)")
    vals = _Values(bi, code)
    vals.counter = 1000 * (box + 1)  # distinct names per box
    for k, v in enumerate(leaves):
        lf = bi.leaves[v]
        nm = vals.fresh("l")
        code(f"const {compute_type(lf.dtype)} {nm} = {vals.leaf_expr(v, lf, names[k], inner_st[k], 'i')};")
        vals.names[v] = nm
    for v, lf in bi.leaves.items():
        if lf.kind == "const":
            vals.names[v] = literal(lf.value, lf.dtype)
    roots = [s.value for s in bi.stores]
    for n in _cone(bi, roots, lambda v: v in bi.leaves):
        vals.emit_node(n)
    for k, s in enumerate(bi.stores):
        j = len(leaves) + k
        code(f"out{s.buf}[{index_expr(names[j], inner_st[j])}] = {store_expr(vals.names[s.value], s.dtype)};")
    while code.depth > depth:
        code.close()
