/* nf_gemm_bf16.cpp — native bf16 matrix products: AMX-BF16 tiles (TDPBF16PS) and AVX512-BF16
 * (VDPBF16PS), chosen at run time from the CPU (CPUID, XCR0 and Linux's AMX permission), with the
 * float32-conversion path of nf_gemm.cpp / nf_gemm_nt.cpp kept for CPUs that have neither.
 *
 * Invariant: bf16_gemm() computes C = act(A @ B [+ C_old] + bias) + residual for bf16 A and bf16 B
 * with float32 accumulation (each bf16 x bf16 product is exact in float32; only the order of the
 * float32 sums differs from the float32 path) and float32 C, for exactly the rows and columns of C
 * given; it reads A and B through their strides or from the VNNI panels below, and touches nothing
 * outside C except per-thread scratch. Every instruction beyond the build's baseline ISA sits in a
 * function with a target attribute, reached only when bf16_path() says the CPU has it, so the library
 * builds and loads on any x86-64 (and on other architectures without this file's native paths).
 *
 * Layouts (bf16 elements are uint16_t):
 *   VNNI panel  16 columns of B, K rounded up to kp (a multiple of 32), zero-padded past K and N:
 *               panel[kq * 32 + 2 * j + h] = B(2 * kq + h, col0 + j), kq < kp / 2, j < 16, h < 2.
 *               One row of a panel (a k pair for 16 columns) is 64 bytes: one zmm for VDPBF16PS,
 *               one row of an AMX B tile; 16 such rows (32 k) are one 16 x 64-byte B tile (1 KiB).
 *               Panels follow each other (panel stride kp * 16); a prepacked B is the same layout.
 *   A rows      bf16, row-major, k-contiguous: read in place when A is bf16 with cs_a == 1 and
 *               K % 32 == 0 (a 16-row tile = 16 rows of 64 bytes, rs_a * 2 bytes apart), else copied
 *               into per-thread scratch rows of kp elements, zero-padded (the K tail of A must be
 *               zeros, not garbage: 0 * NaN would poison the sum). Partial row tiles are padded
 *               with zero rows in scratch.
 *   C tile      32 x 32 floats (2 x 2 AMX accumulator tiles, or 4 x 2 groups of 8 rows x 2 zmm on
 *               AVX512-BF16) stored to a float scratch tile, then the fused epilogue writes C.
 *
 * Loop nest per task (rows [m0, m1) x columns [n0, n1) of C, tasks taken dynamically by threads):
 *   for column block        cb columns: its VNNI panels (packed now, or prepacked) take half of L2
 *     for row pair          32 rows: two A tiles (in place or scratch)
 *       for panel pair      32 columns: C tile = A rows x B panels over all of kp, epilogue -> C
 *       tile callback       on the row pair x column block while it is in cache
 */
#include <alloca.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "nf_gemm.h"
#include "nf_gemm_internal.h"
#include "nf_gemm_simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#define NF_BF16_NATIVE 1
#define NF_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define NF_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define NF_BF16_NATIVE 0
#endif

