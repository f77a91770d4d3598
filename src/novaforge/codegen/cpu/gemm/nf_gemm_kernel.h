/* nf_gemm_kernel.h — register-blocked micro-kernel and its fused tile epilogue.
 *
 * Invariant: ukernel<R> computes one R x NR tile  acc[i][:] = sum_k A(i, k) * Bp[k*ldb + :]
 * entirely in registers (R*NV accumulators) and then writes it to C exactly once:
 *   C = act(acc + [C_old] + [bias]) + [residual]   on the lanes [lo, hi) of the tile only.
 * A(i, k) = ap[i*rsa + k*csa]: A in place (rsa = row stride, csa = 1) or a packed k-major
 * micro-panel (rsa = 1, csa = R). Bp is a k-major panel from the packers in nf_gemm.cpp (k stride
 * t.ldb = NR), or NR contiguous columns of a row-major B read in place (t.ldb = its row stride).
 * Lanes outside [lo, hi) are never read from or written to C/bias/residual.
 * Internal header of nf_gemm.cpp.
 */
#ifndef NF_GEMM_KERNEL_H
#define NF_GEMM_KERNEL_H

#include <array>
#include <utility>

#include "nf_gemm_simd.h"

namespace nfk {
using namespace nfs;

/* Tile shape MR x (NV vectors), each 12 (AVX2) or 24 (AVX-512) accumulators:
 *   AVX-512 6 x 64: 24 zmm accumulators + 4 B vectors + 1 broadcast; 10 loads per 24 FMAs; 6 row
 *     pointers + an index fit the 16 GPRs, and 64 columns divide N = 512, 768, 2048 and 32000
 *     (8 x 48 left a 32-column tail at N = 512). Against 8 x 48 (2 threads, M = 1024, K = 512-32000,
 *     B row-major, transposed or pre-packed): 1.00-1.15x; at M = 128 0.96-1.02x.
 *   AVX2 4 x 24: 12 ymm accumulators + 3 B vectors + 1 broadcast = all 16 registers; 7 loads per
 *     12 FMAs. Measured 3-6% faster here (Zen 4) than the classic 6 x 16 (8 loads per 12 FMAs),
 *     and 128 rows split into tiles without a remainder.
 *   generic 4 x 8 (SSE-width vectors).
 * NF_GEMM_MR / NF_GEMM_NV override them (tests run other shapes on this machine's ISA). */
#if defined(NF_GEMM_MR)
constexpr int MR = NF_GEMM_MR;
#elif NF_ISA == 2
constexpr int MR = 6;
#else
constexpr int MR = 4;
#endif
#if defined(NF_GEMM_NV)
constexpr int NV = NF_GEMM_NV;
#elif NF_ISA == 0
constexpr int NV = 2;
#elif NF_ISA == 2
constexpr int NV = 4;
#else
constexpr int NV = 3;
#endif
constexpr int NR = NV * W;  // tile width = packed panel width

/* What happens to a finished tile. Pointers are pre-offset to the tile's lane 0 (column
 * `panel*NR`), so they may point before the valid range when lo > 0; masked lanes never touch it. */
struct TileOut {
    float* c;
    long ldc;
    bool accumulate;   // add C_old
    bool last;         // last K block: apply bias / act / residual
    const float* bias; // lane 0 of this tile, or nullptr
    int act;
    const float* res;  // row 0 lane 0 of this tile, or nullptr
    long ldr;
    int lo, hi;        // valid lanes
    long ldb = NR;     // B's k stride: NR for a packed panel, the row stride for row-major B read in place
};

/* c[i, lanes] = act(c) + res on a full tile already stored (cold path: once per tile). */
__attribute__((noinline)) static void finish_act(int rows, const TileOut& t) {
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < NV; ++j) {
            vf x = vact(vload(t.c + i * t.ldc + j * W), t.act);
            if (t.res) x = vadd(x, vload(t.res + i * t.ldr + j * W));
            vstore(t.c + i * t.ldc + j * W, x);
        }
}

/* Partial tile (lanes [lo, hi) only) from a spilled accumulator block tmp[rows][NR]. */
__attribute__((noinline)) static void finish_partial(const float* tmp, int rows, const TileOut& t) {
    for (int j = 0; j < NV; ++j) {
        const int lo = t.lo - j * W, hi = t.hi - j * W;
        if (hi <= 0 || lo >= W) continue;
        const vm m = vmask_range(lo < 0 ? 0 : lo, hi > W ? W : hi);
        const vf b = (t.last && t.bias) ? vload_mask(t.bias + j * W, m) : vzero();
        for (int i = 0; i < rows; ++i) {
            vf x = vload(tmp + i * NR + j * W);
            if (t.accumulate) x = vadd(x, vload_mask(t.c + i * t.ldc + j * W, m));
            if (t.last) {
                x = vadd(x, b);
                if (t.act) x = vact(x, t.act);
                if (t.res) x = vadd(x, vload_mask(t.res + i * t.ldr + j * W, m));
            }
            vstore_mask(t.c + i * t.ldc + j * W, m, x);
        }
    }
}

