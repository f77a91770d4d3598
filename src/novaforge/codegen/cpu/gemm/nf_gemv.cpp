/* nf_gemv.cpp — decode-sized products (M <= 4 rows of A; with row-major B, M <= 8 on AVX-512
 * builds, whose 32 vector registers hold the 8 x 2 broadcasts; M <= 8 for an int8 or bf16 W) with B
 * read in place, one contiguous stream of B per thread. B is float32, bf16 or (nt only) int8 and A
 * float32 or bf16; both are converted to float32 in registers (A once, when staged) and the sums are
 * float32.
 *
 * A decode step reads every weight once and does 2 flops per weight element: its matmuls are bound
 * by how fast the cores can stream the weights. Two cores reach the machine's read bandwidth only
 * when each streams one contiguous region (the hardware prefetcher follows it; many short strided
 * runs or dynamically scheduled interleaved tasks leave it 20-40% short, docs/cpu-gemm.md "Decode").
 * So the work is split by where B's bytes are:
 *
 *   nt (B = W^T, W [N, K] row-major, an nn.Linear weight): thread t owns C's columns [n0, n1), which
 *      are W's rows [n0, n1), contiguous. Groups of 4 rows of W over all of K, M x 4 vector
 *      accumulators, one horizontal reduction per group. (M = 8 measured: 608 us against the dot
 *      kernel's 440 at 8 x 768 x 3072: FMA-bound with 8 A loads per 16 FMAs; so M <= 4 here.)
 *   kn (B [K, N] row-major, a Conv1D weight): thread t owns B's rows [k0, k1), contiguous, and sums
 *      their products over all N columns into a per-thread partial (M x N floats, in L1/L2), 4 rows of
 *      B a step (2 for M > 4); after one barrier thread t adds the partials up for its columns.
 *
 * Invariant: every element of B is read once, by one thread; every C element of [0, M) x [0, N) is
 * written by exactly one thread in the final pass, in kChunk-column chunks: the sum (+ C_old when
 * accumulating), then the epilogue pass (bias, activation, residual), then the tile callback on the
 * chunk, as the other entries do. C may be NULL on the kn path only (the chunk then lives in a
 * per-thread buffer the callback reads). The sums run in another order than the other paths' (the
 * results differ from theirs in the last bits, as any two GEMM paths do).
 */
#include <omp.h>
#include <string.h>

#include <algorithm>
#include <atomic>

#include "nf_gemm.h"
#include "nf_gemm_internal.h"
#include "nf_gemm_simd.h"

using nfs::W;

namespace {

inline long cdiv(long a, long b) { return (a + b - 1) / b; }

constexpr long kGemvRows = 4;  // nt, float32 W
constexpr long kNarrowPrefetchGroups = 4;  // int8 / bf16 W: software prefetch distance, in groups of R rows
constexpr long kGemvRowsNarrow = 8;  // nt, int8 / bf16 W: rows 5-8 in a second pass over W's rows while in L1
#if NF_ISA == 2
constexpr long kGemvRowsKn = 8;
#else
constexpr long kGemvRowsKn = 4;
#endif
constexpr long kChunk = 64;              // columns per epilogue / tile-callback chunk
constexpr double kMinThreadMacs = 1e5;   // below this per thread, fewer threads
constexpr long kMaxPartialFloats = 1L << 18;  // kn: M x N partial sums per thread at most (1 MiB, in L2)

std::atomic<int> g_gemv_on{1};  // nf_gemm_set_gemv (tests compare both paths)

thread_local nfi::Scratch t_gemv_scratch;  // a: A staged contiguous, b: kn partial sums, c: a C chunk

int team_size(long M, long N, long K, int nthreads) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const double macs = (double)M * N * std::max(K, 1L);
    return (int)std::max(1L, std::min((long)nt, (long)(macs / kMinThreadMacs)));
}

/* [lo, hi) of `total` for part i of n, in units of `unit` (the last part takes the rest) */
inline void part_range(long total, long unit, int i, int n, long* lo, long* hi) {
    const long units = cdiv(total, unit);
    *lo = std::min(total, units * i / n * unit);
    *hi = std::min(total, units * (i + 1) / n * unit);
}

