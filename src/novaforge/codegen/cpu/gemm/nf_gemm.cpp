/* nf_gemm.cpp — novaforge's CPU GEMM: packing, cache blocking, threading, C API.
 *
 * Invariant: gemm_block() computes exactly the C rows [m0,m1) x columns [n0,n1) it is given,
 * reading only those rows of A and only those columns' panels of B, writing each C element once
 * per K block (the last write carries the epilogue). It keeps no state besides per-thread
 * scratch buffers and the blocking parameters, so disjoint blocks may run concurrently.
 *
 * Loop nest per block (GotoBLAS / BLIS blocking, the A micro-panel resident in L1):
 *   for row block                 (A read in place, or packed once for all K: see pack_a)
 *     for column block            (ncp panels of NR columns: the K-block x ncp*NR block of B in L2)
 *       for K block               (one block when K <= KC: C written once; unpacked B: pack now,
 *                                  or, row-major float32 B in tasks of <= 128 rows, read in place)
 *         for each row tile       (MR rows; remainders split so no tile is very short)
 *                                 (C == NULL: the row block x column block of C is a per-thread
 *                                  buffer that only the tile callback reads)
 *           for each NR panel     (the tile's MR x KC slice of A stays in L1)
 *             micro-kernel        (epilogue fused into the last K block)
 * Build: g++ -O3 -march=native -fopenmp -fPIC -shared nf_gemm.cpp (see build.py).
 */
#include "nf_gemm.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "nf_gemm_internal.h"
#include "nf_gemm_kernel.h"

using nfk::MR;
using nfk::NR;

