// novaforge CPU runtime header: included by every generated kernel library.
//
// Invariant: every function here is a branch-free `static inline` scalar function made of
// arithmetic, comparisons/selects and bit casts, so GCC vectorizes loops that call them under
// `#pragma omp simd` (no libm calls, no -ffast-math needed). Accuracy: exp/log/tanh/sin/cos
// within ~2 ulp of libm over their usual ranges; erf is the formula ATen's vectorized erf uses
// (max abs error 1.5e-7), so GELU matches eager closely. NaN and +-inf propagate like torch.
#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstddef>

#define NF_INLINE static inline __attribute__((always_inline))

NF_INLINE float nf_bits_f(uint32_t u) { return __builtin_bit_cast(float, u); }
NF_INLINE uint32_t nf_f_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

// ----------------------------------------------------------------------------- bfloat16
NF_INLINE float nf_bf16_load(uint16_t h) { return nf_bits_f(((uint32_t)h) << 16); }
NF_INLINE uint16_t nf_bf16_store(float f) {
  uint32_t u = nf_f_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  uint32_t nan = (u >> 16) | 0x40u;                              // quiet NaN
  return (uint16_t)((f != f) ? nan : rounded);
}
// a float rounded to bfloat16 precision (what a bf16 cast followed by a widening gives)
NF_INLINE float nf_round_bf16(float f) { return nf_bf16_load(nf_bf16_store(f)); }

// ------------------------------------------------------------------------ random numbers
// uniform [0, 1) in steps of 2^-24 from SplitMix64(seed, counter): ir/ops/random.py's counter_uniform
NF_INLINE float nf_counter_uniform(int64_t counter, int64_t seed) {
  uint64_t z = (uint64_t)seed + ((uint64_t)counter + 1u) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(int32_t)(z >> 40) * 0x1.0p-24f;
}

// -------------------------------------------------------------------------- comparisons
NF_INLINE float nf_maximum(float a, float b) { return (a > b || a != a) ? a : b; }
NF_INLINE float nf_minimum(float a, float b) { return (a < b || a != a) ? a : b; }
NF_INLINE float nf_relu(float a) { return (a > 0.0f || a != a) ? a : 0.0f; }
NF_INLINE float nf_sign(float a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : a); }

// ------------------------------------------------------------------------------- 2^n
// 2^n for integer-valued float n in [-252, 254], as two normal factors (handles subnormals)
NF_INLINE float nf_ldexp(float y, float n) {
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  float s1 = nf_bits_f((uint32_t)(n1 + 127) << 23);
  float s2 = nf_bits_f((uint32_t)(n2 + 127) << 23);
  return y * s1 * s2;
}

// ------------------------------------------------------------------------------- exp
// exp by Cody-Waite reduction and Cephes' polynomial. Branch- and blend-free: the clamps are
// max/min that let NaN through, x * log2(e) is rounded by adding 1.5 * 2^23 (the sum's low
// mantissa bits are then n itself), and 2^n is two normal factors (subnormal results round
// once, in the last multiply). NaN propagates through the arithmetic, x >= 89 overflows to inf
// in that multiply, x <= -104 gives 0. Same results as the floor/blend form it replaced, ~20%
// fewer cycles (0.71 -> 0.57 ns per element, hot in L1, Zen 3).
NF_INLINE float nf_exp(float x) {
  const float lo = -104.0f, hi = 89.0f, shift = 12582912.0f;
  float xc = x < lo ? lo : x;  // NaN stays NaN
  xc = hi < xc ? hi : xc;
  float t = xc * 1.44269504088896341f + shift;  // round to nearest: n in t's low bits
  float n = t - shift;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  float y = p * (r * r) + r + 1.0f;
  int32_t ni = (int32_t)(nf_f_bits(t) - nf_f_bits(shift));  // in [-150, 128]
  int32_t n1 = ni >> 1;
  return y * nf_bits_f((uint32_t)(n1 + 127) << 23) * nf_bits_f((uint32_t)(ni - n1 + 127) << 23);
}
NF_INLINE float nf_exp2(float x) {
  float xc = x < -151.0f ? -151.0f : (x > 129.0f ? 129.0f : x);
  xc = (x != x) ? 0.0f : xc;
  float n = __builtin_floorf(xc + 0.5f);
  float y = nf_ldexp(nf_exp((xc - n) * 0.693147180559945309f), n);
  y = x > 128.0f ? __builtin_inff() : y;
  return (x != x) ? x : y;
}
NF_INLINE float nf_expm1(float x) {
  // |x| < 0.5: Taylor series to x^9 (rel. error < 2e-8); else exp(x) - 1
  float p = 1.0f / 362880;
  p = p * x + 1.0f / 40320;
  p = p * x + 1.0f / 5040;
  p = p * x + 1.0f / 720;
  p = p * x + 1.0f / 120;
  p = p * x + 1.0f / 24;
  p = p * x + 1.0f / 6;
  p = p * x + 0.5f;
  float t = x + (x * x) * p;
  float e = nf_exp(x) - 1.0f;
  return (x > -0.5f && x < 0.5f) ? t : e;
}

