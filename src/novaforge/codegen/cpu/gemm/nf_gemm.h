/* nf_gemm.h — novaforge's CPU float32 GEMM (C API).
 *
 * Invariant: every entry computes, for the rows/columns it is given,
 *     C = act(A @ B [+ C_old if accumulate] + bias) [+ residual]
 * in float32 with float32 accumulation, row-major C (column stride 1, row stride ldc),
 * and reads A and unpacked B through arbitrary (row, column) element strides.
 * Packed B ("Bp") is produced by nf_sgemm_pack_b* on the same build of this library:
 * panels of nf_sgemm_nr() columns, each K x NR floats, k-major, zero-padded past N.
 * The layout depends on the ISA the library was compiled for; never store it across machines.
 *
 * Threading: functions with an `nthreads` argument run an OpenMP team (nthreads <= 0: the
 * OpenMP default); *_block functions are single-threaded and re-entrant, made to be called
 * from a caller's own `#pragma omp parallel for` over disjoint C blocks.
 */
#ifndef NF_GEMM_H
#define NF_GEMM_H

#include <stdint.h>

/* The library is built with -fvisibility=hidden; only these entry points are exported. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif
#ifdef __cplusplus
extern "C" {
#endif

enum nf_act {
    NF_ACT_NONE = 0,
    NF_ACT_RELU = 1,
    NF_ACT_GELU_ERF = 2,  /* 0.5 x (1 + erf(x / sqrt 2)) */
    NF_ACT_GELU_TANH = 3, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    NF_ACT_SILU = 4       /* x sigmoid(x) */
};

enum nf_isa { NF_ISA_GENERIC = 0, NF_ISA_AVX2 = 1, NF_ISA_AVX512 = 2 };

/* Called on each finished C tile (rows [row0, row0+rows) x cols [col0, col0+cols) of the
 * batch entry `batch`; `c` points at C[row0, col0]) right after the built-in epilogue,
 * while the tile is in cache: nf_gemm_mc() rows x one panel (nf_sgemm_nr() columns) at most, or
 * one row tile (nf_sgemm_mr() rows) x a few panels when K is short; for the nf_*_nt entries, one
 * row block x up to 64 columns. Multi-threaded
 * entries call it from several threads at once (on disjoint tiles): it must be thread-safe. */
typedef void (*nf_tile_fn)(void* ctx, long batch, float* c, long ldc, long row0, long col0, long rows,
                           long cols);

/* Fused epilogue, applied in registers after the last K step:
 *   C[i,j] = act(acc[i,j] + bias[j]) + residual[b*bs_residual + i*ld_residual + j]
 * Indices are global (row i of C, column j of C). NULL pointers mean "absent".
 * C == NULL with a tile_fn (not accumulating; nf_sgemm, nf_sgemm_packed(_batched), nf_sgemm_batched,
 * nf_gemm_mixed, nf_gemm_bf16_packed only): C is never stored; each block of C lives in a
 * per-thread buffer and tile_fn reads its tiles from there (an epilogue whose outputs are all
 * elsewhere, e.g. an optimizer update fused into a weight-gradient GEMM, needs no C matrix). */
typedef struct nf_epilogue {
    const float* bias;     /* [N] or NULL */
    int act;               /* enum nf_act */
    const float* residual; /* or NULL; row stride ld_residual, column stride 1 */
    long ld_residual;
    long bs_residual;      /* batch stride of residual (batched entries) */
    nf_tile_fn tile_fn;    /* or NULL */
    void* tile_ctx;
    /* or NULL: called (with c == NULL) on the tile whose tile_fn comes next, before the current
     * tile is computed, to prefetch what tile_fn will read there (nf_sgemm-family entries only; an
     * optimizer update reads the parameter and its moments, all cold in memory) */
    nf_tile_fn tile_prefetch;
    /* or NULL: a bf16 bias [N], used when bias is NULL, by the bf16 entries only (nf_gemm_mixed,
     * nf_gemm_nt_mixed, nf_gemm_bf16_packed, nf_gemm_bf16_vnni_packed: each converts it to float32 once
     * per call); a bf16 model's bias joins the register epilogue this way */
    const uint16_t* bias_bf16;
} nf_epilogue;

