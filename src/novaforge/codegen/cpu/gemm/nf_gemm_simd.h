/* nf_gemm_simd.h — the few SIMD primitives the GEMM micro-kernel and epilogues use.
 *
 * Invariant: exactly one ISA block below is compiled (AVX-512F, AVX2+FMA, or portable GCC
 * vector extensions), each defining the same names with the same meaning, so that all kernel
 * logic above it is shared and tested by whichever ISA the test machine has. Keep the per-ISA
 * blocks minimal and obviously correct: they are the only code that differs between machines.
 * Internal header of nf_gemm.cpp (C++, GCC/Clang).
 */
#ifndef NF_GEMM_SIMD_H
#define NF_GEMM_SIMD_H

#include <stdint.h>
#include <string.h>

#define NF_INLINE inline __attribute__((always_inline))

namespace nfs {
/* a bf16 value (the upper 16 bits of a float32) as float32: exact */
NF_INLINE float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
}  // namespace nfs

#if defined(__AVX512F__) && !defined(NF_GEMM_NO_AVX512)
#include <immintrin.h>
#define NF_ISA 2
namespace nfs {
constexpr int W = 16;  // lanes
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vm;
NF_INLINE vf vzero() { return _mm512_setzero_ps(); }
NF_INLINE vf vset1(float x) { return _mm512_set1_ps(x); }
NF_INLINE vf vload(const float* p) { return _mm512_loadu_ps(p); }
/* v stays in a register: the compiler may not fold its load into each instruction that uses it
 * (gcc's znver3 tuning turns one load of A used by 4 FMAs into 4 memory operands) */
NF_INLINE void vkeep(vf& v) { asm("" : "+v"(v)); }
NF_INLINE void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
NF_INLINE vm vmask_range(int lo, int hi) {  // lanes lo <= l < hi
    uint32_t bits = ((hi >= 16 ? 0xFFFFu : ((1u << hi) - 1u)) & ~((1u << lo) - 1u));
    return (vm)bits;
}
NF_INLINE vf vload_mask(const float* p, vm m) { return _mm512_maskz_loadu_ps(m, p); }
/* W int8 values from p, as floats (an int8 weight dequantized in registers) */
NF_INLINE vf vload_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
/* W bf16 values from p, as floats (exact: each shifted into a float's upper half) */
NF_INLINE vf vload_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
NF_INLINE void vstore_mask(float* p, vm m, vf v) { _mm512_mask_storeu_ps(p, m, v); }
NF_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
NF_INLINE vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
NF_INLINE vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
NF_INLINE vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
NF_INLINE vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
NF_INLINE vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
NF_INLINE vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
NF_INLINE vf vand(vf a, vf b) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
NF_INLINE vf vor(vf a, vf b) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
NF_INLINE vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
NF_INLINE vi vcvt_i32(vf a) { return _mm512_cvtps_epi32(a); }  // a is already integral
NF_INLINE vf vpow2i(vi n) {  // 2^n as float bits, n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
}
NF_INLINE void vprefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
NF_INLINE void vprefetch_l2(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }
NF_INLINE float vhsum(vf v) { return _mm512_reduce_add_ps(v); }
NF_INLINE float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
/* r[i][j] <- r[j][i] for the 16 x 16 block held in r, in registers: pairs of rows interleaved by
 * 32 and then 64 bits (u[4i + j], 128-bit lane L: rows 4i..4i+3 at column 4L + j), then 128-bit
 * lanes gathered across row groups twice. */
NF_INLINE void vtranspose(vf (&r)[W]) {
    vf t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int j = 0; j < 4; ++j) {
        const vf x = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), y = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
        const vf x2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        const vf y2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(x, x2, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(x, x2, 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(y, y2, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(y, y2, 0xdd);
    }
}
/* [lanes 0-7 of v] + [lanes 8-15 of v] (AVX-512F only: no DQ extract) */
NF_INLINE __m256 vfold256(vf v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
/* out[0..3] (+ out[0..3] if add) = the horizontal sums of a, b, c, d */
NF_INLINE void vhsum4_store(vf a, vf b, vf c, vf d, float* out, bool add) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(vfold256(a), vfold256(b)), _mm256_hadd_ps(vfold256(c), vfold256(d)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    if (add) s = _mm_add_ps(s, _mm_loadu_ps(out));
    _mm_storeu_ps(out, s);
}
/* the same for two groups of four vectors (two C rows of a dot-product tile) */
NF_INLINE void vhsum4x2_store(vf a0, vf a1, vf a2, vf a3, vf b0, vf b1, vf b2, vf b3, float* out0, float* out1,
                              bool add) {
    vhsum4_store(a0, a1, a2, a3, out0, add);
    vhsum4_store(b0, b1, b2, b3, out1, add);
}
}  // namespace nfs

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NF_ISA 1
namespace nfs {
constexpr int W = 8;
typedef __m256 vf;
typedef __m256i vi;
typedef __m256i vm;
NF_INLINE vf vzero() { return _mm256_setzero_ps(); }
NF_INLINE vf vset1(float x) { return _mm256_set1_ps(x); }
NF_INLINE vf vload(const float* p) { return _mm256_loadu_ps(p); }
NF_INLINE void vkeep(vf& v) { asm("" : "+x"(v)); }  // (see the AVX-512 one)
NF_INLINE void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
NF_INLINE vm vmask_range(int lo, int hi) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i ge_lo = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1));
    __m256i lt_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane);
    return _mm256_and_si256(ge_lo, lt_hi);
}
NF_INLINE vf vload_mask(const float* p, vm m) { return _mm256_maskload_ps(p, m); }
NF_INLINE vf vload_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
NF_INLINE vf vload_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
NF_INLINE void vstore_mask(float* p, vm m, vf v) { _mm256_maskstore_ps(p, m, v); }
NF_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
NF_INLINE vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
NF_INLINE vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
NF_INLINE vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
NF_INLINE vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
NF_INLINE vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
NF_INLINE vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
NF_INLINE vf vand(vf a, vf b) { return _mm256_and_ps(a, b); }
NF_INLINE vf vor(vf a, vf b) { return _mm256_or_ps(a, b); }
NF_INLINE vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
NF_INLINE vi vcvt_i32(vf a) { return _mm256_cvtps_epi32(a); }
NF_INLINE vf vpow2i(vi n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}
NF_INLINE void vprefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
NF_INLINE void vprefetch_l2(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }
NF_INLINE float vhsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}
NF_INLINE float vhmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
/* r[i][j] <- r[j][i] for the 8 x 8 block held in r */
NF_INLINE void vtranspose(vf (&r)[W]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
/* [sum of lanes 0-3 of a, b, c, d | sum of lanes 4-7 of a, b, c, d] */
NF_INLINE __m256 vhsum4_halves(vf a, vf b, vf c, vf d) {
    return _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
}
/* out[0..3] (+ out[0..3] if add) = the horizontal sums of a, b, c, d */
NF_INLINE void vhsum4_store(vf a, vf b, vf c, vf d, float* out, bool add) {
    const __m256 t = vhsum4_halves(a, b, c, d);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    if (add) s = _mm_add_ps(s, _mm_loadu_ps(out));
    _mm_storeu_ps(out, s);
}
/* the same for two groups of four vectors (two C rows of a dot-product tile): one 8-lane result */
NF_INLINE void vhsum4x2_store(vf a0, vf a1, vf a2, vf a3, vf b0, vf b1, vf b2, vf b3, float* out0, float* out1,
                              bool add) {
    const __m256 ta = vhsum4_halves(a0, a1, a2, a3), tb = vhsum4_halves(b0, b1, b2, b3);
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(ta, tb, 0x20), _mm256_permute2f128_ps(ta, tb, 0x31));
    if (add) s = _mm256_add_ps(s, _mm256_loadu2_m128(out1, out0));
    _mm_storeu_ps(out0, _mm256_castps256_ps128(s));
    _mm_storeu_ps(out1, _mm256_extractf128_ps(s, 1));
}
}  // namespace nfs

