/* nf_gemm_s8.cpp — int8 x int8 products with exact int32 accumulation (dynamic int8 quantization:
 * torchao's `aten._int_mm`, novaforge.quantize("int8-dynamic")).
 *
 * Invariant: s8 products compute acc[i, j] = sum_k A(i, k) * B(k, j) exactly in int32 (eager's
 * `_int_mm`; the sum wraps past 2^31 only beyond K = 131072, as eager's int32 accumulator would),
 * for exactly the rows and columns of C given, and write either the int32 C or the float32
 *     C = act(float(acc) [+ C_old] + bias) + residual, then tile_fn on the finished tile,
 * so an epilogue that converts the int32 result to float and scales it (torchao's
 * `_int_mm(...).to(float) * x_scale * w_scale`) is the library's float epilogue. float(acc) is the
 * round-to-nearest conversion eager's `.to(torch.float32)` makes. Nothing outside C is touched
 * except per-thread scratch.
 *
 * Layouts:
 *   s8 panel  16 columns of B, K rounded up to kp (even), zero-padded past K and N, int8:
 *             panel[kq * 32 + 2 * j + h] = B(2 * kq + h, col0 + j), kq < kp / 2, j < 16, h < 2.
 *             One row of a panel (a k pair for 16 columns) is 32 bytes; panels follow each other
 *             (panel stride kp * 16 bytes); a prepacked B (`nf_gemm_pack_b_s8`) is the same layout,
 *             so a constant weight packed once costs its int8 bytes again, nothing more.
 *   A rows    int16, kp per row, zero-padded, converted from int8 (any strides) into per-thread
 *             scratch once per task.
 *   Micro-kernel (AVX2; AVX-512 builds run it too): 6 rows x 16 columns of int32 accumulators
 *             (12 ymm). Per k pair: the panel row sign-extended to two vectors of 8 (k, k+1) int16
 *             pairs (vpmovsxbw), each row's pair broadcast as one 32-bit lane, vpmaddwd (two
 *             products summed into an int32 lane: |sum| <= 2 * 128 * 128, never saturating) and
 *             vpaddd. 32 multiply-adds per vpmaddwd: twice the float32 FMA's 8 x 2 per cycle on
 *             CPUs with two vpmaddwd pipes (Zen 3, Skylake and later).
 *   VNNI (CPUs with AVX512-VNNI and AVX512-VL, found at run time: Ice Lake and later Xeons, Zen 4):
 *             the same micro-kernel with vpdpwssd, which is vpmaddwd and vpaddd in one instruction
 *             (the same exact pairwise sums, added to the accumulator without saturation): 12 instead
 *             of 24 multiply-add instructions per k pair of a 6 x 16 tile. One loop body serves both
 *             (NF_S8_TILE_LOOP), so the AVX2 path's tests exercise every line but the instruction.
 *   The portable path (no AVX2, or forced with nf_gemm_set_s8_path(0) for tests) runs the same
 *   loop nest with a scalar tile.
 *
 * Loop nest per task (rows [m0, m1) x columns [n0, n1), tasks taken dynamically by threads):
 *   A rows of the task -> int16 scratch
 *   for column block      its panels (prepacked, or packed now) take half of L2
 *     for row tile        6 rows
 *       for panel         int32 tile over all of kp, then int32 C or the float epilogue
 *       tile callback     on the row tile x column block while it is in cache
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>

#include "nf_gemm.h"
#include "nf_gemm_internal.h"
#include "nf_gemm_simd.h"

#if defined(__AVX2__)
#include <immintrin.h>
#define NF_S8_HAS_AVX2 1
#else
#define NF_S8_HAS_AVX2 0
#endif
#if NF_S8_HAS_AVX2 && defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define NF_S8_HAS_VNNI 1
#define NF_TARGET_VNNI __attribute__((target("avx2,avx512f,avx512vl,avx512vnni")))
#else
#define NF_S8_HAS_VNNI 0
#endif

namespace {

inline long cdiv(long a, long b) { return (a + b - 1) / b; }
inline void compiler_barrier() { __asm__ __volatile__("" ::: "memory"); }

constexpr long kPanel = 16;  // columns per panel
constexpr int kRows = 6;     // rows per micro-tile
inline long kpad(long K) { return cdiv(std::max(K, 1L), 2) * 2; }

std::atomic<int> g_forced{-1};  // nf_gemm_set_s8_path: -1 the hardware's
std::atomic<long> g_counts[3];  // calls per path: [0] portable, [1] AVX2, [2] VNNI

#if NF_S8_HAS_VNNI
/* AVX512-VNNI with AVX512-VL (vpdpwssd on ymm), and the OS saving the AVX-512 state */
bool detect_vnni() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    unsigned xlo, xhi;
    __asm__ __volatile__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6) != 0xe6) return false;  // XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 16)) && (b & (1u << 31)) && (c & (1u << 11));  // AVX512F, AVX512VL, AVX512_VNNI
}
bool has_vnni() {
    static const bool v = detect_vnni();  // (thread-safe one-time initialization)
    return v;
}
#else
bool has_vnni() { return false; }
#endif

