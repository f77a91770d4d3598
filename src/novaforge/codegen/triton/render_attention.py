"""Rendering attention kernels: flash attention forward (online softmax in base 2) with the
anchor's causal / boolean / additive mask, grouped-query heads, and the fused epilogue.

Invariant: the kernel computes softmax(q k^T * scale + mask) v exactly as ir/ops.py's
`attention` defines it (top-left causal triangle; bool mask True keeps; query head h reads
key/value head h // (Hq // Hk)), reading q, k, v and the mask through their view strides, never
materializing the score matrix. A query row whose keys are all masked out yields zeros, as
torch's scaled_dot_product_attention does. Padding lanes (head dims rounded up to a power of
two, the last key/query blocks) are masked on load and never stored.
"""

from __future__ import annotations

import math

import torch

from ...ir.symbolic import provably
from ...ir.views import Strided
from ...schedule.gpu import AttentionSchedule, cdiv
from .analysis import BodyInfo, Unsupported, broadcast_strides
from .emit import BodyEmitter, Lane
from .exprs import linear_offset
from .render import KernelSource, assemble, params, program_ids, wide_index

LOG2E = 1.4426950408889634


def _aligned_strides(layout: Strided, shape: tuple[int, ...]) -> list[int]:
    """Strides of `layout` right-aligned and broadcast to `shape` (0 on broadcast dims)."""
    return list(broadcast_strides(layout, shape))


