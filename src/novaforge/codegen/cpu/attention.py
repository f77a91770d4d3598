"""A generated flash-style attention kernel (float32): online softmax over key/value tiles.

The parallel tasks are (batch, query head, chunk of query blocks); a task packs K transposed
once (in kv_tile-wide tiles, up to the causal limit of its chunk, into a per-thread buffer;
float32 K with contiguous rows a W x W register block at a time, `nf_transpose_into`) and,
for every block of `q_tile` query rows, walks the key/value tiles: it computes the score tile
S = (q * scale) K^T (register-blocked, vectorized over keys), applies the
mask (bool: keep; float: added) and the causal triangle (key j <= query i, top-left aligned),
updates each row's running max and sum (online softmax) and accumulates P V into a per-row
accumulator. Only a q_tile x kv_tile score tile ever exists. Grouped-query heads read the
key/value head h // (Hq / Hk). Shapes and strides are compile-time constants, or expressions
of the call's size symbols (tile sizes are then planned at the symbols' hints; every loop bound
comes from the sizes themselves); q, k, v and the mask are read through their strides (no
transposes copied).

bfloat16 q/k/v (and mask) are converted to float32 when packed (q, K^T, and V into a packed
float copy) and the output is rounded to bfloat16 once; everything in between is float32.

One query row of grouped-query heads (decode: L == 1, Hq = G * Hk with G > 1) has the tasks
(batch, key/value head) instead, with the group's G query heads as the rows of one block: K^T
is packed once per key/value head, not once per query head (`rows_are_heads`).

A kernel with a mask argument reads a null mask pointer as the causal triangle: a program for
a range of sizes passes null where the mask, a value of the sizes alone computed once per size,
is that triangle (`CpuProgram.at`), so the kernel skips the masked half as a causal one does.

Invariant: out = softmax(q k^T * scale + mask) v like torch's CPU scaled_dot_product_attention,
including its zeros for rows where every key is masked.
"""

from __future__ import annotations

import math

import torch

from ...ir import Kernel
from ...ir.symbolic import hint, is_symbolic
from ...schedule.cpu import KernelShape, configure
from ...schedule.target import CpuTarget
from .analysis import Operand, Unsupported, operand
from .loops import Code, GenKernel, coalesce, function_name, signature


def _batch_strides(op: Operand, out_batch: tuple[int, ...], tail: int) -> list[int]:
    """Strides of op's leading dims broadcast onto out_batch (op has `tail` trailing dims; 0 for
    dims op lacks or broadcasts)."""
    lay = op.layout
    nb = len(lay.shape) - tail
    off = len(out_batch) - nb
    out = []
    for d, n in enumerate(out_batch):
        j = d - off
        out.append(0 if j < 0 or (lay.shape[j] == 1 and n != 1) else lay.strides[j])
    return out


