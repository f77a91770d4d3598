/* nf_gemm_internal.h — what the library's translation units share (hidden symbols, not API).
 *
 * Invariant: the cache sizes every blocking decision is derived from live in one place
 * (nf_gemm.cpp's blocking parameters, set by nf_gemm_set_cache_sizes or sysconf).
 */
#ifndef NF_GEMM_INTERNAL_H
#define NF_GEMM_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

#include "nf_gemm.h"

namespace nfi {
/* C = A @ B for few rows of A (M <= 4: decode) and a row-major B (cs_b == 1) read in place, streaming
 * B's rows (nf_gemm_nt.cpp); false (nothing done) when the shape does not qualify. */
bool few_rows_rowmajor(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
                       long cs_b, float* C, long ldc, int accumulate, const struct nf_epilogue* ep, int nthreads);
/* bf16 A and B (B(k, n) = B[k*rs_b + n*cs_b]) on the native bf16 path (nf_gemm_bf16.cpp: AMX tiles or
 * AVX512-BF16) when the CPU has one and the shape suits it; false (nothing done, nothing written)
 * otherwise: the caller then runs the float32-conversion path. */
bool bf16_native(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const uint16_t* B, long rs_b,
                 long cs_b, float* C, long ldc, int accumulate, const struct nf_epilogue* ep, int nthreads);
/* One more call in nf_gemm_bf16_counts' slot `slot` (a path, or NF_BF16_STREAMED) */
void count_bf16(int slot);
/* Decode-sized float32 products (nf_gemv.cpp), M <= 4 (row-major B: 8 on AVX-512 builds): C = A @ W^T with W [N, K] (ldw) and C =
 * A @ B with B row-major (cs_b == 1), one contiguous stream of the weight per thread; false (nothing done)
 * when the shape does not qualify or the path is off (nf_gemm_set_gemv). gemv_nt needs C; gemv_kn takes
 * C == NULL with a tile_fn. */
bool gemv_nt(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Wt, long ldw, float* C,
             long ldc, int accumulate, const struct nf_epilogue* ep, int nthreads);
bool gemv_kn(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b, long cs_b,
             float* C, long ldc, int accumulate, const struct nf_epilogue* ep, int nthreads);
/* The same products with a bf16 A and / or a bf16 W or B, converted to float32 in registers (W read
 * in place: half of float32's bytes; M <= 8 for a bf16 W, else as above); float32 accumulation. */
bool gemv_nt_mixed(long M, long N, long K, const void* A, bool a_bf16, long rs_a, long cs_a, const void* Wt,
                   bool w_bf16, long ldw, float* C, long ldc, int accumulate, const struct nf_epilogue* ep,
                   int nthreads);
bool gemv_kn_mixed(long M, long N, long K, const void* A, bool a_bf16, long rs_a, long cs_a, const void* B,
                   bool b_bf16, long rs_b, long cs_b, float* C, long ldc, int accumulate,
                   const struct nf_epilogue* ep, int nthreads);
/* The same nt product with an int8 W (weight-only quantization; the scales are the caller's epilogue), M <= 8 */
bool gemv_nt_i8(long M, long N, long K, const float* A, long rs_a, long cs_a, const int8_t* Wt, long ldw, float* C,
                long ldc, int accumulate, const struct nf_epilogue* ep, int nthreads);
/* C[i, j] = act(C[i, j] + bias[j]) + res[i*ldr + j] for rows [r0, r1) x columns [c0, c1) (nf_gemm_nt.cpp) */
void epilogue_pass(float* C, long ldc, long r0, long r1, long c0, long c1, const float* bias, int act,
                   const float* res, long ldr);
long l1d_bytes();  // L1 data cache, bytes
long l2_bytes();   // L2 cache (per core), bytes

/* Do 16 rows `row_bytes` apart fall into fewer than 4 sets of a 64-set L1d? (Rows a multiple of
 * 4 KiB apart all map to one set: a kernel reading such rows in place thrashes L1.) */
inline bool rows_alias_in_l1(long row_bytes) {
    unsigned long long sets = 0;
    for (long l = 0; l < 16; ++l) sets |= 1ull << (((unsigned long)(l * row_bytes) / 64) % 64);
    return __builtin_popcountll(sets) < 4;
}

/* The epilogue of a bf16 entry with its bf16 bias (nf_epilogue.bias_bf16) converted to float32 for this
 * call: `get` returns `ep` itself when there is none. */
struct Bf16Bias {
    nf_epilogue ep;
    float* buf = nullptr;
    const nf_epilogue* get(const nf_epilogue* e, long N);
    ~Bf16Bias() { free(buf); }
};

/* A growable, 64-byte aligned buffer of any element type (the bf16 and int8 entries' per-thread scratch). */
struct Buf {
    void* p = nullptr;
    size_t cap = 0;
    template <typename T>
    T* get(size_t n) {
        const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
        if (bytes > cap) {
            free(p);
            cap = bytes + 4096;
            p = aligned_alloc(64, cap);
        }
        return (T*)p;
    }
    ~Buf() { free(p); }
};

/* Growable, 64-byte aligned float buffers (A and B panels, a block of C); each translation unit
 * keeps one per thread. */
struct Scratch {
    float* a = nullptr;
    long a_cap = 0;
    float* b = nullptr;
    long b_cap = 0;
    float* c = nullptr;
    long c_cap = 0;
    static float* grow(float*& p, long& cap, long need) {
        if (need > cap) {
            free(p);
            cap = need + 1024;
            p = (float*)aligned_alloc(64, (size_t)((cap * 4 + 63) / 64) * 64);
        }
        return p;
    }
    ~Scratch() {
        free(a);
        free(b);
        free(c);
    }
};
}  // namespace nfi

#endif /* NF_GEMM_INTERNAL_H */
