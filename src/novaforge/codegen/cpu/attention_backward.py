"""A generated flash-attention backward kernel (float32 math): dq, dk, dv from the saved logsumexp.

`attention_backward(grad_out, q, k, v, out, lse[, mask])` (ir/ops/matmul.py) is what autograd
records for scaled_dot_product_attention on the CPU. With P = exp(q k^T * scale + mask - lse)
(the forward's softmax, rebuilt one tile at a time from its saved row logsumexp) and
D = rowsum(grad_out * out):

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D) * scale,   dQ = dS K,   dK = dS^T Q.

The parallel tasks are (batch, key/value head): a task owns every query head of its key/value
head (grouped-query heads sum into one dK, dV) and all of their query and key blocks, so no two
tasks write the same gradient element and nothing is reduced across threads. A task packs K
(rows, and transposed in kv-tile-wide tiles) and V (transposed) into per-thread scratch once,
keeps dK and dV for all keys in float accumulators there, and walks query blocks of `BQ` rows;
for each it loads q and dO rows and D, then walks key blocks of `BK` keys up to the causal
limit: the score tile S = q K^T and dP = dO V^T (register tiles vectorized over keys), P and
dS in place, dV += P^T dO and dK += dS^T q (register tiles that read the two tiles
transposed: `nf_tile_rank<R, ACC, true>`), and dQ += dS K in a per-block accumulator. Only
BQ x BK tiles of P and dS ever exist.

Layouts: q, k, v, out, grad_out, lse and the mask are read through their strides (any view);
the gradients are written heads-last ([..., L, H, E]) and contiguous, as the op's type says.
bfloat16 inputs are converted to float on load and the gradients rounded to bfloat16 once.

Invariant: the results equal ATen's `_scaled_dot_product_flash_attention_for_cpu_backward` up
to float rounding, including zeros for query rows whose every key is masked (their P is 0).
Sizes must be static and non-zero (else Unsupported: the kernel runs through torch, ATen's).
"""

from __future__ import annotations

import math

import torch

from ...ir import Kernel
from ...ir.symbolic import is_symbolic
from ...schedule.cpu import KernelShape, configure
from ...schedule.target import CpuTarget
from .analysis import Unsupported, operand
from .attention import _batch_strides
from .loops import Code, GenKernel, coalesce, function_name, signature

BQ = 32  # query rows per block
BK = 64  # keys per block (a multiple of two vectors of every SIMD width)


def _product(c: Code, a: str, lda, b: str, ldb, k, out: str, ldo, rows, cols, acc: bool, tiled: bool,
             step: int, a_t: bool = False, groups: tuple[int, ...] = (6, 4, 1)) -> None:
    """out[r][0:cols] (+)= sum_{k' < k} A[r][k'] * b[k' * ldb + 0:cols] for r < rows, where
    A[r][k'] = a[r * lda + k'] (or a[k' * lda + r] with `a_t`): register tiles of `groups` rows
    x two vectors (`tiled`: cols a multiple of `step`), or loops vectorized over cols."""
    c.open("")
    if tiled:
        c("int64_t r_ = 0;")
        row = "r_" if a_t else f"r_ * {lda}"
        flags = f"{'true' if acc else 'false'}, {'true' if a_t else 'false'}"
        for r in groups:
            c(f"for (; r_ + {r} <= {rows}; r_ += {r}) for (int64_t c_ = 0; c_ < {cols}; c_ += {step}) "
              f"nf_tile_rank<{r}, {flags}>({a} + {row}, {lda}, {b} + c_, {ldb}, {k}, "
              f"{out} + r_ * {ldo} + c_, {ldo});")
    else:
        c.open(f"for (int64_t r_ = 0; r_ < {rows}; r_++)")
        c(f"float* o_ = {out} + r_ * {ldo};")
        if not acc:
            c(f"for (int64_t c_ = 0; c_ < {cols}; c_++) o_[c_] = 0.0f;")
        c.open(f"for (int64_t k_ = 0; k_ < {k}; k_++)")
        c(f"const float a_ = ({a})[{f'k_ * {lda} + r_' if a_t else f'r_ * {lda} + k_'}];")
        c(f"const float* b_ = {b} + k_ * {ldb};")
        c("#pragma omp simd")
        c(f"for (int64_t c_ = 0; c_ < {cols}; c_++) o_[c_] += a_ * b_[c_];")
        c.close()
        c.close()
    c.close()