namespace {

inline long cdiv(long a, long b) { return (a + b - 1) / b; }

/* ---------------- blocking parameters ---------------- */

struct Blocking {
    long kc;  // deepest K block: an MR x KC micro-panel of A takes three quarters of L1d
    long mc;  // most rows per row block
    long l2;  // L2 bytes: row blocks and column blocks are sized from it per call
    long l1;  // L1d bytes (the dot-product entries size their K blocks from it)
};

Blocking blocking_for(long l1d, long l2) {
    if (l1d <= 0) l1d = 32 * 1024;
    if (l2 <= 0) l2 = 512 * 1024;
    Blocking b;
    b.kc = std::min(4096L, std::max(64L, (l1d * 3 / 4 / (MR * 4)) / 8 * 8));
    b.mc = std::min(2040L, 1000L * MR) / MR * MR;
    b.l2 = l2;
    b.l1 = l1d;
    return b;
}

Blocking g_blocking = {0, 0, 0, 0};

const Blocking& blocking() {
    if (g_blocking.kc == 0) {
        long l1 = 0, l2 = 0;
#ifdef _SC_LEVEL1_DCACHE_SIZE
        l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        g_blocking = blocking_for(l1, l2);
    }
    return g_blocking;
}

/* ---------------- per-thread scratch ---------------- */

using nfi::Scratch;
using nfi::rows_alias_in_l1;
thread_local Scratch t_scratch;

/* ---------------- operand descriptors ---------------- */

struct Problem {
    long M, N, K;
    const void* A;
    bool a_bf16;
    long bs_a, rs_a, cs_a;
    const float* Bp;  // packed B (panel stride K*NR), or nullptr: use B
    long bs_bp;
    const float* B;  // (uint16_t bf16 when b_bf16, int8_t when b_i8)
    bool b_bf16, b_i8;
    long bs_b, rs_b, cs_b;
    float* C;
    long bs_c, ldc;
    bool accumulate;
    const nf_epilogue* ep;
};

/* Row tiles for `rows` rows: MR-high tiles, remainder r < MR merged with one MR tile and split
 * evenly when r is small, so no tile has fewer than MR/2 rows (short tiles are latency-bound). */
int row_tiles(long rows, int* sizes) {
    int n = 0;
    long q = rows / MR, r = rows % MR;
    if (r != 0 && r < MR / 2 && q > 0) {
        --q;
        const long t = r + MR;
        for (long i = 0; i < q; ++i) sizes[n++] = MR;
        sizes[n++] = (int)(t - t / 2);
        sizes[n++] = (int)(t / 2);
        return n;
    }
    for (long i = 0; i < q; ++i) sizes[n++] = MR;
    if (r) sizes[n++] = (int)r;
    return n;
}

/* The row tiles of one row block of a column-major A (rs == 1: dY^T in a weight gradient), each
 * into its k-major micro-panel (abuf + tile_row[t] * K): for each k the block's rows are one
 * contiguous run. K is walked in chunks, all tiles per chunk, so each chunk's source pages and
 * lines are read once for all tiles (tile by tile, a k-major walk of a 128 KB-strided source
 * touched a new page per k for every tile). */
#ifndef NF_GEMM_PACK_A_BLOCK
#define NF_GEMM_PACK_A_BLOCK 1
#endif
template <typename T>
void pack_a_block_colmajor(const T* A, long cs, long r0, int nt, const int* tiles, const long* tile_row, long K,
                           float* abuf) {
    constexpr long kChunk = 32;
    for (long k0 = 0; k0 < K; k0 += kChunk) {
        const long k1 = std::min(K, k0 + kChunk);
        for (int t = 0; t < nt; ++t) {
            const int R = tiles[t];
            float* panel = abuf + tile_row[t] * K;
            if (sizeof(T) == 4 && R == MR) {  // a constant-size copy per k (the generic loop: 3-6% slower dW)
                for (long k = k0; k < k1; ++k) memcpy(panel + k * MR, A + r0 + tile_row[t] + k * cs, MR * sizeof(float));
                continue;
            }
            for (long k = k0; k < k1; ++k) {
                const T* src = A + r0 + tile_row[t] + k * cs;
                float* d = panel + k * R;
                for (int i = 0; i < R; ++i) {
                    if constexpr (sizeof(T) == 2) d[i] = nfs::bf16_to_f32(src[i]);
                    else d[i] = src[i];
                }
            }
        }
    }
}

/* dst[k*R + i] = A(r0 + i, k) for k < K: one k-major micro-panel of R rows (float32) */
template <typename T>
void pack_a_tile(const T* A, long rs, long cs, long r0, int R, long K, float* dst) {
    for (int i = 0; i < R; ++i) {
        const T* src = A + (r0 + i) * rs;
        float* d = dst + i;
        if (cs == 1) {
            for (long k = 0; k < K; ++k) {
                if constexpr (sizeof(T) == 2) d[k * R] = nfs::bf16_to_f32(src[k]);
                else d[k * R] = src[k];
            }
        } else {
            for (long k = 0; k < K; ++k) {
                if constexpr (sizeof(T) == 2) d[k * R] = nfs::bf16_to_f32(src[k * cs]);
                else d[k * R] = src[k * cs];
            }
        }
    }
}

#ifndef NF_PACK_PF
#define NF_PACK_PF 8
#endif

/* W elements of a float32 or int8 source as floats (bf16 sources never take the staged transposes) */
template <typename T>
NF_INLINE nfs::vf stage_load(const T* p) {
    if constexpr (sizeof(T) == 2) return nfs::vzero();
    else return nfs::vload_as_f32(p);
}

/* dst[(p-p0)*pstride + k*NR + j] = B(k0+k, p*NR+j), zero past column N. */
template <typename T>
void pack_b_panels(const T* B, long rs, long cs, long N, long k0, long kc, long p0, long p1, float* dst,
                   long pstride) {
    if (cs == 1 && sizeof(T) == 4 && p1 * NR <= N) {
        // row-major float32 source ([K, N], e.g. a Conv1D weight): vector copies, row by row (each source
        // row is visited once per block, not once per panel: a new page per row when rows are long)
        const long row_lines = cdiv((p1 - p0) * NR * 4, 64) + 1;
        for (long k = 0; k < kc; ++k) {
            const float* src = (const float*)B + (k0 + k) * rs + p0 * NR;
            float* d = dst + k * NR;
            if (NF_PACK_PF > 0 && k + NF_PACK_PF < kc)  // rows are pages apart: no hardware prefetch across them
                for (long l = 0; l < row_lines; ++l) nfs::vprefetch((const char*)(src + NF_PACK_PF * rs) + l * 64);
            for (long p = 0; p < p1 - p0; ++p)
                for (int g = 0; g < nfk::NV; ++g)
                    nfs::vstore(d + p * pstride + g * nfs::W, nfs::vload(src + p * NR + g * nfs::W));
        }
        return;
    }
    for (long p = p0; p < p1; ++p) {
        float* d = dst + (p - p0) * pstride;
        const long c0 = p * NR;
        const int w = (int)std::min((long)NR, N - c0);
        if (cs == 1 || w < NR || sizeof(T) == 2) {  // (int8 B: cs == 1 here, or the transposes below)
            for (long k = 0; k < kc; ++k) {
                const T* src = B + (k0 + k) * rs + c0 * cs;
                float* dk = d + k * NR;
                for (int j = 0; j < w; ++j) {
                    if constexpr (sizeof(T) == 2) dk[j] = nfs::bf16_to_f32(src[j * cs]);
                    else dk[j] = src[j * cs];
                }
                for (int j = w; j < NR; ++j) dk[j] = 0.f;
            }
        } else if (rs == 1) {  // k-contiguous source (nn.Linear weight [N, K]): W x W block transposes
            // Each group of W source rows is copied first, row by row (sequential reads), kStageK floats at a
            // time, into a staging block whose rows are padded apart, and transposed from there. Transposing
            // straight from the source rows loads one vector from each of W rows cs floats apart at once;
            // when cs * 4 is a multiple of 4 KiB (K = 1024, 2048, 3072, ...) those all fall into one L1 set,
            // and it ran at a third of the speed (the staged copy is as fast for other strides).
            constexpr long kStageK = 256, kStageLd = kStageK + nfs::W;
            alignas(64) float stage[nfs::W * kStageLd];
            const long kv = kc / nfs::W * nfs::W;
            for (int g = 0; g < nfk::NV; ++g)
                for (long ks = 0; ks < kv; ks += kStageK) {
                    const long kn = std::min(kStageK, kv - ks);
                    const T* src = B + k0 + ks + (c0 + g * nfs::W) * cs;
                    for (int l = 0; l < nfs::W; ++l)
                        for (long k = 0; k < kn; k += nfs::W)
                            nfs::vstore(stage + l * kStageLd + k, stage_load(src + l * cs + k));
                    for (long k = 0; k < kn; k += nfs::W) {
                        nfs::vf r[nfs::W];
                        for (int l = 0; l < nfs::W; ++l) r[l] = nfs::vload(stage + l * kStageLd + k);
                        nfs::vtranspose(r);
                        for (int l = 0; l < nfs::W; ++l) nfs::vstore(d + (ks + k + l) * NR + g * nfs::W, r[l]);
                    }
                }
            for (long k = kv; k < kc; ++k)
                for (int j = 0; j < NR; ++j) d[k * NR + j] = B[k0 + k + (c0 + j) * cs];
        } else {  // column-contiguous source: walk each column along k
            for (int j = 0; j < NR; ++j) {
                const T* src = B + k0 * rs + (c0 + j) * cs;
                for (long k = 0; k < kc; ++k) d[k * NR + j] = src[k * rs];
            }
        }
    }
}

/* The lines of a 2-D region (rows of row_bytes, row_stride apart) prefetched into L2 a share at a time:
 * the source of the next block of unpacked B arrives while the current block is multiplied. */
struct RegionPrefetch {
    const char* base = nullptr;
    long stride = 0, lines = 0, total = 0, done = 0;
    void set(const void* p, long row_stride, long rows, long row_bytes) {
        base = (const char*)p;
        stride = row_stride;
        lines = cdiv(row_bytes, 64) + 1;  // + 1: the row may start mid-line
        total = rows > 0 && row_bytes > 0 ? rows * lines : 0;
        done = 0;
    }
    void upto(long n) {
        for (n = std::min(n, total); done < n; ++done) nfs::vprefetch_l2(base + (done / lines) * stride + (done % lines) * 64);
    }
};

#ifndef NF_GEMM_PREFETCH_B
#define NF_GEMM_PREFETCH_B 512
#endif
/* Row-major float32 B (a [K, N] weight such as GPT-2's Conv1D) is read in place by the micro-kernel,
 * not copied into panels, when a task has at most this many rows, on AMD CPUs with the AVX-512 build:
 * on a Zen 4, GPT-2 b1 x 128 (M = 128) ran 3% faster (5 of 5 interleaved pairs); at M = 1024 the
 * strided re-reads of each block by 128 row tiles cost 13-17% (a partial last panel is still packed,
 * as it would be read past N). On an Intel Xeon (Sapphire Rapids, 2 threads, M = 128) packing was
 * never slower and up to 1.7x faster (K x N = 768 x 3840: 139 GFLOP/s in place, 233 packed; 768 x
 * 2304: 154 and 216); on a Zen 3 (AVX2: a row of a 24-column panel is 96 bytes, one and a half
 * cache lines) whole GPT-2 b1 x 128 forwards ran 1.23x faster packing (271 -> 220 ms, interleaved calls in
 * one process). So elsewhere B is always packed. Never when B's rows alias in L1 (N = 1024, 2048,
 * 3072, ...: rows a multiple of 4 KiB apart). 0 turns it off. */
#ifndef NF_GEMM_B_IN_PLACE_MAX_ROWS
#define NF_GEMM_B_IN_PLACE_MAX_ROWS 128
#endif
#ifndef NF_GEMM_B_IN_PLACE_ANY_CPU  // 1: on every CPU (the tests' builds cover the path anywhere)
#define NF_GEMM_B_IN_PLACE_ANY_CPU 0
#endif
static const bool kBInPlaceCpu = NF_GEMM_B_IN_PLACE_ANY_CPU || (NF_ISA == 2 && __builtin_cpu_is("amd"));
#ifndef NF_GEMM_UNPACKED_PACK_A
#define NF_GEMM_UNPACKED_PACK_A 0
#endif
constexpr long kPrefetchB = NF_GEMM_PREFETCH_B;  // most rows per block for which the next B block is prefetched

#ifndef NF_GEMM_PACK_A_MIN_PANELS
#define NF_GEMM_PACK_A_MIN_PANELS 32
#endif
constexpr long kPackAMinPanels = NF_GEMM_PACK_A_MIN_PANELS;

/* The most rows of one row block, for `rows` rows of a task. The block's A (mc x kcb) fits L2
 * (measured 2-4% faster than half of L2 for M = 1024). With B packed on the fly every row block
 * packs all of its B columns again, so then a block takes all the rows when A is read in place,
 * or up to twice L2 of packed A (with 16 MB blocks, the weight gradient of a 32000-row LM head,
 * 32000 x 1024 x 512, streamed each block from L3 once per column block: 195 -> 228 GFLOP/s at
 * 4 MB). */
long row_block_max(long rows, long K, bool pack_a, bool b_packed) {
    const Blocking& bl = blocking();
    const long kk = std::max(K, 1L);
    const long nk = K > 0 ? cdiv(K, bl.kc) : 1;
    const long kcb = std::max(K > 0 ? cdiv(K, nk) : 0, 1L);
    long mc_max = std::max(8L * MR, std::min(bl.mc, bl.l2 / (kcb * 4) / MR * MR));
    if (!b_packed) mc_max = std::max(mc_max, std::min({rows, 1000L * MR, pack_a ? 2 * bl.l2 / 4 / kk / MR * MR : rows}));
    return mc_max;
}

void gemm_block(const Problem& P, long bi, long m0, long m1, long n0, long n1) {
    if (m0 >= m1 || n0 >= n1) return;
    const Blocking& bl = blocking();
    const long K = P.K;
    // K blocks of at most KC (one block for K <= KC: C is then written once, never reloaded)
    const long nk = K > 0 ? cdiv(K, bl.kc) : 1;
    const long kcb = K > 0 ? cdiv(K, nk) : 0, kk = std::max(kcb, 1L);
    const long p0 = n0 / NR, p1 = cdiv(n1, NR);
    // A is packed (once per row block, for all K) when it is strided or bf16, or, with packed B, when many
    // panels reuse it. With unpacked B there is one row block when A is read in place (its tiles stream
    // from L2/L3), so that each block of B is packed once per call.
    const bool b_in_place = kBInPlaceCpu && m1 - m0 <= NF_GEMM_B_IN_PLACE_MAX_ROWS && !P.Bp && !P.b_bf16 && !P.b_i8 &&
                            P.cs_b == 1 && !rows_alias_in_l1(P.rs_b * 4);
    const bool pack_a = P.a_bf16 || P.cs_a != 1 || ((P.Bp || NF_GEMM_UNPACKED_PACK_A) && p1 - p0 >= kPackAMinPanels);
    const long mc_max = row_block_max(m1 - m0, K, pack_a, P.Bp != nullptr);
    const long nmb = cdiv(m1 - m0, mc_max);
    const long mc = std::min(m1 - m0, cdiv(cdiv(m1 - m0, nmb), MR) * MR);
    const long ncp = std::max(2L, bl.l2 / 4 / (kk * NR * 4));
    Scratch& ws = t_scratch;
    float* abuf = pack_a ? Scratch::grow(ws.a, ws.a_cap, mc * std::max(K, 1L) + 16) : nullptr;
    float* bbuf = P.Bp ? nullptr : Scratch::grow(ws.b, ws.b_cap, ncp * NR * kcb + 16);
    // C == NULL (tile_fn only): each row block x column block of C lives in a per-thread buffer
    // (never larger than this task's share of C)
    const bool c_local = P.C == nullptr;
    const long ld_local = std::min(ncp, p1 - p0) * NR;
    float* cbuf = c_local ? Scratch::grow(ws.c, ws.c_cap, mc * ld_local + 16) : nullptr;

    float* C = c_local ? nullptr : P.C + bi * P.bs_c;
    const nf_epilogue* ep = P.ep;
    const float* bias = ep ? ep->bias : nullptr;
    const float* res = (ep && ep->residual) ? ep->residual + bi * ep->bs_residual : nullptr;
    const long ldr = ep ? ep->ld_residual : 0;
    const bool tile_fn = ep && ep->tile_fn;
    const bool tile_prefetch = tile_fn && ep->tile_prefetch;
    int tiles[1024];  // mc <= 1000 * MR (blocking_for)
    long tile_row[1024];

    for (long ic = m0; ic < m1; ic += mc) {
        const long mcb = std::min(mc, m1 - ic);
        const int nt = row_tiles(mcb, tiles);
        for (int t = 0, r = 0; t < nt; r += tiles[t], ++t) tile_row[t] = r;
        // Row-major float32 A is read in place unless many panels will reuse it: then (and for
        // strided or bf16 A) these rows are packed once, for all K, into k-major micro-panels.
        if (pack_a && P.rs_a == 1 && NF_GEMM_PACK_A_BLOCK) {
            if (P.a_bf16)
                pack_a_block_colmajor((const uint16_t*)P.A + bi * P.bs_a, P.cs_a, ic, nt, tiles, tile_row, K, abuf);
            else
                pack_a_block_colmajor((const float*)P.A + bi * P.bs_a, P.cs_a, ic, nt, tiles, tile_row, K, abuf);
        } else if (pack_a) {
            for (int t = 0; t < nt; ++t) {
                float* dst = abuf + tile_row[t] * K;
                if (P.a_bf16)
                    pack_a_tile((const uint16_t*)P.A + bi * P.bs_a, P.rs_a, P.cs_a, ic + tile_row[t], tiles[t], K, dst);
                else
                    pack_a_tile((const float*)P.A + bi * P.bs_a, P.rs_a, P.cs_a, ic + tile_row[t], tiles[t], K, dst);
            }
        }
        const float* a_in_place = (const float*)P.A + bi * P.bs_a + ic * P.rs_a;
        RegionPrefetch pf;
        for (long pj = p0; pj < p1; pj += ncp) {
            const long pje = std::min(p1, pj + ncp);
            const long c_lo = std::max(n0, pj * NR), c_hi = std::min(n1, pje * NR);
            for (long kb = 0; kb < nk; ++kb) {
                const long k0 = kb * kcb;
                const long kc = std::min(kcb, K - k0);
                const bool last = kb == nk - 1;
                const float* bbase = nullptr;
                long pstride = 0;
                bool in_place = false;  // row-major float32 B read by the micro-kernel where it is
                if (kc > 0) {
                    if (P.Bp) {
                        bbase = P.Bp + bi * P.bs_bp + pj * K * NR + k0 * NR;
                        pstride = K * NR;
                    } else {
                        if (P.b_bf16)
                            pack_b_panels((const uint16_t*)P.B + bi * P.bs_b, P.rs_b, P.cs_b, P.N, k0, kc, pj, pje,
                                          bbuf, kc * NR);
                        else if (P.b_i8)
                            pack_b_panels((const int8_t*)P.B + bi * P.bs_b, P.rs_b, P.cs_b, P.N, k0, kc, pj, pje,
                                          bbuf, kc * NR);
                        else if (b_in_place && pje * NR <= P.N)
                            in_place = true;
                        else
                            pack_b_panels(P.B + bi * P.bs_b, P.rs_b, P.cs_b, P.N, k0, kc, pj, pje, bbuf, kc * NR);
                        bbase = in_place ? P.B + bi * P.bs_b + k0 * P.rs_b + pj * NR : bbuf;
                        pstride = in_place ? NR : kc * NR;
                    }
                }
                // unpacked B: prefetch the source of the next block (same columns, next K block, or next columns)
                // into L2, a share after each row tile; only with a packed A (weight gradients: 2-3% faster GPT-42M
                // steps). With A read in place (inference, 128 rows) the bursts of ~300 software prefetches per tile
                // cost more than they saved: BERT / GPT-2 b1 x 128 3-7% faster without them, Llama within 1%
                // (same process, interleaved calls, on a Sapphire Rapids Xeon)
                pf.total = 0;
                if (pack_a && mcb <= kPrefetchB && !P.Bp && (kb + 1 < nk || pj + ncp < p1)) {
                    const long pjn = kb + 1 < nk ? pj : pj + ncp, k0n = kb + 1 < nk ? k0 + kcb : 0;
                    const long kcn = std::min(kcb, K - k0n), c0 = pjn * NR, c1 = std::min(P.N, std::min(p1, pjn + ncp) * NR);
                    const long es = P.b_bf16 ? 2 : P.b_i8 ? 1 : 4;
                    const char* src = (const char*)P.B + bi * P.bs_b * es;
                    if (P.cs_b == 1)
                        pf.set(src + (k0n * P.rs_b + c0) * es, P.rs_b * es, kcn, (c1 - c0) * es);
                    else if (P.rs_b == 1)
                        pf.set(src + (k0n + c0 * P.cs_b) * es, P.cs_b * es, c1 - c0, kcn * es);
                }
                // one micro-kernel call: row tile t x panel p
                auto run = [&](int t, long p) {
                    const long col0 = p * NR, row = ic + tile_row[t];
                    nfk::TileOut o;
                    o.c = c_local ? cbuf + tile_row[t] * ld_local + (p - pj) * NR : C + row * P.ldc + col0;
                    o.ldc = c_local ? ld_local : P.ldc;
                    o.accumulate = kb > 0 || (P.accumulate && !c_local);
                    o.last = last;
                    o.bias = bias ? bias + col0 : nullptr;
                    o.act = ep ? ep->act : 0;
                    o.res = res ? res + row * ldr + col0 : nullptr;
                    o.ldr = ldr;
                    o.lo = (int)std::max(0L, n0 - col0);
                    o.hi = (int)std::min((long)NR, n1 - col0);
                    if (in_place) o.ldb = P.rs_b;
                    const float* bp = bbase ? bbase + (p - pj) * pstride : nullptr;
                    if (pack_a)
                        nfk::kernels[tiles[t]](kc, abuf + tile_row[t] * K + k0 * tiles[t], 1, tiles[t], bp, o);
                    else
                        nfk::kernels[tiles[t]](kc, a_in_place + tile_row[t] * P.rs_a + k0, P.rs_a, 1, bp, o);
                };
                // each row tile's A micro-panel stays in L1 while it sweeps the ncp panels of B (in L2)
                for (int t = 0; t < nt; ++t) {
                    // what the next tile's epilogue reads, into L2 while this tile computes (the next row tile,
                    // or the next column block's first)
                    if (last && tile_prefetch) {
                        if (t + 1 < nt)
                            ep->tile_prefetch(ep->tile_ctx, bi, nullptr, 0, ic + tile_row[t + 1], c_lo, tiles[t + 1],
                                              c_hi - c_lo);
                        else if (pje < p1)
                            ep->tile_prefetch(ep->tile_ctx, bi, nullptr, 0, ic + tile_row[0], pje * NR, tiles[0],
                                              std::min(n1, std::min(p1, pje + ncp) * NR) - pje * NR);
                    }
                    for (long p = pj; p < pje; ++p) run(t, p);
                    pf.upto(pf.total * (t + 1) / nt);
                    if (last && tile_fn) {
                        float* ct = c_local ? cbuf + tile_row[t] * ld_local + (c_lo - pj * NR)
                                            : C + (ic + tile_row[t]) * P.ldc + c_lo;
                        ep->tile_fn(ep->tile_ctx, bi, ct, c_local ? ld_local : P.ldc, ic + tile_row[t], c_lo, tiles[t],
                                    c_hi - c_lo);
                    }
                }
            }
        }
    }
}

/* ---------------- threading ---------------- */

struct Grid {
    long tm, tn;
};

/* Pick tm x tn blocks per matrix (batch*tm*tn tasks dealt contiguously to nt threads) that
 * minimise the busiest thread's padded MACs plus a packing/streaming cost per task. With B packed
 * on the fly (`b_unpacked`) every task packs its own columns of B: splitting M re-packs the same
 * columns once per row block, so columns weigh more than rows. A column-major or bf16 A
 * (`a_packed`: dY^T in a weight gradient) is packed by every task for its rows, so then rows weigh
 * as much as columns (dW 1536 x 1024 x 512 on 2 threads split N and packed all of A twice). */
Grid choose_grid(long batch, long M, long N, long K, int nt, bool b_unpacked = false, bool a_packed = false) {
    const long mt = cdiv(M, MR), np = cdiv(N, NR);
    Grid best = {1, 1};
    double best_cost = -1;
    const long kk = std::max(K, 1L);
    for (long tm = 1; tm <= std::min(mt, 4L * nt); ++tm)
        for (long tn = 1; tn <= std::min(np, 4L * nt); ++tn) {
            const long tasks = batch * tm * tn;
            if (tasks > 64L * nt && (tm > 1 || tn > 1)) continue;
            const double per = (double)cdiv(tasks, nt);
            const double rows = (double)cdiv(mt, tm) * MR, cols = (double)cdiv(np, tn) * NR;
            const double stream = b_unpacked ? (a_packed ? 16.0 : 2.0) * rows + 16.0 * cols : 8.0 * (rows + cols);
            const double cost = per * (rows * cols * kk + stream * kk + 20000.0);
            if (best_cost < 0 || cost < best_cost - 1e-9 * best_cost) {
                best_cost = cost;
                best = {tm, tn};
            }
        }
    return best;
}

inline long split(long units, long parts, long i, long unit, long limit) {
    return std::min(limit, (units * i / parts) * unit);
}

void run_task(const Problem& P, const Grid& g, long task) {
    const long per = g.tm * g.tn;
    const long bi = task / per, r = task % per, mi = r / g.tn, ni = r % g.tn;
    const long mt = cdiv(P.M, MR), np = cdiv(P.N, NR);
    gemm_block(P, bi, split(mt, g.tm, mi, MR, P.M), split(mt, g.tm, mi + 1, MR, P.M), split(np, g.tn, ni, NR, P.N),
               split(np, g.tn, ni + 1, NR, P.N));
}

/* Split tasks further (up to kTasksPerThread per thread) while each keeps >= kMinTaskMacs MACs
 * and >= 8 tiles along the split dimension: threads then take tasks dynamically, so a thread
 * that is descheduled or slowed (shared machines, SMT siblings) does not hold the others up.
 * With B packed on the fly only N is split (an M split would pack the same B columns twice).
 * M is split only while each half keeps >= 16 row tiles: every row block streams all of its B
 * columns from memory, so at M = 128 an M split read the packed weights twice (2 threads,
 * 128 x 768 x 2048 / 2048 x 768 / 768 x 2304 pre-packed: 1.14-1.19x faster without it). */
constexpr long kTasksPerThread = 4;
constexpr double kMinTaskMacs = 4e6;

Grid refine_grid(Grid g, long batch, long M, long N, long K, int nt, bool b_unpacked = false) {
    const long mt = cdiv(M, MR), np = cdiv(N, NR);
    while (batch * g.tm * g.tn < kTasksPerThread * nt) {
        const long tiles_m = cdiv(mt, g.tm), tiles_n = cdiv(np, g.tn);
        if ((double)tiles_m * MR * tiles_n * NR * std::max(K, 1L) / 2 < kMinTaskMacs) break;
        if (tiles_n >= 16) g.tn *= 2;
        else if (tiles_m >= 32 && !b_unpacked) g.tm *= 2;
        else break;
    }
    return g;
}

template <typename T>
void pack_b_all(long K, long N, const T* B, long sk, long sn, float* packed, int nthreads = 0);

/* B packed once per call, before the tasks, when the tasks would pack it on the fly more than
 * once: a packed A (dY^T of a weight gradient) limits a row block to twice L2, so a tall dW
 * (out x tokens x in) packs all of B again for every row block. Packing it up front (the threads
 * share the work) and running on the packed panels: GPT-42M's dW GEMMs 4-6% faster, its training
 * step 1.6% (Zen 3, 2 threads). The buffer is the calling thread's, kept up to 16 MB. */
thread_local Scratch t_call_b;
constexpr long kKeepPrepackedB = 4L << 20;  // floats

bool prepack_b(const Problem& P, long batch, const Grid& g, bool a_packed) {
    if (P.Bp || batch != 1 || P.K <= 0 || !a_packed) return false;
    const long rows = cdiv(cdiv(P.M, MR), g.tm) * MR;
    return cdiv(rows, row_block_max(rows, P.K, true, false)) >= 2;
}

void run(const Problem& P0, long batch, int nthreads) {
    if (batch <= 0 || P0.M <= 0 || P0.N <= 0) return;
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const bool a_packed = P0.a_bf16 || P0.cs_a != 1;
    Grid g = choose_grid(batch, P0.M, P0.N, P0.K, nt, P0.Bp == nullptr, a_packed);
    Problem P = P0;
    if (prepack_b(P0, batch, g, a_packed)) {
        float* buf = Scratch::grow(t_call_b.b, t_call_b.b_cap, nf_sgemm_packed_size(P.K, P.N) + 16);
        if (P.b_bf16)
            pack_b_all(P.K, P.N, (const uint16_t*)P.B, P.rs_b, P.cs_b, buf, nt);
        else if (P.b_i8)
            pack_b_all(P.K, P.N, (const int8_t*)P.B, P.rs_b, P.cs_b, buf, nt);
        else
            pack_b_all(P.K, P.N, P.B, P.rs_b, P.cs_b, buf, nt);
        P.Bp = buf, P.bs_bp = 0, P.B = nullptr, P.b_bf16 = P.b_i8 = false;
        g = choose_grid(batch, P.M, P.N, P.K, nt, false, a_packed);
    }
    struct Release {
        ~Release() {
            if (t_call_b.b_cap > kKeepPrepackedB) free(t_call_b.b), t_call_b.b = nullptr, t_call_b.b_cap = 0;
        }
    } release;
    const bool b_unpacked = P.Bp == nullptr;
    if (nt > 1) g = refine_grid(g, batch, P.M, P.N, P.K, nt, b_unpacked);
    const long tasks = batch * g.tm * g.tn;
    if (nt > tasks) nt = (int)tasks;
    if (nt <= 1) {
        for (long t = 0; t < tasks; ++t) run_task(P, g, t);
        return;
    }
    std::atomic<long> next{0};
#pragma omp parallel num_threads(nt)
    {
        for (long t = next.fetch_add(1, std::memory_order_relaxed); t < tasks;
             t = next.fetch_add(1, std::memory_order_relaxed))
            run_task(P, g, t);
    }
}

Problem make_problem(long M, long N, long K, const void* A, bool a_bf16, long bs_a, long rs_a, long cs_a,
                     const float* Bp, long bs_bp, const float* B, long bs_b, long rs_b, long cs_b, float* C, long bs_c,
                     long ldc, int accumulate, const nf_epilogue* ep) {
    Problem P;
    P.M = M, P.N = N, P.K = K;
    P.A = A, P.a_bf16 = a_bf16, P.bs_a = bs_a, P.rs_a = rs_a, P.cs_a = cs_a;
    P.Bp = Bp, P.bs_bp = bs_bp;
    P.B = B, P.bs_b = bs_b, P.rs_b = rs_b, P.cs_b = cs_b, P.b_bf16 = P.b_i8 = false;
    P.C = C, P.bs_c = bs_c, P.ldc = ldc;
    P.accumulate = accumulate != 0;
    P.ep = ep;
    return P;
}

template <typename T>
void pack_b_all(long K, long N, const T* B, long sk, long sn, float* packed, int nthreads) {
    const long np = cdiv(N, NR);
    if (K <= 0 || np <= 0) return;
    if (nthreads <= 0) nthreads = omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nthreads) if (np * K > (1L << 16) && !omp_in_parallel())
    for (long p = 0; p < np; ++p) pack_b_panels(B, sk, sn, N, 0, K, p, p + 1, packed + p * K * NR, K * NR);
}

}  // namespace