#else
#define NF_ISA 0
namespace nfs {
constexpr int W = 4;
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
typedef int32_t vm __attribute__((vector_size(16)));
NF_INLINE vf vzero() { return vf{0.f, 0.f, 0.f, 0.f}; }
NF_INLINE vf vset1(float x) { return vf{x, x, x, x}; }
NF_INLINE void vkeep(vf&) {}
NF_INLINE vf vload(const float* p) { vf v; memcpy(&v, p, sizeof v); return v; }
NF_INLINE void vstore(float* p, vf v) { memcpy(p, &v, sizeof v); }
NF_INLINE vm vmask_range(int lo, int hi) {
    vm m;
    for (int l = 0; l < W; ++l) m[l] = (l >= lo && l < hi) ? -1 : 0;
    return m;
}
NF_INLINE vf vload_mask(const float* p, vm m) {
    vf v = vzero();
    for (int l = 0; l < W; ++l) if (m[l]) v[l] = p[l];
    return v;
}
NF_INLINE void vstore_mask(float* p, vm m, vf v) {
    for (int l = 0; l < W; ++l) if (m[l]) p[l] = v[l];
}
NF_INLINE vf vload_i8(const int8_t* p) { return vf{(float)p[0], (float)p[1], (float)p[2], (float)p[3]}; }
NF_INLINE vf vload_bf16(const uint16_t* p) {
    return vf{bf16_to_f32(p[0]), bf16_to_f32(p[1]), bf16_to_f32(p[2]), bf16_to_f32(p[3])};
}
NF_INLINE vf vfma(vf a, vf b, vf c) { return a * b + c; }
NF_INLINE vf vadd(vf a, vf b) { return a + b; }
NF_INLINE vf vsub(vf a, vf b) { return a - b; }
NF_INLINE vf vmul(vf a, vf b) { return a * b; }
NF_INLINE vf vdiv(vf a, vf b) { return a / b; }
NF_INLINE vf vmax(vf a, vf b) { return a > b ? a : b; }
NF_INLINE vf vmin(vf a, vf b) { return a < b ? a : b; }
NF_INLINE vf vand(vf a, vf b) { return (vf)((vi)a & (vi)b); }
NF_INLINE vf vor(vf a, vf b) { return (vf)((vi)a | (vi)b); }
NF_INLINE vf vround(vf a) {
    vf r;
    for (int l = 0; l < W; ++l) r[l] = __builtin_nearbyintf(a[l]);
    return r;
}
NF_INLINE vi vcvt_i32(vf a) { return __builtin_convertvector(a, vi); }
NF_INLINE vf vpow2i(vi n) { return (vf)((n + 127) << 23); }
NF_INLINE void vprefetch(const void* p) { __builtin_prefetch(p); }
NF_INLINE void vprefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }
NF_INLINE void vtranspose(vf (&r)[W]) {
    for (int i = 0; i < W; ++i)
        for (int j = i + 1; j < W; ++j) {
            const float t = r[i][j];
            r[i][j] = r[j][i];
            r[j][i] = t;
        }
}
NF_INLINE float vhsum(vf v) {
    float s = 0.f;
    for (int l = 0; l < W; ++l) s += v[l];
    return s;
}
NF_INLINE float vhmax(vf v) {
    float m = v[0];
    for (int l = 1; l < W; ++l) m = v[l] > m ? v[l] : m;
    return m;
}
/* out[0..3] (+ out[0..3] if add) = the horizontal sums of a, b, c, d */
NF_INLINE void vhsum4_store(vf a, vf b, vf c, vf d, float* out, bool add) {
    const float s[4] = {vhsum(a), vhsum(b), vhsum(c), vhsum(d)};
    for (int j = 0; j < 4; ++j) out[j] = add ? out[j] + s[j] : s[j];
}
NF_INLINE void vhsum4x2_store(vf a0, vf a1, vf a2, vf a3, vf b0, vf b1, vf b2, vf b3, float* out0, float* out1,
                              bool add) {
    vhsum4_store(a0, a1, a2, a3, out0, add);
    vhsum4_store(b0, b1, b2, b3, out1, add);
}
}  // namespace nfs
#endif