int hw_path() { return has_vnni() ? NF_S8_VNNI : NF_S8_HAS_AVX2 ? NF_S8_AVX2 : NF_S8_PORTABLE; }
int s8_path() {
    const int f = g_forced.load(std::memory_order_relaxed);
    return f < 0 ? hw_path() : std::min(f, hw_path());
}

using nfi::Buf;
thread_local Buf t_a, t_b, t_c;

/* ---------------- packing B into s8 panels ---------------- */

struct BSrc {
    const int8_t* packed;  // prepacked panels (panel p at packed + p * kp * 16), or nullptr
    const int8_t* B;       // else B(k, n) = B[k * rs + n * cs]
    long rs, cs;
};

#if NF_S8_HAS_AVX2
/* 8 k pairs (16 k) of 8 contiguous columns (column j at col + j * cs) -> d[kq * 32 + 2 * j], kq < 8: an 8 x 8
 * transpose of 16-bit pairs */
inline void pack_8x8_pairs(const int8_t* col, long cs, int8_t* d) {
    __m128i r[8], t[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm_loadu_si128((const __m128i*)(col + j * cs));
    for (int j = 0; j < 4; ++j) {
        t[2 * j] = _mm_unpacklo_epi16(r[2 * j], r[2 * j + 1]);
        t[2 * j + 1] = _mm_unpackhi_epi16(r[2 * j], r[2 * j + 1]);
    }
    // t[0] = c0k0 c1k0 c0k1 c1k1 c0k2 c1k2 c0k3 c1k3 (pairs), t[1] = the same for k pairs 4..7; t[2], t[3]: c2, c3...
    for (int h = 0; h < 2; ++h) {
        const __m128i a0 = _mm_unpacklo_epi32(t[h], t[2 + h]), a1 = _mm_unpackhi_epi32(t[h], t[2 + h]);
        const __m128i b0 = _mm_unpacklo_epi32(t[4 + h], t[6 + h]), b1 = _mm_unpackhi_epi32(t[4 + h], t[6 + h]);
        _mm_storeu_si128((__m128i*)(d + (4 * h + 0) * 32), _mm_unpacklo_epi64(a0, b0));
        _mm_storeu_si128((__m128i*)(d + (4 * h + 1) * 32), _mm_unpackhi_epi64(a0, b0));
        _mm_storeu_si128((__m128i*)(d + (4 * h + 2) * 32), _mm_unpacklo_epi64(a1, b1));
        _mm_storeu_si128((__m128i*)(d + (4 * h + 3) * 32), _mm_unpackhi_epi64(a1, b1));
    }
}
#endif

/* panels [p0, p1) of B into dst (zero past K and N) */
void pack_panels(const BSrc& s, long K, long N, long kp, long p0, long p1, int8_t* dst) {
    for (long p = p0; p < p1; ++p) {
        int8_t* d = dst + (p - p0) * kp * kPanel;
        long done = 0;  // k pairs packed by the vector transpose (whole panels of k-contiguous columns)
#if NF_S8_HAS_AVX2
        if (s.rs == 1 && (p + 1) * kPanel <= N) {
            for (; 2 * done + 16 <= K; done += 8)
                for (long h = 0; h < 2; ++h)
                    pack_8x8_pairs(s.B + (p * kPanel + 8 * h) * s.cs + 2 * done, s.cs, d + done * 32 + 16 * h);
        }
#endif
        for (long j = 0; j < kPanel; ++j) {
            const long n = p * kPanel + j;
            if (n >= N) {
                for (long kq = 0; kq < kp / 2; ++kq) d[kq * 32 + 2 * j] = d[kq * 32 + 2 * j + 1] = 0;
                continue;
            }
            const int8_t* col = s.B + n * s.cs;
            if (s.rs == 1) {  // (an nn.Linear weight [N, K] seen as W^T: the column is contiguous)
                for (long kq = done; kq < K / 2; ++kq) memcpy(d + kq * 32 + 2 * j, col + 2 * kq, 2);
            } else {
                for (long kq = 0; kq < K / 2; ++kq) {
                    d[kq * 32 + 2 * j] = col[2 * kq * s.rs];
                    d[kq * 32 + 2 * j + 1] = col[(2 * kq + 1) * s.rs];
                }
            }
            if (K % 2) {
                d[(K / 2) * 32 + 2 * j] = col[(K - 1) * s.rs];
                d[(K / 2) * 32 + 2 * j + 1] = 0;
            }
        }
    }
}

/* ---------------- tiles: tmp[r * 16 + j] = sum_k A(r, k) B(k, j), r < rows ---------------- */

/* A rows: int16, row r at a + r * kp */
void ref_tile(long kp, const int16_t* a, int rows, const int8_t* b, int32_t* tmp) {
    for (int r = 0; r < rows; ++r)
        for (long j = 0; j < kPanel; ++j) {
            int32_t acc = 0;
            for (long kq = 0; kq < kp / 2; ++kq)
                acc += (int32_t)a[r * kp + 2 * kq] * b[kq * 32 + 2 * j] +
                       (int32_t)a[r * kp + 2 * kq + 1] * b[kq * 32 + 2 * j + 1];
            tmp[r * kPanel + j] = acc;
        }
}

#if NF_S8_HAS_AVX2
/* The tile's loop, MAC(acc, a, b) = acc + the pairwise int16 products of a and b in int32 lanes. (The row
 * loops are unrolled so the 12 accumulators stay in registers: as an array GCC kept them on the stack, at
 * 0.6x the speed.) */
#define NF_S8_TILE_LOOP(MAC)                                                                      \
    __m256i acc[R][2];                                                                            \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256(); \
    const long nq = kp / 2;                                                                       \
    for (long kq = 0; kq < nq; ++kq) {                                                            \
        const __m256i b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + kq * 32)));   \
        const __m256i b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + kq * 32 + 16))); \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                     \
            const __m256i av = _mm256_broadcastd_epi32(_mm_loadu_si32(a + r * kp + 2 * kq));      \
            acc[r][0] = MAC(acc[r][0], av, b0);                                                   \
            acc[r][1] = MAC(acc[r][1], av, b1);                                                   \
        }                                                                                         \
    }                                                                                             \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                         \
        _mm256_storeu_si256((__m256i*)(tmp + r * kPanel), acc[r][0]);                             \
        _mm256_storeu_si256((__m256i*)(tmp + r * kPanel + 8), acc[r][1]);                         \
    }

