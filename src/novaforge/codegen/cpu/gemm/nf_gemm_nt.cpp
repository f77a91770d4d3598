/* nf_gemm_nt.cpp — C = A @ W^T with W a row-major [N, K] matrix (an nn.Linear weight) and no packed
 * copy of W: for few rows (M < kPackMinRows, decode-like; float32 W up to kDotMaxRows rows) a
 * dot-product micro-kernel reads W in place (or a staged copy of a few of its rows, see nt_block); for
 * more rows, and where it is on (kBcast) for rows aliasing in L1, a broadcast micro-kernel (vectors along
 * M, nf_gemm_bcast.h: bc_block) reads W in place, else the entries hand over to nf_gemm.cpp's on-the-fly
 * packing of B = W^T.
 *
 * Invariant: nt_block() and bc_block() compute exactly the C rows [m0,m1) x columns [n0,n1) given,
 * reading only those rows of A and those rows of W. Each C element is written once per K block
 * by the micro-kernel (the first block stores, or adds to C_old when accumulating; later blocks
 * add), then once by the epilogue pass (bias, activation, residual), then handed to the tile
 * callback. Only per-thread scratch is kept (A staged when strided or bf16, W rows staged when
 * bf16 or aliasing in L1), so disjoint blocks may run concurrently.
 *
 * Loop nest per block (a group of DNR rows of W resident in L1 while the A rows stream from L2):
 *   for row block          mb rows: the A block (mb x KC) takes half of L2
 *     for K block          KC: DNR rows of W + DMR rows of A take 3/4 of L1d (one block for K <= 872)
 *       [stage A block]    only for strided or bf16 A
 *       for column chunk   kChunk columns of C, finished (epilogue + callback) while in L2
 *         for column group DNR rows of W ([staged to float32 if bf16]), from L3/DRAM once, then L1
 *           for row tile   DMR rows of A
 *             dot micro-kernel (nf_gemm_dot.h)
 *         last K block: epilogue pass and tile callback on the chunk
 * Threads split the columns (each thread streams only its rows of W); rows too when N is narrow.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>

#include "nf_gemm.h"
#include "nf_gemm_bcast.h"
#include "nf_gemm_dot.h"
#include "nf_gemm_internal.h"

using nfb::BMR;
using nfb::BNR;
using nfd::DMR;
using nfd::DNR;
using nfs::W;
using nfi::rows_alias_in_l1;

namespace {

inline long cdiv(long a, long b) { return (a + b - 1) / b; }

struct NtProblem {
    long M, N, K;
    const void* A;
    bool a_bf16;
    long rs_a, cs_a;
    const void* W;
    bool w_bf16;
    long ldw;
    float* C;
    long ldc;
    bool accumulate;
    const nf_epilogue* ep;
    long call;  // a number no other call of the library's entries has (a packed A is reused within a call)
};

std::atomic<long> g_calls{0};

thread_local nfi::Scratch t_nt_scratch;  // a: staged rows of A, b: a block of W rows in float32

constexpr long kChunk = 64;  // columns per epilogue / tile-callback chunk
#ifndef NF_GEMM_NT_PREFETCH
#define NF_GEMM_NT_PREFETCH 1
#endif
constexpr bool kPrefetchW = NF_GEMM_NT_PREFETCH != 0;
#ifndef NF_GEMM_NT_STAGE_MIN_ROWS  // fewer rows reuse a staged group of W rows too little to pay for the copy
#define NF_GEMM_NT_STAGE_MIN_ROWS 96
#endif
constexpr long kStageMinRows = NF_GEMM_NT_STAGE_MIN_ROWS;

struct NtBlocking {
    long kc;  // K block (a multiple of W unless it is all of K)
    long mb;  // rows per row block
};

NtBlocking nt_blocking(long K) {
    const long l1 = nfi::l1d_bytes() > 0 ? nfi::l1d_bytes() : 32 * 1024;
    const long l2 = nfi::l2_bytes() > 0 ? nfi::l2_bytes() : 512 * 1024;
    const long kmax = std::max((long)W, (l1 * 3 / 4 / ((DMR + DNR) * 4)) / W * W);
    NtBlocking b;
    const long nk = K > 0 ? cdiv(K, kmax) : 1;
    b.kc = K > 0 ? std::min(K, cdiv(cdiv(K, nk), W) * W) : 0;
    const long mb = (l2 / 2 / (std::max(b.kc, 1L) * 4)) / DMR * DMR;
    b.mb = std::min(1000L * DMR, std::max(8L * DMR, mb));
    return b;
}

/* Row tiles for `rows` rows: DMR-high tiles; a remainder r < DMR/2 is merged with one full tile
 * and split evenly (a 1-row tile would be FMA-latency-bound). */