/* ---- configuration / queries ---- */
int nf_gemm_isa(void);
int nf_sgemm_nr(void);  /* packed panel width (16 on AVX2, 32 on AVX-512) */
int nf_sgemm_mr(void);  /* micro-tile rows */
long nf_gemm_mc(void);
/* Derive KC/MC/NC from cache sizes in bytes (<= 0: keep the current value). Defaults come
 * from sysconf at first use. Not thread-safe against concurrent GEMMs; call at load time. */
void nf_gemm_set_cache_sizes(long l1d, long l2, long l3);
void nf_gemm_get_blocking(long* kc, long* mc, long* nc);
/* Split an M x N problem over nthreads as tm x tn blocks (what nf_sgemm_packed does). */
void nf_gemm_partition(long M, long N, long K, int nthreads, long* tm, long* tn);

/* ---- packing B (weights: once, at compile time) ---- */
long nf_sgemm_packed_size(long K, long N); /* in floats */
/* B(k, n) = B[k*stride_k + n*stride_n]; [K,N] row-major: (N, 1); nn.Linear weight [N,K]: (1, K). */
void nf_sgemm_pack_b(long K, long N, const float* B, long stride_k, long stride_n, float* packed);
void nf_sgemm_pack_b_bf16(long K, long N, const uint16_t* B, long stride_k, long stride_n, float* packed);

/* ---- GEMM with packed B ---- */
/* Single-threaded: rows [m0,m1) x columns [n0,n1) of C. A(i, k) = A[i*rs_a + k*cs_a]. */
void nf_sgemm_packed_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Bp,
                           float* C, long ldc, long m0, long m1, long n0, long n1, int accumulate,
                           const nf_epilogue* ep);
void nf_sgemm_packed(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* Bp, float* C,
                     long ldc, int accumulate, const nf_epilogue* ep, int nthreads);
/* batch entries b: A + b*bs_a, Bp + b*bs_bp (bs_bp = 0: shared weights), C + b*bs_c. */
void nf_sgemm_packed_batched(long batch, long M, long N, long K, const float* A, long bs_a, long rs_a,
                             long cs_a, const float* Bp, long bs_bp, float* C, long bs_c, long ldc,
                             int accumulate, const nf_epilogue* ep, int nthreads);

/* ---- GEMM with unpacked B (activations, or weights without a packed copy) ----
 * B(k, n) = B[k*rs_b + n*cs_b]. Row-major B (cs_b = 1) is read in place by the micro-kernel;
 * other layouts are packed on the fly, one KC x NC block at a time, per thread. */
void nf_sgemm(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
              long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);
void nf_sgemm_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* B, long rs_b,
                    long cs_b, float* C, long ldc, long m0, long m1, long n0, long n1, int accumulate,
                    const nf_epilogue* ep);
void nf_sgemm_batched(long batch, long M, long N, long K, const float* A, long bs_a, long rs_a, long cs_a,
                      const float* B, long bs_b, long rs_b, long cs_b, float* C, long bs_c, long ldc,
                      int accumulate, const nf_epilogue* ep, int nthreads);

/* A and/or B in bfloat16 (a_bf16 / b_bf16 = 1: that operand is uint16_t bf16, else float32), B
 * packed on the fly; float32 accumulation and output. */
void nf_gemm_mixed(long M, long N, long K, const void* A, int a_bf16, long rs_a, long cs_a, const void* B, int b_bf16,
                   long rs_b, long cs_b, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);

