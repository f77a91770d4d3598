"""Rendering matmul kernels: a tiled, grouped `tl.dot` main loop with prologue views as strides
and the fused elementwise epilogue applied to the accumulator tile before the store.

Invariant: for an anchor `matmul(A, B)` with output space [batch..., M, N], batch dims along
which B is broadcast are folded into the rows (a Linear over [B, T, K] is one [B*T, K] GEMM);
the other batch dims are the grid's second axis. A and B are read through their view chains'
strides (a transposed weight is a stride swap, never a copy). The accumulator is float32;
float32 operands use TF32 tensor cores unless the schedule says "ieee". The `tma` loader reads
both operands with device-side tensor descriptors (Hopper's bulk copy engine; zero-filled at
the edges); the `pointer` loader uses masked pointer loads and works everywhere.
"""

from __future__ import annotations

import math

import torch

from ...ir.symbolic import is_symbolic, provably
from ...ir.views import Strided
from ...schedule.gpu import MatmulSchedule, cdiv
from .analysis import BodyInfo
from .emit import BodyEmitter, Lane
from .exprs import linear_offset, single_stride
from .render import KernelSource, assemble, params, program_ids, store_all, wide_index


def batch_strides(layout: Strided, space: tuple[int, ...], nb: int) -> list[int]:
    """Strides of an operand's batch dims right-aligned to the output's nb batch dims."""
    own = len(layout.shape) - 2
    out = []
    for d in range(nb):
        j = d - (nb - own)
        out.append(0 if j < 0 or layout.shape[j] == 1 else layout.strides[j])
    return out


class MatmulLayout:
    """How the output space splits into grid batch dims, folded rows and columns, and the
    operands' strides along each."""

    def __init__(self, info: BodyInfo) -> None:
        anchor = info.anchor
        a, b = anchor.inputs
        self.la, self.lb = info.leaves[a], info.leaves[b]
        space = info.space
        self.space = space
        self.nb = nb = len(space) - 2
        self.m, self.n, self.k = space[-2], space[-1], a.type.shape[-1]
        self.a_bs = batch_strides(self.la.layout, space, nb)
        self.b_bs = batch_strides(self.lb.layout, space, nb)
        self.a_sm, self.a_sk = self.la.layout.strides[-2], self.la.layout.strides[-1]
        self.b_sk, self.b_sn = self.lb.layout.strides[-2], self.lb.layout.strides[-1]
        self.fold = [d for d in range(nb) if self.b_bs[d] == 0]
        self.grid_dims = [d for d in range(nb) if self.b_bs[d] != 0]
        self.row_dims = self.fold + [nb]
        self.rows = math.prod(space[d] for d in self.fold) * self.m
        self.batch = math.prod(space[d] for d in self.grid_dims)
        self.dtype = a.type.dtype
        # a batch the grid's second axis (65535) may not hold: one flat axis over (batch, tile)
        self.flat = not provably(lambda: self.batch <= 65535)

    def a_row_dims(self) -> list[tuple[int, int]]:
        return [(self.space[d], self.a_bs[d]) for d in self.fold] + [(self.m, self.a_sm)]

    def a_batch(self) -> str:
        return linear_offset("pid_b", [(self.space[d], self.a_bs[d]) for d in self.grid_dims])

    def b_batch(self) -> str:
        return linear_offset("pid_b", [(self.space[d], self.b_bs[d]) for d in self.grid_dims])

    def tma_operands(self) -> tuple[str, str] | None:
        """('k'|'m', 'n'|'k'): which dim of A and B is contiguous, if tensor descriptors can
        read them (one row stride, the other stride 1, 16-byte aligned strides and bases);
        None for symbolic sizes (descriptors are built for static shapes here)."""
        if is_symbolic(self.space) or is_symbolic(self.k) or is_symbolic([self.a_bs, self.b_bs, self.a_sm,
                                                                        self.a_sk, self.b_sk, self.b_sn]):
            return None
        e = torch.empty((), dtype=self.dtype).element_size()
        a_rs = single_stride(self.a_row_dims())
        if a_rs is None:
            return None
        bases = [self.la.layout.offset * e, self.lb.layout.offset * e]
        bases += [s * e for s in self.a_bs] + [s * e for s in self.b_bs]
        if any(x % 16 for x in bases):
            return None
        if self.a_sk == 1 and (a_rs * e) % 16 == 0:
            a_major = "k"
        elif a_rs == 1 and (self.a_sk * e) % 16 == 0 and self.rows > 1:
            a_major = "m"
        else:
            return None
        if self.b_sn == 1 and (self.b_sk * e) % 16 == 0:
            b_major = "n"
        elif self.b_sk == 1 and (self.b_sn * e) % 16 == 0 and self.n > 1:
            b_major = "k"
        else:
            return None
        if min(self.rows, self.n, self.k) < 1:
            return None
        return a_major, b_major


def _plus(base: str) -> str:
    return "" if base == "0" else f"{base} + "


