/* nf_gemm_dot.h — dot-product ("inner-product") micro-kernel for C = A @ W^T with W read in place.
 *
 * Invariant: dot_tile<R, C> computes, for an R x C tile,
 *     s[i][j] = sum_{k < kc} A(i, k) * W(j, k),   A(i, k) = a[i*lda + k],  W(j, k) = w[j*ldw + k]
 * (both operands contiguous along k: a row-major activation and an nn.Linear weight [N, K]) in
 * R*C vector accumulators over k, reduces each accumulator horizontally once after the K loop,
 * and writes c[i*ldc + j] = s[i][j] (+ c[i*ldc + j] if `add`) for i < R, j < C only. Nothing
 * outside the tile is read or written; k past kc is never read (the tail uses masked loads).
 * Internal header of nf_gemm_nt.cpp.
 */
#ifndef NF_GEMM_DOT_H
#define NF_GEMM_DOT_H

#include <array>
#include <utility>

#include "nf_gemm_simd.h"

namespace nfd {
using namespace nfs;

/* Tile DMR rows of A x DNR rows of W (= DNR columns of C):
 *   AVX2 3 x 4: 12 ymm accumulators + 3 A vectors + 1 W vector = all 16 registers, 7 loads per 12
 *     FMAs (as the packed 4 x 24 kernel); the 4 W rows (4 x KC floats) stay in L1 while A rows stream.
 *   AVX-512 4 x 4: 16 zmm accumulators (not measured: no AVX-512 machine here).
 *   generic 3 x 4 (SSE-width vectors).
 * Four columns per tile make the reduction cheap: hadd trees turn 4 (or 2 x 4) accumulators into
 * one vector of C values (vhsum4_store / vhsum4x2_store). NF_GEMM_DOT_MR / _NR override the shape
 * (tests run other shapes; a width that is not a multiple of 4 uses the scalar reduction). */
#if defined(NF_GEMM_DOT_MR)
constexpr int DMR = NF_GEMM_DOT_MR;
#elif NF_ISA == 2
constexpr int DMR = 4;
#else
constexpr int DMR = 3;
#endif
#if defined(NF_GEMM_DOT_NR)
constexpr int DNR = NF_GEMM_DOT_NR;
#else
constexpr int DNR = 4;
#endif

template <int R, int C>
NF_INLINE void dot_step(vf (&acc)[R][C], const float* a, long lda, const float* w, long ldw, long k) {
    vf av[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) av[i] = vload(a + i * lda + k);
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) {
        const vf wv = vload(w + j * ldw + k);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) acc[i][j] = vfma(av[i], wv, acc[i][j]);
    }
}

template <int R, int C>
NF_INLINE void store_sums(vf (&acc)[R][C], float* c, long ldc, bool add) {
    if constexpr (C % 4 == 0) {
#pragma GCC unroll 4
        for (int j = 0; j < C; j += 4) {
            int i = 0;
#pragma GCC unroll 8
            for (; i + 1 < R; i += 2)
                vhsum4x2_store(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3], acc[i + 1][j], acc[i + 1][j + 1],
                               acc[i + 1][j + 2], acc[i + 1][j + 3], c + i * ldc + j, c + (i + 1) * ldc + j, add);
            if constexpr (R % 2 == 1)
                vhsum4_store(acc[R - 1][j], acc[R - 1][j + 1], acc[R - 1][j + 2], acc[R - 1][j + 3],
                             c + (R - 1) * ldc + j, add);
        }
    } else {
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < C; ++j) {
                const float s = vhsum(acc[i][j]);
                c[i * ldc + j] = add ? c[i * ldc + j] + s : s;
            }
    }
}

template <int R, int C>
__attribute__((noinline)) void dot_tile(long kc, const float* __restrict a, long lda, const float* __restrict w, long ldw,
                                        float* c, long ldc, bool add) {
    vf acc[R][C];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) acc[i][j] = vzero();
    const long kv = kc / W * W;
    long k = 0;
    if constexpr (R * C < 8) {
        // few accumulators: the FMA chains are latency-bound, keep a second set for odd vectors
        vf acc2[R][C];
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < C; ++j) acc2[i][j] = vzero();
        for (; k + 2 * W <= kv; k += 2 * W) {
            dot_step<R, C>(acc, a, lda, w, ldw, k);
            dot_step<R, C>(acc2, a, lda, w, ldw, k + W);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < C; ++j) acc[i][j] = vadd(acc[i][j], acc2[i][j]);
    }
#pragma GCC unroll 2
    for (; k < kv; k += W) dot_step<R, C>(acc, a, lda, w, ldw, k);
    if (k < kc) {  // K tail: lanes past kc are neither read nor summed
        const vm m = vmask_range(0, (int)(kc - k));
        vf av[R];
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) av[i] = vload_mask(a + i * lda + k, m);
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) {
            const vf wv = vload_mask(w + j * ldw + k, m);
#pragma GCC unroll 8
            for (int i = 0; i < R; ++i) acc[i][j] = vfma(av[i], wv, acc[i][j]);
        }
    }
    store_sums<R, C>(acc, c, ldc, add);
}

typedef void (*dot_fn)(long, const float*, long, const float*, long, float*, long, bool);

template <int R, size_t... J>
constexpr std::array<dot_fn, DNR + 1> dot_row(std::index_sequence<J...>) {
    return {nullptr, &dot_tile<R, (int)J + 1>...};
}
template <size_t... I>
constexpr std::array<std::array<dot_fn, DNR + 1>, DMR + 1> make_dot_table(std::index_sequence<I...>) {
    return {std::array<dot_fn, DNR + 1>{}, dot_row<(int)I + 1>(std::make_index_sequence<DNR>{})...};
}
/* dot_kernels[R][C] computes an R x C tile, 1 <= R <= DMR, 1 <= C <= DNR */
static constexpr auto dot_kernels = make_dot_table(std::make_index_sequence<DMR>{});

}  // namespace nfd
#endif /* NF_GEMM_DOT_H */