/* Every loop touching acc is fully unrolled so that acc stays in registers. */
template <int R>
NF_INLINE void finish_tile(vf (&acc)[R][NV], const TileOut& t) {
    if (t.lo != 0 || t.hi != NR) {
        alignas(64) float tmp[R * NR];
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) vstore(tmp + i * NR + j * W, acc[i][j]);
        finish_partial(tmp, R, t);
        return;
    }
    if (t.accumulate) {
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = vadd(acc[i][j], vload(t.c + i * t.ldc + j * W));
    }
    if (t.last && t.bias) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) {
            const vf b = vload(t.bias + j * W);
#pragma GCC unroll 16
            for (int i = 0; i < R; ++i) acc[i][j] = vadd(acc[i][j], b);
        }
    }
    if (t.last && t.res && !t.act) {
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = vadd(acc[i][j], vload(t.res + i * t.ldr + j * W));
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) vstore(t.c + i * t.ldc + j * W, acc[i][j]);
    if (t.last && t.act) finish_act(R, t);
}

/* The micro-kernel prefetches B this many k steps ahead into L1 (0: never). B's panel streams
 * from L2 (packed) or L3/memory (read in place); 8 steps (2 KiB of a 64-wide panel) measured
 * 1-5% faster whole models on a Sapphire Rapids Xeon (BERT / GPT-2 / Llama b1 x 128, packed and
 * unpacked weights, GPT-42M training steps; same process, interleaved calls), 16 no better. */
#ifndef NF_GEMM_PREFETCH_B_K
#define NF_GEMM_PREFETCH_B_K 8
#endif
template <int R>
__attribute__((noinline)) void ukernel(long kc, const float* __restrict ap, long rsa, long csa, const float* __restrict bp,
                                       const TileOut& t) {
    vf acc[R][NV];
    const long ldb = t.ldb;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = vzero();
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) vprefetch(t.c + i * t.ldc);
    // With few rows the FMA chains are latency-bound: keep a second accumulator set on odd k.
    if constexpr (R <= 2) {
        vf acc2[R][NV];
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc2[i][j] = vzero();
        long k = 0;
        for (; k + 1 < kc; k += 2) {
            vf b0[NV], b1[NV];
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) {
                b0[j] = vload(bp + k * ldb + j * W);
                b1[j] = vload(bp + (k + 1) * ldb + j * W);
            }
#pragma GCC unroll 16
            for (int i = 0; i < R; ++i) {
                const vf a0 = vset1(ap[i * rsa + k * csa]), a1 = vset1(ap[i * rsa + (k + 1) * csa]);
#pragma GCC unroll 4
                for (int j = 0; j < NV; ++j) {
                    acc[i][j] = vfma(a0, b0[j], acc[i][j]);
                    acc2[i][j] = vfma(a1, b1[j], acc2[i][j]);
                }
            }
        }
        if (k < kc) {
#pragma GCC unroll 16
            for (int i = 0; i < R; ++i) {
                const vf a0 = vset1(ap[i * rsa + k * csa]);
#pragma GCC unroll 4
                for (int j = 0; j < NV; ++j) acc[i][j] = vfma(a0, vload(bp + k * ldb + j * W), acc[i][j]);
            }
        }
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = vadd(acc[i][j], acc2[i][j]);
    } else {
#pragma GCC unroll 4
        for (long k = 0; k < kc; ++k) {
            vf b[NV];
            if constexpr (NF_GEMM_PREFETCH_B_K > 0) {
#pragma GCC unroll 4
                for (int j = 0; j < NV; ++j) vprefetch(bp + (k + NF_GEMM_PREFETCH_B_K) * ldb + j * W);
            }
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) b[j] = vload(bp + k * ldb + j * W);
#pragma GCC unroll 16
            for (int i = 0; i < R; ++i) {
                const vf a = vset1(ap[i * rsa + k * csa]);
#pragma GCC unroll 4
                for (int j = 0; j < NV; ++j) acc[i][j] = vfma(a, b[j], acc[i][j]);
            }
        }
    }
    finish_tile<R>(acc, t);
}

typedef void (*ukernel_fn)(long, const float*, long, long, const float*, const TileOut&);

template <size_t... I>
constexpr std::array<ukernel_fn, sizeof...(I) + 1> make_kernel_table(std::index_sequence<I...>) {
    return {nullptr, &ukernel<(int)I + 1>...};
}
/* kernels[R] computes an R-row tile, 1 <= R <= MR */
static constexpr auto kernels = make_kernel_table(std::make_index_sequence<MR>{});

}  // namespace nfk
#endif /* NF_GEMM_KERNEL_H */
