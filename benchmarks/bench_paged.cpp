// Micro-benchmarks of the block pool and the arena, one thread, std::chrono.
// Built and run by benchmarks/bench_paged.py, which passes all of
// csrc/core/*.cpp (the caching allocator is the arena's comparison).
// Output: one "name value unit" line per figure.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/allocators/arena.h"
#include "core/allocators/paged_block_pool.h"
#ifndef TORCHMEM_BENCH_NO_CACHING
#include "core/policy/native/caching_allocator.h"
#endif
#include "core/devices/host_device.h"

using namespace torchmem;
using Clock = std::chrono::steady_clock;

static volatile uint64_t sink;

template <typename F>
static double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

int main() {
  const int repeats = 5;

  // 1. allocate + release one block at a time.
  {
    PagedBlockPool pool(4096);
    const int64_t n = 20'000'000;
    const double s = best_seconds(repeats, [&] {
      uint64_t acc = 0;
      for (int64_t i = 0; i < n; ++i) {
        const BlockId id = pool.allocate();
        acc += static_cast<uint64_t>(id);
        pool.release(id);
      }
      sink = acc;
    });
    std::printf("block_pool_single_ops_per_s %.1f Mops/s\n", 2.0 * n / s / 1e6);
    std::printf("block_pool_single_pair_ns %.2f ns\n", s / n * 1e9);
  }

  // 2. a working set: allocate 64 blocks (one call), release them (one call).
  {
    PagedBlockPool pool(4096);
    std::vector<BlockId> ids(64);
    const int64_t rounds = 500'000;
    const double s = best_seconds(repeats, [&] {
      uint64_t acc = 0;
      for (int64_t r = 0; r < rounds; ++r) {
        pool.allocate_n(ids.size(), ids.data());
        acc += static_cast<uint64_t>(ids[0]);
        pool.release_n(ids.data(), ids.size());
      }
      sink = acc;
    });
    std::printf("block_pool_batch64_ops_per_s %.1f Mops/s\n", 2.0 * rounds * 64 / s / 1e6);
  }

  // 3. a decode step at batch 64 with copy-on-write bookkeeping: 64 partial
  //    last blocks made writable (half shared), 4 fresh blocks.
  {
    PagedBlockPool pool(4096);
    std::vector<BlockId> last(64), fresh(4), work(64);
    pool.allocate_n(last.size(), last.data());
    std::vector<PagedBlockPool::Copy> copies;
    const int64_t rounds = 200'000;
    const double s = best_seconds(repeats, [&] {
      for (int64_t r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < last.size(); i += 2) pool.retain(last[i]);  // shared by a fork
        work = last;
        copies.clear();
        pool.allocate_and_make_writable(fresh.size(), fresh.data(), work.data(), work.size(), &copies);
        for (size_t i = 0; i < work.size(); i += 2) pool.release(work[i]);  // the forks end
        pool.release_n(fresh.data(), fresh.size());
      }
      sink = copies.size();
    });
    std::printf("block_pool_step64_us %.3f us/step\n", s / rounds * 1e6);
  }

  // 4. arena vs caching allocator: steps of 256 allocations of mixed sizes
  //    (64 B .. 64 KiB); the arena resets per step, the caching allocator
  //    frees each block.
  {
    const int per_step = 256;
    std::vector<size_t> sizes(per_step);
    uint64_t x = 88172645463325252ull;
    for (auto& sz : sizes) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      sz = 64u << (x % 11);  // 64 B .. 64 KiB
    }
    std::vector<void*> ptrs(per_step);
    const int steps = 20'000;
    HostDevice device;
    Arena arena(device, {64u << 20});
    const double arena_s = best_seconds(repeats, [&] {
      for (int st = 0; st < steps; ++st) {
        for (int i = 0; i < per_step; ++i) ptrs[i] = arena.allocate(sizes[i]);
        for (int i = 0; i < per_step; ++i) arena.deallocate(ptrs[i]);  // as tensors die: no-ops
        arena.reset();
      }
      sink = reinterpret_cast<uintptr_t>(ptrs[0]);
    });
    const double arena_bump_s = best_seconds(repeats, [&] {
      for (int st = 0; st < steps; ++st) {
        for (int i = 0; i < per_step; ++i) ptrs[i] = arena.allocate(sizes[i]);
        arena.reset();
      }
      sink = reinterpret_cast<uintptr_t>(ptrs[0]);
    });
    const double n = static_cast<double>(steps) * per_step;
    std::printf("arena_alloc_free_per_s %.1f M/s\n", n / arena_s / 1e6);
    std::printf("arena_alloc_reset_only_per_s %.1f M/s\n", n / arena_bump_s / 1e6);
#ifndef TORCHMEM_BENCH_NO_CACHING
    CachingAllocator caching(device);
    const double caching_s = best_seconds(repeats, [&] {
      for (int st = 0; st < steps; ++st) {
        for (int i = 0; i < per_step; ++i) ptrs[i] = caching.allocate(sizes[i]);
        for (int i = 0; i < per_step; ++i) caching.deallocate(ptrs[i]);
      }
      sink = reinterpret_cast<uintptr_t>(ptrs[0]);
    });
    std::printf("caching_alloc_free_per_s %.1f M/s\n", n / caching_s / 1e6);
#endif
  }
  return 0;
}