int row_tiles(long rows, int* sizes) {
    int n = 0;
    long q = rows / DMR, r = rows % DMR;
    if (r != 0 && 2 * r < DMR && q > 0) {
        --q;
        const long t = r + DMR;
        for (long i = 0; i < q; ++i) sizes[n++] = DMR;
        sizes[n++] = (int)(t - t / 2);
        sizes[n++] = (int)(t / 2);
        return n;
    }
    for (long i = 0; i < q; ++i) sizes[n++] = DMR;
    if (r) sizes[n++] = (int)r;
    return n;
}

template <typename T>
inline float to_f32(T x) {
    if constexpr (sizeof(T) == 2) return nfs::bf16_to_f32(x);
    else return x;
}

/* dst[r*kc + k] = A(r0 + r, k0 + k) as float32 */
template <typename T>
void stage_rows(const T* src, long rs, long cs, long r0, long rows, long k0, long kc, float* dst) {
    for (long r = 0; r < rows; ++r) {
        const T* s = src + (r0 + r) * rs + k0 * cs;
        float* d = dst + r * kc;
        if (cs == 1)
            for (long k = 0; k < kc; ++k) d[k] = to_f32(s[k]);
        else
            for (long k = 0; k < kc; ++k) d[k] = to_f32(s[k * cs]);
    }
}

using nfi::epilogue_pass;