def plan_flash_attention_backward(kernel: Kernel, target: CpuTarget) -> GenKernel:
    body = kernel.body
    nodes = [n for n in body.nodes if n.op == "attention_backward"]
    if len(nodes) != 1 or list(body.outputs) != list(nodes[0].outputs):
        raise Unsupported("attention_backward kernel with extra nodes")
    node = nodes[0]
    ops = [operand(body, v) for v in node.inputs]
    g, q, k, v, o, lse = ops[:6]
    mask = ops[6] if len(ops) == 7 else None
    dt = q.dtype
    if dt not in (torch.float32, torch.bfloat16) or any(x.dtype != dt for x in (g, k, v, o)):
        raise Unsupported("attention backward is generated for float32 and bfloat16")
    if mask is not None and mask.dtype not in (dt, torch.bool):
        raise Unsupported("attention mask dtype")
    layouts = [x.layout for x in ops]
    if is_symbolic([(lay.shape, lay.strides, lay.offset) for lay in layouts]):
        raise Unsupported("attention backward with symbolic sizes runs through torch")
    *batch, hq, L, E = q.layout.shape
    hk, S, Ev = k.layout.shape[-3], k.layout.shape[-2], v.layout.shape[-1]
    batch = tuple(batch)
    if 0 in (math.prod(batch), hq, L, S, E, Ev):
        raise Unsupported("attention backward of an empty tensor")
    causal, scale = bool(node.attrs["causal"]), float(node.attrs["scale"])
    group = hq // hk
    strides = [_batch_strides(x, batch, 3) for x in (g, q, k, v, o)] + [_batch_strides(lse, batch, 2)]
    if mask is not None:
        mst = _batch_strides(mask, batch + (hq, L, S), 0)  # the mask broadcast to [..., Hq, L, S]
        mask_tail = mst[-3:]
        strides.append(mst[:-3])
    for rows, heads, width in ((L, hq, E), (S, hk, E), (S, hk, Ev)):  # the heads-last gradients
        strides.append([math.prod(batch[d + 1:]) * rows * heads * width for d in range(len(batch))])
    dims = coalesce(list(range(len(batch))), batch, [tuple(s) for s in strides])
    if len(dims) > 1:
        raise Unsupported("attention batch dims do not coalesce")
    B = dims[0][0] if dims else 1
    bst = dims[0][1] if dims else [0] * len(strides)
    gst, qst, kst, vst, ost, lst = bst[:6]
    mst_b = bst[6] if mask is not None else 0
    dqst, dkst, dvst = bst[-3:]
    shape = KernelShape("attention", outer=B * hk, inner=S, head_dim=max(E, Ev), kv_len=S, q_len=L,
                        flops=2.5 * 4.0 * B * hq * L * S * E / (2 if causal else 1),
                        bytes=4.0 * (2 * B * hq * L * (E + Ev) + 2 * B * hk * S * (E + Ev)))
    sched = configure(shape, target)
    W = target.vector_floats
    step = 2 * W
    simd = target.simd != "scalar" and BK % step == 0
    tiled_e, tiled_ev = simd and E % step == 0, simd and Ev % step == 0
    key = (f"{kernel.structural_key}|flash_bwd|{'|'.join(str(lay) for lay in layouts)}|{BQ}x{BK}")
    name = function_name(key, sched, "ab")
    n_in = len(body.inputs)
    bf16 = dt == torch.bfloat16
    T = "uint16_t" if bf16 else "float"
    mtype = "uint8_t" if mask is not None and mask.dtype == torch.bool else T
    k_in_place = not bf16 and k.layout.strides[-1] == 1
    groups = (8, 4, 2, 1) if W >= 16 else (6, 4, 1)  # rows per register tile (AVX-512 has 32 registers)
    nkb = -(-S // BK)
    SP = nkb * BK

    def ld(x: str) -> str:
        return f"nf_bf16_load({x})" if bf16 else x

    def st(x: str) -> str:
        return f"nf_bf16_store({x})" if bf16 else x

    def render() -> str:
        c = Code()
        c.open(f"static int {name}({signature(n_in + 3)})")
        for nm, x in (("gg", g), ("qg", q), ("kg", k), ("vg", v), ("og", o)):
            c(f"const {T}* {nm} = (const {T}*)p{x.buf} + {x.layout.offset};")
        c(f"const float* lg = (const float*)p{lse.buf} + {lse.layout.offset};")
        if mask is not None:
            c(f"const {mtype}* mg = (const {mtype}*)p{mask.buf} + {mask.layout.offset};")
        c(f"{T}* dqg = ({T}*)p{n_in}; {T}* dkg = ({T}*)p{n_in + 1}; {T}* dvg = ({T}*)p{n_in + 2};")
        if sched.threads > 1:
            c(f"#pragma omp parallel for num_threads({sched.threads}) schedule(dynamic, 1)")
        c.open(f"for (int64_t t = 0; t < {B * hk}; t++)")
        c(f"const int64_t b = t / {hk}, kh = t % {hk};")
        c(f"const {T}* kp = kg + b * {kst} + kh * {k.layout.strides[-3]};")
        c(f"const {T}* vp = vg + b * {vst} + kh * {v.layout.strides[-3]};")
        # per-thread scratch: K^T and V^T tiles [nkb][E|Ev][BK] (zero past S), dK [S][E], dV [S][Ev],
        # and K's rows [S][E] unless they are read in place (float32, unit stride along E)
        c(f"float* ktb = nf_scratch(0, {SP * (E + Ev) + S * (E + Ev) + (0 if k_in_place else S * E)});")
        c(f"float* vtb = ktb + {SP * E}; float* dka = vtb + {SP * Ev}; float* dva = dka + {S * E};")
        c("#pragma omp simd")
        c(f"for (int64_t x = 0; x < {S * (E + Ev)}; x++) dka[x] = 0.0f;  // (dva follows dka)")
        if k_in_place:
            c(f"const float* kr = kp; const int64_t ldk = {k.layout.strides[-2]};")
        else:
            c(f"float* kr = dva + {S * Ev}; const int64_t ldk = {E};")
        for nm, x, w, buf in (("k", k, E, "ktb"), ("v", v, Ev, "vtb")):
            if not bf16 and x.layout.strides[-1] == 1:  # rows contiguous: a register block at a time
                c.open(f"for (int64_t j0 = 0; j0 < {SP}; j0 += {BK})")
                c(f"float* tile = {buf} + j0 * {w};")
                c(f"const int64_t nj = {S} - j0 < {BK} ? {S} - j0 : {BK};")
                ldx = x.layout.strides[-2]
                c(f"nf_transpose_into({nm}p + j0 * {ldx}, {ldx}, nj, {w}, tile, {BK});")
                if S % BK:
                    c(f"for (int64_t e = 0; e < {w}; e++) "
                      f"for (int64_t j = nj; j < {BK}; j++) tile[e * {BK} + j] = 0.0f;")
                c.close()
                continue
            c.open(f"for (int64_t j0 = 0; j0 < {SP}; j0 += {BK})")
            c(f"float* tile = {buf} + j0 * {w};")
            c.open(f"for (int64_t j = 0; j < {BK}; j++)")
            c.open(f"if (j0 + j >= {S})")
            c(f"for (int64_t e = 0; e < {w}; e++) tile[e * {BK} + j] = 0.0f;")
            c("continue;")
            c.close()
            c(f"const {T}* row = {nm}p + (j0 + j) * {x.layout.strides[-2]};")
            c.open(f"for (int64_t e = 0; e < {w}; e++)")
            c(f"const float y = {ld(f'row[e * {x.layout.strides[-1]}]')};")
            c(f"tile[e * {BK} + j] = y;")
            if nm == "k" and not k_in_place:
                c(f"kr[(j0 + j) * {E} + e] = y;")
            c.close()
            c.close()
            c.close()
        c(f"alignas(64) float qb[{BQ}][{E}], gb[{BQ}][{Ev}], s[{BQ}][{BK}], dp[{BQ}][{BK}], "
          f"dqa[{BQ}][{E}];")
        c(f"float ls[{BQ}], dd[{BQ}];")
        c.open(f"for (int64_t h = kh * {group}; h < (kh + 1) * {group}; h++)")
        c(f"const {T}* qp = qg + b * {qst} + h * {q.layout.strides[-3]};")
        c(f"const {T}* gp = gg + b * {gst} + h * {g.layout.strides[-3]};")
        c(f"const {T}* op = og + b * {ost} + h * {o.layout.strides[-3]};")
        c(f"const float* lp = lg + b * {lst} + h * {lse.layout.strides[-2]};")
        if mask is not None:
            c(f"const {mtype}* mp = mg + b * {mst_b} + h * {mask_tail[0]};")
        c(f"{T}* dqp = dqg + b * {dqst} + h * {E};")
        c.open(f"for (int64_t i0 = 0; i0 < {L}; i0 += {BQ})")
        c(f"const int64_t nr = {L} - i0 < {BQ} ? {L} - i0 : {BQ};")
        # the next block's rows of q, dO and out into L2 while this block computes (rows are strided)
        pf = [(nm, x, w) for nm, x, w in (("qp", q, E), ("gp", g, Ev), ("op", o, Ev)) if x.layout.strides[-1] == 1]
        if pf:
            c.open(f"for (int64_t r = i0 + {BQ}; r < i0 + {2 * BQ} && r < {L}; r++)")
            for nm, x, w in pf:
                c(f"nf_pf_row((const char*)({nm} + r * {x.layout.strides[-2]}), {w * (2 if bf16 else 4)}, 0);")
            c.close()
        c.open("for (int64_t r = 0; r < nr; r++)")
        c("const int64_t i = i0 + r;")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {E}; e++) "
          f"qb[r][e] = {ld(f'qp[i * {q.layout.strides[-2]} + e * {q.layout.strides[-1]}]')};")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {E}; e++) dqa[r][e] = 0.0f;")
        c("float d = 0.0f;")
        c("#pragma omp simd reduction(+:d)")
        c.open(f"for (int64_t e = 0; e < {Ev}; e++)")
        c(f"gb[r][e] = {ld(f'gp[i * {g.layout.strides[-2]} + e * {g.layout.strides[-1]}]')};")
        c(f"d += gb[r][e] * {ld(f'op[i * {o.layout.strides[-2]} + e * {o.layout.strides[-1]}]')};")
        c.close()
        c("dd[r] = d;")
        c(f"const float l = lp[i * {lse.layout.strides[-1]}];")
        c("ls[r] = l == -__builtin_inff() ? 0.0f : l;  // a row with every key masked: its P is 0")
        c.close()
        c(f"const int64_t jend = {f'(i0 + nr < {S} ? i0 + nr : {S})' if causal else S};")
        c.open(f"for (int64_t j0 = 0; j0 < jend; j0 += {BK})")
        c(f"const int64_t nj = jend - j0 < {BK} ? jend - j0 : {BK};")
        c(f"const int64_t njv = {f'(nj + {step - 1}) / {step} * {step}' if simd else 'nj'};")
        c(f"const float* kt = ktb + (j0 / {BK}) * {E * BK};")
        c(f"const float* vt = vtb + (j0 / {BK}) * {Ev * BK};")
        _product(c, "&qb[0][0]", E, "kt", BK, E, "&s[0][0]", BK, "nr", "njv", False, simd, step, groups=groups)
        _product(c, "&gb[0][0]", Ev, "vt", BK, Ev, "&dp[0][0]", BK, "nr", "njv", False, simd, step, groups=groups)
        c.open("for (int64_t r = 0; r < nr; r++)")
        c("const int64_t i = i0 + r;")
        c("const float lr = ls[r], dr = dd[r];")
        c("float* sr = s[r]; float* dpr = dp[r];")
        if mask is not None:
            c(f"const {mtype}* mr = mp + i * {mask_tail[1]} + j0 * {mask_tail[2]};")
        c("#pragma omp simd")
        c.open("for (int64_t j = 0; j < nj; j++)")
        c(f"float x = sr[j] * {scale!r}f;")
        if mask is not None and mtype == "uint8_t":
            c(f"x = mr[j * {mask_tail[2]}] ? x : -__builtin_inff();")
        elif mask is not None:
            c(f"x += {ld(f'mr[j * {mask_tail[2]}]')};")
        if causal:
            c("x = j0 + j > i ? -__builtin_inff() : x;")
        c("const float p = x == -__builtin_inff() ? 0.0f : nf_exp(x - lr);")
        c(f"sr[j] = p; dpr[j] = p * (dpr[j] - dr) * {scale!r}f;  // P and dS in place")
        c.close()
        c.close()
        # dV += P^T dO, dK += dS^T q (the tiles read transposed), dQ += dS K
        _product(c, "&s[0][0]", BK, "&gb[0][0]", Ev, "nr", f"dva + j0 * {Ev}", Ev, "nj", Ev, True, tiled_ev, step,
                 a_t=True, groups=groups)
        _product(c, "&dp[0][0]", BK, "&qb[0][0]", E, "nr", f"dka + j0 * {E}", E, "nj", E, True, tiled_e, step,
                 a_t=True, groups=groups)
        _product(c, "&dp[0][0]", BK, "kr + j0 * ldk", "ldk", "nj", "&dqa[0][0]", E, "nr", E, True, tiled_e, step,
                 groups=groups)
        c.close()  # key blocks
        c.open("for (int64_t r = 0; r < nr; r++)")
        c(f"{T}* row = dqp + (i0 + r) * {hq * E};")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {E}; e++) row[e] = {st('dqa[r][e]')};")
        c.close()
        c.close()  # query blocks
        c.close()  # query heads
        c.open(f"for (int64_t j = 0; j < {S}; j++)")
        c(f"{T}* krow = dkg + b * {dkst} + (j * {hk} + kh) * {E};")
        c(f"{T}* vrow = dvg + b * {dvst} + (j * {hk} + kh) * {Ev};")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {E}; e++) krow[e] = {st(f'dka[j * {E} + e]')};")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {Ev}; e++) vrow[e] = {st(f'dva[j * {Ev} + e]')};")
        c.close()
        c.close()  # tasks
        c("return 0;")
        c.close()
        return c.text()

    return GenKernel(name, n_in + 3, render, sched, f"{key}|{sched.key()}")