namespace nfi {
long l1d_bytes() { return blocking().l1; }
long l2_bytes() { return blocking().l2; }
}  // namespace nfi

/* ---------------- C API ---------------- */

extern "C" {

int nf_gemm_isa(void) { return NF_ISA; }
int nf_sgemm_nr(void) { return NR; }
int nf_sgemm_mr(void) { return MR; }
long nf_gemm_mc(void) { return blocking().mc; }

void nf_gemm_set_cache_sizes(long l1d, long l2, long l3) {
    (void)l3;
    const Blocking cur = blocking();
    Blocking b = blocking_for(l1d, l2);
    if (l1d <= 0) b.kc = cur.kc, b.l1 = cur.l1;
    if (l2 <= 0) b.l2 = cur.l2;
    g_blocking = b;
}

void nf_gemm_get_blocking(long* kc, long* mc, long* nc) {
    const Blocking& b = blocking();
    if (kc) *kc = b.kc;
    if (mc) *mc = b.mc;
    if (nc) *nc = std::max(2L, b.l2 / 4 / (b.kc * NR * 4)) * NR;  // column block for a full K block
}

void nf_gemm_partition(long M, long N, long K, int nthreads, long* tm, long* tn) {
    const Grid g = choose_grid(1, std::max(M, 1L), std::max(N, 1L), K, nthreads > 0 ? nthreads : 1);
    *tm = g.tm;
    *tn = g.tn;
}

long nf_sgemm_packed_size(long K, long N) { return cdiv(std::max(N, 0L), NR) * NR * std::max(K, 0L); }

void nf_sgemm_pack_b(long K, long N, const float* B, long stride_k, long stride_n, float* packed) {
    pack_b_all(K, N, B, stride_k, stride_n, packed);
}

void nf_sgemm_pack_b_bf16(long K, long N, const uint16_t* B, long stride_k, long stride_n, float* packed) {
    pack_b_all(K, N, B, stride_k, stride_n, packed);
}

void nf_sgemm_packed_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Bp, float* C,
                           long ldc, long m0, long m1, long n0, long n1, int accumulate, const nf_epilogue* ep) {
    const Problem P = make_problem(M, N, K, A, false, 0, rs_a, cs_a, Bp, 0, nullptr, 0, 0, 0, C, 0, ldc, accumulate, ep);
    gemm_block(P, 0, std::max(0L, m0), std::min(M, m1), std::max(0L, n0), std::min(N, n1));
}