void nt_block(const NtProblem& P, long m0, long m1, long n0, long n1) {
    if (m0 >= m1 || n0 >= n1) return;
    const long K = P.K;
    const NtBlocking bl = nt_blocking(K);
    const long kcb = bl.kc, nkb = K > 0 ? cdiv(K, kcb) : 1;
    const long nmb = cdiv(m1 - m0, bl.mb);
    const long mb = std::min(m1 - m0, cdiv(cdiv(m1 - m0, nmb), DMR) * DMR);
    // W rows are staged (copied, as float32, into one contiguous DNR x KC block per column group, read by
    // every row tile) when bf16, or, for several row tiles, when they alias in L1: rows a multiple of 4 KiB
    // apart (K = 1024, 2048, 3072) all map to the few L1 sets where the tile's A rows sit too. Zen 4, 2
    // threads, M = 96-128, W from DRAM: K x N = 3072 x 768, 2048 x 768, 1024 x 1024 193-202 GFLOP/s, against
    // 163-189 packing W on the fly (the path these shapes took before; docs/cpu-gemm.md)
    const bool stage_a = P.a_bf16 || P.cs_a != 1;
    const bool stage_w = P.w_bf16 || (m1 - m0 >= kStageMinRows && rows_alias_in_l1(P.ldw * 4));
    nfi::Scratch& ws = t_nt_scratch;
    float* abuf = stage_a ? nfi::Scratch::grow(ws.a, ws.a_cap, mb * std::max(kcb, 1L) + 16) : nullptr;
    float* wbuf = stage_w ? nfi::Scratch::grow(ws.b, ws.b_cap, DNR * std::max(kcb, 1L) + 16) : nullptr;
    const nf_epilogue* ep = P.ep;
    const float* bias = ep ? ep->bias : nullptr;
    const int act = ep ? ep->act : 0;
    const float* res = ep ? ep->residual : nullptr;
    const long ldr = ep ? ep->ld_residual : 0;
    int tiles[1024];  // mb <= 1000 * DMR (nt_blocking)
    long tile_row[1024];

    for (long ic = m0; ic < m1; ic += mb) {
        const long mcb = std::min(mb, m1 - ic);
        const int nt = row_tiles(mcb, tiles);
        for (int t = 0, r = 0; t < nt; r += tiles[t], ++t) tile_row[t] = r;
        float* c_blk = P.C + ic * P.ldc;
        for (long kb = 0; kb < nkb; ++kb) {
            const long k0 = kb * kcb, kc = std::min(kcb, K - k0);
            const bool add = kb > 0 || P.accumulate, last = kb == nkb - 1;
            const float* a = nullptr;
            long lda = kc;
            if (kc > 0 && stage_a) {
                if (P.a_bf16) stage_rows((const uint16_t*)P.A, P.rs_a, P.cs_a, ic, mcb, k0, kc, abuf);
                else stage_rows((const float*)P.A, P.rs_a, P.cs_a, ic, mcb, k0, kc, abuf);
                a = abuf;
            } else if (kc > 0) {
                a = (const float*)P.A + ic * P.rs_a + k0;
                lda = P.rs_a;
            }
            for (long jc = n0; jc < n1; jc += kChunk) {
                const long jce = std::min(n1, jc + kChunk);
                for (long j = jc; j < jce; j += DNR) {
                    const int cw = (int)std::min((long)DNR, jce - j);
                    const float* w = nullptr;
                    long ldw = kc;
                    if (kc > 0 && stage_w) {
                        if (P.w_bf16) stage_rows((const uint16_t*)P.W, P.ldw, 1, j, cw, k0, kc, wbuf);
                        else stage_rows((const float*)P.W, P.ldw, 1, j, cw, k0, kc, wbuf);
                        w = wbuf;
                    } else if (kc > 0) {
                        w = (const float*)P.W + j * P.ldw + k0;
                        ldw = P.ldw;
                    }
                    // a later group's W rows are prefetched into L2, a share after each row tile: the next
                    // group when there are many row tiles, further ahead when there are few (decode)
                    const long jn = j + DNR * (nt >= 8 ? 1 : cdiv(8, nt));
                    const long pf_rows = (kPrefetchW && !P.w_bf16 && kc > 0 && jn < n1) ? std::min((long)DNR, n1 - jn) : 0;
                    const long row_lines = cdiv(kc * 4, 64), pf_total = pf_rows * row_lines;
                    const float* pf_base = (const float*)P.W + jn * P.ldw + k0;
                    long pf_done = 0;
                    for (int t = 0; t < nt; ++t) {
                        nfd::dot_kernels[tiles[t]][cw](kc, a ? a + tile_row[t] * lda : nullptr, lda, w, ldw,
                                                       c_blk + tile_row[t] * P.ldc + j, P.ldc, add);
                        for (const long upto = pf_total * (t + 1) / nt; pf_done < upto; ++pf_done)
                            nfs::vprefetch_l2(pf_base + (pf_done / row_lines) * P.ldw + (pf_done % row_lines) * 16);
                    }
                }
                if (last) {
                    epilogue_pass(P.C, P.ldc, ic, ic + mcb, jc, jce, bias, act, res, ldr);
                    if (ep && ep->tile_fn)
                        ep->tile_fn(ep->tile_ctx, 0, c_blk + jc, P.ldc, ic, jc, mcb, jce - jc);
                }
            }
        }
    }
}

/* The broadcast kernel (nf_gemm_bcast.h) instead of packing W on the fly, for float32 W, up to
 * kBcastMaxRows rows. Measured on AVX2 (Zen 3, 2 threads, M = 128, `benchmarks/gemm_cpu.py --only
 * nf,nf-nt,nf-unpacked`), GFLOP/s in place / packed on the fly / pre-packed: K x N = 3072 x 768 123 /
 * 97 / 112, 2048 x 768 122 / 110 / 123, 2048 x 512 121 / 109 / 121; whole Llama-style b1 x 128 forwards
 * 5.5% faster (interleaved calls, one process, with L2-sized row blocks, before the blocks below). At
 * M = 1024 it was 4-17% slower than packing (W streams from L3 once per row block of A), so more rows
 * are packed. On AVX-512 not measured yet, so off there. NF_GEMM_NT_BCAST=1 forces it on. */
#ifndef NF_GEMM_NT_BCAST
#define NF_GEMM_NT_BCAST (NF_ISA == 1)
#endif
constexpr bool kBcast = NF_GEMM_NT_BCAST != 0;
#ifndef NF_GEMM_NT_BCAST_MAX_ROWS
#define NF_GEMM_NT_BCAST_MAX_ROWS 128
#endif
constexpr long kBcastMaxRows = NF_GEMM_NT_BCAST_MAX_ROWS;

