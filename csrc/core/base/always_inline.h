// TORCHMEM_ALWAYS_INLINE: for the steps of the caching allocator's hot path
// (a cached malloc and free), which -O2's heuristics would otherwise leave
// as calls, each with its register saves and restores (with them inlined, a
// cached malloc+free pair of bench_malloc.py's bert mix takes 595
// instructions instead of 726: benchmarks/bench_malloc.py --instructions).
// Only for small functions called from a few places.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TORCHMEM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define TORCHMEM_ALWAYS_INLINE inline
#endif