/* ---- vector math shared by all ISAs (written once on the primitives above) ---- */
namespace nfs {

NF_INLINE vf vabs(vf x) {
    uint32_t bits = 0x7fffffffu;
    float m;
    memcpy(&m, &bits, 4);
    return vand(x, vset1(m));
}

NF_INLINE vf vsignbit(vf x) {
    uint32_t bits = 0x80000000u;
    float m;
    memcpy(&m, &bits, 4);
    return vand(x, vset1(m));
}

/* exp(x), relative error ~1-2 ulp on [-87.3, 88]; clamps its argument there (never inf). */
NF_INLINE vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-87.33654f)), vset1(88.0f));
    vf n = vround(vmul(x, vset1(1.44269504088896341f)));
    vf r = vfma(n, vset1(-0.693359375f), x);  // Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4
    r = vfma(n, vset1(2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.f)));
    return vmul(p, vpow2i(vcvt_i32(n)));  // n in [-126, 127] by the clamp
}

/* x * sigmoid(x) with sigmoid(z) = 1 / (1 + exp(-z)) */
NF_INLINE vf vsilu(vf x) { return vdiv(x, vadd(vset1(1.f), vexp(vsub(vzero(), x)))); }

/* 0.5 x (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
NF_INLINE vf vgelu_tanh(vf x) {
    vf x3 = vmul(vmul(x, x), x);
    vf u2 = vmul(vset1(2.f * 0.7978845608028654f), vfma(vset1(0.044715f), x3, x));
    return vdiv(x, vadd(vset1(1.f), vexp(vsub(vzero(), u2))));
}

/* erf by Abramowitz-Stegun 7.1.26 (abs error < 1.5e-7), the formula PyTorch's vectorized erf uses. */
NF_INLINE vf verf(vf x) {
    vf ax = vabs(x);
    vf t = vdiv(vset1(1.f), vfma(vset1(0.3275911f), ax, vset1(1.f)));
    vf r = vset1(1.061405429f);
    r = vfma(r, t, vset1(-1.453152027f));
    r = vfma(r, t, vset1(1.421413741f));
    r = vfma(r, t, vset1(-0.284496736f));
    r = vfma(r, t, vset1(0.254829592f));
    vf e = vexp(vsub(vzero(), vmul(ax, ax)));
    vf y = vsub(vset1(1.f), vmul(vmul(r, t), e));
    return vor(y, vsignbit(x));
}