#define NF_S8_MADD_ADD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
template <int R>
void avx2_tile(long kp, const int16_t* a, const int8_t* b, int32_t* tmp) {
    NF_S8_TILE_LOOP(NF_S8_MADD_ADD)
}

#if NF_S8_HAS_VNNI
template <int R>
NF_TARGET_VNNI void vnni_tile(long kp, const int16_t* a, const int8_t* b, int32_t* tmp) {
    NF_S8_TILE_LOOP(_mm256_dpwssd_epi32)
}
#endif

template <void (*T6)(long, const int16_t*, const int8_t*, int32_t*),
          void (*T5)(long, const int16_t*, const int8_t*, int32_t*),
          void (*T4)(long, const int16_t*, const int8_t*, int32_t*),
          void (*T3)(long, const int16_t*, const int8_t*, int32_t*),
          void (*T2)(long, const int16_t*, const int8_t*, int32_t*),
          void (*T1)(long, const int16_t*, const int8_t*, int32_t*)>
void tile_rows(int rows, long kp, const int16_t* a, const int8_t* b, int32_t* tmp) {
    switch (rows) {
        case 6: T6(kp, a, b, tmp); break;
        case 5: T5(kp, a, b, tmp); break;
        case 4: T4(kp, a, b, tmp); break;
        case 3: T3(kp, a, b, tmp); break;
        case 2: T2(kp, a, b, tmp); break;
        default: T1(kp, a, b, tmp);
    }
}
constexpr auto avx2_rows = tile_rows<avx2_tile<6>, avx2_tile<5>, avx2_tile<4>, avx2_tile<3>, avx2_tile<2>, avx2_tile<1>>;
#if NF_S8_HAS_VNNI
constexpr auto vnni_rows = tile_rows<vnni_tile<6>, vnni_tile<5>, vnni_tile<4>, vnni_tile<3>, vnni_tile<2>, vnni_tile<1>>;
#endif
#endif

