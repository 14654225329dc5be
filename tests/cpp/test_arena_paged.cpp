// C++ tests for the arena, the block pool, the pmr adapters and
// aligned_allocator. A plain driver: every check prints on failure, the exit
// status is the number of failed checks. Built and run by
// tests/allocator/test_arena_cpp.py (or by hand, see that file for the command).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/allocators/aligned_allocator.h"
#include "core/allocators/arena.h"
#include "core/allocators/memory_resource.h"
#include "core/allocators/paged_block_pool.h"
#include "core/devices/host_device.h"
#include "core/devices/sim_device.h"

using namespace torchmem;

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    ++checks;                                                              \
    if (!(cond)) {                                                         \
      ++failures;                                                          \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
    }                                                                      \
  } while (0)

template <typename E, typename F>
static bool throws(F&& f) {
  try {
    f();
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

static bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// A minimal Allocator to stand in for the fallback: counts calls.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(size_t size, Stream) override {
    if (size == 0) return nullptr;
    ++allocs;
    void* p = ::operator new(size, std::align_val_t(64));
    live.push_back(p);
    return p;
  }
  void deallocate(void* p) override {
    if (!p) return;
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i] == p) {
        live.erase(live.begin() + i);
        ::operator delete(p, std::align_val_t(64));
        ++frees;
        return;
      }
    throw std::invalid_argument("CountingAllocator: unknown pointer");
  }
  bool owns(const void* p) const override {
    for (void* q : live)
      if (q == p) return true;
    return false;
  }
  std::vector<void*> live;
  int allocs = 0, frees = 0;
};

static void test_arena_basics() {
  HostDevice device;
  Arena arena(device, {1 << 20});
  CHECK(arena.capacity() == (1u << 20));
  CHECK(arena.used() == 0);
  CHECK(arena.allocate(0) == nullptr);
  void* a = arena.allocate(100);
  void* b = arena.allocate(1);
  CHECK(aligned(a, 64) && aligned(b, 64));
  CHECK(static_cast<char*>(b) - static_cast<char*>(a) == 128);  // 100 rounded to 64
  CHECK(arena.used() == 129);
  std::memset(a, 1, 100);
  void* c = arena.allocate_aligned(10, 4096);
  CHECK(aligned(c, 4096));
  void* d = arena.allocate_aligned(3, 1);
  CHECK(static_cast<char*>(d) == static_cast<char*>(c) + 10);
  CHECK(arena.owns(a) && arena.owns(d) && !arena.owns(static_cast<char*>(a) + 1));
  CHECK(arena.live_allocations() == 4);
  arena.check_invariants();
  const size_t used = arena.used();
  arena.deallocate(b);  // frees nothing
  CHECK(arena.used() == used);
  CHECK(arena.live_allocations() == 3);
  CHECK(!arena.owns(b));
  CHECK(throws<std::invalid_argument>([&] { arena.deallocate(b); }));             // double free
  CHECK(throws<std::invalid_argument>([&] { arena.deallocate(static_cast<char*>(a) + 8); }));  // interior
  int on_stack;
  CHECK(throws<std::invalid_argument>([&] { arena.deallocate(&on_stack); }));     // foreign
  CHECK(arena.live_allocations() == 3);
  arena.check_invariants();
  CHECK(throws<std::invalid_argument>([&] { arena.allocate_aligned(8, 48); }));
  arena.reset();
  CHECK(arena.used() == 0 && arena.peak() == used && arena.live_allocations() == 0);
  CHECK(arena.allocate(8) == a);  // the region is reused from the start
  arena.reset_peak();
  CHECK(arena.peak() == 8);
  arena.check_invariants();
}