def render_attention(info: BodyInfo, sched: AttentionSchedule) -> KernelSource:
    anchor = info.anchor
    q, k, v = anchor.inputs[:3]
    mask = anchor.inputs[3] if len(anchor.inputs) == 4 else None
    lq, lk, lv = (info.leaves[x] for x in (q, k, v))
    space = info.space  # [..., Hq, L, Ev]
    nb = len(space) - 3
    hq, length = q.type.shape[-3], q.type.shape[-2]
    e, s, ev = q.type.shape[-1], k.type.shape[-2], v.type.shape[-1]
    hk = k.type.shape[-3]
    group = hq // hk
    batch_shape = space[:nb]
    nbatch = math.prod(batch_shape)
    causal = bool(anchor.attrs["causal"])
    scale = anchor.attrs["scale"]
    scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
    bm, bn, bd, bdv = sched.block_m, sched.block_n, sched.block_d, sched.block_dv
    wide = wide_index(info)
    ins, outs = params(info)
    qs = _aligned_strides(lq.layout, batch_shape + (hq, length, e))
    ks = _aligned_strides(lk.layout, batch_shape + (hk, s, e))
    vs = _aligned_strides(lv.layout, batch_shape + (hk, s, ev))
    flat = not provably(lambda: nbatch * hq <= 65535)  # (the grid's second axis holds 65535)

    def base(leaf, strides, head: str) -> str:
        parts = [f"{leaf.layout.offset}"] if leaf.layout.offset else []
        b = linear_offset("b", [(n, st) for n, st in zip(batch_shape, strides[:nb], strict=True)])
        if b != "0":
            parts.append(b)
        if strides[nb]:
            parts.append(f"{head} * {strides[nb]}")
        return " + ".join(parts) or "0"

    mmask = None if length % bm == 0 else "mmask"
    dvmask = None if ev == bdv else "dvmask"
    em = BodyEmitter(info, [Lane("bh", tuple(range(nb + 1)), None), Lane("om2", (nb + 1,), mmask),
                            Lane("od2", (nb + 2,), dvmask)], ins)
    L = em.line
    program_ids(em, "pid_m", "bh", cdiv(length, bm), flat, wide)  # (query block, batch x head)
    L(f"b = bh // {hq}")
    L(f"h = bh % {hq}")
    L(f"hk = h // {group}")
    L(f"offs_m = pid_m * {bm} + tl.arange(0, {bm})")
    L(f"offs_n0 = tl.arange(0, {bn})")
    L(f"offs_d = tl.arange(0, {bd})")
    L(f"offs_dv = tl.arange(0, {bdv})")
    def both(a: str | None, b: str | None) -> str | None:
        return f"{a} & {b}" if a and b else (a or b)

    row_in = None if length % bm == 0 else f"(offs_m[:, None] < {length})"
    d_in = None if e == bd else f"(offs_d[None, :] < {e})"
    dt_in = None if e == bd else f"(offs_d[:, None] < {e})"
    dv_in = None if ev == bdv else f"(offs_dv[None, :] < {ev})"
    qm = both(row_in, d_in)
    L(f"q = tl.load({ins[lq.buf]} + {base(lq, qs, 'h')} + offs_m[:, None] * {qs[nb + 1]} + "
      f"offs_d[None, :] * {qs[nb + 2]}" + (f", mask={qm}, other=0.0)" if qm else ")"))
    L("if UPCAST:")
    L("    q = q.to(tl.float32)")
    L(f"m_i = tl.zeros([{bm}], tl.float32) + _NEG_INF")
    L(f"l_i = tl.zeros([{bm}], tl.float32)")
    L(f"acc = tl.zeros([{bm}, {bdv}], tl.float32)")
    prec = f", input_precision=\"{sched.input_precision}\"" if q.type.dtype == torch.float32 else ""
    k_base, v_base = base(lk, ks, "hk"), base(lv, vs, "hk")
    mask_leaf = None
    if mask is not None:
        mask_leaf = info.leaves[mask]
        if mask_leaf.buf is None:
            raise Unsupported("attention mask is not a kernel input")

    def key_blocks(lo: str, hi: str, bounded: bool, diagonal: bool) -> None:
        """One loop over key blocks [lo, hi); `bounded`: the last block may pass S; `diagonal`:
        apply the causal triangle (only blocks that cross it need it)."""
        n_in = f"(offs_n[None, :] < {s})" if bounded else None
        nt_in = f"(offs_n[:, None] < {s})" if bounded else None
        with em.block(f"for start_n in range({lo}, {hi}, {bn}):"):
            L("offs_n = start_n + offs_n0")
            km = both(n_in, dt_in)
            L(f"kt = tl.load({ins[lk.buf]} + {k_base} + offs_n[None, :] * {ks[nb + 1]} + "
              f"offs_d[:, None] * {ks[nb + 2]}" + (f", mask={km}, other=0.0)" if km else ")"))
            L("if UPCAST:")
            L("    kt = kt.to(tl.float32)")
            L(f"qk = tl.dot(q, kt{prec}) * {scale * LOG2E!r}")
            keep = [n_in] if n_in else []
            if diagonal:
                keep.append("(offs_n[None, :] <= offs_m[:, None])")
            if mask_leaf is not None:
                ms = _aligned_strides(mask_leaf.layout, batch_shape + (hq, length, s))
                m_ptr = (f"{ins[mask_leaf.buf]} + {base(mask_leaf, ms, 'h')} + offs_m[:, None] * {ms[nb + 1]} + "
                         f"offs_n[None, :] * {ms[nb + 2]}")
                m_in = both(row_in, n_in)
                m_arg = f", mask={m_in}, other=0" if m_in else ""
                if mask.type.dtype == torch.bool:
                    L(f"mk = tl.load({m_ptr}{m_arg})")
                    keep.append("(mk != 0)")
                else:
                    L(f"qk = qk + tl.load({m_ptr}{m_arg}).to(tl.float32) * {LOG2E!r}")
            if keep:
                L(f"qk = tl.where({' & '.join(keep)}, qk, _NEG_INF)")
            L("m_new = tl.maximum(m_i, tl.max(qk, 1))")
            L("m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)")
            L("p = tl.exp2(qk - m_safe[:, None])")
            L("alpha = tl.exp2(m_i - m_safe)")
            L("l_i = l_i * alpha + tl.sum(p, 1)")
            vm = both(nt_in, dv_in)
            L(f"vt = tl.load({ins[lv.buf]} + {v_base} + offs_n[:, None] * {vs[nb + 1]} + "
              f"offs_dv[None, :] * {vs[nb + 2]}" + (f", mask={vm}, other=0.0)" if vm else ")"))
            L("if UPCAST:")
            L("    vt = vt.to(tl.float32)")
            L("acc = acc * alpha[:, None]")
            L(f"acc = tl.dot(p.to(vt.dtype), vt, acc{prec})")
            L("m_i = m_new")

    s_full = s // bn * bn  # key blocks that lie entirely inside S
    if causal and bm % bn == 0:
        # blocks left of the query tile's first row need no triangle; the rest cross it
        L(f"split = tl.minimum(pid_m * {bm}, {s_full})")
        key_blocks("0", "split", False, False)
        L(f"hi = tl.minimum((pid_m + 1) * {bm}, {s})")
        key_blocks("split", "hi", s % bn != 0, True)
    elif causal:
        L(f"hi = tl.minimum((pid_m + 1) * {bm}, {s})")
        key_blocks("0", "hi", s % bn != 0, True)
    elif mask_leaf is None and s % bn:
        key_blocks("0", f"{s_full}", False, False)
        key_blocks(f"{s_full}", f"{s}", True, False)
    else:
        key_blocks("0", f"{s}", s % bn != 0, False)
    L("o = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]")
    L("om2 = offs_m[:, None]")
    L("od2 = offs_dv[None, :]")
    if mmask:
        L(f"mmask = om2 < {length}")
    if dvmask:
        L(f"dvmask = od2 < {ev}")
    em.preset(anchor.out, "o", {"om2", "od2"})
    for st in info.stores:
        i, c, strides = st.buf, st.value, st.strides
        em.store(outs[i], c, strides, info.outputs[i].dtype)
    header = (f"flash attention [{nbatch} x {hq} heads (kv {hk})] L={length} S={s} D={e} Dv={ev} "
              f"{'causal' if causal else ('masked' if mask is not None else 'full')}, {q.type.dtype}")
    src = assemble(info, em, header, sched)
    grid = (cdiv(length, bm) * nbatch * hq,) if flat else (cdiv(length, bm), nbatch * hq)
    return KernelSource(info.kernel.name, "attention", src, grid, sched.num_warps,
                        sched.num_stages, len(ins), len(outs), sched)