def render_matmul(info: BodyInfo, sched: MatmulSchedule) -> KernelSource:
    lay = MatmulLayout(info)
    bm, bn, bk = sched.block_m, sched.block_n, sched.block_k
    rows, n, k = lay.rows, lay.n, lay.k
    wide = wide_index(info)
    ins, outs = params(info)
    a_ptr, b_ptr = ins[lay.la.buf], ins[lay.lb.buf]
    tma = lay.tma_operands() if sched.loader == "tma" else None
    mmask = None if rows % bm == 0 else "mmask"
    nmask = None if n % bn == 0 else "nmask"
    space = info.space
    em = BodyEmitter(info, [Lane("pid_b", tuple(lay.grid_dims), None), Lane("rm2", tuple(lay.row_dims), mmask),
                            Lane("rn2", (len(space) - 1,), nmask)], ins)
    L = em.line
    mn_tiles = cdiv(rows, bm) * cdiv(n, bn)
    a_base = " + ".join(x for x in (f"{lay.la.layout.offset}" if lay.la.layout.offset else "", lay.a_batch())
                        if x and x != "0") or "0"
    b_base = " + ".join(x for x in (f"{lay.lb.layout.offset}" if lay.lb.layout.offset else "", lay.b_batch())
                        if x and x != "0") or "0"
    # descriptors are made once per program, or once per tile when their bases move with the batch
    hoist = tma is not None and sched.persistent and lay.batch == 1
    if hoist:
        _descriptors(L, lay, tma, a_ptr, b_ptr, a_base, b_base, bm, bn, bk)
    descs = tma is not None and not hoist
    if sched.persistent:
        # persistent: `programs` CTAs walk the tiles with a stride of `programs` (flattened with the
        # k loop, so the next tile's loads are issued while this one's epilogue runs)
        tiles = mn_tiles * lay.batch
        start = "tl.program_id(0)" + (".to(tl.int64)" if wide else "")
        with em.block(f"for tile in tl.range({start}, {tiles}, {sched.programs}, flatten=True):"):
            if lay.batch != 1:
                L(f"pid_b = tile // {mn_tiles}")
                L(f"pid = tile % {mn_tiles}")
            else:
                L("pid_b = 0")
                L("pid = tile")
            _tile(em, info, lay, sched, tma, a_ptr, b_ptr, a_base, b_base, outs, wide, mmask, nmask, descs)
    else:
        program_ids(em, "pid", "pid_b", mn_tiles, lay.flat, wide)  # (output tile, batch)
        _tile(em, info, lay, sched, tma, a_ptr, b_ptr, a_base, b_base, outs, wide, mmask, nmask, descs)
    header = (f"[{lay.batch} x] ({rows} x {k}) @ ({k} x {n}), {lay.dtype}, "
              f"loader {'tma ' + '/'.join(tma) if tma else 'pointer'}"
              + (f", persistent over {sched.programs} programs, epilogue in {sched.subtile} subtiles"
                 if sched.persistent else ""))
    src = assemble(info, em, header, sched)
    grid = (sched.programs, 1) if sched.persistent else (mn_tiles * lay.batch, 1) if lay.flat else (mn_tiles, lay.batch)
    return KernelSource(info.kernel.name, "matmul", src, grid, sched.num_warps, sched.num_stages, len(ins), len(outs),
                        sched, uses_tma=tma is not None)


def _descriptors(L, lay: MatmulLayout, tma: tuple[str, str], a_ptr: str, b_ptr: str, a_base: str, b_base: str,
                 bm: int, bn: int, bk: int) -> None:
    rows, n, k = lay.rows, lay.n, lay.k
    a_major, b_major = tma
    a_rs = single_stride(lay.a_row_dims())
    if a_major == "k":
        L(f"a_desc = tl.make_tensor_descriptor({a_ptr} + {a_base}, shape=[{rows}, {k}], strides=[{a_rs}, 1], "
          f"block_shape=[{bm}, {bk}])")
    else:
        L(f"a_desc = tl.make_tensor_descriptor({a_ptr} + {a_base}, shape=[{k}, {rows}], strides=[{lay.a_sk}, 1], "
          f"block_shape=[{bk}, {bm}])")
    if b_major == "n":
        L(f"b_desc = tl.make_tensor_descriptor({b_ptr} + {b_base}, shape=[{k}, {n}], strides=[{lay.b_sk}, 1], "
          f"block_shape=[{bk}, {bn}])")
    else:
        L(f"b_desc = tl.make_tensor_descriptor({b_ptr} + {b_base}, shape=[{n}, {k}], strides=[{lay.b_sn}, 1], "
          f"block_shape=[{bn}, {bk}])")