namespace {

inline long cdiv(long a, long b) { return (a + b - 1) / b; }
using nfs::bf16_to_f32;
inline void compiler_barrier() { __asm__ __volatile__("" ::: "memory"); }

constexpr long kPanel = 16;    // columns per VNNI panel
constexpr long kKStep = 32;    // k per AMX tile (16 rows of 64 bytes = 16 k pairs)
constexpr long kTileRows = 32;  // rows of the C tile (two 16-row A tiles)
constexpr long kTileCols = 32;  // columns of the C tile (two panels)
inline long kpad(long K) { return cdiv(std::max(K, 1L), kKStep) * kKStep; }

/* ---------------- what the CPU has ---------------- */

struct Caps {
    bool avx512 = false;  // AVX-512 F/BW/VL with the OS saving zmm state
    bool bf16 = false;    // + AVX512_BF16
    bool amx = false;     // + AMX-TILE/AMX-BF16, XCR0 tile state, and the process's permission
};

#if NF_BF16_NATIVE
Caps detect_caps() {
    Caps c;
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d) || !(cx & (1u << 27))) return c;  // OSXSAVE
    unsigned xlo, xhi;
    __asm__ __volatile__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    const unsigned long long xcr0 = ((unsigned long long)xhi << 32) | xlo;
    if (!__get_cpuid_count(7, 0, &a, &b, &cx, &d)) return c;
    const unsigned leaf7_ebx = b, leaf7_edx = d;
    c.avx512 = (leaf7_ebx & (1u << 16)) && (leaf7_ebx & (1u << 30)) && (leaf7_ebx & (1u << 31)) &&
               (xcr0 & 0xe6) == 0xe6;  // F, BW, VL; XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
    unsigned a1 = 0, b1, c1, d1;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    c.bf16 = c.avx512 && (a1 & (1u << 5));
    const bool amx_cpu = (leaf7_edx & (1u << 22)) && (leaf7_edx & (1u << 24));  // AMX-BF16, AMX-TILE
    const bool amx_os = (xcr0 & (3ull << 17)) == (3ull << 17);                  // XTILECFG, XTILEDATA
    if (c.bf16 && amx_cpu && amx_os) {
        // Linux (>= 5.16) arms the tile data state per process: ask once (ARCH_REQ_XCOMP_PERM,
        // XFEATURE_XTILEDATA) before any tile instruction; without it the first one raises SIGILL.
        c.amx = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    return c;
}
#else
Caps detect_caps() { return Caps(); }
#endif

const Caps& caps() {
    static const Caps c = detect_caps();  // thread-safe one-time initialization (C++11 statics)
    return c;
}

int hw_path() {
    const Caps& c = caps();
    return c.amx ? NF_BF16_AMX : (c.bf16 ? NF_BF16_AVX512 : NF_BF16_CONVERT);
}

std::atomic<int> g_forced{-1};
std::atomic<long> g_counts[NF_BF16_COUNTS];  // the three paths, then NF_BF16_STREAMED

int bf16_path() {
    const int f = g_forced.load(std::memory_order_relaxed);
    return f < 0 ? hw_path() : std::min(f, hw_path());
}

/* ---------------- per-thread scratch ---------------- */

using nfi::Buf;
thread_local Buf t_a, t_b, t_c;

/* ---------------- packing B into VNNI panels ---------------- */

struct BSrc {
    const uint16_t* packed;  // prepacked VNNI panels (panel p at packed + p * kp * 16), or nullptr
    const uint16_t* B;       // else B(k, n) = B[k * rs + n * cs]
    long rs, cs;
};

/* panels [p0, p1) of B into dst (portable; zero past K and N) */
void pack_panels_scalar(const BSrc& s, long K, long N, long kp, long p0, long p1, uint16_t* dst) {
    for (long p = p0; p < p1; ++p) {
        uint16_t* d = dst + (p - p0) * kp * kPanel;
        for (long kq = 0; kq < kp / 2; ++kq)
            for (long j = 0; j < kPanel; ++j) {
                const long n = p * kPanel + j, k = 2 * kq;
                d[kq * 32 + 2 * j] = (n < N && k < K) ? s.B[k * s.rs + n * s.cs] : 0;
                d[kq * 32 + 2 * j + 1] = (n < N && k + 1 < K) ? s.B[(k + 1) * s.rs + n * s.cs] : 0;
            }
    }
}

#if NF_BF16_NATIVE
/* r[i] <- column i of the 16 x 16 block of 32-bit words in r (the AVX-512 transpose of
 * nf_gemm_simd.h, on integer vectors: bit moves only) */