// ------------------------------------------------------------------------------- log
NF_INLINE float nf_log(float x) {
  const float sqrthf = 0.707106781186547524f;
  // subnormals: scale up by 2^23
  float xs = x < 1.17549435e-38f ? x * 8388608.0f : x;
  float ebias = x < 1.17549435e-38f ? -23.0f : 0.0f;
  uint32_t u = nf_f_bits(xs);
  float e = (float)((int32_t)((u >> 23) & 0xff) - 126) + ebias;
  float m = nf_bits_f((u & 0x807fffffu) | 0x3f000000u);  // [0.5, 1)
  bool small = m < sqrthf;
  e = small ? e - 1.0f : e;
  m = small ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float p = 7.0376836292E-2f;
  p = p * m - 1.1514610310E-1f;
  p = p * m + 1.1676998740E-1f;
  p = p * m - 1.2420140846E-1f;
  p = p * m + 1.4249322787E-1f;
  p = p * m - 1.6668057665E-1f;
  p = p * m + 2.0000714765E-1f;
  p = p * m - 2.4999993993E-1f;
  p = p * m + 3.3333331174E-1f;
  float y = p * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  float r = m + y + e * 0.693359375f;
  r = x == 0.0f ? -__builtin_inff() : r;
  r = x < 0.0f ? __builtin_nanf("") : r;
  r = x == __builtin_inff() ? x : r;
  return (x != x) ? x : r;
}
NF_INLINE float nf_log2(float x) { return nf_log(x) * 1.44269504088896341f; }
NF_INLINE float nf_log1p(float x) {
  // log1p(x) = log(u) * x / (u - 1) with u = 1 + x (exact correction), x itself when u == 1
  float u = 1.0f + x;
  float d = u - 1.0f;
  float r = nf_log(u) * (x / (d == 0.0f ? 1.0f : d));
  r = d == 0.0f ? x : r;
  return u == __builtin_inff() ? u : r;
}

// ----------------------------------------------------------------------- tanh, sigmoid
NF_INLINE float nf_tanh(float x) {
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float p = -5.70498872745E-3f;
  p = p * z + 2.06390887954E-2f;
  p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f;
  p = p * z - 3.33332819422E-1f;
  float small = p * z * x + x;
  float e = nf_exp(2.0f * ax);
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  float r = ax < 0.625f ? small : big;
  return (x != x) ? x : r;
}
NF_INLINE float nf_sigmoid(float x) { return 1.0f / (1.0f + nf_exp(-x)); }
NF_INLINE float nf_silu(float x) { return x / (1.0f + nf_exp(-x)); }

