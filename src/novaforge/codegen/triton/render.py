"""Rendering pointwise and row-reduction kernels as Triton source; the KernelSource record.

Invariant: a rendered module defines one `@triton.jit` function `kernel(in0.., out0..,
[s0..,] UPCAST)` taking the kernel's body inputs then outputs as contiguous buffers of their IR
types, and writes every element of every output exactly once per launch over `grid`. Static
sizes and strides are literals (kernels are shape-specialized, as their structural keys are);
a kernel for a range of sizes, rendered inside `symbolic.formatting`, prints each symbolic size
as an expression of integer size arguments (`s0..`, after the outputs, `KernelSource.symbols`)
and its `grid` holds size expressions; every bound that depends on a size is then masked.

Reductions run single-pass when the schedule says the row fits one program, else as
column loops (one loop per wave of independent reductions, one for row-shaped outputs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ...ir import OPS, Value
from ...ir.symbolic import current_formatting, provably
from ...schedule.gpu import PointwiseSchedule, ReductionSchedule, cdiv
from .analysis import BodyInfo
from .emit import BodyEmitter, Lane, combine, identity, reduce_expr
from .exprs import PRELUDE, helper_source, tl_compute

WIDE = 2**31 - 2**20  # element counts at or above this index with 64-bit integers


@dataclass(frozen=True)
class KernelSource:
    title: str  # the IR kernel's name (for dumps and profiles)
    kind: str
    source: str
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int
    n_inputs: int
    n_outputs: int
    schedule: Any
    uses_tma: bool = False
    symbols: tuple[str, ...] = ()  # size arguments (after the outputs) of a kernel for a range of sizes


def wide_index(info: BodyInfo) -> bool:
    """64-bit indices: some buffer may reach WIDE elements (for symbolic sizes: unless the
    ranges bound every buffer below it)."""
    return not provably(lambda: info.max_span() < WIDE)


def program_ids(em: BodyEmitter, inner: str, outer: str, inner_count: Any, flat: bool, wide: bool) -> None:
    """`inner` and `outer` program coordinates: the grid's two axes, or, on a flat grid (an outer
    extent the second axis, 65535, may not hold), both from its one axis, `inner` fastest."""
    to64 = ".to(tl.int64)" if wide else ""
    if flat:
        em.line(f"flat_pid = tl.program_id(0){to64}")
        em.line(f"{inner} = flat_pid % {inner_count}")
        em.line(f"{outer} = flat_pid // {inner_count}")
    else:
        em.line(f"{inner} = tl.program_id(0)")
        em.line(f"{outer} = tl.program_id(1){to64}")


def params(info: BodyInfo) -> tuple[list[str], list[str]]:
    return [f"in{i}" for i in range(len(info.inputs))], [f"out{i}" for i in range(len(info.outputs))]


def assemble(info: BodyInfo, em: BodyEmitter, header: str, schedule: Any, extra_helpers: set[str] = frozenset()) -> str:
    """The module's text. A kernel of symbolic sizes (rendered inside `symbolic.formatting`)
    takes the symbols its code names as integer arguments after the outputs (`size_args`)."""
    ins, outs = params(info)
    sig = ", ".join(ins + outs + list(size_args()) + ["UPCAST: tl.constexpr"])
    fn = function_name(info.kind, info.kernel.name)
    lines = [f"# novaforge {info.kind} kernel {info.kernel.name}: {header}",
             f"# schedule {schedule.key()}; structural key {info.kernel.structural_key}",
             PRELUDE, helper_source(em.ctx.helpers | set(extra_helpers)), "", "@triton.jit", f"def {fn}({sig}):"]
    return "\n".join(lines) + "\n" + "\n".join(em.lines) + f"\n\n\nkernel = {fn}\n"


def function_name(kind: str, title: str) -> str:
    """The JIT function's name, which profilers show as the GPU kernel's: nf_<kind>_<title>
    (the module's `kernel` names it for the loader)."""
    return re.sub(r"\W", "_", f"nf_{kind}_{title}")[:64]


def size_args() -> tuple[str, ...]:
    """The size symbols printed so far in the open `formatting` context, in index order (none
    outside one: a static kernel)."""
    fmt = current_formatting()
    return fmt.args() if fmt is not None else ()


def store_all(em: BodyEmitter, outs: list[str], stores: list[tuple[int, Value, tuple[int, ...]]],
              info: BodyInfo) -> None:
    """Every stored value computed (its loads emitted) before the first store: an output may share
    an input's buffer (plan_memory's in-place pairs, a mutated input updated in place), and a
    lane must read its element of the input before it writes it."""
    for _, c, _ in stores:
        em.value(c)
    for i, c, strides in stores:
        em.store(outs[i], c, strides, info.outputs[i].dtype)


def render_pointwise(info: BodyInfo, sched: PointwiseSchedule) -> KernelSource:
    space = info.space
    numel = math.prod(space)
    block = sched.block
    wide = wide_index(info)
    ins, outs = params(info)
    mask = None if numel % block == 0 else "xmask"
    em = BodyEmitter(info, [Lane("x", tuple(range(len(space))), mask)], ins)
    em.line("pid = tl.program_id(0)")
    em.line(f"x = {'pid.to(tl.int64)' if wide else 'pid'} * {block} + tl.arange(0, {block})")
    if mask:
        em.line(f"xmask = x < {numel}")
    store_all(em, outs, [(st.buf, st.value, st.strides) for st in info.stores], info)
    src = assemble(info, em, f"pointwise over {list(space)}", sched)
    return KernelSource(info.kernel.name, "pointwise", src, (cdiv(numel, block),), sched.num_warps, 1,
                        len(ins), len(outs), sched)


def _reduction_waves(info: BodyInfo) -> list[list]:
    """Reductions grouped so that each group depends only on earlier groups (one loop each)."""
    red_deps: dict[Value, frozenset] = {}
    for v in info.leaves:
        red_deps[v] = frozenset()
    for n in info.computed:
        deps = frozenset().union(*(red_deps.get(v, frozenset()) for v in n.inputs))
        red_deps[n.out] = deps | {n} if OPS[n.op].has("reduction") else deps
    done: set = set()
    pending = list(info.reductions)
    waves = []
    while pending:
        wave = [r for r in pending if red_deps[r.inputs[0]] <= done]
        if not wave:
            raise AssertionError("cyclic reductions")
        waves.append(wave)
        done |= set(wave)
        pending = [r for r in pending if r not in wave]
    return waves


def render_reduction(info: BodyInfo, sched: ReductionSchedule) -> KernelSource:
    space, axes = info.space, info.red_axes
    outer = tuple(d for d in range(len(space)) if d not in axes)
    rows = math.prod(space[d] for d in outer)
    cols = math.prod(space[d] for d in axes)
    br, bc = sched.block_rows, sched.block_cols
    wide = wide_index(info)
    ins, outs = params(info)
    rmask = None if rows % br == 0 else "rmask"
    cmask = None if cols % bc == 0 else "cmask"
    em = BodyEmitter(info, [Lane("r", outer, rmask), Lane("c", axes, cmask)], ins)
    em.line("pid = tl.program_id(0)")
    em.line(f"r = ({'pid.to(tl.int64)' if wide else 'pid'} * {br} + tl.arange(0, {br}))[:, None]")
    if rmask:
        em.line(f"rmask = r < {rows}")

    def open_columns(start: str) -> None:
        em.line(f"c = {start}tl.arange(0, {bc})[None, :]")
        if cmask:
            em.line(f"cmask = c < {cols}")

    if not sched.looped:
        open_columns("")
    for wave in _reduction_waves(info):
        if not sched.looped:
            for r in wave:
                x = r.inputs[0]
                cdt = tl_compute(r.out.type.dtype)
                val = em.value(x)
                if "c" not in em.deps[x]:
                    val = f"tl.broadcast_to({val}, ({br}, {bc}))"
                if cmask:
                    val = f"tl.where(cmask, {val}, {identity(r.op, r.out.type.dtype)})"
                name = em.fresh("red")
                em.line(f"{name} = {reduce_expr(r.op, val, 1, em.ctx)}.to({cdt})")
                em.preset(r.out, name, em.deps[x] - {"c"})
            continue
        targets = [r.inputs[0] for r in wave]
        pre = {v for v in em.cone(targets) if "c" not in em.static.get(v, frozenset())}
        em.emit_cone(targets, only=pre)
        accs = []
        for r in wave:
            acc = em.fresh("acc")
            cdt = tl_compute(r.out.type.dtype)
            em.line(f"{acc} = tl.zeros([{br}, {bc}], {cdt}) + {identity(r.op, r.out.type.dtype)}")
            accs.append(acc)
        with em.block(f"for c0 in range(0, {cols}, {bc}):"):
            open_columns("c0 + ")
            for r, acc in zip(wave, accs, strict=True):
                val = em.value(r.inputs[0])
                if cmask:
                    val = f"tl.where(cmask, {val}, {identity(r.op, r.out.type.dtype)})"
                em.line(f"{acc} = {combine(r.op, acc, val)}")
        for r, acc in zip(wave, accs, strict=True):
            name = em.fresh("red")
            em.line(f"{name} = {reduce_expr(r.op, acc, 1, em.ctx)}")
            em.preset(r.out, name, em.static[r.out])
    row_stores, outer_stores = [], []
    for st in info.stores:
        i, c, strides = st.buf, st.value, st.strides
        uses_c = any(strides[d] != 0 and space[d] != 1 for d in axes) or "c" in em.static.get(c, frozenset())
        (row_stores if uses_c else outer_stores).append((i, c, strides))
    store_all(em, outs, outer_stores, info)
    if row_stores and sched.looped:
        targets = [c for _, c, _ in row_stores]
        pre = {v for v in em.cone(targets) if "c" not in em.static.get(v, frozenset())}
        em.emit_cone(targets, only=pre)
        with em.block(f"for c0 in range(0, {cols}, {bc}):"):
            open_columns("c0 + ")
            store_all(em, outs, row_stores, info)
    else:
        store_all(em, outs, row_stores, info)
    mode = "looped" if sched.looped else "single-pass"
    src = assemble(info, em, f"{mode} reduction of {rows} rows x {cols} over axes {list(axes)} of {list(space)}", sched)
    return KernelSource(info.kernel.name, "reduction", src, (cdiv(rows, br),), sched.num_warps, 1,
                        len(ins), len(outs), sched)