NF_TARGET_BF16 inline void transpose16x16(__m512i (&r)[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
        const __m512i x = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), y = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
        const __m512i x2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        const __m512i y2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_i32x4(x, x2, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(x, x2, 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(y, y2, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(y, y2, 0xdd);
    }
}

/* The same panels with AVX-512: a k-contiguous B (rs == 1: an nn.Linear weight W [N, K], B = W^T)
 * is a 16 x 16 transpose of 32-bit words (a word is a k pair of one column) per 32 k; a row-major B
 * (cs == 1: a [K, N] Conv1D weight) interleaves two rows of 16 columns per k pair. Tails in K and
 * partial panels go through the portable loop. */
NF_TARGET_BF16 void pack_panels_avx512(const BSrc& s, long K, long N, long kp, long p0, long p1, uint16_t* dst) {
    if (s.cs == 1 && s.rs != 1) {
        // row-major B: each pair of source rows is read once across all full panels of the block (sequential
        // reads; panel by panel, each 64-byte line served two panels and came back from L2 for the second),
        // the rows a few pairs ahead prefetched (rows are pages apart: no hardware prefetch across them)
        const long pf = std::min(p1, N / kPanel);
        const long row_lines = cdiv((pf - p0) * kPanel * 2, 64) + 1;
        for (long kq = 0; kq < K / 2 && p0 < pf; ++kq) {
            const uint16_t* r0 = s.B + 2 * kq * s.rs + p0 * kPanel;
            const uint16_t* r1 = r0 + s.rs;
            if (2 * kq + 9 < K)
                for (long l = 0; l < row_lines; ++l) {
                    _mm_prefetch((const char*)(r0 + 8 * s.rs) + l * 64, _MM_HINT_T0);
                    _mm_prefetch((const char*)(r1 + 8 * s.rs) + l * 64, _MM_HINT_T0);
                }
            for (long p = p0; p < pf; ++p) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(r0 + (p - p0) * kPanel)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(r1 + (p - p0) * kPanel)));
                _mm512_storeu_si512((void*)(dst + (p - p0) * kp * kPanel + kq * 32),
                                    _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        for (long p = p0; p < p1; ++p) {  // the K tail (odd K, padding) and a partial last panel
            uint16_t* d = dst + (p - p0) * kp * kPanel;
            if (p >= pf) {
                pack_panels_scalar(s, K, N, kp, p, p + 1, d);
                continue;
            }
            for (long kq = K / 2; kq < kp / 2; ++kq)
                for (long j = 0; j < kPanel; ++j) {
                    d[kq * 32 + 2 * j] = 2 * kq < K ? s.B[2 * kq * s.rs + p * kPanel + j] : 0;
                    d[kq * 32 + 2 * j + 1] = 0;
                }
        }
        return;
    }
    for (long p = p0; p < p1; ++p) {
        const long c0 = p * kPanel;
        uint16_t* d = dst + (p - p0) * kp * kPanel;
        if (c0 + kPanel > N || (s.rs != 1 && s.cs != 1)) {
            pack_panels_scalar(s, K, N, kp, p, p + 1, d);
            continue;
        }
        long kdone = 0;  // k pairs written by the vector loop
        if (s.rs == 1) {
            const long kv = K / kKStep * kKStep;
            for (long k = 0; k < kv; k += kKStep) {
                __m512i r[16];
                for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512((const void*)(s.B + (c0 + j) * s.cs + k));
                transpose16x16(r);
                for (int i = 0; i < 16; ++i) _mm512_storeu_si512((void*)(d + (k / 2 + i) * 32), r[i]);
            }
            kdone = kv / 2;
        } else {
            const long kv = K / 2;
            for (long kq = 0; kq < kv; ++kq) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(s.B + 2 * kq * s.rs + c0)));
                const __m512i hi =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(s.B + (2 * kq + 1) * s.rs + c0)));
                _mm512_storeu_si512((void*)(d + kq * 32), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
            kdone = kv;
        }
        for (long kq = kdone; kq < kp / 2; ++kq)
            for (long j = 0; j < kPanel; ++j) {
                const long n = c0 + j, k = 2 * kq;
                d[kq * 32 + 2 * j] = k < K ? s.B[k * s.rs + n * s.cs] : 0;
                d[kq * 32 + 2 * j + 1] = k + 1 < K ? s.B[(k + 1) * s.rs + n * s.cs] : 0;
            }
    }
}
#endif