// -------------------------------------------------------------------------------- erf
// erf: musl's erff (rational approximations on three ranges), ~1 ulp; all ranges computed
// and selected so that it vectorizes
NF_INLINE float nf_erf(float x) {
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float r = -2.3763017452e-05f;
  r = r * z - 5.7702702470e-03f;
  r = r * z - 2.8481749818e-02f;
  r = r * z - 3.2504209876e-01f;
  r = r * z + 1.2837916613e-01f;
  float s = -3.9602282413e-06f;
  s = s * z + 1.3249473704e-04f;
  s = s * z + 5.0813062117e-03f;
  s = s * z + 6.5022252500e-02f;
  s = s * z + 3.9791721106e-01f;
  s = s * z + 1.0f;
  float small = x + x * (r / s);
  float t = ax - 1.0f;
  float P = -2.1663755178e-03f;
  P = P * t + 3.5478305072e-02f;
  P = P * t - 1.1089469492e-01f;
  P = P * t + 3.1834661961e-01f;
  P = P * t - 3.7220788002e-01f;
  P = P * t + 4.1485610604e-01f;
  P = P * t - 2.3621185683e-03f;
  float Q = 1.1984500103e-02f;
  Q = Q * t + 1.3637083583e-02f;
  Q = Q * t + 1.2617121637e-01f;
  Q = Q * t + 7.1828655899e-02f;
  Q = Q * t + 5.4039794207e-01f;
  Q = Q * t + 1.0642088205e-01f;
  Q = Q * t + 1.0f;
  float mid = 8.4506291151e-01f + P / Q;
  float w = 1.0f / (ax * ax);
  float Ra = -9.8143291473e+00f;
  Ra = Ra * w - 8.1287437439e+01f;
  Ra = Ra * w - 1.8460508728e+02f;
  Ra = Ra * w - 1.6239666748e+02f;
  Ra = Ra * w - 6.2375331879e+01f;
  Ra = Ra * w - 1.0558626175e+01f;
  Ra = Ra * w - 6.9385856390e-01f;
  Ra = Ra * w - 9.8649440333e-03f;
  float Sa = -6.0424413532e-02f;
  Sa = Sa * w + 6.5702495575e+00f;
  Sa = Sa * w + 1.0863500214e+02f;
  Sa = Sa * w + 4.2900814819e+02f;
  Sa = Sa * w + 6.4538726807e+02f;
  Sa = Sa * w + 4.3456588745e+02f;
  Sa = Sa * w + 1.3765776062e+02f;
  Sa = Sa * w + 1.9651271820e+01f;
  Sa = Sa * w + 1.0f;
  float Rb = -4.8351919556e+02f;
  Rb = Rb * w - 1.0250950928e+03f;
  Rb = Rb * w - 6.3756646729e+02f;
  Rb = Rb * w - 1.6063638306e+02f;
  Rb = Rb * w - 1.7757955551e+01f;
  Rb = Rb * w - 7.9928326607e-01f;
  Rb = Rb * w - 9.8649431020e-03f;
  float Sb = -2.2440952301e+01f;
  Sb = Sb * w + 4.7452853394e+02f;
  Sb = Sb * w + 2.5530502930e+03f;
  Sb = Sb * w + 3.1998581543e+03f;
  Sb = Sb * w + 1.5367296143e+03f;
  Sb = Sb * w + 3.2579251099e+02f;
  Sb = Sb * w + 3.0338060379e+01f;
  Sb = Sb * w + 1.0f;
  bool near = ax < 2.85714285714f;  // 1 / 0.35
  float RS = near ? Ra / Sa : Rb / Sb;
  float zz = nf_bits_f(nf_f_bits(ax) & 0xffffe000u);
  float erfc = nf_exp(-zz * zz - 0.5625f) * nf_exp((zz - ax) * (zz + ax) + RS) / ax;
  float big = 1.0f - erfc;
  float y = ax < 0.84375f ? small : (ax < 1.25f ? mid : (ax < 6.0f ? big : 1.0f));
  y = (ax >= 0.84375f && x < 0.0f) ? -y : y;
  return (x != x) ? x : y;
}
// the erf formula of ATen's vectorized GELU (A&S 7.1.26, abs error 1.5e-7): GELU matches eager
NF_INLINE float nf_erf_fast(float x) {
  float ax = __builtin_fabsf(x);
  float t = 1.0f / (0.3275911f * ax + 1.0f);
  float r = 1.061405429f * t - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  float e = nf_exp(-(x * x));
  float y = 1.0f - r * t * e;
  return x < 0.0f ? -y : y;
}
NF_INLINE float nf_gelu_erf(float x) { return x * 0.5f * (1.0f + nf_erf_fast(x * 0.70710678118654752440f)); }
// 0.5 x (1 + tanh(u)) as x * sigmoid(2u): one exp and a division instead of tanh's polynomial,
// exp and division both evaluated and selected (1.44 -> 0.86 ns per element hot, Zen 3); within
// 4.8e-7 of eager everywhere (eager's own 1 + tanh(u) cancels for negative x)
NF_INLINE float nf_gelu_tanh(float x) {
  float u2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);
  return x / (1.0f + nf_exp(-u2));
}