static void test_arena_oom_and_fallback() {
  HostDevice device;
  {
    Arena arena(device, {4096});
    arena.allocate(4000);
    bool caught = false;
    try {
      arena.allocate(200);
    } catch (const OutOfMemory& e) {
      caught = true;
      CHECK(std::string(e.what()).find("Arena out of memory") != std::string::npos);
      CHECK(e.info().requested == 200);
      CHECK(e.info().reserved == 4096);
    }
    CHECK(caught);
    CHECK(arena.used() == 4000);  // unchanged
    arena.check_invariants();
  }
  {
    CountingAllocator fallback;
    Arena arena(device, {4096, 64, &fallback});
    void* a = arena.allocate(4000);
    void* b = arena.allocate(500);  // beyond capacity
    void* c = arena.allocate_aligned(100, 1024);
    CHECK(fallback.allocs == 2 && aligned(c, 1024));
    CHECK(arena.owns(b) && arena.owns(c) && arena.owns(a));
    ArenaStats s = arena.stats();
    CHECK(s.fallback_allocations == 2 && s.fallback_bytes == 600 && s.fallback_live == 2);
    CHECK(s.live_allocations == 3);
    arena.check_invariants();
    arena.deallocate(b);
    CHECK(fallback.frees == 1);
    arena.reset();  // returns c to the fallback
    CHECK(fallback.frees == 2 && fallback.live.empty());
    arena.check_invariants();
  }
  {
    SimDevice sim(1 << 20);
    CHECK(throws<OutOfMemory>([&] { Arena big(sim, {2 << 20}); }));
    Arena arena(sim, {1 << 20});
    CHECK(sim.free_bytes() == 0);
    void* p = arena.allocate(1000);  // an address only: never touched
    CHECK(arena.owns(p));
  }
  {
    SimDevice sim(1 << 20);
    { Arena arena(sim, {1 << 20}); }
    CHECK(sim.free_bytes() == (1u << 20));  // region returned
    CHECK(sim.live_segments() == 0);
  }
}

static void test_arena_rewind_and_holes() {
  HostDevice device;
  Arena arena(device, {1 << 16});
  char* a = static_cast<char*>(arena.allocate(64));
  char* b = static_cast<char*>(arena.allocate(64));
  arena.deallocate(a);                   // behind the cursor: reused from the next rewind
  CHECK(arena.used() == 128);
  CHECK(arena.rewind() == 1);            // b is live: it becomes a hole
  CHECK(arena.used() == 0 && arena.stats().hole_bytes == 64 && arena.stats().block_peak == 128);
  char* c = static_cast<char*>(arena.allocate(64));
  CHECK(c == a);                         // a's bytes again
  char* d = static_cast<char*>(arena.allocate(64));
  CHECK(d == b + 64);                    // the cursor skipped b
  CHECK(arena.stats().block_holes_skipped == 1);
  arena.deallocate(d);                   // the newest: the cursor comes back to c's end
  CHECK(arena.used() == 64);
  arena.deallocate(b);                   // a hole ahead of the cursor: no longer skipped
  char* e = static_cast<char*>(arena.allocate(64));
  CHECK(e == b && arena.stats().block_holes_skipped == 1);  // no new jump
  arena.check_invariants();
  arena.deallocate(c);
  arena.deallocate(e);                   // nothing live: the cursor is back at the start
  CHECK(arena.used() == 0 && arena.live_allocations() == 0 && arena.stats().holes == 0);
  arena.check_invariants();

  // A wrap: at the region's end, bytes freed behind the cursor are found again.
  Arena small(device, {4096});
  void* p[4];
  for (auto& q : p) q = small.allocate(1024);
  small.deallocate(p[1]);
  small.deallocate(p[2]);
  void* w = small.allocate(2048);        // does not fit ahead; 2 KiB freed behind
  CHECK(w == p[1] && small.stats().wraps == 1 && small.stats().holes == 2);
  CHECK(throws<OutOfMemory>([&] { small.allocate(64); }));  // full, nothing freed since the wrap
  small.check_invariants();
  for (void* q : {p[0], p[3], w}) small.deallocate(q);
  CHECK(small.live_allocations() == 0 && small.used() == 0);

  // Many allocations, freed in random order: tracking stays consistent.
  std::vector<void*> ptrs;
  for (int i = 0; i < 500; ++i) ptrs.push_back(arena.allocate(8));
  std::mt19937 rng(1);
  std::shuffle(ptrs.begin(), ptrs.end(), rng);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    arena.deallocate(ptrs[i]);
    if (i % 50 == 0) arena.check_invariants();
  }
  CHECK(arena.live_allocations() == 0);
}

