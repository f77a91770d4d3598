/* nf_gemm_internal.h — what the library's translation units share (hidden symbols, not API).
 *
 * Invariant: the cache sizes every blocking decision is derived from live in one place
 * (nf_gemm.cpp's blocking parameters, set by nf_gemm_set_cache_sizes or sysconf).
 */
#ifndef NF_GEMM_INTERNAL_H
#define NF_GEMM_INTERNAL_H

namespace nfi {
long l1d_bytes();  // L1 data cache, bytes
long l2_bytes();   // L2 cache (per core), bytes
}  // namespace nfi

#endif /* NF_GEMM_INTERNAL_H */