// ----------------------------------------------------------------------------- sin, cos
// Cephes sinf/cosf: octant reduction with a three-part pi/4 (accurate for |x| < 8192)
NF_INLINE float nf_sincos_poly(float x, bool want_cos) {
  float ax = __builtin_fabsf(x);
  float jf = __builtin_floorf(ax * 1.27323954473516f);
  int32_t j = (int32_t)jf;
  j = (j + 1) & ~1;
  float y = (float)j;
  float r = ((ax - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  int32_t oct = want_cos ? (j + 2) & 7 : j & 7;
  float z = r * r;
  float pc = 2.443315711809948E-005f;
  pc = pc * z - 1.388731625493765E-003f;
  pc = pc * z + 4.166664568298827E-002f;
  float c = pc * z * z - 0.5f * z + 1.0f;
  float ps = -1.9515295891E-4f;
  ps = ps * z + 8.3321608736E-3f;
  ps = ps * z - 1.6666654611E-1f;
  float s = ps * z * r + r;
  float v = (oct & 2) ? c : s;
  bool neg = (oct & 4) != 0;
  if (!want_cos) neg = neg != (x < 0.0f);
  v = neg ? -v : v;
  return (x != x || ax == __builtin_inff()) ? __builtin_nanf("") : v;
}
NF_INLINE float nf_sin(float x) { return nf_sincos_poly(x, false); }
NF_INLINE float nf_cos(float x) { return nf_sincos_poly(x, true); }

// ------------------------------------------------------------------ integer semantics
NF_INLINE int64_t nf_floordiv_i(int64_t a, int64_t b) {
  int64_t q = b == 0 ? 0 : a / b;
  int64_t r = b == 0 ? 0 : a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
// torch's integer pow (ATen powi): negative exponents give 0, except for bases 1 and -1
NF_INLINE int64_t nf_pow_i(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((-b) % 2 ? -1 : 1) : 0);
  int64_t r = 1;
  while (b) {
    if (b & 1) r *= a;
    b /= 2;
    a *= a;
  }
  return r;
}
NF_INLINE int64_t nf_remainder_i(int64_t a, int64_t b) {
  int64_t r = b == 0 ? 0 : a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// torch's div_floor_floating and remainder for floats (scalar; not vectorized)
static inline float nf_floordiv_f(float a, float b) {
  if (b == 0.0f) return a / b;
  float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  if (div != 0.0f) {
    float fd = std::floor(div);
    if (div - fd > 0.5f) fd += 1.0f;
    return fd;
  }
  return std::copysign(0.0f, a / b);
}
static inline float nf_remainder_f(float a, float b) {
  float mod = std::fmod(a, b);
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) mod += b;
  return mod;
}

// ------------------------------------------------------------------ small vector tiles
// GCC vector extensions at the target's width (NF_VEC floats, set by the build), used by the
// register-blocked micro-kernels of the generated attention kernel.
#ifndef NF_VEC
#define NF_VEC 8
#endif
typedef float nf_vf __attribute__((vector_size(NF_VEC * 4)));
NF_INLINE nf_vf nf_vload(const float* p) { nf_vf v; __builtin_memcpy(&v, p, sizeof v); return v; }
NF_INLINE void nf_vstore(float* p, nf_vf v) { __builtin_memcpy(p, &v, sizeof v); }
NF_INLINE nf_vf nf_vsplat(float x) { return x - (nf_vf){}; }  // x - (+0) == x, folds to a broadcast

// c[r][0:2V] (+)= sum_{k < n} A[r][k] * b[k][0:2V] for R rows, accumulators in registers:
// ACC = false overwrites c (attention's S = Q K^T), true adds to it (O += P V); A[r][k] is
// a[r * lda + k], or with AT a[k * lda + r] (A read transposed: attention's backward, dV += P^T dO
// and dK += dS^T Q from the row-major P and dS tiles, no transposed copy)
template <int R, bool ACC, bool AT = false>
NF_INLINE void nf_tile_rank(const float* a, long lda, const float* b, long ldb, long n, float* c, long ldc) {
  nf_vf acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    acc[r][0] = ACC ? nf_vload(c + r * ldc) : nf_vsplat(0.0f);
    acc[r][1] = ACC ? nf_vload(c + r * ldc + NF_VEC) : nf_vsplat(0.0f);
  }
  for (long k = 0; k < n; k++) {
    const nf_vf b0 = nf_vload(b + k * ldb), b1 = nf_vload(b + k * ldb + NF_VEC);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const nf_vf av = nf_vsplat(AT ? a[k * lda + r] : a[r * lda + k]);
      acc[r][0] += av * b0;
      acc[r][1] += av * b1;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    nf_vstore(c + r * ldc, acc[r][0]);
    nf_vstore(c + r * ldc + NF_VEC, acc[r][1]);
  }
}

// A per-thread, 64-byte aligned scratch buffer of at least `floats` floats (slot 0 or 1), kept
// and grown across calls (a generated kernel never holds it across another kernel's call).
#include <cstdlib>
static inline float* nf_scratch(int slot, size_t floats) {
  static thread_local float* buf[2] = {nullptr, nullptr};
  static thread_local size_t cap[2] = {0, 0};
  if (floats > cap[slot]) {
    std::free(buf[slot]);
    size_t n = (floats + 15) / 16 * 16;
    buf[slot] = (float*)std::aligned_alloc(64, n * sizeof(float));
    cap[slot] = buf[slot] ? n : 0;
  }
  return buf[slot];
}

// Prefetch `bytes` from `p` into L2 (a GEMM tile epilogue's rows, one tile ahead; write != 0: the
// lines will be written). Not a scalar math function: called outside vectorized loops.
NF_INLINE void nf_pf_row(const char* p, long bytes, int write) {
  const char* end = p + bytes;
  p = (const char*)((uintptr_t)p & ~(uintptr_t)63);
  if (write)
    for (; p < end; p += 64) __builtin_prefetch(p, 1, 2);
  else
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 2);
}