/* ---------------- one task ---------------- */

struct Job {
    long M, N, K, kp;
    const int8_t* A;
    long rs_a, cs_a;
    BSrc b;
    void* C;  // int32 (c_int32) or float32; nullptr: float C lives in per-thread blocks only tile_fn reads
    long ldc;
    bool c_int32, accumulate;
    const nf_epilogue* ep;
    int path;
};

/* a finished int32 tile (rows x cols, row stride 16) into C at (row0, col0) */
void store_tile(const Job& J, const int32_t* tmp, int rows, int cols, long row0, long col0, float* cf, long ldc) {
    if (J.c_int32) {
        int32_t* c = (int32_t*)J.C + row0 * J.ldc + col0;
        for (int i = 0; i < rows; ++i) memcpy(c + i * J.ldc, tmp + i * kPanel, (size_t)cols * 4);
        return;
    }
    using namespace nfs;
    const nf_epilogue* ep = J.ep;
    const float* bias = ep && ep->bias ? ep->bias + col0 : nullptr;
    const int act = ep ? ep->act : 0;
    const float* res = ep && ep->residual ? ep->residual + row0 * ep->ld_residual + col0 : nullptr;
    alignas(64) float row[kPanel];
    for (int i = 0; i < rows; ++i) {
        float* c = cf + i * ldc;
        const int32_t* t = tmp + i * kPanel;
        for (int j = 0; j < kPanel; ++j) row[j] = (float)t[j];  // (tmp rows are 16 wide past `cols`)
        for (int j = 0; j < cols; j += W) {
            const vm m = vmask_range(0, std::min(W, cols - j));
            vf x = vload(row + j);
            if (J.accumulate) x = vadd(x, vload_mask(c + j, m));
            if (bias) x = vadd(x, vload_mask(bias + j, m));
            if (act) x = vact(x, act);
            if (res) x = vadd(x, vload_mask(res + i * ep->ld_residual + j, m));
            vstore_mask(c + j, m, x);
        }
    }
}

long column_block(long kp) {
    const long half_l2 = std::max(nfi::l2_bytes(), 256L * 1024) / 2;
    return std::max(kPanel, half_l2 / (kp * kPanel) * kPanel);
}

