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
NF_INLINE void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
NF_INLINE vm vmask_range(int lo, int hi) {  // lanes lo <= l < hi
    uint32_t bits = ((hi >= 16 ? 0xFFFFu : ((1u << hi) - 1u)) & ~((1u << lo) - 1u));
    return (vm)bits;
}
NF_INLINE vf vload_mask(const float* p, vm m) { return _mm512_maskz_loadu_ps(m, p); }
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
NF_INLINE void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
NF_INLINE vm vmask_range(int lo, int hi) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i ge_lo = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1));
    __m256i lt_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane);
    return _mm256_and_si256(ge_lo, lt_hi);
}
NF_INLINE vf vload_mask(const float* p, vm m) { return _mm256_maskload_ps(p, m); }
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
#endif /* NF_GEMM_SIMD_H */