/* A's M rows as a contiguous M x K float32 block (A is small: M <= 8 rows); a bf16 A is converted */
template <typename TA>
const float* stage_a(const TA* A, long M, long K, long rs_a, long cs_a, float* buf) {
    if constexpr (sizeof(TA) == 4) {
        if (cs_a == 1 && (M == 1 || rs_a == K)) return A;
    }
    for (long m = 0; m < M; ++m)
        for (long k = 0; k < K; ++k) {
            if constexpr (sizeof(TA) == 4) buf[m * K + k] = A[m * rs_a + k * cs_a];
            else buf[m * K + k] = nfs::bf16_to_f32(A[m * rs_a + k * cs_a]);
        }
    return buf;
}

/* C[i, j] = act(C[i, j] + bias[j]) + res[i*ldr + j], then the tile callback, on rows [0, M) x [c0, c1) */
void finish_chunk(float* C, long ldc, long M, long c0, long c1, long col0, const nf_epilogue* ep) {
    if (!ep) return;
    nfi::epilogue_pass(C, ldc, 0, M, 0, c1 - c0, ep->bias ? ep->bias + col0 : nullptr, ep->act,
                       ep->residual ? ep->residual + col0 : nullptr, ep->ld_residual);
    if (ep->tile_fn) ep->tile_fn(ep->tile_ctx, 0, C, ldc, 0, col0, M, c1 - c0);
}

/* ---------------- nt: W [N, K], C[m, j] = sum_k A[m, k] * W[j, k] ---------------- */

/* C[m, j..j+R) (+= when add) for R <= 4 rows of W (float32, bf16 or int8) from j, all of K */
template <int MR, int R, typename T>
NF_INLINE void nt_group(const float* a, long K, const T* w, long ldw, float* c, long ldc, bool add) {
    nfs::vf acc[MR][R];
    for (int m = 0; m < MR; ++m)
        for (int r = 0; r < R; ++r) acc[m][r] = nfs::vzero();
    long k = 0;
    // int8 (bf16) W: the hardware prefetchers fall behind a stream that is consumed 4x (2x) faster
    // per instruction than float32 (int8, measured: 6.6 G weights/s per thread from DRAM, 15.6 from
    // L3), so each step prefetches its share (R x W elements) of the group kNarrowPrefetchGroups
    // groups ahead
    const char* pf = (const char*)(w + kNarrowPrefetchGroups * R * ldw);
    for (; k + W <= K; k += W) {
        if constexpr (sizeof(T) < 4) __builtin_prefetch(pf + k * R * (long)sizeof(T), 0, 2);
        nfs::vf x[MR];
        for (int m = 0; m < MR; ++m) {
            x[m] = nfs::vload(a + m * K + k);
            nfs::vkeep(x[m]);  // one load of A for the R rows' FMAs (folded into each, it ran 1.3x slower: int8)
        }
        for (int r = 0; r < R; ++r) {
            nfs::vf wv = nfs::vload_as_f32(w + r * ldw + k);
            if constexpr (MR > 1) nfs::vkeep(wv);  // (a float32 W's load, once for the MR FMAs)
            for (int m = 0; m < MR; ++m) acc[m][r] = nfs::vfma(x[m], wv, acc[m][r]);
        }
    }
    if (k < K) {
        const nfs::vm tail = nfs::vmask_range(0, (int)(K - k));
        nfs::vf x[MR];
        for (int m = 0; m < MR; ++m) x[m] = nfs::vload_mask(a + m * K + k, tail);
        for (int r = 0; r < R; ++r) {
            const nfs::vf wv = nfs::vload_as_f32_tail(w + r * ldw + k, (int)(K - k));
            for (int m = 0; m < MR; ++m) acc[m][r] = nfs::vfma(x[m], wv, acc[m][r]);
        }
    }
    for (int m = 0; m < MR; ++m) {
        if constexpr (R == 4) {
            nfs::vhsum4_store(acc[m][0], acc[m][1], acc[m][2], acc[m][3], c + m * ldc, add);
        } else {
            for (int r = 0; r < R; ++r) c[m * ldc + r] = nfs::vhsum(acc[m][r]) + (add ? c[m * ldc + r] : 0.0f);
        }
    }
}

/* rows [0, MR) of A, then (MR2 > 0) rows [MR, MR + MR2) against the same rows of W, still in L1 */
template <int MR, int MR2, int R, typename T>
NF_INLINE void nt_group_rows(const float* a, long K, const T* w, long ldw, float* c, long ldc, bool add) {
    nt_group<MR, R>(a, K, w, ldw, c, ldc, add);
    if constexpr (MR2 > 0) nt_group<MR2, R>(a + MR * K, K, w, ldw, c + MR * ldc, ldc, add);
}