void run_block(const Job& J, long m0, long m1, long n0, long n1) {
    const long kp = J.kp, rows = m1 - m0;
    int16_t* a = t_a.get<int16_t>((size_t)(rows * kp));
    for (long r = 0; r < rows; ++r) {
        int16_t* d = a + r * kp;
        const int8_t* src = J.A + (m0 + r) * J.rs_a;
        if (J.cs_a == 1)
            for (long k = 0; k < J.K; ++k) d[k] = src[k];
        else
            for (long k = 0; k < J.K; ++k) d[k] = src[k * J.cs_a];
        for (long k = J.K; k < kp; ++k) d[k] = 0;
    }
    const nf_epilogue* ep = J.ep;
    const bool local = J.C == nullptr;
    const long cb = column_block(kp);
    alignas(64) int32_t tmp[kRows * kPanel + kPanel];  // (store_tile reads 16 per row from any column offset)
    for (long c0 = n0; c0 < n1; c0 += cb) {
        const long c1 = std::min(n1, c0 + cb), p0 = c0 / kPanel, p1 = cdiv(c1, kPanel);
        const int8_t* bblk;
        if (J.b.packed) {
            bblk = J.b.packed + p0 * kp * kPanel;
        } else {
            int8_t* d = t_b.get<int8_t>((size_t)((p1 - p0) * kp * kPanel));
            pack_panels(J.b, J.K, J.N, kp, p0, p1, d);
            bblk = d;
        }
        float* cloc = local ? t_c.get<float>((size_t)(kRows * (c1 - c0))) : nullptr;
        compiler_barrier();
        for (long r = 0; r < rows; r += kRows) {
            const int tr = (int)std::min((long)kRows, rows - r);
            const int16_t* ar = a + r * kp;
            for (long p = p0; p < p1; ++p) {
                const int8_t* bp = bblk + (p - p0) * kp * kPanel;
#if NF_S8_HAS_VNNI
                if (J.path == NF_S8_VNNI)
                    vnni_rows(tr, kp, ar, bp, tmp);
                else
#endif
#if NF_S8_HAS_AVX2
                if (J.path == NF_S8_AVX2)
                    avx2_rows(tr, kp, ar, bp, tmp);
                else
#endif
                    ref_tile(kp, ar, tr, bp, tmp);
                const long col = p * kPanel, lo = std::max(col, c0), hi = std::min(col + kPanel, c1);
                float* cf = local ? cloc + (lo - c0) : J.c_int32 ? nullptr : (float*)J.C + (m0 + r) * J.ldc + lo;
                store_tile(J, tmp + (lo - col), tr, (int)(hi - lo), m0 + r, lo, cf, local ? c1 - c0 : J.ldc);
            }
            if (!J.c_int32 && ep && ep->tile_fn) {
                float* c = local ? cloc : (float*)J.C + (m0 + r) * J.ldc + c0;
                ep->tile_fn(ep->tile_ctx, 0, c, local ? c1 - c0 : J.ldc, m0 + r, c0, tr, c1 - c0);
            }
        }
    }
}

/* Tasks: columns in panels, at least two tasks per thread for balance on a shared machine, each no
 * wider than a column block; rows split past 384 or when N is too narrow to feed every thread. */
void run_job(const Job& J, int nthreads) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const long nu = cdiv(J.N, kPanel), mu = cdiv(J.M, kRows);
    long tn = std::min(nu, cdiv(std::max(cdiv(J.N, column_block(J.kp)), nt > 1 ? 2L * nt : 1L), nt) * nt);
    long tm = std::min(mu, cdiv(J.M, 384));
    if (tm * tn < nt) tm = std::min(mu, cdiv(nt, tn));
    const long tasks = tm * tn;
    auto task = [&](long t) {
        const long i = t / tn, j = t % tn;
        const long m0 = std::min(J.M, mu * i / tm * kRows), m1 = std::min(J.M, mu * (i + 1) / tm * kRows);
        const long n0 = std::min(J.N, nu * j / tn * kPanel), n1 = std::min(J.N, nu * (j + 1) / tn * kPanel);
        if (m0 < m1 && n0 < n1) run_block(J, m0, m1, n0, n1);
    };
    if (nt > tasks) nt = (int)tasks;
    if (nt <= 1) {
        for (long t = 0; t < tasks; ++t) task(t);
        return;
    }
    std::atomic<long> next{0};