/* ---- float32 A times an int8 B (weight-only quantization): C = A @ float(B), B(k, n) = B[k*rs_b + n*cs_b] ----
 * The weight stays int8 in memory and is converted in registers: with rs_b == 1 (an int8 nn.Linear weight
 * [N, K] seen as W^T, ldw = cs_b) and M <= 8 one contiguous stream of W per thread (nf_gemv.cpp); otherwise
 * B is converted while it is packed, block by block, and the float32 micro-kernel runs. Per-channel scales
 * are not applied here: they are the caller's epilogue (a tile_fn). C == NULL with a tile_fn as nf_sgemm. */
void nf_gemm_i8w(long M, long N, long K, const float* A, long rs_a, long cs_a, const int8_t* B, long rs_b, long cs_b,
                 float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);
/* counts[0] += nf_gemm_i8w calls on the streaming GEMV, counts[1] += calls on the packed path (2 longs) */
void nf_gemm_i8_counts(long* counts);

/* ---- int8 A times int8 B, exact int32 accumulation (nf_gemm_s8.cpp; dynamic int8 quantization) ----
 * acc = A @ B summed exactly in int32 (aten._int_mm), B(k, n) = B[k*rs_b + n*cs_b] packed on the fly, or Bp from
 * nf_gemm_pack_b_s8 (int8 k-pair panels of 16 columns: the weight's bytes once more). c_int32 = 1: C is int32
 * (row stride ldc) and gets acc (no epilogue, no accumulate); else C is float32 and gets
 * act(float(acc) [+ C_old] + bias) + residual, then tile_fn, as the float entries (C == NULL with a tile_fn:
 * per-thread blocks). VNNI (vpdpwssd) where the CPU has AVX512-VNNI, else AVX2 (vpmaddwd on sign-extended k
 * pairs) where the build has it, else a portable tile. */
enum nf_s8_path { NF_S8_PORTABLE = 0, NF_S8_AVX2 = 1, NF_S8_VNNI = 2 };
int nf_gemm_s8_path(void);
void nf_gemm_set_s8_path(int path); /* tests: force a path no better than the CPU's; -1: the CPU's best */
void nf_gemm_s8_counts(long* counts); /* calls per path since load (3 longs) */
long nf_gemm_s8_packed_size(long K, long N); /* in bytes */
void nf_gemm_pack_b_s8(long K, long N, const int8_t* B, long stride_k, long stride_n, int8_t* packed);
void nf_gemm_s8s8(long M, long N, long K, const int8_t* A, long rs_a, long cs_a, const int8_t* B, long rs_b, long cs_b,
                  void* C, long ldc, int c_int32, int accumulate, const nf_epilogue* ep, int nthreads);
void nf_gemm_s8s8_packed(long M, long N, long K, const int8_t* A, long rs_a, long cs_a, const int8_t* Bp, void* C,
                         long ldc, int c_int32, int accumulate, const nf_epilogue* ep, int nthreads);
/* ---- GEMM with B = W^T, W row-major [N, K] (an nn.Linear weight), no packed copy of W ----
 * C = A @ W^T with W(j, k) = W[j*ldw + k]. With few rows (M < 96: decode) a dot-product micro-kernel
 * (nf_sgemm_nt_mr() rows of A x nf_sgemm_nt_nr() rows of W) reads both operands along K in place; its
 * epilogue is a vectorized pass over each finished chunk of C, then tile_fn is called on it (a row
 * block x up to 64 columns); A with cs_a != 1 (or bf16) is copied into per-thread scratch. With more
 * rows, float32 W, on AVX2 builds: a broadcast micro-kernel (vectors along M: A packed once per row block
 * and thread, W's elements broadcast where they are); otherwise these entries run nf_sgemm /
 * nf_gemm_mixed on B = W^T (W packed on the fly, block by block). */
int nf_sgemm_nt_mr(void);
int nf_sgemm_nt_nr(void);
void nf_sgemm_nt(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* W, long ldw, float* C,
                 long ldc, int accumulate, const nf_epilogue* ep, int nthreads);
void nf_sgemm_nt_block(long M, long N, long K, const float* A, long rs_a, long cs_a, const float* W, long ldw,
                       float* C, long ldc, long m0, long m1, long n0, long n1, int accumulate, const nf_epilogue* ep);