def _tile(em: BodyEmitter, info: BodyInfo, lay: MatmulLayout, sched: MatmulSchedule, tma: tuple[str, str] | None,
          a_ptr: str, b_ptr: str, a_base: str, b_base: str, outs: list[str], wide: bool, mmask: str | None,
          nmask: str | None, descs: bool) -> None:
    """One output tile: `pid` (the tile within the batch) and `pid_b` are defined; grouped
    swizzle, the k loop, then the epilogue (in `sched.subtile` column pieces)."""
    L = em.line
    bm, bn, bk, g = sched.block_m, sched.block_n, sched.block_k, sched.group_m
    rows, n, k = lay.rows, lay.n, lay.k
    L(f"num_pid_n = {cdiv(n, bn)}")
    L(f"num_pid_in_group = {g} * num_pid_n")
    L("group_id = pid // num_pid_in_group")
    L(f"first_pid_m = group_id * {g}")
    L(f"group_size_m = tl.minimum({cdiv(rows, bm)} - first_pid_m, {g})")
    L("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)")
    L("pid_n = (pid % num_pid_in_group) // group_size_m")
    if wide:
        L("pid_m = pid_m.to(tl.int64)")
        L("pid_n = pid_n.to(tl.int64)")
    L(f"rm = pid_m * {bm} + tl.arange(0, {bm})")
    L(f"rn = pid_n * {bn} + tl.arange(0, {bn})")
    L(f"rk = tl.arange(0, {bk})")
    k_tiles = cdiv(k, bk)
    precision = "tf32" if sched.input_precision == "tf32rn" else sched.input_precision
    prec = f", input_precision=\"{precision}\"" if lay.dtype == torch.float32 else ""
    if tma is None:
        L(f"ram = rm % {rows}" if rows % bm else "ram = rm")
        L(f"rbn = rn % {n}" if n % bn else "rbn = rn")
        a_row = linear_offset("ram", lay.a_row_dims())
        if a_row == "0":  # a single row: keep the tile shape
            a_row = "ram * 0"
        L(f"a_ptrs = {a_ptr} + {_plus(a_base)}({a_row})[:, None] + (rk * {lay.a_sk})[None, :]")
        L(f"b_ptrs = {b_ptr} + {_plus(b_base)}(rk * {lay.b_sk})[:, None] + (rbn * {lay.b_sn})[None, :]")
    elif descs:
        _descriptors(L, lay, tma, a_ptr, b_ptr, a_base, b_base, bm, bn, bk)
    L(f"acc = tl.zeros(({bm}, {bn}), dtype=tl.float32)")
    with em.block(f"for kt in range({k_tiles}):"):
        if tma is None:
            if k % bk:
                L(f"kmask = rk < {k} - kt * {bk}")
                L("a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)")
                L("b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)")
            else:
                L("a = tl.load(a_ptrs)")
                L("b = tl.load(b_ptrs)")
        else:
            a_major, b_major = tma
            L(f"a = a_desc.load([pid_m * {bm}, kt * {bk}])" if a_major == "k"
              else f"a = a_desc.load([kt * {bk}, pid_m * {bm}]).T")
            L(f"b = b_desc.load([kt * {bk}, pid_n * {bn}])" if b_major == "n"
              else f"b = b_desc.load([pid_n * {bn}, kt * {bk}]).T")
        if sched.input_precision == "tf32rn" and lay.dtype == torch.float32:  # nearest, not truncated (GPU only)
            L("if not UPCAST:")
            for x in ("a", "b"):
                L(f"    {x} = tl.inline_asm_elementwise(\"cvt.rna.tf32.f32 $0, $1;\", \"=r,r\", [{x}], "
                  "dtype=tl.float32, is_pure=True, pack=1)")
        if lay.dtype != torch.float32:
            L("if UPCAST:")
            L("    a = a.to(tl.float32)")
            L("    b = b.to(tl.float32)")
        L(f"acc = tl.dot(a, b, acc{prec})")
        if tma is None:
            L(f"a_ptrs += {bk * lay.a_sk}")
            L(f"b_ptrs += {bk * lay.b_sk}")
    L("rm2 = rm[:, None]")
    if mmask:
        L(f"mmask = rm2 < {rows}")
    parts = _split_columns(L, "acc", bm, bn, sched.subtile)
    width = bn // len(parts)
    for h, part in enumerate(parts):
        with em.scope():
            L("rn2 = rn[None, :]" if len(parts) == 1 else
              f"rn2 = (pid_n * {bn} + {h * width} + tl.arange(0, {width}))[None, :]")
            if nmask:
                L(f"nmask = rn2 < {n}")
            em.preset(info.anchor.out, part, {"rm2", "rn2"})
            store_all(em, outs, [(st.buf, st.value, st.strides) for st in info.stores], info)


def _split_columns(L, acc: str, bm: int, bn: int, pieces: int) -> list[str]:
    """Names of `pieces` column blocks of the [bm, bn] tile `acc`, left to right (tl.split halves
    the last dim of a [bm, bn/2, 2] view; quarters split the halves again)."""
    names = [acc]
    width = bn
    while len(names) < pieces:
        width //= 2
        nxt = []
        for nm in names:
            lo, hi = f"{nm}_l", f"{nm}_h"
            L(f"{lo}, {hi} = tl.split(tl.permute(tl.reshape({nm}, ({bm}, 2, {width})), (0, 2, 1)))")
            nxt += [lo, hi]
        names = nxt
    return names
