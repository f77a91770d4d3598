"""Flash attention for training: a forward that also returns the row log-sum-exp, and the
backward (dQ, dK, dV) with causal masking and grouped-query heads, as standalone Triton kernels.

    o, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)

q [B, Hq, L, D], k and v [B, Hk, S, D] with Hq % Hk == 0 (query head h reads key/value head
h // (Hq / Hk)), any strides. Invariants: o = softmax(q k^T * scale + causal mask) v with the
top-left causal triangle (key j visible to query i iff j <= i), as ir/ops.py's `attention` and
torch's `is_causal` define it; lse [B, Hq, L] float32 is the natural-log log-sum-exp of each
row of scaled scores; the backward recomputes the probabilities from q, k and lse (FlashAttention-2)
and returns the gradients in the inputs' dtypes, dk and dv summed over the query heads that share
a key/value head. Every reduction is done inside one program (no atomics), so results are
deterministic. Scores are kept in base 2 (scale * log2(e)). Arithmetic and accumulation are in
float32; float32 inputs use TF32 tensor cores unless tf32=False. In Triton's interpreter (CPU
tensors) 16-bit operands are widened before tl.dot (UPCAST), which the interpreter cannot run
on bfloat16. Not wired into compiled graphs yet (the training compiler will call these).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import loader

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3, so0, so1, so2, so3,
                HQ, L, S, qk_scale, GROUP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    hk = h // GROUP
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_n0 = tl.arange(0, BN)
    m_in = offs_m < L
    d_in = offs_d < D
    q = tl.load(Q + b * sq0 + h * sq1 + offs_m[:, None] * sq2 + offs_d[None, :] * sq3,
                mask=m_in[:, None] & d_in[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kb = K + b * sk0 + hk * sk1
    vb = V + b * sv0 + hk * sv1
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, S) if CAUSAL else S
    for n0 in range(0, hi, BN):
        offs_n = n0 + offs_n0
        n_in = offs_n < S
        kt = tl.load(kb + offs_n[None, :] * sk2 + offs_d[:, None] * sk3, mask=n_in[None, :] & d_in[:, None], other=0.0)
        vt = tl.load(vb + offs_n[:, None] * sv2 + offs_d[None, :] * sv3, mask=n_in[:, None] & d_in[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        qk = tl.dot(q, kt, input_precision=PREC) * qk_scale
        keep = n_in[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PREC)
        m_i = m_new
    o = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
    tl.store(O + b * so0 + h * so1 + offs_m[:, None] * so2 + offs_d[None, :] * so3, o.to(O.dtype.element_ty),
             mask=m_in[:, None] & d_in[None, :])
    lse2 = tl.where(l_i == 0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0, 1.0, l_i)))
    tl.store(LSE + bh.to(tl.int64) * L + offs_m, lse2, mask=m_in)  # base 2: log2(sum 2^(s * log2 e))


@triton.jit
def _delta_kernel(O, DO, DELTA, so0, so1, so2, so3, sd0, sd1, sd2, sd3, HQ, L, D: tl.constexpr, BD: tl.constexpr,
                  BM: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    mask = (offs_m[:, None] < L) & (offs_d[None, :] < D)
    o = tl.load(O + b * so0 + h * so1 + offs_m[:, None] * so2 + offs_d[None, :] * so3, mask=mask, other=0.0)
    do = tl.load(DO + b * sd0 + h * sd1 + offs_m[:, None] * sd2 + offs_d[None, :] * sd3, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * L + offs_m, delta, mask=offs_m < L)


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                 sd0, sd1, sd2, sd3, go0, go1, go2, go3, HQ, HK, L, S, qk_scale, scale, GROUP: tl.constexpr,
                 D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                 UPCAST: tl.constexpr, PREC: tl.constexpr):
    """One block of BN keys of one key/value head: dK and dV summed over the GROUP query heads that
    read it and over every query block that sees these keys."""
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = (bhk // HK).to(tl.int64)
    hk = bhk % HK
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_m0 = tl.arange(0, BM)
    n_in = offs_n < S
    d_in = offs_d < D
    kv_mask = n_in[:, None] & d_in[None, :]
    k = tl.load(K + b * sk0 + hk * sk1 + offs_n[:, None] * sk2 + offs_d[None, :] * sk3, mask=kv_mask, other=0.0)
    v = tl.load(V + b * sv0 + hk * sv1 + offs_n[:, None] * sv2 + offs_d[None, :] * sv3, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    lo = (pid_n * BN // BM) * BM if CAUSAL else 0  # earlier query blocks see none of these keys
    for g in range(GROUP):
        h = hk * GROUP + g
        qb = Q + b * sq0 + h * sq1
        dob = DO + b * sd0 + h * sd1
        row = (b * HQ + h) * L
        for m0 in range(lo, L, BM):
            offs_m = m0 + offs_m0
            m_in = offs_m < L
            qm = m_in[:, None] & d_in[None, :]
            q = tl.load(qb + offs_m[:, None] * sq2 + offs_d[None, :] * sq3, mask=qm, other=0.0)
            do = tl.load(dob + offs_m[:, None] * sd2 + offs_d[None, :] * sd3, mask=qm, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            lse = tl.load(LSE + row + offs_m, mask=m_in, other=0.0)
            delta = tl.load(DELTA + row + offs_m, mask=m_in, other=0.0)
            qkt = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale  # [BN, BM]
            keep = n_in[:, None] & m_in[None, :]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            pt = tl.where(keep, tl.exp2(qkt - lse[None, :]), 0.0)
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    dk = dk * scale
    out = b * go0 + hk * go1 + offs_n[:, None] * go2 + offs_d[None, :] * go3  # dk and dv: contiguous, same shape
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
               sd0, sd1, sd2, sd3, go0, go1, go2, go3, HQ, L, S, qk_scale, scale, GROUP: tl.constexpr, D: tl.constexpr,
               BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
               PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    hk = h // GROUP
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_n0 = tl.arange(0, BN)
    m_in = offs_m < L
    d_in = offs_d < D
    qm = m_in[:, None] & d_in[None, :]
    q = tl.load(Q + b * sq0 + h * sq1 + offs_m[:, None] * sq2 + offs_d[None, :] * sq3, mask=qm, other=0.0)
    do = tl.load(DO + b * sd0 + h * sd1 + offs_m[:, None] * sd2 + offs_d[None, :] * sd3, mask=qm, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    row = bh.to(tl.int64) * L
    lse = tl.load(LSE + row + offs_m, mask=m_in, other=0.0)
    delta = tl.load(DELTA + row + offs_m, mask=m_in, other=0.0)
    kb = K + b * sk0 + hk * sk1
    vb = V + b * sv0 + hk * sv1
    dq = tl.zeros([BM, BD], tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, S) if CAUSAL else S
    for n0 in range(0, hi, BN):
        offs_n = n0 + offs_n0
        n_in = offs_n < S
        kt = tl.load(kb + offs_n[None, :] * sk2 + offs_d[:, None] * sk3, mask=n_in[None, :] & d_in[:, None], other=0.0)
        vt = tl.load(vb + offs_n[None, :] * sv2 + offs_d[:, None] * sv3, mask=n_in[None, :] & d_in[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        qk = tl.dot(q, kt, input_precision=PREC) * qk_scale
        keep = m_in[:, None] & n_in[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        p = tl.where(keep, tl.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, vt, input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC)
    dq = dq * scale
    tl.store(DQ + b * go0 + h * go1 + offs_m[:, None] * go2 + offs_d[None, :] * go3, dq.to(DQ.dtype.element_ty),
             mask=qm)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, bool]:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [B, Hq, L, D], k = v [B, Hk, S, D]; got {q.shape} {k.shape} {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(f"incompatible q {q.shape} and k {k.shape}")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtypes {q.dtype} {k.dtype} {v.dtype}")
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError("q, k, v on different devices")
    interpret = q.device.type == "cpu"
    loader.ensure_mode(interpret)
    return q.shape[1] // k.shape[1], interpret


def _blocks(length: int, d: int, interpret: bool, bm: int | None, bn: int | None) -> tuple[int, int, int]:
    """Head dim padded to a power of two (>= 16); 64 x 64 query x key blocks (32 keys for d > 64:
    registers), no larger than the sequence; smaller in the interpreter only if asked."""
    bd = max(16, triton.next_power_of_2(d))
    cap = max(16, triton.next_power_of_2(length))
    return bd, bm or min(64, cap), bn or min(64 if bd <= 64 else 32, cap)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                            scale: float | None = None, tf32: bool = True, block_m: int | None = None,
                            block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): softmax(q k^T * scale + causal mask) v and the natural-log log-sum-exp of each
    scaled score row ([B, Hq, L] float32; -inf for a row that sees no key)."""
    group, interpret = _check(q, k, v)
    bsz, hq, length, d = q.shape
    s = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bd, bm, bn = _blocks(length, d, interpret, block_m, block_n)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse2 = torch.empty(bsz, hq, length, dtype=torch.float32, device=q.device)
    prec = "tf32" if tf32 else "ieee"
    if o.numel():
        _fwd_kernel[(triton.cdiv(length, bm), bsz * hq)](
            q, k, v, o, lse2, *q.stride(), *k.stride(), *v.stride(), *o.stride(), hq, length, s, scale * LOG2E,
            GROUP=group, D=d, BD=bd, BM=bm, BN=bn, CAUSAL=causal, UPCAST=interpret, PREC=prec, num_warps=4,
            num_stages=2)
    return o, lse2 / LOG2E


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                             do: torch.Tensor, *, causal: bool = False, scale: float | None = None, tf32: bool = True,
                             block_m: int | None = None,
                             block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of flash_attention_forward's o given do = d loss / d o, from the forward's
    output o and log-sum-exp lse (dk, dv summed over the query heads of each key/value head)."""
    group, interpret = _check(q, k, v)
    bsz, hq, length, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bd, bm, bn = _blocks(max(length, s), d, interpret, block_m, block_n)
    lse2 = (lse.float() * LOG2E).contiguous()
    delta = torch.empty(bsz, hq, length, dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    prec = "tf32" if tf32 else "ieee"
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    _delta_kernel[(triton.cdiv(length, bm), bsz * hq)](o, do, delta, *o.stride(), *do.stride(), hq, length, D=d,
                                                       BD=bd, BM=bm, num_warps=4)
    common = dict(GROUP=group, D=d, BD=bd, BM=bm, BN=bn, CAUSAL=causal, UPCAST=interpret, PREC=prec, num_warps=4,
                  num_stages=2)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    _dkdv_kernel[(triton.cdiv(s, bn), bsz * hk)](q, k, v, do, lse2, delta, dk, dv, *strides, *dk.stride(), hq, hk,
                                                 length, s, scale * LOG2E, scale, **common)
    _dq_kernel[(triton.cdiv(length, bm), bsz * hq)](q, k, v, do, lse2, delta, dq, *strides, *dq.stride(), hq,
                                                    length, s, scale * LOG2E, scale, **common)
    return dq, dk, dv