template <int MR, int MR2, typename T>
void nt_columns(const float* a, long K, const T* Wt, long ldw, float* C, long ldc, bool add, long n0, long n1,
                const nf_epilogue* ep) {
    for (long jc = n0; jc < n1; jc += kChunk) {
        const long jce = std::min(n1, jc + kChunk);
        long j = jc;
        for (; j + 4 <= jce; j += 4) nt_group_rows<MR, MR2, 4>(a, K, Wt + j * ldw, ldw, C + j, ldc, add);
        switch (jce - j) {
            case 3: nt_group_rows<MR, MR2, 3>(a, K, Wt + j * ldw, ldw, C + j, ldc, add); break;
            case 2: nt_group_rows<MR, MR2, 2>(a, K, Wt + j * ldw, ldw, C + j, ldc, add); break;
            case 1: nt_group_rows<MR, MR2, 1>(a, K, Wt + j * ldw, ldw, C + j, ldc, add); break;
            default: break;
        }
        finish_chunk(C + jc, ldc, MR + MR2, jc, jce, jc, ep);
    }
}

template <typename T>
void nt_range(long M, const float* a, long K, const T* Wt, long ldw, float* C, long ldc, bool add, long n0,
              long n1, const nf_epilogue* ep) {
    switch (M) {
        case 1: nt_columns<1, 0>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 2: nt_columns<2, 0>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 3: nt_columns<3, 0>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 4: nt_columns<4, 0>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 5: nt_columns<4, 1>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 6: nt_columns<4, 2>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        case 7: nt_columns<4, 3>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
        default: nt_columns<4, 4>(a, K, Wt, ldw, C, ldc, add, n0, n1, ep); break;
    }
}

/* the nt product on a team of threads, each on its own contiguous rows of W */
template <typename TA, typename T>
void nt_team(long M, long N, long K, const TA* A, long rs_a, long cs_a, const T* Wt, long ldw, float* C,
             long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    const int nt = team_size(M, N, K, nthreads);
    auto run = [&](int t, int n) {
        nfi::Scratch& ws = t_gemv_scratch;
        const float* a = stage_a(A, M, K, rs_a, cs_a, nfi::Scratch::grow(ws.a, ws.a_cap, M * K + 16));
        long n0, n1;
        part_range(N, W, t, n, &n0, &n1);
        if (n0 < n1) nt_range(M, a, K, Wt, ldw, C, ldc, accumulate != 0, n0, n1, ep);
    };
    if (nt <= 1) {
        run(0, 1);
        return;
    }
#pragma omp parallel num_threads(nt)
    run(omp_get_thread_num(), omp_get_num_threads());
}

/* ---------------- kn: B [K, N], partial[m, j] = sum_{k in [k0, k1)} A[m, k] * B[k, j] ---------------- */