static void test_pmr_and_aligned_allocator() {
  HostDevice device;
  Arena arena(device, {1 << 20});
  {
    ArenaResource resource(arena);
    std::pmr::vector<int> v(&resource);
    for (int i = 0; i < 1000; ++i) v.push_back(i);
    CHECK(v[999] == 999);
    CHECK(arena.owns(v.data()));
    std::pmr::vector<double> w(&resource);
    w.resize(10);
    CHECK(arena.owns(w.data()));
    void* p = resource.allocate(24, 256);
    CHECK(aligned(p, 256));
    resource.deallocate(p, 24, 256);
  }
  CHECK(arena.live_allocations() == 0);  // containers gave everything back
  arena.reset();
  {
    CountingAllocator base;
    AllocatorResource resource(base);
    {
      std::pmr::vector<float> v(&resource);
      v.assign(100, 1.0f);
      CHECK(base.owns(v.data()));
      void* p = resource.allocate(10, 512);
      CHECK(aligned(p, 512));
      resource.deallocate(p, 10, 512);
    }
    CHECK(base.live.empty() && base.allocs == base.frees);
  }
  {
    AllocatorResource over_arena(arena);  // the generic adapter works on an arena too
    std::pmr::string s("a string long enough to leave the small-string buffer", &over_arena);
    CHECK(arena.owns(s.data()));
  }
  std::vector<float, aligned_allocator<float, 64>> v;
  bool all_aligned = true;
  for (int i = 0; i < 10000; ++i) {
    v.push_back(static_cast<float>(i));
    all_aligned = all_aligned && aligned(v.data(), 64);
  }
  CHECK(all_aligned);
  std::vector<double, aligned_allocator<double, 4096>> page(3);
  CHECK(aligned(page.data(), 4096));
  using Rebound = std::allocator_traits<aligned_allocator<float, 128>>::rebind_alloc<char>;
  static_assert(Rebound::alignment == 128, "rebind keeps the alignment");
}

static void test_block_pool_scenario() {
  // The scenario on an 8-block pool.
  PagedBlockPool pool(8);
  BlockId a[3];
  pool.allocate_n(3, a);
  CHECK(a[0] == 0 && a[1] == 1 && a[2] == 2 && pool.num_free() == 5);
  pool.retain_n(a, 3);  // B forks from A
  CHECK(pool.ref_count(0) == 2 && pool.ref_count(2) == 2 && pool.num_free() == 5);
  BlockId b[3] = {a[0], a[1], a[2]};
  int copied = 0;
  b[2] = pool.make_writable(b[2], [&](BlockId src, BlockId dst) {
    CHECK(src == 2 && dst == 3);
    ++copied;
  });
  CHECK(copied == 1 && b[0] == 0 && b[1] == 1 && b[2] == 3 && pool.num_free() == 4);
  CHECK(pool.ref_count(2) == 1);
  CHECK(pool.make_writable(b[2], [&](BlockId, BlockId) { ++copied; }) == 3 && copied == 1);
  pool.check_invariants();
  pool.release_n(a, 3);  // A ends
  CHECK(pool.num_free() == 5);
  pool.release_n(b, 3);  // B ends
  CHECK(pool.num_free() == 8);
  pool.check_invariants();
}

static void test_block_pool_errors() {
  PagedBlockPool pool(4);
  const BlockId x = pool.allocate();
  CHECK(throws<std::invalid_argument>([&] { pool.release(7); }));
  CHECK(throws<std::invalid_argument>([&] { pool.release(-1); }));
  CHECK(throws<std::invalid_argument>([&] { pool.release(3); }));  // free block
  pool.release(x);
  CHECK(throws<std::invalid_argument>([&] { pool.release(x); }));  // twice
  CHECK(throws<std::invalid_argument>([&] { pool.retain(x); }));
  BlockId ids[2];
  pool.allocate_n(2, ids);
  const BlockId twice[3] = {ids[0], ids[1], ids[0]};  // ids[0] has one reference
  CHECK(throws<std::invalid_argument>([&] { pool.release_n(twice, 3); }));
  CHECK(pool.ref_count(ids[0]) == 1 && pool.ref_count(ids[1]) == 1 && pool.num_free() == 2);
  const BlockId bad[2] = {ids[1], 99};
  CHECK(throws<std::invalid_argument>([&] { pool.release_n(bad, 2); }));
  CHECK(pool.ref_count(ids[1]) == 1);
  pool.check_invariants();
  BlockId more[3];
  CHECK(throws<OutOfBlocks>([&] { pool.allocate_n(3, more); }));
  CHECK(!pool.try_allocate_n(3, more));
  CHECK(pool.num_free() == 2);
  CHECK(throws<OutOfMemory>([&] { pool.allocate_n(3, more); }));  // OutOfBlocks is an OutOfMemory
  pool.allocate_n(2, more);
  CHECK(pool.try_allocate() == kNoBlock);
  CHECK(throws<OutOfBlocks>([&] { pool.allocate(); }));
  pool.retain(more[0]);
  CHECK(throws<OutOfBlocks>([&] { pool.make_writable(more[0], [](BlockId, BlockId) {}); }));
  CHECK(pool.ref_count(more[0]) == 2);
  // A copy that throws leaves the pool unchanged.
  pool.release(more[1]);
  const int32_t free_before = pool.num_free();
  CHECK(throws<std::runtime_error>(
      [&] { pool.make_writable(more[0], [](BlockId, BlockId) { throw std::runtime_error("copy failed"); }); }));
  CHECK(pool.num_free() == free_before && pool.ref_count(more[0]) == 2);
  pool.check_invariants();
  CHECK(throws<std::invalid_argument>([] { PagedBlockPool empty(0); }));
}