void pack_panels(const BSrc& s, long K, long N, long kp, long p0, long p1, uint16_t* dst) {
#if NF_BF16_NATIVE
    if (caps().avx512) {
        pack_panels_avx512(s, K, N, kp, p0, p1, dst);
        return;
    }
#endif
    pack_panels_scalar(s, K, N, kp, p0, p1, dst);
}

/* ---------------- micro-kernels: one C tile (TA 16-row A tiles x TB panels) into tmp[32][32] ---------------- */

struct ATile {  // 16 rows of A: row r at ptr + r * ld (bf16 elements), kp elements readable
    const uint16_t* ptr;
    long ld;
};

#if NF_BF16_NATIVE
struct alignas(64) TileConfig {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* tmm0-3: C (2 x 2 tiles of 16 x 16 floats), tmm4-5: A (16 rows x 32 bf16), tmm6-7: B (16 k pairs x
 * 16 columns x 2). All 16 rows x 64 bytes: partial tiles are zero-padded in scratch, so one
 * configuration serves every call. */
NF_TARGET_AMX void amx_configure() {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}
NF_TARGET_AMX void amx_release() { _tile_release(); }

template <int TA, int TB>
NF_TARGET_AMX void amx_tile(long kp, const ATile* a, const uint16_t* b0, const uint16_t* b1, float* tmp) {
    _tile_zero(0);
    if constexpr (TB > 1) _tile_zero(1);
    if constexpr (TA > 1) _tile_zero(2);
    if constexpr (TA > 1 && TB > 1) _tile_zero(3);
    const long sa0 = a[0].ld * 2, sa1 = TA > 1 ? a[1].ld * 2 : 0;
    compiler_barrier();
    for (long k = 0; k < kp; k += kKStep) {
        _tile_loadd(4, a[0].ptr + k, sa0);
        _tile_loadd(6, b0 + k * kPanel, 64);
        if constexpr (TB > 1) _tile_loadd(7, b1 + k * kPanel, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (TB > 1) _tile_dpbf16ps(1, 4, 7);
        if constexpr (TA > 1) {
            _tile_loadd(5, a[1].ptr + k, sa1);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (TB > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, tmp, kTileCols * 4);
    if constexpr (TB > 1) _tile_stored(1, tmp + 16, kTileCols * 4);
    if constexpr (TA > 1) _tile_stored(2, tmp + 16 * kTileCols, kTileCols * 4);
    if constexpr (TA > 1 && TB > 1) _tile_stored(3, tmp + 16 * kTileCols + 16, kTileCols * 4);
    compiler_barrier();
}

/* R rows (R <= kDpRows) x TB panels with VDPBF16PS: acc[r][t] += A(r, 2kq..2kq+1) . panel_t[kq]; the A pair
 * is one 32-bit broadcast, the panel row one 64-byte load. rows[r] points at row r's k = 0. */
template <int R, int TB>
NF_TARGET_BF16 void dp_rows(long kp, const uint16_t* const* rows, const uint16_t* b0, const uint16_t* b1, float* tmp) {
    __m512 acc[R][TB];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
    for (long kq = 0; kq < kp / 2; ++kq) {
        __m512bh b[TB];
        b[0] = (__m512bh)_mm512_loadu_si512((const void*)(b0 + kq * 32));
        if constexpr (TB > 1) b[1] = (__m512bh)_mm512_loadu_si512((const void*)(b1 + kq * 32));
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            memcpy(&pair, rows[r] + 2 * kq, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 2
            for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], a, b[t]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < TB; ++t) _mm512_storeu_ps(tmp + r * kTileCols + t * 16, acc[r][t]);
}

constexpr int kDpRows = 12;  // 12 rows x 2 panels: 24 zmm accumulators + 2 B rows + 1 broadcast
template <int TB>
void dp_tile(long kp, const ATile* a, int rows, const uint16_t* b0, const uint16_t* b1, float* tmp) {
    typedef void (*fn)(long, const uint16_t* const*, const uint16_t*, const uint16_t*, float*);
    static constexpr fn table[kDpRows + 1] = {
        nullptr,         &dp_rows<1, TB>, &dp_rows<2, TB>, &dp_rows<3, TB>,  &dp_rows<4, TB>,  &dp_rows<5, TB>,
        &dp_rows<6, TB>, &dp_rows<7, TB>, &dp_rows<8, TB>, &dp_rows<9, TB>, &dp_rows<10, TB>, &dp_rows<11, TB>,
        &dp_rows<12, TB>};
    for (int r0 = 0; r0 < rows; r0 += kDpRows) {
        const int R = std::min(kDpRows, rows - r0);
        const uint16_t* ptrs[kDpRows];
        for (int r = 0; r < R; ++r) {
            const ATile& t = a[(r0 + r) / 16];
            ptrs[r] = t.ptr + ((r0 + r) % 16) * t.ld;
        }
        table[R](kp, ptrs, b0, b1, tmp + r0 * kTileCols);
    }
}
#endif

/* portable: the same tile in plain C++ (the forced fallback of the VNNI-packed entry, and CPUs
 * without bf16 dot instructions given VNNI panels) */
void ref_tile(long kp, const ATile* a, int rows, int tb, const uint16_t* b0, const uint16_t* b1, float* tmp) {
    for (int r = 0; r < rows; ++r) {
        const ATile& t = a[r / 16];
        const uint16_t* ar = t.ptr + (r % 16) * t.ld;
        float acc[kTileCols] = {};
        for (long kq = 0; kq < kp / 2; ++kq) {
            const float x0 = bf16_to_f32(ar[2 * kq]), x1 = bf16_to_f32(ar[2 * kq + 1]);
            for (int pt = 0; pt < tb; ++pt) {
                const uint16_t* bp = (pt ? b1 : b0) + kq * 32;
                for (int j = 0; j < 16; ++j) acc[pt * 16 + j] += x0 * bf16_to_f32(bp[2 * j]) + x1 * bf16_to_f32(bp[2 * j + 1]);
            }
        }
        memcpy(tmp + r * kTileCols, acc, sizeof acc);
    }
}

/* ---------------- the fused epilogue on a finished tile ---------------- */

struct Job {
    long M, N, K, kp;
    const uint16_t* A;
    long rs_a, cs_a;
    bool a_in_place;
    BSrc b;
    float* C;  // or nullptr: C lives in per-thread blocks that only ep->tile_fn reads
    long ldc;
    bool accumulate;
    const nf_epilogue* ep;
    int path;
};

/* c[i, 0:cols] = act(tmp[i, 0:cols] [+ c_old] + bias[col0:]) + residual[row0 + i, col0:] for i < rows */
void epilogue(const Job& J, const float* tmp, int rows, int cols, long row0, long col0, float* c, long ldc) {
    using namespace nfs;
    const nf_epilogue* ep = J.ep;
    const float* bias = ep && ep->bias ? ep->bias + col0 : nullptr;
    const int act = ep ? ep->act : 0;
    const float* res = ep && ep->residual ? ep->residual + row0 * ep->ld_residual + col0 : nullptr;
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; j += W) {
            const vm m = vmask_range(0, std::min(W, cols - j));
            vf x = vload(tmp + i * kTileCols + j);
            if (J.accumulate) x = vadd(x, vload_mask(c + i * ldc + j, m));
            if (bias) x = vadd(x, vload_mask(bias + j, m));
            if (act) x = vact(x, act);
            if (res) x = vadd(x, vload_mask(res + i * ep->ld_residual + j, m));
            vstore_mask(c + i * ldc + j, m, x);
        }
}

/* ---------------- one task: rows [m0, m1) x columns [n0, n1) ---------------- */

long column_block(long kp) {
    const long half_l2 = std::max(nfi::l2_bytes(), 256L * 1024) / 2;
    return std::max(kTileCols, half_l2 / (kp * 2) / kTileCols * kTileCols);
}

void run_block(const Job& J, long m0, long m1, long n0, long n1) {
    const long kp = J.kp, rows = m1 - m0, nrt = cdiv(rows, 16);
    // A: one ATile per 16 rows, in place where it can be, else into zero-padded scratch rows
    ATile* tiles = (ATile*)alloca(sizeof(ATile) * (size_t)(nrt + 1));
    long scratch_tiles = 0;
    for (long t = 0; t < nrt; ++t)
        if (!(J.a_in_place && m0 + (t + 1) * 16 <= m1)) ++scratch_tiles;
    uint16_t* abuf = scratch_tiles ? t_a.get<uint16_t>((size_t)(scratch_tiles * 16 * kp)) : nullptr;
    long next = 0;
    for (long t = 0; t < nrt; ++t) {
        const long r0 = m0 + t * 16;
        if (J.a_in_place && r0 + 16 <= m1) {
            tiles[t] = {J.A + r0 * J.rs_a, J.rs_a};
            continue;
        }
        uint16_t* d = abuf + next++ * 16 * kp;
        const long nr = std::min(16L, m1 - r0);
        if (J.cs_a != 1) {  // k-strided A (dY^T of a weight gradient): k outer, so each k reads the tile's
            for (long k = 0; k < J.K; ++k)  // rows together (contiguous when rs_a == 1)
                for (long r = 0; r < nr; ++r) d[r * kp + k] = J.A[(r0 + r) * J.rs_a + k * J.cs_a];
        }
        for (long r = 0; r < 16; ++r) {
            uint16_t* dr = d + r * kp;
            if (r >= nr) {
                memset(dr, 0, (size_t)kp * 2);
                continue;
            }
            if (J.cs_a == 1) memcpy(dr, J.A + (r0 + r) * J.rs_a, (size_t)J.K * 2);
            memset(dr + J.K, 0, (size_t)(kp - J.K) * 2);
        }
        tiles[t] = {d, kp};
    }
    tiles[nrt] = tiles[nrt - 1];  // a pair's second tile past the end is never read (TA = 1)
    compiler_barrier();

    const nf_epilogue* ep = J.ep;
    const bool local = J.C == nullptr;
    const long cb = column_block(kp);
    alignas(64) float tmp[kTileRows * kTileCols];
#if NF_BF16_NATIVE
    if (J.path == NF_BF16_AMX) amx_configure();
#endif
    for (long c0 = n0; c0 < n1; c0 += cb) {
        const long c1 = std::min(n1, c0 + cb), p0 = c0 / kPanel, p1 = cdiv(c1, kPanel);
        const uint16_t* bblk;
        if (J.b.packed) {
            bblk = J.b.packed + p0 * kp * kPanel;
        } else {
            uint16_t* d = t_b.get<uint16_t>((size_t)((p1 - p0) * kp * kPanel));
            pack_panels(J.b, J.K, J.N, kp, p0, p1, d);
            bblk = d;
        }
        float* cloc = local ? t_c.get<float>((size_t)(kTileRows * (c1 - c0))) : nullptr;
        compiler_barrier();
        for (long r = 0; r < rows; r += kTileRows) {
            const int tr = (int)std::min(kTileRows, rows - r);
            const ATile* a = tiles + r / 16;
            for (long p = p0; p < p1; p += 2) {
                const int tb = p + 1 < p1 ? 2 : 1;
                const uint16_t* b0 = bblk + (p - p0) * kp * kPanel;
                const uint16_t* b1 = tb > 1 ? b0 + kp * kPanel : b0;
                const long col = p * kPanel;
                switch (J.path) {
#if NF_BF16_NATIVE
                    case NF_BF16_AMX:
                        if (tr > 16) tb > 1 ? amx_tile<2, 2>(kp, a, b0, b1, tmp) : amx_tile<2, 1>(kp, a, b0, b1, tmp);
                        else tb > 1 ? amx_tile<1, 2>(kp, a, b0, b1, tmp) : amx_tile<1, 1>(kp, a, b0, b1, tmp);
                        break;
                    case NF_BF16_AVX512:
                        tb > 1 ? dp_tile<2>(kp, a, tr, b0, b1, tmp) : dp_tile<1>(kp, a, tr, b0, b1, tmp);
                        break;
#endif
                    default:
                        ref_tile(kp, a, tr, tb, b0, b1, tmp);
                }
                const long lo = std::max(col, c0), hi = std::min(col + tb * kPanel, c1);
                float* c = local ? cloc + (lo - c0) : J.C + (m0 + r) * J.ldc + lo;
                epilogue(J, tmp + (lo - col), tr, (int)(hi - lo), m0 + r, lo, c, local ? c1 - c0 : J.ldc);
            }
            if (ep && ep->tile_fn) {
                float* c = local ? cloc : J.C + (m0 + r) * J.ldc + c0;
                ep->tile_fn(ep->tile_ctx, 0, c, local ? c1 - c0 : J.ldc, m0 + r, c0, tr, c1 - c0);
            }
        }
    }
#if NF_BF16_NATIVE
    if (J.path == NF_BF16_AMX) amx_release();
#endif
}

/* Tasks: columns in units of 32 (a C tile), at least two tasks per thread for balance on a shared
 * machine, each no wider than a column block; rows split only past 512 or when N is too narrow, or
 * when A is copied into scratch and is the larger operand (then rows first). */
void run_job(const Job& J, int nthreads) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (omp_in_parallel()) nt = 1;
    const long nu = cdiv(J.N, kTileCols), mu = cdiv(J.M, kTileRows);
    // a multiple of the thread count: N = 3072 in 5 column blocks ran 3 + 2 on 2 threads (0.83x)
    long tn = std::min(nu, cdiv(std::max(cdiv(J.N, column_block(J.kp)), nt > 1 ? 2L * nt : 1L), nt) * nt);
    long tm = std::min(mu, cdiv(J.M, 512));
    if (tm * tn < nt) tm = std::min(mu, cdiv(nt, tn));
    if (!J.a_in_place && mu >= 2L * nt && J.M >= J.N) {
        // A is copied (transposed: a weight gradient's dY^T) by every task for its rows: when it is the
        // larger operand, split rows instead, so each row is copied once (a task walks all its column
        // blocks itself; B is then packed once per row block)
        tm = std::min(mu, std::max(cdiv(J.M, 512), nt > 1 ? 2L * nt : 1L));
        tn = std::max(1L, std::min(nu, cdiv(nt > 1 ? 2L * nt : 1L, tm)));
    }
    const long tasks = tm * tn;
    auto task = [&](long t) {
        const long i = t / tn, j = t % tn;
        const long m0 = std::min(J.M, mu * i / tm * kTileRows), m1 = std::min(J.M, mu * (i + 1) / tm * kTileRows);
        const long n0 = std::min(J.N, nu * j / tn * kTileCols), n1 = std::min(J.N, nu * (j + 1) / tn * kTileCols);
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

constexpr long kMinRows = 16;  // fewer rows (decode): the conversion path's dot-product kernel reads W in place

Job make_job(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, BSrc b, float* C, long ldc,
             int accumulate, const nf_epilogue* ep, int path) {
    Job J;
    J.M = M, J.N = N, J.K = K, J.kp = kpad(K);
    J.A = A, J.rs_a = rs_a, J.cs_a = cs_a;
    J.a_in_place = cs_a == 1 && K % kKStep == 0;
    J.b = b;
    J.C = C, J.ldc = ldc, J.accumulate = accumulate != 0, J.ep = ep;
    J.path = path;
    return J;
}

}  // namespace

namespace nfi {
const nf_epilogue* Bf16Bias::get(const nf_epilogue* e, long N) {
    if (!e || !e->bias_bf16 || e->bias || N <= 0) return e;
    ep = *e;
    buf = (float*)malloc((size_t)N * sizeof(float));
    for (long j = 0; j < N; ++j) buf[j] = bf16_to_f32(e->bias_bf16[j]);
    ep.bias = buf;
    ep.bias_bf16 = nullptr;
    return &ep;
}

void count_bf16(int slot) { g_counts[slot].fetch_add(1, std::memory_order_relaxed); }

/* bf16 A and B (B(k, n) = B[k * rs_b + n * cs_b]) on the native path, when the CPU has one and the
 * shape suits it; false (nothing done, nothing counted) otherwise, and the caller runs another path. */
bool bf16_native(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const uint16_t* B, long rs_b,
                 long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads) {
    const int path = bf16_path();
    if (path == NF_BF16_CONVERT || M < kMinRows || N <= 0 || K <= 0 || (C == nullptr && accumulate)) return false;
    g_counts[path].fetch_add(1, std::memory_order_relaxed);
    run_job(make_job(M, N, K, A, rs_a, cs_a, BSrc{nullptr, B, rs_b, cs_b}, C, ldc, accumulate, ep, path), nthreads);
    return true;
}
}  // namespace nfi

extern "C" {

int nf_gemm_bf16_path(void) { return bf16_path(); }
int nf_gemm_bf16_hw_path(void) { return hw_path(); }
void nf_gemm_set_bf16_path(int path) { g_forced.store(path < 0 ? -1 : std::min(path, (int)NF_BF16_AMX)); }
void nf_gemm_bf16_counts(long* counts) {
    for (int i = 0; i < NF_BF16_COUNTS; ++i) counts[i] = g_counts[i].load(std::memory_order_relaxed);
}

long nf_gemm_vnni_size(long K, long N) { return cdiv(std::max(N, 0L), kPanel) * kPanel * kpad(K); }

void nf_gemm_pack_b_vnni(long K, long N, const uint16_t* B, long stride_k, long stride_n, uint16_t* packed) {
    if (N <= 0) return;
    const long np = cdiv(N, kPanel), kp = kpad(K);
    const BSrc s{nullptr, B, stride_k, stride_n};
#pragma omp parallel for schedule(static) if (np * kp > (1L << 17) && !omp_in_parallel())
    for (long p = 0; p < np; ++p) pack_panels(s, std::max(K, 0L), N, kp, p, p + 1, packed + p * kp * kPanel);
}

void nf_gemm_bf16_vnni_packed(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const uint16_t* Bp,
                              float* C, long ldc, int accumulate, const nf_epilogue* ep0, int nthreads) {
    if (M <= 0 || N <= 0) return;
    nfi::Bf16Bias bias;
    const nf_epilogue* ep = bias.get(ep0, N);
    const int path = bf16_path();
    g_counts[path].fetch_add(1, std::memory_order_relaxed);
    if (K <= 0) {  // C = act([C_old] + bias) + residual: an empty product through the same epilogue
        static const uint16_t zero[kKStep] = {};  // a 32-deep product of zeros (rows and columns stride 0)
        run_job(make_job(M, N, kKStep, zero, 0, 1, BSrc{nullptr, zero, 0, 0}, C, ldc, accumulate, ep, path), nthreads);
        return;
    }
    run_job(make_job(M, N, K, A, rs_a, cs_a, BSrc{Bp, nullptr, 0, 0}, C, ldc, accumulate, ep, path), nthreads);
}

}  // extern "C"