void nf_sgemm_packed(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Bp, float* C,
                     long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    run(make_problem(M, N, K, A, false, 0, rs_a, cs_a, Bp, 0, nullptr, 0, 0, 0, C, 0, ldc, accumulate, ep), 1,
        nthreads);
}

void nf_sgemm_packed_batched(long batch, long M, long N, long K, const float* A, long bs_a, long rs_a, long cs_a,
                             const float* Bp, long bs_bp, float* C, long bs_c, long ldc, int accumulate,
                             const nf_epilogue* ep, int nthreads) {
    run(make_problem(M, N, K, A, false, bs_a, rs_a, cs_a, Bp, bs_bp, nullptr, 0, 0, 0, C, bs_c, ldc, accumulate, ep),
        batch, nthreads);
}

void nf_sgemm(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b, long cs_b,
              float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (nfi::gemv_kn(M, N, K, A, rs_a, cs_a, B, rs_b, cs_b, C, ldc, accumulate, ep, nthreads)) return;
    if (C && nfi::few_rows_rowmajor(M, N, K, A, rs_a, cs_a, B, rs_b, cs_b, C, ldc, accumulate, ep, nthreads)) return;
    run(make_problem(M, N, K, A, false, 0, rs_a, cs_a, nullptr, 0, B, 0, rs_b, cs_b, C, 0, ldc, accumulate, ep), 1,
        nthreads);
}