NF_INLINE vf vgelu_erf(vf x) {
    vf e = verf(vmul(x, vset1(0.70710678118654752f)));
    return vmul(vmul(vset1(0.5f), x), vadd(vset1(1.f), e));
}

NF_INLINE vf vact(vf x, int act) {
    switch (act) {
        case 1: return vmax(x, vzero());
        case 2: return vgelu_erf(x);
        case 3: return vgelu_tanh(x);
        case 4: return vsilu(x);
        default: return x;
    }
}

}  // namespace nfs

namespace nfs {
/* W elements of a float32, int8 or bf16 (uint16_t) operand as floats; the _tail forms read n < W
 * elements (the rest 0) */
NF_INLINE vf vload_as_f32(const float* p) { return vload(p); }
NF_INLINE vf vload_as_f32(const int8_t* p) { return vload_i8(p); }
NF_INLINE vf vload_as_f32(const uint16_t* p) { return vload_bf16(p); }
NF_INLINE vf vload_as_f32_tail(const float* p, int n) { return vload_mask(p, vmask_range(0, n)); }
NF_INLINE vf vload_as_f32_tail(const int8_t* p, int n) {
    int8_t t[16] = {0};
    memcpy(t, p, (size_t)n);
    return vload_i8(t);
}
NF_INLINE vf vload_as_f32_tail(const uint16_t* p, int n) {
    uint16_t t[16] = {0};
    memcpy(t, p, (size_t)n * 2);
    return vload_bf16(t);
}
}  // namespace nfs

#endif /* NF_GEMM_SIMD_H */
