// torchmem from C++: a per-step arena, std::pmr containers drawing from it,
// an aligned std::vector, and a paged block pool with fork and copy-on-write.
//
// Build and run from the repository root (no torch needed):
//   g++ -O2 -std=c++17 -Icsrc examples/cpp/arena_and_pool.cpp csrc/core/arena.cpp
//       csrc/core/block_pool.cpp csrc/core/host_device.cpp csrc/core/sim_device.cpp
//       csrc/core/fork_safety.cpp -pthread -o /tmp/arena_and_pool && /tmp/arena_and_pool
#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <vector>

#include "core/aligned_allocator.h"
#include "core/arena.h"
#include "core/block_pool.h"
#include "core/host_device.h"
#include "core/memory_resource.h"

using namespace torchmem;

int main() {
  // 1. Scratch memory per step: one 8 MiB region; each step starts a pass
  //    with rewind(), which reuses every byte no live allocation holds.
  HostDevice device;
  Arena arena(device, {8u << 20});
  ArenaResource resource(arena);
  std::pmr::vector<int> kept(&resource);  // outlives its step: a hole later passes skip
  for (int step = 0; step < 3; ++step) {
    const size_t holes = arena.rewind();
    {
      std::pmr::vector<float> activations(&resource);
      activations.resize(100000, 1.0f);  // growth reallocates inside the arena
      float* scratch = static_cast<float*>(arena.allocate(4096 * sizeof(float)));
      std::memset(scratch, 0, 4096 * sizeof(float));
      std::printf("step %d: %zu holes at the start, cursor at %zu bytes, %zu live allocations\n", step, holes,
                  arena.used(), arena.live_allocations());
      arena.deallocate(scratch);
      if (step == 0) kept.assign(1000, 7);
    }  // the vectors give their storage back here
  }
  std::printf("kept[0] = %d, %zu bytes held by it\n", kept[0], arena.stats().hole_bytes);
  std::printf("peak %zu bytes\n", arena.peak());

  // 2. 64-byte alignment kept through every reallocation.
  std::vector<float, aligned_allocator<float, 64>> simd;
  for (int i = 0; i < 1000; ++i) simd.push_back(static_cast<float>(i));
  std::printf("aligned vector data %% 64 = %zu\n", reinterpret_cast<uintptr_t>(simd.data()) % 64);

  // 3. A paged KV cache's bookkeeping: 8 blocks of pages stored elsewhere.
  std::vector<std::vector<float>> pages(8, std::vector<float>(16, 0.0f));
  PagedBlockPool pool(8);
  BlockId a[3];
  pool.allocate_n(3, a);  // sequence A: blocks 0 1 2
  pool.retain_n(a, 3);    // B forks from A: every block shared
  BlockId b[3] = {a[0], a[1], a[2]};
  b[2] = pool.make_writable(b[2], [&](BlockId src, BlockId dst) { pages[dst] = pages[src]; });
  pages[b[2]][5] = 42.0f;  // B writes its own copy; A's page is untouched
  std::printf("A = [%d %d %d], B = [%d %d %d], free %d, A's page %g, B's page %g\n", a[0], a[1], a[2], b[0], b[1],
              b[2], pool.num_free(), pages[a[2]][5], pages[b[2]][5]);
  pool.release_n(a, 3);
  pool.release_n(b, 3);
  pool.check_invariants();
  std::printf("all %d blocks free again\n", pool.num_free());
  return 0;
}