/* ---------------- broadcast kernel: vectors along M, W read in place ----------------
 * Loop nest per block (nf_gemm_bcast.h):
 *   for row block          up to kBcastMaxRows rows of A packed once per call (all of K) into BMR-row tiles
 *     for column chunk     kBcChunk columns of C, finished (epilogue + callback) while in L2
 *       for column group   BNR rows of W, each K block (BNR x KC: 3/4 of L1d) from L3/DRAM once, then L1
 *         for K block
 *           for row tile   its BMR x KC slice of packed A streams from L2
 *             broadcast micro-kernel (partial sums of earlier K blocks in per-thread scratch)
 *       epilogue pass and tile callback on the chunk */
constexpr long kBcChunk = kChunk / BNR * BNR;

thread_local nfi::Scratch t_bc_scratch;  // a: the packed row block of A, c: partial sums of one column group
thread_local long t_bc_key[3] = {-1, -1, -1};  // (call, first row, rows) of the row block packed in t_bc_scratch.a

NtBlocking bc_blocking(long K) {
    const long l1 = nfi::l1d_bytes() > 0 ? nfi::l1d_bytes() : 32 * 1024;
    const long kmax = std::max((long)W, (l1 * 3 / 4 / (BNR * 4)) / W * W);
    NtBlocking b;
    const long nk = cdiv(K, kmax);
    b.kc = std::min(K, cdiv(cdiv(K, nk), W) * W);
    // all of a task's rows (it has at most kBcastMaxRows) in one block: at K = 2048-3072 an L2-sized block
    // is 32-48 rows, and packing A again for each block and task cost more than streaming a 1.5 MB packed
    // A from L3 (Zen 3, 2 threads, M = 128: 3072 x 768 136 against 119 GFLOP/s, 2048 x 512 149 against 132)
    b.mb = cdiv(kBcastMaxRows, BMR) * BMR;
    return b;
}

/* rows [r0, r0 + rows) of A, all of K, as BMR-row tiles packed k-major:
 * dst[(t*K + k)*BMR + i] = A(r0 + t*BMR + i, k) as float32, 0 past `rows` */
template <typename T>
void pack_a_tiles(const T* A, long rs, long cs, long r0, long rows, long K, float* dst) {
    for (long t = 0; t * BMR < rows; ++t) {
        const long tr = std::min((long)BMR, rows - t * BMR), row0 = r0 + t * BMR;
        float* d = dst + t * K * BMR;
        if (sizeof(T) == 4 && cs == 1) {  // W x W blocks, transposed in registers
            const float* a = (const float*)A + row0 * rs;
            for (long k0 = 0; k0 < K; k0 += W) {
                const int kw = (int)std::min((long)W, K - k0);
                const nfs::vm m = nfs::vmask_range(0, kw);
                for (int h = 0; h < 2; ++h) {
                    nfs::vf r[W];
                    for (int i = 0; i < W; ++i)
                        r[i] = h * W + i < tr ? nfs::vload_mask(a + (h * W + i) * rs + k0, m) : nfs::vzero();
                    nfs::vtranspose(r);
                    for (int q = 0; q < kw; ++q) nfs::vstore(d + (k0 + q) * BMR + h * W, r[q]);
                }
            }
            continue;
        }
        for (long k = 0; k < K; ++k)
            for (long i = 0; i < BMR; ++i) d[k * BMR + i] = i < tr ? to_f32(A[(row0 + i) * rs + k * cs]) : 0.f;
    }
}