void nf_sgemm_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
                    long cs_b, float* C, long ldc, long m0, long m1, long n0, long n1, int accumulate,
                    const nf_epilogue* ep) {
    const Problem P =
        make_problem(M, N, K, A, false, 0, rs_a, cs_a, nullptr, 0, B, 0, rs_b, cs_b, C, 0, ldc, accumulate, ep);
    gemm_block(P, 0, std::max(0L, m0), std::min(M, m1), std::max(0L, n0), std::min(N, n1));
}

void nf_sgemm_batched(long batch, long M, long N, long K, const float* A, long bs_a, long rs_a, long cs_a,
                      const float* B, long bs_b, long rs_b, long cs_b, float* C, long bs_c, long ldc, int accumulate,
                      const nf_epilogue* ep, int nthreads) {
    run(make_problem(M, N, K, A, false, bs_a, rs_a, cs_a, nullptr, 0, B, bs_b, rs_b, cs_b, C, bs_c, ldc, accumulate,
                     ep),
        batch, nthreads);
}

void nf_gemm_mixed(long M, long N, long K, const void* A, int a_bf16, long rs_a, long cs_a, const void* B, int b_bf16,
                   long rs_b, long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep0, int nthreads) {
    nfi::Bf16Bias bias;
    const nf_epilogue* ep = bias.get(ep0, N);
    if (a_bf16 && b_bf16 &&
        nfi::bf16_native(M, N, K, (const uint16_t*)A, rs_a, cs_a, (const uint16_t*)B, rs_b, cs_b, C, ldc, accumulate, ep,
                         nthreads))
        return;
    if (nfi::gemv_kn_mixed(M, N, K, A, a_bf16 != 0, rs_a, cs_a, B, b_bf16 != 0, rs_b, cs_b, C, ldc, accumulate, ep,
                           nthreads)) {
        if (a_bf16 || b_bf16) nfi::count_bf16(NF_BF16_STREAMED);
        return;
    }
    if (a_bf16 || b_bf16) nfi::count_bf16(NF_BF16_CONVERT);
    Problem P = make_problem(M, N, K, A, a_bf16 != 0, 0, rs_a, cs_a, nullptr, 0, (const float*)B, 0, rs_b, cs_b, C, 0,
                             ldc, accumulate, ep);
    P.b_bf16 = b_bf16 != 0;
    run(P, 1, nthreads);
}