#pragma omp parallel num_threads(nt)
    for (long t = next.fetch_add(1, std::memory_order_relaxed); t < tasks; t = next.fetch_add(1, std::memory_order_relaxed))
        task(t);
}

void s8_gemm(long M, long N, long K, const int8_t* A, long rs_a, long cs_a, BSrc b, void* C, long ldc, int c_int32,
             int accumulate, const nf_epilogue* ep, int nthreads) {
    if (M <= 0 || N <= 0) return;
    Job J;
    static const int8_t zero[2] = {0, 0};
    if (K <= 0) {  // an empty sum: zeros through the same epilogue (a 2-deep product of zero rows)
        K = 2, A = zero, rs_a = 0, cs_a = 1, b = BSrc{nullptr, zero, 0, 0};
    }
    J.M = M, J.N = N, J.K = K, J.kp = kpad(K);
    J.A = A, J.rs_a = rs_a, J.cs_a = cs_a;
    J.b = b;
    J.C = C, J.ldc = ldc, J.c_int32 = c_int32 != 0, J.accumulate = accumulate != 0 && !c_int32;
    J.ep = c_int32 ? nullptr : ep;
    J.path = s8_path();
    g_counts[J.path].fetch_add(1, std::memory_order_relaxed);
    run_job(J, nthreads);
}

}  // namespace

extern "C" {

int nf_gemm_s8_path(void) { return s8_path(); }
void nf_gemm_set_s8_path(int path) { g_forced.store(path < 0 ? -1 : std::min(path, (int)NF_S8_VNNI)); }
void nf_gemm_s8_counts(long* counts) {
    for (int i = 0; i < 3; ++i) counts[i] = g_counts[i].load(std::memory_order_relaxed);
}

long nf_gemm_s8_packed_size(long K, long N) { return cdiv(std::max(N, 0L), kPanel) * kPanel * kpad(K); }

void nf_gemm_pack_b_s8(long K, long N, const int8_t* B, long stride_k, long stride_n, int8_t* packed) {
    if (N <= 0) return;
    const long np = cdiv(N, kPanel), kp = kpad(K);
    const BSrc s{nullptr, B, stride_k, stride_n};
#pragma omp parallel for schedule(static) if (np * kp > (1L << 18) && !omp_in_parallel())
    for (long p = 0; p < np; ++p) pack_panels(s, std::max(K, 0L), N, kp, p, p + 1, packed + p * kp * kPanel);
}

void nf_gemm_s8s8(long M, long N, long K, const int8_t* A, long rs_a, long cs_a, const int8_t* B, long rs_b, long cs_b,
                  void* C, long ldc, int c_int32, int accumulate, const nf_epilogue* ep, int nthreads) {
    s8_gemm(M, N, K, A, rs_a, cs_a, BSrc{nullptr, B, rs_b, cs_b}, C, ldc, c_int32, accumulate, ep, nthreads);
}

void nf_gemm_s8s8_packed(long M, long N, long K, const int8_t* A, long rs_a, long cs_a, const int8_t* Bp, void* C,
                         long ldc, int c_int32, int accumulate, const nf_epilogue* ep, int nthreads) {
    s8_gemm(M, N, K, A, rs_a, cs_a, K > 0 ? BSrc{Bp, nullptr, 0, 0} : BSrc{nullptr, nullptr, 0, 0}, C, ldc, c_int32,
            accumulate, ep, nthreads);
}

}  // extern "C"