void bc_block(const NtProblem& P, long m0, long m1, long n0, long n1) {
    if (m0 >= m1 || n0 >= n1) return;
    const long K = P.K;  // > 0 (nt_path)
    const NtBlocking bl = bc_blocking(K);
    const long nkb = cdiv(K, bl.kc);
    const long nmb = cdiv(m1 - m0, bl.mb);
    const long mb = std::min(m1 - m0, cdiv(cdiv(m1 - m0, nmb), BMR) * BMR);
    nfi::Scratch& ws = t_bc_scratch;
    const nf_epilogue* ep = P.ep;
    const float* res = ep ? ep->residual : nullptr;
    const float* wbase = (const float*)P.W;
    for (long ic = m0; ic < m1; ic += mb) {
        const long mcb = std::min(mb, m1 - ic), ntile = cdiv(mcb, BMR);
        auto packed_a = [&]() -> const float* {  // this row block of A, packed once per call and thread
            if (t_bc_key[0] != P.call || t_bc_key[1] != ic || t_bc_key[2] != mcb) {
                float* dst = nfi::Scratch::grow(ws.a, ws.a_cap, ntile * K * BMR);
                if (P.a_bf16) pack_a_tiles((const uint16_t*)P.A, P.rs_a, P.cs_a, ic, mcb, K, dst);
                else pack_a_tiles((const float*)P.A, P.rs_a, P.cs_a, ic, mcb, K, dst);
                t_bc_key[0] = P.call, t_bc_key[1] = ic, t_bc_key[2] = mcb;
            }
            return ws.a;
        };
        const float* ap = packed_a();
        for (long jc = n0; jc < n1; jc += kBcChunk) {
            const long jce = std::min(n1, jc + kBcChunk);
            for (long j = jc; j < jce; j += BNR) {
                const int cw = (int)std::min((long)BNR, jce - j);
                float* part = nkb > 1 ? nfi::Scratch::grow(ws.c, ws.c_cap, ntile * BNR * BMR) : nullptr;
                for (long kb = 0; kb < nkb; ++kb) {
                    const long k0 = kb * bl.kc, kc = std::min(bl.kc, K - k0);
                    const bool last = kb == nkb - 1;
                    for (long t = 0; t < ntile; ++t)
                        nfb::bc_kernels[cw](kc, ap + (t * K + k0) * BMR, wbase + j * P.ldw + k0, P.ldw,
                                            part ? part + t * BNR * BMR : nullptr, kb > 0,
                                            last ? P.C + (ic + t * BMR) * P.ldc + j : nullptr, P.ldc,
                                            (int)std::min((long)BMR, mcb - t * BMR), P.accumulate);
                }
            }
            epilogue_pass(P.C, P.ldc, ic, ic + mcb, jc, jce, ep ? ep->bias : nullptr, ep ? ep->act : 0, res,
                          ep ? ep->ld_residual : 0);
            if (ep && ep->tile_fn) {
                ep->tile_fn(ep->tile_ctx, 0, P.C + ic * P.ldc + jc, P.ldc, ic, jc, mcb, jce - jc);
                ap = packed_a();  // (a callback that ran a GEMM of its own on this thread took the scratch)
            }
        }
    }
}

/* ---------------- few rows, row-major B: C = A @ B streaming the rows of B ----------------
 * For decode (M <= kRowsRowMajor) with B[K, N] row-major read in place (a GPT-2 Conv1D weight): each
 * thread owns a column range [n0, n1) of C, which stays in L1/L2, and streams its slice of four rows
 * of B at a time (contiguous runs the hardware prefetcher follows), C[m, j] += sum of a[m, k..k+3] *
 * B[k..k+3, j]. Nothing is packed; every element of B is read once. Then the epilogue pass and the
 * tile callback run on the range, in kChunk-column chunks. */
constexpr long kRowsRowMajor = 4;