void nf_gemm_bf16_packed(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const float* Bp, float* C,
                         long ldc, int accumulate, const nf_epilogue* ep0, int nthreads) {
    nfi::Bf16Bias bias;
    const nf_epilogue* ep = bias.get(ep0, N);
    run(make_problem(M, N, K, A, true, 0, rs_a, cs_a, Bp, 0, nullptr, 0, 0, 0, C, 0, ldc, accumulate, ep), 1,
        nthreads);
}

static std::atomic<long> g_i8_counts[2];  // nf_gemm_i8w calls: [0] streaming GEMV, [1] packed (converted) path

void nf_gemm_i8_counts(long* counts) {
    for (int i = 0; i < 2; ++i) counts[i] = g_i8_counts[i].load(std::memory_order_relaxed);
}

void nf_gemm_i8w(long M, long N, long K, const float* A, long rs_a, long cs_a, const int8_t* B, long rs_b, long cs_b,
                 float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (rs_b == 1 && C && nfi::gemv_nt_i8(M, N, K, A, rs_a, cs_a, B, cs_b, C, ldc, accumulate, ep, nthreads)) {
        g_i8_counts[0].fetch_add(1, std::memory_order_relaxed);
        return;
    }
    g_i8_counts[1].fetch_add(1, std::memory_order_relaxed);
    Problem P = make_problem(M, N, K, A, false, 0, rs_a, cs_a, nullptr, 0, (const float*)B, 0, rs_b, cs_b, C, 0, ldc,
                             accumulate, ep);
    P.b_i8 = true;
    run(P, 1, nthreads);
}

}  // extern "C"