// ------------------------------------------------------------------ register transposes
// nf_gemm's SIMD primitives (the ISA the build's flags select), for the W x W transpose below;
// NF_INLINE is this header's own again after it.
#pragma push_macro("NF_INLINE")
#undef NF_INLINE
#include "gemm/nf_gemm_simd.h"

// Row reductions of the attention kernels, in vectors with one horizontal step at the end (an
// `omp simd reduction` loop ends with a scalar pass over the lanes: per row and key tile it cost
// ~6% of the forward). NaN lanes may or may not win the max, as in the scalar `x > m ? x : m`;
// the softmax of a row holding a NaN is NaN either way.
NF_INLINE float nf_row_max(const float* x, long n, float m) {
  long j = 0;
  if (n >= nfs::W) {
    nfs::vf a = nfs::vload(x);
    for (j = nfs::W; j + nfs::W <= n; j += nfs::W) a = nfs::vmax(a, nfs::vload(x + j));
    const float h = nfs::vhmax(a);
    m = h > m ? h : m;
  }
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  return m;
}

NF_INLINE float nf_row_sum(const float* x, long n) {
  long j = 0;
  float s = 0.0f;
  if (n >= nfs::W) {
    nfs::vf a = nfs::vload(x);
    for (j = nfs::W; j + nfs::W <= n; j += nfs::W) a = nfs::vadd(a, nfs::vload(x + j));
    s = nfs::vhsum(a);
  }
  for (; j < n; j++) s += x[j];
  return s;
}
#pragma pop_macro("NF_INLINE")

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (float32; the attention kernel's K^T
// pack): W x W blocks transposed in registers (W loads, W stores), the edges element by element.
static inline void nf_transpose_into(const float* src, long lds, long rows, long cols, float* dst, long ldd) {
  constexpr long W = nfs::W;
  long r0 = 0;
  for (; r0 + W <= rows; r0 += W) {
    // the next block's rows (strided rows are not followed by the hardware prefetchers)
    for (long i = r0 + W; i < r0 + 2 * W && i < rows; i++) nf_pf_row((const char*)(src + i * lds), cols * 4, 0);
    long c0 = 0;
    for (; c0 + W <= cols; c0 += W) {
      nfs::vf v[W];
      for (long i = 0; i < W; i++) v[i] = nfs::vload(src + (r0 + i) * lds + c0);
      nfs::vtranspose(v);
      for (long i = 0; i < W; i++) nfs::vstore(dst + (c0 + i) * ldd + r0, v[i]);
    }
    for (; c0 < cols; c0++)
      for (long i = 0; i < W; i++) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
  }
  for (; r0 < rows; r0++)
    for (long c = 0; c < cols; c++) dst[c * ldd + r0] = src[r0 * lds + c];
}