/* A and/or W in bfloat16 (a_bf16 / w_bf16 = 1: that operand is uint16_t bf16, else float32); float32
 * accumulation and output. bf16 W rows are converted to float32 per row block (into L1 scratch). */
void nf_gemm_nt_mixed(long M, long N, long K, const void* A, int a_bf16, long rs_a, long cs_a, const void* W,
                      int w_bf16, long ldw, float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);

/* ---- bfloat16 inputs, float32 accumulation and output ----
 * A is bf16 (converted while packing A); Bp comes from nf_sgemm_pack_b_bf16 (or _pack_b). */
void nf_gemm_bf16_packed(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const float* Bp,
                         float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);

/* ---- native bf16 matrix work (nf_gemm_bf16.cpp) ----
 * bf16 A and bf16 B with float32 accumulation and output run on bf16 dot-product hardware when the
 * CPU has it, chosen at run time: AMX-BF16 tiles (TDPBF16PS; Sapphire Rapids and later, with the Linux
 * tile permission requested once per process), else AVX512-BF16 (VDPBF16PS; Zen 4, Cooper Lake),
 * else the float32-conversion path above. nf_gemm_mixed and nf_gemm_nt_mixed take the native path
 * when both operands are bf16 and M >= 16; fewer rows take the decode path that streams the bf16
 * weight in place (nf_gemv.cpp: M <= 8, or <= 4 for a row-major B without AVX-512), else the
 * conversion path's dot-product kernel. */
enum nf_bf16_path { NF_BF16_CONVERT = 0, NF_BF16_AVX512 = 1, NF_BF16_AMX = 2 };
int nf_gemm_bf16_path(void);    /* the path bf16 products take now */
int nf_gemm_bf16_hw_path(void); /* the best path this CPU (and OS) allows */
/* Force a path (tests): at most the hardware's (a higher one is lowered to it); -1: the hardware's. */
void nf_gemm_set_bf16_path(int path);
/* Calls since the library was loaded (NF_BF16_COUNTS longs): counts[path] took that path (convert:
 * a bf16 operand converted to float32 while packing or staging), counts[NF_BF16_STREAMED] were
 * decode-sized products with a bf16 operand streamed in place (nf_gemv.cpp, converted in registers). */
enum { NF_BF16_STREAMED = 3, NF_BF16_COUNTS = 4 };
void nf_gemm_bf16_counts(long* counts);
/* B (bf16, B(k, n) = B[k*stride_k + n*stride_n]) in VNNI panels: 16 columns each, K rounded up to 32,
 * panel[kq*32 + 2j + h] = B(2kq + h, 16p + j), zero-padded; the same on every CPU (size in bf16 elements). */
long nf_gemm_vnni_size(long K, long N);
void nf_gemm_pack_b_vnni(long K, long N, const uint16_t* B, long stride_k, long stride_n, uint16_t* packed);
/* C = act(A @ B [+ C_old] + bias) + residual, A bf16 (any strides), Bp from nf_gemm_pack_b_vnni, on the
 * current bf16 path (the conversion path computes on the panels in plain C++: correct, slow). C == NULL
 * with a tile_fn as for nf_gemm_mixed. */
void nf_gemm_bf16_vnni_packed(long M, long N, long K, const uint16_t* A, long rs_a, long cs_a, const uint16_t* Bp,
                              float* C, long ldc, int accumulate, const nf_epilogue* ep, int nthreads);

/* Decode-sized products (nf_gemv.cpp): float32 A with at most 4 rows (nf_sgemm with row-major B: 8 on
 * AVX-512 builds) and float32 B read in place take the streaming path (one contiguous stream of B per
 * thread) in nf_sgemm_nt, nf_gemm_nt_mixed (both float32) and nf_sgemm (row-major B). 0 turns it off (tests compare both paths); returns the setting
 * it replaced. */
int nf_gemm_set_gemv(int on);

#ifdef __cplusplus
}
#endif
#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#endif /* NF_GEMM_H */