template <int MR, typename TB>
void kn_partial(const float* a, long K, const TB* B, long rs_b, long N, long k0, long k1, float* part) {
    // rows of B a step: M x KB broadcasts of A stay in registers; a bf16 B's rows are half as long
    // in bytes, so 8 of them a step keep the partial's loads and stores per byte of B as float32's
    constexpr int KB = MR > 4 ? 2 : (sizeof(TB) == 2 && MR <= 2) ? 8 : 4;
    memset(part, 0, (size_t)(MR * N) * sizeof(float));
    const long full = N / W * W;
    const nfs::vm tail = nfs::vmask_range(0, (int)(N - full));
    long k = k0;
    for (; k + KB <= k1; k += KB) {
        const TB* b[KB];
        for (int q = 0; q < KB; ++q) b[q] = B + (k + q) * rs_b;
        nfs::vf x[MR][KB];
        for (int m = 0; m < MR; ++m)
            for (int q = 0; q < KB; ++q) x[m][q] = nfs::vset1(a[m * K + k + q]);
        for (long j = 0; j < full; j += W) {
            if constexpr (sizeof(TB) == 2 && KB == 8) {
                // bf16: the hardware prefetchers fall behind 8 interleaved short rows (N = 768: 20 against
                // 27 GB/s measured), so each j step prefetches the next step's rows at j, kRows of them,
                // every 64-byte line of those rows once over kSteps steps
                constexpr int kSteps = 32 / W, kRows = KB / kSteps;  // W is 4, 8 or 16 lanes
                const long q0 = (j / W) % kSteps * kRows;
                for (long q = q0; q < q0 + kRows; ++q) __builtin_prefetch(b[q] + KB * rs_b + j, 0, 2);
            }
            nfs::vf v[KB];
            for (int q = 0; q < KB; ++q) v[q] = nfs::vload_as_f32(b[q] + j);
            for (int m = 0; m < MR; ++m) {
                float* p = part + m * N + j;
                nfs::vf s = nfs::vload(p);
                for (int q = 0; q < KB; ++q) s = nfs::vfma(x[m][q], v[q], s);
                nfs::vstore(p, s);
            }
        }
        if (full < N) {
            nfs::vf v[KB];
            for (int q = 0; q < KB; ++q) v[q] = nfs::vload_as_f32_tail(b[q] + full, (int)(N - full));
            for (int m = 0; m < MR; ++m) {
                float* p = part + m * N + full;
                nfs::vf s = nfs::vload_mask(p, tail);
                for (int q = 0; q < KB; ++q) s = nfs::vfma(x[m][q], v[q], s);
                nfs::vstore_mask(p, tail, s);
            }
        }
    }
    for (; k < k1; ++k) {
        const TB* b0 = B + k * rs_b;
        for (int m = 0; m < MR; ++m) {
            const nfs::vf x0 = nfs::vset1(a[m * K + k]);
            float* p = part + m * N;
            for (long j = 0; j < full; j += W)
                nfs::vstore(p + j, nfs::vfma(x0, nfs::vload_as_f32(b0 + j), nfs::vload(p + j)));
            if (full < N)
                nfs::vstore_mask(p + full, tail, nfs::vfma(x0, nfs::vload_as_f32_tail(b0 + full, (int)(N - full)),
                                                           nfs::vload_mask(p + full, tail)));
        }
    }
}

template <typename TB>
void kn_partial_rows(long M, const float* a, long K, const TB* B, long rs_b, long N, long k0, long k1, float* part) {
    switch (M) {
        case 1: kn_partial<1>(a, K, B, rs_b, N, k0, k1, part); break;
        case 2: kn_partial<2>(a, K, B, rs_b, N, k0, k1, part); break;
        case 3: kn_partial<3>(a, K, B, rs_b, N, k0, k1, part); break;
#if NF_ISA == 2
        case 4: kn_partial<4>(a, K, B, rs_b, N, k0, k1, part); break;
        case 5: kn_partial<5>(a, K, B, rs_b, N, k0, k1, part); break;
        case 6: kn_partial<6>(a, K, B, rs_b, N, k0, k1, part); break;
        case 7: kn_partial<7>(a, K, B, rs_b, N, k0, k1, part); break;
        default: kn_partial<8>(a, K, B, rs_b, N, k0, k1, part); break;
#else
        default: kn_partial<4>(a, K, B, rs_b, N, k0, k1, part); break;
#endif
    }
}

/* C's columns [c0, c1) = sum of the nparts partials (+ C_old), then the epilogue, in chunks */
void kn_reduce(long M, long N, float* const* parts, int nparts, float* C, long ldc, bool add, long c0, long c1,
               const nf_epilogue* ep) {
    nfi::Scratch& ws = t_gemv_scratch;
    float* local = C ? nullptr : nfi::Scratch::grow(ws.c, ws.c_cap, M * kChunk + 16);
    for (long jc = c0; jc < c1; jc += kChunk) {
        const long jce = std::min(c1, jc + kChunk), len = jce - jc, full = len / W * W;
        const nfs::vm tail = nfs::vmask_range(0, (int)(len - full));
        float* dst = C ? C + jc : local;
        const long ld = C ? ldc : kChunk;
        for (long m = 0; m < M; ++m) {
            float* d = dst + m * ld;
            for (long j = 0; j < len; j += W) {
                const bool whole = j < full;
                const long at = m * N + jc + j;
                nfs::vf s = whole ? nfs::vload(parts[0] + at) : nfs::vload_mask(parts[0] + at, tail);
                for (int p = 1; p < nparts; ++p)
                    s = nfs::vadd(s, whole ? nfs::vload(parts[p] + at) : nfs::vload_mask(parts[p] + at, tail));
                if (add) s = nfs::vadd(s, whole ? nfs::vload(d + j) : nfs::vload_mask(d + j, tail));
                if (whole) nfs::vstore(d + j, s);
                else nfs::vstore_mask(d + j, tail, s);
            }
        }
        finish_chunk(dst, ld, M, jc, jce, jc, ep);
    }
}

}  // namespace