static void test_block_pool_step_and_prefix_cache() {
  PagedBlockPool pool(6);
  BlockId a = pool.allocate();
  pool.retain(a);
  pool.retain(a);  // three holders
  BlockId last[3] = {a, a, a};
  BlockId fresh[1];
  std::vector<PagedBlockPool::Copy> copies;
  pool.allocate_and_make_writable(1, fresh, last, 3, &copies);
  CHECK(copies.size() == 2 && last[2] == a && last[0] != a && last[1] != a);
  CHECK(pool.ref_count(a) == 1 && pool.num_free() == 2);
  pool.check_invariants();
  BlockId last2[2] = {last[0], last[1]};
  pool.retain(last2[0]);
  BlockId fresh2[2];
  copies.clear();
  CHECK(throws<OutOfBlocks>([&] { pool.allocate_and_make_writable(2, fresh2, last2, 2, &copies); }));
  CHECK(copies.empty() && pool.num_free() == 2 && pool.ref_count(last2[0]) == 2);
  pool.check_invariants();

  // Prefix cache: parked blocks count as free, revive on a hit, evict LRU.
  PagedBlockPool cache(4);
  BlockId s[3];
  cache.allocate_n(3, s);
  CHECK(cache.set_hash(s[0], 100) && cache.set_hash(s[1], 101) && cache.set_hash(s[2], 102));
  CHECK(!cache.set_hash(s[2], 100));  // held by s[0]
  CHECK(throws<std::invalid_argument>([&] { cache.set_hash(s[2], 555); }));
  cache.release_n(s, 3);  // parked in order 0, 1, 2
  CHECK(cache.num_free() == 4 && cache.num_parked() == 3);
  cache.check_invariants();
  CHECK(cache.acquire_cached(101) == s[1] && cache.ref_count(s[1]) == 1 && cache.num_parked() == 2);
  CHECK(cache.acquire_cached(999) == kNoBlock);
  CHECK(cache.allocate() == 3);  // the free stack first
  CHECK(cache.allocate() == s[0]);  // then the least recently parked
  CHECK(cache.lookup(100) == kNoBlock && cache.lookup(102) == s[2]);
  CHECK(cache.stats().evictions == 1 && cache.stats().cache_hits == 1);
  cache.check_invariants();
}

static void test_block_pool_random() {
  std::mt19937 rng(7);
  PagedBlockPool pool(32);
  std::vector<int32_t> refs(32, 0);
  std::vector<BlockId> held;
  for (int step = 0; step < 20000; ++step) {
    const int op = rng() % 4;
    if (op == 0) {
      const BlockId id = pool.try_allocate();
      if (id != kNoBlock) {
        CHECK(refs[id] == 0);
        refs[id] = 1;
        held.push_back(id);
      } else {
        CHECK(held.size() == 32 || pool.num_free() == 0);
      }
    } else if (op == 1 && !held.empty()) {
      const size_t i = rng() % held.size();
      pool.retain(held[i]);
      ++refs[held[i]];
      held.push_back(held[i]);
    } else if (op == 2 && !held.empty()) {
      const size_t i = rng() % held.size();
      pool.release(held[i]);
      --refs[held[i]];
      held.erase(held.begin() + i);
    } else if (op == 3 && !held.empty()) {
      const size_t i = rng() % held.size();
      const BlockId before = held[i];
      BlockId copied_to = kNoBlock;
      try {
        const BlockId after = pool.make_writable(before, [&](BlockId src, BlockId dst) {
          CHECK(src == before);
          copied_to = dst;
        });
        if (refs[before] == 1) {
          CHECK(after == before && copied_to == kNoBlock);
        } else {
          CHECK(after == copied_to && refs[after] == 0);
          --refs[before];
          refs[after] = 1;
          held[i] = after;
        }
      } catch (const OutOfBlocks&) {
        CHECK(refs[before] > 1 && pool.num_free() == 0);
      }
    }
    if (step % 1000 == 0) pool.check_invariants();
    int32_t used = 0;
    for (int32_t r : refs) used += r > 0;
    if (used != pool.num_used()) {
      CHECK(used == pool.num_used());
      break;
    }
  }
}

int main() {
  test_arena_basics();
  test_arena_oom_and_fallback();
  test_arena_rewind_and_holes();
  test_pmr_and_aligned_allocator();
  test_block_pool_scenario();
  test_block_pool_errors();
  test_block_pool_step_and_prefix_cache();
  test_block_pool_random();
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