def plan_flash_attention(kernel: Kernel, target: CpuTarget, heads_last: bool = False) -> GenKernel:
    """heads_last: the kernel stores its output as [..., L, Hq, Ev] (the fused transpose of a
    `copy(permute(attention))` epilogue) instead of [..., Hq, L, Ev].

    An `attention` anchor's function takes (its output, the body's inputs, the body's outputs);
    an `attention_lse` kernel (a single node: training's forward) takes (the body's inputs, the
    output stored heads-last, the float32 row logsumexp [..., Hq, L])."""
    body = kernel.body
    anchor = kernel.anchor_node
    lse_out = anchor is None
    if lse_out:
        nodes = [n for n in body.nodes if n.op == "attention_lse"]
        if len(nodes) != 1 or list(body.outputs) != list(nodes[0].outputs):
            raise Unsupported("attention_lse kernel with extra nodes")
        anchor, heads_last = nodes[0], True
    assert anchor.op in ("attention", "attention_lse")
    ops = [operand(body, v) for v in anchor.inputs]
    q, k, v = ops[:3]
    mask = ops[3] if len(ops) == 4 else None
    dt = q.dtype
    if dt not in (torch.float32, torch.bfloat16) or k.dtype != dt or v.dtype != dt:
        raise Unsupported("flash attention is generated for float32 and bfloat16")
    if mask is not None and mask.dtype not in (dt, torch.bool):
        raise Unsupported("attention mask dtype")
    out_t = anchor.outputs[0].type
    *batch, hq, L, E = q.layout.shape
    hk, S = k.layout.shape[-3], k.layout.shape[-2]
    Ev = v.layout.shape[-1]
    batch = tuple(batch)
    causal, scale = bool(anchor.attrs["causal"]), float(anchor.attrs["scale"])
    group = hq // hk
    # flatten the batch dims of q, k, v, mask and out into one
    strides = [_batch_strides(q, batch, 3), _batch_strides(k, batch, 3), _batch_strides(v, batch, 3)]
    if mask is not None:
        mst = _batch_strides(mask, batch + (hq, L, S), 0)  # the mask broadcast to [..., Hq, L, S]
        mask_tail = mst[-3:]
        strides.append(mst[:-3])
    out_bs = [math.prod(batch[d + 1:]) * hq * L * Ev for d in range(len(batch))]
    strides.append(out_bs)
    dims = coalesce(list(range(len(batch))), batch, [tuple(s) for s in strides])
    if len(dims) > 1:
        raise Unsupported("attention batch dims do not coalesce")
    B = dims[0][0] if dims else 1
    bst = dims[0][1] if dims else [0] * len(strides)
    if B == 0 or hq == 0 or L == 0:
        B = 0
    qs, ks, vs = q.layout.strides[-3:], k.layout.strides[-3:], v.layout.strides[-3:]
    hB, hL, hS = hint(B), hint(L), hint(S)  # symbolic sizes: planned at their hint
    shape = KernelShape("attention", outer=hB * hq * max(1, math.ceil(hL / 16)), inner=hS,
                        flops=4.0 * hB * hq * hL * hS * E / (2 if causal else 1),
                        bytes=4.0 * (hB * hq * hL * (E + Ev) + hB * hk * hS * (E + Ev)), head_dim=max(E, Ev),
                        kv_len=hS, q_len=hL)
    sched = configure(shape, target)
    BQ, BK = sched.q_tile, sched.kv_tile
    # decode with grouped-query heads: a task per (batch, key/value head), its G query heads the
    # block's rows (all at query position 0), so K^T is packed once for the group
    rows_are_heads = (L == 1 and 1 < group <= 16 and not lse_out and not is_symbolic(B)
                      and B * hk >= sched.threads)
    if rows_are_heads:
        BQ = group
    W = target.vector_floats
    tiled = BK % (2 * W) == 0 and target.simd != "scalar"
    pv_tiled = tiled and Ev % (2 * W) == 0 and vs[2] == 1
    key = (f"{kernel.structural_key}|flash|{q.layout}|{k.layout}|{v.layout}|{mask.layout if mask else None}"
           f"|{heads_last}|{rows_are_heads}")
    head_off, row_stride = (Ev, hq * Ev) if heads_last else (L * Ev, Ev)
    if lse_out and is_symbolic([(op.layout.shape, op.layout.strides, op.layout.offset) for op in ops]):
        raise Unsupported("attention with its logsumexp and symbolic sizes runs through torch")
    key += "|lse" if lse_out else ""
    name = function_name(key, sched, "a")
    n_args = 1 + len(body.inputs) + len(body.outputs)
    inb = 1  # the first input's argument (after the anchor's output)
    out_arg = "p0"
    if lse_out:
        n_args, inb, out_arg = len(body.inputs) + 2, 0, f"p{len(body.inputs)}"
    bf16 = dt == torch.bfloat16
    T = "uint16_t" if bf16 else "float"  # storage type of q, k, v, out (bf16 is converted to float on load)
    mtype = "uint8_t" if mask is not None and mask.dtype == torch.bool else T
    if bf16:
        pv_tiled = tiled and Ev % (2 * W) == 0  # V is converted into a packed float copy

    def ld(x: str) -> str:
        return f"nf_bf16_load({x})" if bf16 else x

    def render() -> str:
        c = Code()
        c.open(f"static int {name}({signature(n_args)})")
        if B == 0:
            c("return 0;")
            c.close()
            return c.text()
        c(f"{T}* out = ({T}*){out_arg};")
        if lse_out:
            c(f"float* lseg = (float*)p{len(body.inputs) + 1};")
        c(f"const {T}* qg = (const {T}*)p{inb + q.buf} + {q.layout.offset};")
        c(f"const {T}* kg = (const {T}*)p{inb + k.buf} + {k.layout.offset};")
        c(f"const {T}* vg = (const {T}*)p{inb + v.buf} + {v.layout.offset};")
        if mask is not None:
            c(f"const {mtype}* mg = (const {mtype}*)p{inb + mask.buf};")
            c("const bool tri = mg == nullptr;  // a null mask: the causal triangle (see the module docstring)")
            c(f"if (!tri) mg += {mask.layout.offset};")
        nqb = 1 if rows_are_heads else -(-L // BQ)
        # tasks: (batch, head, chunk of query blocks); K^T is packed once per task. The number of
        # chunks is a performance choice (at the hint); with symbolic sizes a chunk past the last
        # query block finds its block range empty. rows_are_heads: (batch, key/value head)
        nchunk = 1 if rows_are_heads else max(1, min(hint(nqb), -(-4 * sched.threads // max(1, hint(B) * hq))))
        per = -(-nqb // nchunk)
        total = B * (hk if rows_are_heads else hq) * nchunk
        # one query row (decode): the key/value stream is the work, and each task's is short, so
        # tasks go round-robin and a task prefetches the next one's keys and values (below)
        prefetch_next = L == 1 and sched.threads > 1
        if sched.threads > 1:
            c(f"#pragma omp parallel for num_threads({sched.threads}) "
              f"schedule({'static' if prefetch_next else 'dynamic'}, 1)")
        c.open(f"for (int64_t t = 0; t < {total}; t++)")

        def task(t: str, sfx: str = "") -> None:
            if rows_are_heads:
                c(f"const int64_t ch{sfx} = 0, hk{sfx} = {t} % {hk}, b{sfx} = {t} / {hk}, "
                  f"h{sfx} = hk{sfx} * {group};  // the group's first head")
            else:
                c(f"const int64_t ch{sfx} = {t} % {nchunk}, bh{sfx} = {t} / {nchunk}, h{sfx} = bh{sfx} % {hq}, "
                  f"b{sfx} = bh{sfx} / {hq}, hk{sfx} = h{sfx} / {group};")
            c(f"const {T}* kp{sfx} = kg + b{sfx} * {bst[1]} + hk{sfx} * {ks[0]};")
            c(f"const {T}* vp{sfx} = vg + b{sfx} * {bst[2]} + hk{sfx} * {vs[0]};")

        task("t")
        c(f"const {T}* qp = qg + b * {bst[0]} + h * {qs[0]};")
        if mask is not None:
            c(f"const {mtype}* mp = tri ? mg : mg + b * {bst[3]} + h * {mask_tail[0]};")
        c(f"{T}* op = out + b * {bst[-1]} + h * {head_off};")
        c(f"const int64_t qb0 = ch * {per}, qb1 = qb0 + {per} < {nqb} ? qb0 + {per} : {nqb};")
        c(f"const int64_t iend = qb1 * {BQ} < {L} ? qb1 * {BQ} : {L};")
        c(f"int64_t kend = {_causal_end('iend', S, causal, mask is not None)};")
        if mask is not None and mtype == "uint8_t":
            # keys past the last one any row of this chunk keeps are skipped (a static KV cache's
            # unwritten tail): they would add exp(-inf) = 0 to every row, so the result is the same
            c.open("if (!tri)")
            c("int64_t last = 0;")
            if rows_are_heads:  # every head of the group at query position 0
                c(f"for (int64_t r = 0; r < {group}; r++) for (int64_t j = kend - 1; j >= last; j--) "
                  f"if (mp[r * {mask_tail[0]} + j * {mask_tail[2]}]) {{ last = j + 1; break; }}")
            else:
                c(f"for (int64_t i = qb0 * {BQ}; i < iend; i++) for (int64_t j = kend - 1; j >= last; j--) "
                  f"if (mp[i * {mask_tail[1]} + j * {mask_tail[2]}]) {{ last = j + 1; break; }}")
            c("kend = last;")
            c.close()
        if prefetch_next:  # this thread's next task (static round-robin): its first kend keys and values
            c.open(f"if (t + {sched.threads} < {total})")
            task(f"t + {sched.threads}", "n")
            c("(void)chn; (void)hn;")
            isz = 2 if bf16 else 4
            c.open("for (int64_t j = 0; j < kend; j++)")
            c(f"nf_pf_row((const char*)(kpn + j * {ks[1]}), {(E - 1) * ks[2] * isz + isz}, 0);")
            c(f"nf_pf_row((const char*)(vpn + j * {vs[1]}), {(Ev - 1) * vs[2] * isz + isz}, 0);")
            c.close()
            c.close()
        c(f"float* ktb = nf_scratch(0, ((kend + {BK - 1}) / {BK}) * {E * BK});")
        if not bf16 and ks[2] == 1:  # K rows contiguous: transposed a register block at a time
            c(f"for (int64_t j0 = 0; j0 < kend; j0 += {BK}) nf_transpose_into(kp + j0 * {ks[1]}, {ks[1]}, "
              f"kend - j0 < {BK} ? kend - j0 : {BK}, {E}, ktb + (j0 / {BK}) * {E * BK}, {BK});")
        else:
            c.open("for (int64_t j = 0; j < kend; j++)")
            c(f"const {T}* kr = kp + j * {ks[1]};")
            c(f"float* kc = ktb + (j / {BK}) * {E * BK} + j % {BK};")
            c(f"for (int64_t e = 0; e < {E}; e++) kc[e * {BK}] = {ld(f'kr[e * {ks[2]}]')};")
            c.close()
        if bf16:  # V converted to a packed float copy (the P V tile reads float rows)
            c(f"float* vcb = nf_scratch(1, kend * {Ev} + 1);")
            c(f"for (int64_t j = 0; j < kend; j++) for (int64_t e = 0; e < {Ev}; e++) "
              f"vcb[j * {Ev} + e] = nf_bf16_load(vp[j * {vs[1]} + e * {vs[2]}]);")
        c.open("for (int64_t qb = qb0; qb < qb1; qb++)")
        if rows_are_heads:  # row r: head h + r at query position 0
            c(f"const int64_t i0 = 0, i1 = 1, nr = {group};")
        else:
            c(f"const int64_t i0 = qb * {BQ}, i1 = i0 + {BQ} < {L} ? i0 + {BQ} : {L}, nr = i1 - i0;")
        q_row, out_row = (f"r * {qs[0]}", f"r * {head_off}") if rows_are_heads else \
            (f"(i0 + r) * {qs[1]}", f"(i0 + r) * {row_stride}")
        c(f"alignas(64) float qs[{BQ}][{E}];")
        c(f"alignas(64) float s[{BQ}][{BK}];")
        c(f"alignas(64) float acc[{BQ}][{Ev}];")
        c(f"float m[{BQ}], l[{BQ}];")
        c.open("for (int64_t r = 0; r < nr; r++)")
        c("m[r] = -__builtin_inff(); l[r] = 0.0f;")
        c(f"for (int64_t e = 0; e < {Ev}; e++) acc[r][e] = 0.0f;")
        c(f"for (int64_t e = 0; e < {E}; e++) qs[r][e] = {ld(f'qp[{q_row} + e * {qs[2]}]')} * {scale!r}f;")
        c.close()
        if qs[2] == 1:  # the next block's q rows into L2 while this block computes (rows are strided)
            c(f"for (int64_t r = i1; r < i1 + {BQ} && r < {L}; r++) "
              f"nf_pf_row((const char*)(qp + r * {qs[1]}), {E * (2 if bf16 else 4)}, 0);")
        c(f"const int64_t jend = {_causal_end('i1', 'kend' if mask is not None else S, causal, mask is not None)};")
        c.open(f"for (int64_t j0 = 0; j0 < jend; j0 += {BK})")
        c(f"const int64_t nj = jend - j0 < {BK} ? jend - j0 : {BK};")
        c(f"const float* kt = ktb + (j0 / {BK}) * {E * BK};")
        if tiled:
            # register-blocked scores: 4 rows x 2 vectors of keys at a time
            c("int64_t rq = 0;")
            c(f"const int64_t njv = (nj + {2 * W - 1}) / {2 * W} * {2 * W};")
            c(f"for (; rq + 6 <= nr; rq += 6) for (int64_t j = 0; j < njv; j += {2 * W}) "
              f"nf_tile_rank<6, false>(qs[rq], {E}, kt + j, {BK}, {E}, &s[rq][j], {BK});")
            c(f"for (; rq + 4 <= nr; rq += 4) for (int64_t j = 0; j < njv; j += {2 * W}) "
              f"nf_tile_rank<4, false>(qs[rq], {E}, kt + j, {BK}, {E}, &s[rq][j], {BK});")
            c(f"for (; rq < nr; rq++) for (int64_t j = 0; j < njv; j += {2 * W}) "
              f"nf_tile_rank<1, false>(qs[rq], {E}, kt + j, {BK}, {E}, &s[rq][j], {BK});")
        else:
            c.open("for (int64_t r = 0; r < nr; r++)")
            c("float* sr = s[r];")
            c("#pragma omp simd")
            c(f"for (int64_t j = 0; j < {BK}; j++) sr[j] = 0.0f;")
            c.open(f"for (int64_t e = 0; e < {E}; e++)")
            c("const float qv = qs[r][e];")
            c(f"const float* kte = kt + e * {BK};")
            c("#pragma omp simd")
            c(f"for (int64_t j = 0; j < {BK}; j++) sr[j] += qv * kte[j];")
            c.close()
            c.close()
        c.open("for (int64_t r = 0; r < nr; r++)")
        c("float* sr = s[r];")
        c("const int64_t i = 0;" if rows_are_heads else "const int64_t i = i0 + r;")
        if mask is not None:
            c.open("if (!tri)")
            row = f"r * {mask_tail[0]}" if rows_are_heads else f"i * {mask_tail[1]}"
            c(f"const {mtype}* mr = mp + {row} + j0 * {mask_tail[2]};")
            c("#pragma omp simd")
            if mtype == "uint8_t":
                c(f"for (int64_t j = 0; j < nj; j++) sr[j] = mr[j * {mask_tail[2]}] ? sr[j] : -__builtin_inff();")
            else:
                c(f"for (int64_t j = 0; j < nj; j++) sr[j] += {ld(f'mr[j * {mask_tail[2]}]')};")
            c.close()
        if causal or mask is not None:
            c(("if (tri) " if mask is not None else "")
              + "for (int64_t j = i - j0 + 1 > 0 ? i - j0 + 1 : 0; j < nj; j++) sr[j] = -__builtin_inff();")
        c("const float mx = nf_row_max(sr, nj, m[r]);")
        c("const bool none = mx == -__builtin_inff();")
        c("const float corr = m[r] == -__builtin_inff() ? 0.0f : nf_exp(m[r] - mx);")
        c("#pragma omp simd")
        c("for (int64_t j = 0; j < nj; j++) sr[j] = none ? 0.0f : nf_exp(sr[j] - mx);")
        c("l[r] = l[r] * corr + nf_row_sum(sr, nj);")
        c("m[r] = mx;")
        c("float* ar = acc[r];")
        c("#pragma omp simd")
        c(f"for (int64_t e = 0; e < {Ev}; e++) ar[e] *= corr;")
        if not pv_tiled:
            c.open("for (int64_t j = 0; j < nj; j++)")
            c("const float pj = sr[j];")
            c(f"const {T}* vr = vp + (j0 + j) * {vs[1]};")
            c("#pragma omp simd")
            c(f"for (int64_t e = 0; e < {Ev}; e++) ar[e] += pj * {ld(f'vr[e * {vs[2]}]')};")
            c.close()
        c.close()  # rows
        if pv_tiled:
            # register-blocked P V: 4 rows x 2 vectors of the head dim, V read in place (rows contiguous)
            ldv = Ev if bf16 else vs[1]
            c(f"const float* vt = {f'vcb + j0 * {Ev}' if bf16 else f'vp + j0 * {vs[1]}'};")
            c("int64_t rp = 0;")
            c(f"for (; rp + 6 <= nr; rp += 6) for (int64_t e = 0; e < {Ev}; e += {2 * W}) "
              f"nf_tile_rank<6, true>(s[rp], {BK}, vt + e, {ldv}, nj, &acc[rp][e], {Ev});")
            c(f"for (; rp + 4 <= nr; rp += 4) for (int64_t e = 0; e < {Ev}; e += {2 * W}) "
              f"nf_tile_rank<4, true>(s[rp], {BK}, vt + e, {ldv}, nj, &acc[rp][e], {Ev});")
            c(f"for (; rp < nr; rp++) for (int64_t e = 0; e < {Ev}; e += {2 * W}) "
              f"nf_tile_rank<1, true>(s[rp], {BK}, vt + e, {ldv}, nj, &acc[rp][e], {Ev});")
        c.close()  # key tiles
        c.open("for (int64_t r = 0; r < nr; r++)")
        c("const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;")
        c(f"{T}* orow = op + {out_row};")
        c("#pragma omp simd")
        val = "nf_bf16_store(acc[r][e] * inv)" if bf16 else "acc[r][e] * inv"
        c(f"for (int64_t e = 0; e < {Ev}; e++) orow[e] = {val};")
        if lse_out:  # log(sum exp(s)) in the scores' units (scale and mask applied); 0 for a row without keys
            c(f"lseg[(b * {hq} + h) * {L} + i0 + r] = l[r] > 0.0f ? m[r] + nf_log(l[r]) : 0.0f;")
        c.close()
        c.close()  # query blocks
        c.close()  # tasks
        c("return 0;")
        c.close()
        return c.text()

    del out_t
    return GenKernel(name, n_args, render, sched, key, mask_arg=inb + mask.buf if mask is not None else None)


def _causal_end(i: str, S, causal: bool, masked: bool) -> str:
    """The end of the keys a query row up to `i` reads: S, or min(i, S) under the causal
    triangle (decided at run time for a mask argument: `tri`)."""
    bounded = f"({i} < {S} ? {i} : {S})"
    if masked:
        return f"(tri ? {bounded} : {S})"
    return bounded if causal else f"{S}"