namespace {

/* the kn product on a team: each thread's rows of B into its partial, one barrier, then each
 * thread sums its columns of the partials and finishes them */
template <typename TA, typename TB>
void kn_team(long M, long N, long K, const TA* A, long rs_a, long cs_a, const TB* B, long rs_b, float* C, long ldc,
             int accumulate, const nf_epilogue* ep, int nthreads) {
    const int want = team_size(M, N, K, nthreads);
    float* parts[64];
    const int nt = std::min(want, 64);
    auto partial = [&](int t, int n) {
        nfi::Scratch& ws = t_gemv_scratch;
        const float* a = stage_a(A, M, K, rs_a, cs_a, nfi::Scratch::grow(ws.a, ws.a_cap, M * K + 16));
        float* part = nfi::Scratch::grow(ws.b, ws.b_cap, M * N + 16);
        parts[t] = part;
        long k0, k1;
        part_range(K, 4, t, n, &k0, &k1);
        kn_partial_rows(M, a, K, B, rs_b, N, k0, k1, part);
    };
    if (nt <= 1) {
        partial(0, 1);
        kn_reduce(M, N, parts, 1, C, ldc, accumulate != 0, 0, N, ep);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        partial(t, n);
#pragma omp barrier
        long c0, c1;
        part_range(N, W, t, n, &c0, &c1);
        if (c0 < c1) kn_reduce(M, N, parts, n, C, ldc, accumulate != 0, c0, c1, ep);
    }
}

bool gemv_on() { return g_gemv_on.load(std::memory_order_relaxed) != 0; }

/* fn(a, b) with A and B as typed pointers: uint16_t (bf16) or float */
template <typename Fn>
void with_types(const void* A, bool a_bf16, const void* B, bool b_bf16, Fn&& fn) {
    auto second = [&](auto a) {
        if (b_bf16) fn(a, (const uint16_t*)B);
        else fn(a, (const float*)B);
    };
    if (a_bf16) second((const uint16_t*)A);
    else second((const float*)A);
}

}  // namespace

namespace nfi {

bool gemv_nt(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Wt, long ldw, float* C,
             long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    return gemv_nt_mixed(M, N, K, A, false, rs_a, cs_a, Wt, false, ldw, C, ldc, accumulate, ep, nthreads);
}

bool gemv_nt_mixed(long M, long N, long K, const void* A, bool a_bf16, long rs_a, long cs_a, const void* Wt,
                   bool w_bf16, long ldw, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (!gemv_on() || M < 1 || M > (w_bf16 ? kGemvRowsNarrow : kGemvRows) || N < 1 || K < 1 || !C) return false;
    with_types(A, a_bf16, Wt, w_bf16, [&](auto a, auto w) {
        nt_team(M, N, K, a, rs_a, cs_a, w, ldw, C, ldc, accumulate, ep, nthreads);
    });
    return true;
}

bool gemv_nt_i8(long M, long N, long K, const float* A, long rs_a, long cs_a, const int8_t* Wt, long ldw, float* C,
                long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    if (!gemv_on() || M < 1 || M > kGemvRowsNarrow || N < 1 || K < 1 || !C) return false;
    nt_team(M, N, K, A, rs_a, cs_a, Wt, ldw, C, ldc, accumulate, ep, nthreads);
    return true;
}

bool gemv_kn(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b, long cs_b,
             float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    return gemv_kn_mixed(M, N, K, A, false, rs_a, cs_a, B, false, rs_b, cs_b, C, ldc, accumulate, ep, nthreads);
}

bool gemv_kn_mixed(long M, long N, long K, const void* A, bool a_bf16, long rs_a, long cs_a, const void* B,
                   bool b_bf16, long rs_b, long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep,
                   int nthreads) {
    if (!gemv_on() || M < 1 || M > kGemvRowsKn || N < 1 || K < 1 || cs_b != 1 || M * N > kMaxPartialFloats ||
        (!C && accumulate))
        return false;
    with_types(A, a_bf16, B, b_bf16, [&](auto a, auto b) {
        kn_team(M, N, K, a, rs_a, cs_a, b, rs_b, C, ldc, accumulate, ep, nthreads);
    });
    return true;
}

}  // namespace nfi

extern "C" {

int nf_gemm_set_gemv(int on) { return g_gemv_on.exchange(on ? 1 : 0); }

}  // extern "C"