void rowmajor_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
                    float* C, long ldc, bool accumulate, const nf_epilogue* ep, long n0, long n1) {
    (void)N;
    if (n0 >= n1) return;
    const long len = n1 - n0, full = n0 + len / W * W;
    const nfs::vm tail = nfs::vmask_range(0, (int)(n1 - full));
    if (!accumulate)
        for (long m = 0; m < M; ++m) memset(C + m * ldc + n0, 0, (size_t)len * sizeof(float));
    long k = 0;
    for (; k + 4 <= K; k += 4) {
        const float* b0 = B + k * rs_b;
        const float *b1 = b0 + rs_b, *b2 = b1 + rs_b, *b3 = b2 + rs_b;
        nfs::vf a[kRowsRowMajor][4];
        for (long m = 0; m < M; ++m)
            for (int q = 0; q < 4; ++q) a[m][q] = nfs::vset1(A[m * rs_a + (k + q) * cs_a]);
        for (long j = n0; j < full; j += W) {
            const nfs::vf x0 = nfs::vload(b0 + j), x1 = nfs::vload(b1 + j), x2 = nfs::vload(b2 + j),
                          x3 = nfs::vload(b3 + j);
            for (long m = 0; m < M; ++m) {
                float* c = C + m * ldc + j;
                nfs::vf acc = nfs::vfma(a[m][0], x0, nfs::vload(c));
                acc = nfs::vfma(a[m][1], x1, acc);
                acc = nfs::vfma(a[m][2], x2, acc);
                nfs::vstore(c, nfs::vfma(a[m][3], x3, acc));
            }
        }
        if (full < n1) {
            const nfs::vf x0 = nfs::vload_mask(b0 + full, tail), x1 = nfs::vload_mask(b1 + full, tail),
                          x2 = nfs::vload_mask(b2 + full, tail), x3 = nfs::vload_mask(b3 + full, tail);
            for (long m = 0; m < M; ++m) {
                float* c = C + m * ldc + full;
                nfs::vf acc = nfs::vfma(a[m][0], x0, nfs::vload_mask(c, tail));
                acc = nfs::vfma(a[m][1], x1, acc);
                acc = nfs::vfma(a[m][2], x2, acc);
                nfs::vstore_mask(c, tail, nfs::vfma(a[m][3], x3, acc));
            }
        }
    }
    for (; k < K; ++k) {
        const float* b0 = B + k * rs_b;
        for (long m = 0; m < M; ++m) {
            const nfs::vf a0 = nfs::vset1(A[m * rs_a + k * cs_a]);
            float* c = C + m * ldc;
            for (long j = n0; j < full; j += W) nfs::vstore(c + j, nfs::vfma(a0, nfs::vload(b0 + j), nfs::vload(c + j)));
            if (full < n1)
                nfs::vstore_mask(c + full, tail,
                                 nfs::vfma(a0, nfs::vload_mask(b0 + full, tail), nfs::vload_mask(c + full, tail)));
        }
    }
    const float* bias = ep ? ep->bias : nullptr;
    const int act = ep ? ep->act : 0;
    const float* res = ep ? ep->residual : nullptr;
    const long ldr = ep ? ep->ld_residual : 0;
    for (long jc = n0; jc < n1; jc += kChunk) {
        const long jce = std::min(n1, jc + kChunk);
        epilogue_pass(C, ldc, 0, M, jc, jce, bias, act, res, ldr);
        if (ep && ep->tile_fn) ep->tile_fn(ep->tile_ctx, 0, C + jc, ldc, 0, jc, M, jce - jc);
    }
}

/* ---------------- threading ---------------- */

constexpr long kTasksPerThread = 4;  // dynamic tasks per thread (robust to a descheduled thread)
constexpr double kMinTaskMacs = 2e6;  // below this, no more than one task per thread
constexpr double kMinThreadMacs = 1e5;  // below this per thread, fewer threads

inline long split(long units, long parts, long i, long unit, long limit) {
    return std::min(limit, (units * i / parts) * unit);
}

void nt_run(const NtProblem& P, int nthreads, bool bcast) {
    if (P.M <= 0 || P.N <= 0) return;
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const double macs = (double)P.M * P.N * std::max(P.K, 1L);
    long want = std::max(std::min((long)nt, (long)(macs / kMinThreadMacs)),
                         std::min(kTasksPerThread * nt, (long)(macs / kMinTaskMacs)));
    want = std::max(want, 1L);
    // columns in units of whole vectors of C (the epilogue pass stays aligned) or of broadcast column
    // groups, rows in tiles
    const long unit = bcast ? BNR : DNR * cdiv(8, DNR), rows = bcast ? BMR : DMR;
    const long nu = cdiv(P.N, unit), mt = cdiv(P.M, rows);
    const long tn = std::min(nu, want), tm = std::min(mt, cdiv(want, tn));
    const long tasks = tm * tn;
    auto run_task = [&](long t) {
        const long mi = t / tn, ni = t % tn;
        const long r0 = split(mt, tm, mi, rows, P.M), r1 = split(mt, tm, mi + 1, rows, P.M);
        const long c0 = split(nu, tn, ni, unit, P.N), c1 = split(nu, tn, ni + 1, unit, P.N);
        if (bcast) bc_block(P, r0, r1, c0, c1);
        else nt_block(P, r0, r1, c0, c1);
    };
    if (nt > tasks) nt = (int)tasks;
    if (nt <= 1) {
        for (long t = 0; t < tasks; ++t) run_task(t);
        return;
    }
    std::atomic<long> next{0};
#pragma omp parallel num_threads(nt)
    {
        for (long t = next.fetch_add(1, std::memory_order_relaxed); t < tasks;
             t = next.fetch_add(1, std::memory_order_relaxed))
            run_task(t);
    }
}

