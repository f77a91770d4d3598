/* nf_gemm_bcast.h — broadcast micro-kernel for C = A @ W^T with W read in place, vectors along M.
 *
 * Invariant: bc_tile<C> computes, for a tile of BMR rows x C columns (C <= BNR),
 *     s[i][j] = acc0[i][j] + sum_{k < kc} Ap[k*BMR + i] * W(j, k),   W(j, k) = w[j*ldw + k]
 * where Ap is the tile's rows of A packed k-major (BMR floats per k; rows past the block are zero)
 * and acc0 is zero, or the partial sums a previous K block left in `part` (`load`). It then either
 * stores s to `part` (a K block that is not the last) or writes rows i < rows of C:
 *     c[i*ldc + j] = s[i][j] (+ c[i*ldc + j] if `add`),  j < C,
 * touching nothing else. Internal header of nf_gemm_nt.cpp.
 *
 * Why: an nn.Linear weight W [N, K] is k-contiguous, so the packed kernel (vectors along N) needs W
 * transposed into panels, a copy made on the fly or kept (memory). Here the vectors run along M (two
 * per tile, from A packed once per row block) and W's elements are broadcast from where they are:
 * each FMA pair takes one `vbroadcastss` of W(j, k); the C x kc slice of W stays in L1 while the
 * row tiles of A stream from L2. The tile is transposed in registers (W x W blocks) when written.
 */
#ifndef NF_GEMM_BCAST_H
#define NF_GEMM_BCAST_H

#include <array>
#include <utility>

#include "nf_gemm_simd.h"

namespace nfb {
using namespace nfs;

/* BMR x BNR: AVX2 16 x 6 (12 ymm accumulators + 2 A vectors + the broadcast: 15 of 16 registers;
 * 8 loads per 12 FMAs), AVX-512 32 x 12 (24 zmm accumulators), generic 8 x 6. */
constexpr int BMR = 2 * W;
#if defined(NF_GEMM_BC_NR)
constexpr int BNR = NF_GEMM_BC_NR;
#elif NF_ISA == 2
constexpr int BNR = 12;
#else
constexpr int BNR = 6;
#endif

/* rows [0, rows) of the W-row half `acc` (lane i = row i, vector j = column j < C) into C */
template <int C>
NF_INLINE void store_half(const vf (&acc)[C], float* c, long ldc, int rows, bool add) {
#pragma GCC unroll 4
    for (int g = 0; g < C; g += W) {
        const int cols = C - g < W ? C - g : W;
        const vm m = vmask_range(0, cols);
        vf r[W];
#pragma GCC unroll 16
        for (int j = 0; j < W; ++j) r[j] = g + j < C ? acc[g + j] : vzero();
        vtranspose(r);  // r[i] = row i, columns g .. g + W - 1
        for (int i = 0; i < rows; ++i) {
            vf x = r[i];
            if (add) x = vadd(x, vload_mask(c + i * ldc + g, m));
            vstore_mask(c + i * ldc + g, m, x);
        }
    }
}

template <int C>
__attribute__((noinline)) void bc_tile(long kc, const float* __restrict ap, const float* __restrict w, long ldw,
                                       float* part, bool load, float* c, long ldc, int rows, bool add) {
    vf lo[C], hi[C];
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) {
        lo[j] = load ? vload(part + j * BMR) : vzero();
        hi[j] = load ? vload(part + j * BMR + W) : vzero();
    }
    for (long k = 0; k < kc; ++k) {
        const vf a0 = vload(ap + k * BMR), a1 = vload(ap + k * BMR + W);
#pragma GCC unroll 16
        for (int j = 0; j < C; ++j) {
            const vf b = vset1(w[j * ldw + k]);
            lo[j] = vfma(a0, b, lo[j]);
            hi[j] = vfma(a1, b, hi[j]);
        }
    }
    if (!c) {
#pragma GCC unroll 16
        for (int j = 0; j < C; ++j) {
            vstore(part + j * BMR, lo[j]);
            vstore(part + j * BMR + W, hi[j]);
        }
        return;
    }
    store_half<C>(lo, c, ldc, rows < W ? rows : W, add);
    if (rows > W) store_half<C>(hi, c + W * ldc, ldc, rows - W, add);
}

typedef void (*bc_fn)(long, const float*, const float*, long, float*, bool, float*, long, int, bool);

template <size_t... J>
constexpr std::array<bc_fn, BNR + 1> make_bc_table(std::index_sequence<J...>) {
    return {nullptr, &bc_tile<(int)J + 1>...};
}
/* bc_kernels[C] computes a BMR x C tile, 1 <= C <= BNR */
static constexpr auto bc_kernels = make_bc_table(std::make_index_sequence<BNR>{});

}  // namespace nfb
#endif /* NF_GEMM_BCAST_H */