void rowmajor_run(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b, float* C,
                  long ldc, bool accumulate, const nf_epilogue* ep, int nthreads) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const double macs = (double)M * N * K;
    // columns in whole vectors, at least 64 per task; a task per thread (one parallel region, no barrier
    // but its end: each thread streams only its columns of every row of B)
    const long unit = std::max((long)W, kChunk), nu = cdiv(N, unit);
    long tasks = std::min(nu, std::max(1L, std::min((long)nt, (long)(macs / kMinThreadMacs))));
    if (nt > tasks) nt = (int)tasks;
    auto run_task = [&](long t) {
        rowmajor_block(M, N, K, A, rs_a, cs_a, B, rs_b, C, ldc, accumulate, ep, split(nu, tasks, t, unit, N),
                       split(nu, tasks, t + 1, unit, N));
    };
    if (nt <= 1) {
        for (long t = 0; t < tasks; ++t) run_task(t);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (long t = 0; t < tasks; ++t) run_task(t);
}

NtProblem make_nt(long M, long N, long K, const void* A, int a_bf16, long rs_a, long cs_a, const void* Wt, int w_bf16,
                  long ldw, float* C, long ldc, int accumulate, const nf_epilogue* ep) {
    NtProblem P;
    P.M = M, P.N = N, P.K = std::max(K, 0L);
    P.A = A, P.a_bf16 = a_bf16 != 0, P.rs_a = rs_a, P.cs_a = cs_a;
    P.W = Wt, P.w_bf16 = w_bf16 != 0, P.ldw = ldw;
    P.C = C, P.ldc = ldc, P.accumulate = accumulate != 0, P.ep = ep;
    P.call = g_calls.fetch_add(1, std::memory_order_relaxed);
    return P;
}

/* From this many rows on, W is packed on the fly, one block at a time (nf_sgemm / nf_gemm_mixed in
 * nf_gemm.cpp), instead: the packed micro-kernel's advantage over the dot-product kernel then exceeds
 * the packing cost. Measured here, single thread, weights coming from DRAM, GPT-2 layer shapes, time
 * relative to pre-packed weights: M = 64: dot 1.08-1.14x, packing 1.13x; M = 128: dot 1.12-1.19x,
 * packing 1.01x (docs/cpu-gemm.md). */
#ifndef NF_GEMM_NT_PACK_MIN_ROWS
#define NF_GEMM_NT_PACK_MIN_ROWS 96
#endif
constexpr long kPackMinRows = NF_GEMM_NT_PACK_MIN_ROWS;

/* Up to this many rows the dot-product kernel is kept for float32 W: measured on an AVX-512 Zen 4 at
 * M = 128, 2 threads, weights from DRAM, it ran 8-10% faster than the packing path for K = 768
 * (128x768x768, x2304, x3072); for K = 1024, 2048, 3072, whose rows all fall into a few L1 sets, it
 * runs 4-10% faster than packing once it stages each group of W rows (nt_block). Where the broadcast
 * kernel is on (below: AVX2), it takes those aliasing shapes instead. */
#ifndef NF_GEMM_NT_DOT_MAX_ROWS
#define NF_GEMM_NT_DOT_MAX_ROWS 128
#endif
constexpr long kDotMaxRows = NF_GEMM_NT_DOT_MAX_ROWS;

enum class NtPath { dot, bcast, pack };

/* dot-product kernel, broadcast kernel, or W packed on the fly (nf_gemm.cpp)? */
inline NtPath nt_path(long M, long K, long ldw, bool w_bf16) {
    if (M < kPackMinRows || !(w_bf16 || M > kDotMaxRows || (kBcast && rows_alias_in_l1(ldw * 4)))) return NtPath::dot;
    return kBcast && !w_bf16 && K > 0 && M <= kBcastMaxRows ? NtPath::bcast : NtPath::pack;
}

}  // namespace

namespace nfi {
void epilogue_pass(float* C, long ldc, long r0, long r1, long c0, long c1, const float* bias, int act,
                   const float* res, long ldr) {
    if (!bias && !act && !res) return;
    const long full = c0 + (c1 - c0) / W * W;
    const nfs::vm tail = nfs::vmask_range(0, (int)(c1 - full));
    for (long i = r0; i < r1; ++i) {
        float* c = C + i * ldc;
        const float* rr = res ? res + i * ldr : nullptr;
        for (long j = c0; j < full; j += W) {
            nfs::vf x = nfs::vload(c + j);
            if (bias) x = nfs::vadd(x, nfs::vload(bias + j));
            if (act) x = nfs::vact(x, act);
            if (rr) x = nfs::vadd(x, nfs::vload(rr + j));
            nfs::vstore(c + j, x);
        }
        if (full < c1) {
            nfs::vf x = nfs::vload_mask(c + full, tail);
            if (bias) x = nfs::vadd(x, nfs::vload_mask(bias + full, tail));
            if (act) x = nfs::vact(x, act);
            if (rr) x = nfs::vadd(x, nfs::vload_mask(rr + full, tail));
            nfs::vstore_mask(c + full, tail, x);
        }
    }
}

bool few_rows_rowmajor(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
                       long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (M < 1 || M > kRowsRowMajor || cs_b != 1 || N < 1) return false;
    rowmajor_run(M, N, std::max(K, 0L), A, rs_a, cs_a, B, rs_b, C, ldc, accumulate != 0, ep, nthreads);
    return true;
}
}  // namespace nfi

/* ---------------- C API ---------------- */

extern "C" {

int nf_sgemm_nt_mr(void) { return DMR; }
int nf_sgemm_nt_nr(void) { return DNR; }

void nf_sgemm_nt(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Wt, long ldw, float* C,
                 long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (nfi::gemv_nt(M, N, K, A, rs_a, cs_a, Wt, ldw, C, ldc, accumulate, ep, nthreads)) return;
    const NtPath path = nt_path(M, K, ldw, false);
    if (path == NtPath::pack)
        nf_sgemm(M, N, K, A, rs_a, cs_a, Wt, 1, ldw, C, ldc, accumulate, ep, nthreads);
    else
        nt_run(make_nt(M, N, K, A, 0, rs_a, cs_a, Wt, 0, ldw, C, ldc, accumulate, ep), nthreads, path == NtPath::bcast);
}

void nf_sgemm_nt_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Wt, long ldw,
                       float* C, long ldc, long m0, long m1, long n0, long n1, int accumulate, const nf_epilogue* ep) {
    const NtPath path = nt_path(std::min(M, m1) - std::max(0L, m0), K, ldw, false);
    if (path == NtPath::pack) {
        nf_sgemm_block(M, N, K, A, rs_a, cs_a, Wt, 1, ldw, C, ldc, m0, m1, n0, n1, accumulate, ep);
        return;
    }
    const NtProblem P = make_nt(M, N, K, A, 0, rs_a, cs_a, Wt, 0, ldw, C, ldc, accumulate, ep);
    if (path == NtPath::bcast) bc_block(P, std::max(0L, m0), std::min(M, m1), std::max(0L, n0), std::min(N, n1));
    else nt_block(P, std::max(0L, m0), std::min(M, m1), std::max(0L, n0), std::min(N, n1));
}

void nf_gemm_nt_mixed(long M, long N, long K, const void* A, int a_bf16, long rs_a, long cs_a, const void* Wt,
                      int w_bf16, long ldw, float* C, long ldc, int accumulate, const nf_epilogue* ep0, int nthreads) {
    nfi::Bf16Bias bias;
    const nf_epilogue* ep = bias.get(ep0, N);
    if (a_bf16 && w_bf16 &&
        nfi::bf16_native(M, N, K, (const uint16_t*)A, rs_a, cs_a, (const uint16_t*)Wt, 1, ldw, C, ldc, accumulate, ep,
                         nthreads))
        return;
    if (nfi::gemv_nt_mixed(M, N, K, A, a_bf16 != 0, rs_a, cs_a, Wt, w_bf16 != 0, ldw, C, ldc, accumulate, ep,
                           nthreads)) {
        if (a_bf16 || w_bf16) nfi::count_bf16(NF_BF16_STREAMED);
        return;
    }
    if (a_bf16 || w_bf16) nfi::count_bf16(NF_BF16_CONVERT);
    const NtPath path = nt_path(M, K, ldw, w_bf16 != 0);
    if (path == NtPath::pack)
        nf_gemm_mixed(M, N, K, A, a_bf16, rs_a, cs_a, Wt, w_bf16, 1, ldw, C, ldc, accumulate, ep, nthreads);
    else
        nt_run(make_nt(M, N, K, A, a_bf16, rs_a, cs_a, Wt, w_bf16, ldw, C, ldc, accumulate, ep), nthreads,
               path == NtPath::bcast);
}

}  // extern "C"
