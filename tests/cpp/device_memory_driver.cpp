// Driver of DeviceMemory (core/device_memory/device_memory.h), the per-device policy
// behind the CUDA allocator: stream uses and deferred frees, private pools,
// the capture rules, with several threads, on a SimDevice whose events
// complete when a thread says so and which throws on any call that would
// invalidate a CUDA graph capture. Pure C++17. Built and run under
// sanitizers by scripts/sanitize.sh, next to core_driver.
//
//   device_memory_driver [--quick] [--seed N] [NAME_SUBSTRING ...]
//
// The exit status is the number of failed checks (capped at 125); "N checks,
// 0 failures" is the last line of a clean run.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/out_of_memory.h"
#include "core/device_memory/device_memory.h"
#include "core/devices/sim_device.h"

#include "driver_checks.h"

using namespace torchmem;

namespace {

using namespace driver;


// Threads allocate on their own streams, record uses on others and free,
// while another thread completes events and another empties the cache.
void test_device_memory_streams_threads() {
  SimDevice dev(4 * GiB);
  dev.set_manual_events(true);
  DeviceMemory mem(dev, AllocatorConfig{});
  const int threads = 4;
  const int ops = scaled(3000, 300);
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(g_seed * 31 + t);
      std::vector<void*> live;
      const Stream own = 100 + t;
      for (int i = 0; i < ops; ++i) {
        if (live.empty() || (live.size() < 16 && rng() % 3 != 0)) {
          void* p = mem.allocate(512 + rng() % (4 * MiB), own);
          if (rng() % 4 == 0) CHECK(mem.record_stream(p, 200 + rng() % 3));
          live.push_back(p);
        } else {
          const size_t k = rng() % live.size();
          CHECK(mem.free(live[k]));
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (void* p : live) CHECK(mem.free(p));
    });
  }
  std::thread completer([&] {
    while (!done) {
      dev.complete_events(200);
      dev.complete_all_events();
      std::this_thread::yield();
    }
  });
  std::thread emptier([&] {
    while (!done) {
      mem.empty_cache();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (auto& w : workers) w.join();
  done = true;
  completer.join();
  emptier.join();
  INVARIANTS(mem);
  mem.empty_cache();
  CHECK(mem.pending_frees() == 0);
  CHECK(dev.live_events() == 0);
  const DeviceStats s = mem.stats();
  CHECK(s.allocated_bytes[kAggregate].current == 0);
  CHECK(s.active_bytes[kAggregate].current == 0);
  CHECK(s.reserved_bytes[kAggregate].current == 0);
}

// Threads route their streams to their own pools (as use_mem_pool), make
// MemPools and release them, while others allocate on the main allocator.
void test_device_memory_pools_threads() {
  SimDevice dev(4 * GiB);
  DeviceMemory mem(dev, AllocatorConfig{});
  const int threads = 4;
  const int rounds = scaled(200, 30);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(g_seed * 17 + t);
      const Stream own = 100 + t;
      for (int r = 0; r < rounds; ++r) {
        const PoolId id{uint64_t(t + 1), uint64_t(r)};
        mem.create_or_incref_pool(id);
        mem.begin_allocate_to_pool(id, [own](Stream s) { return s == own; }, /*capture=*/false);
        std::vector<void*> in_pool;
        for (int i = 0; i < 5; ++i) in_pool.push_back(mem.allocate(512 + rng() % MiB, own));
        void* outside = mem.allocate(4096, own + 50);
        mem.end_allocate_to_pool(id);
        CHECK(mem.release_pool(id));
        CHECK(mem.pool_use_count(id) == 1);
        if (rng() % 2) mem.empty_cache();
        CHECK(mem.free(outside));
        // ~MemPool: none of these may throw.
        CHECK(mem.set_use_on_oom(id, false));
        CHECK(mem.release_pool(id));
        mem.empty_pool_cache(id);
        for (void* p : in_pool) CHECK(mem.free(p));
      }
    });
  }
  for (auto& w : workers) w.join();
  INVARIANTS(mem);
  CHECK(mem.pool_count() == 0);
  mem.empty_cache();
  CHECK(mem.stats().reserved_bytes[kAggregate].current == 0);
}

// While a capture is underway the device raises on any call that would
// invalidate it: threads keep allocating, recording uses and freeing.
void test_device_memory_capture_threads() {
  SimDevice dev(4 * GiB);
  dev.set_manual_events(true);
  DeviceMemory mem(dev, AllocatorConfig::parse("expandable_segments:True"));
  const PoolId graph{7, 0};
  std::vector<void*> before;
  for (int i = 0; i < 20; ++i) before.push_back(mem.allocate(MiB * (1 + i % 3), 5));
  for (size_t i = 0; i < before.size(); i += 2) mem.record_stream(before[i], 6);
  mem.begin_allocate_to_pool(graph, [](Stream s) { return s == 9; }, /*capture=*/true);
  dev.set_capturing(true);
  std::vector<std::thread> workers;
  std::mutex before_mutex;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(g_seed * 7 + t);
      for (int i = 0; i < scaled(500, 60); ++i) {
        const Stream stream = (t == 0) ? 9 : 5;  // thread 0 allocates to the graph's pool
        void* p = mem.allocate(512 + rng() % (2 * MiB), stream);
        if (rng() % 3 == 0) mem.record_stream(p, 6);
        CHECK(mem.free(p));
        if (rng() % 50 == 0) mem.empty_cache();
        std::lock_guard<std::mutex> lock(before_mutex);
        if (!before.empty() && rng() % 10 == 0) {
          CHECK(mem.free(before.back()));
          before.pop_back();
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  CHECK(dev.events_recorded() == 0);
  dev.set_capturing(false);
  mem.end_allocate_to_pool(graph);
  CHECK(mem.release_pool(graph));
  for (void* p : before) CHECK(mem.free(p));
  dev.complete_all_events();
  mem.empty_cache();
  INVARIANTS(mem);
  CHECK(mem.pending_frees() == 0 && mem.pool_count() == 0);
  CHECK(mem.stats().reserved_bytes[kAggregate].current == 0);
}

// Out of memory with frees pending: the retry waits for them (no OOM); when
// even that fails, one OOM is counted.
void test_device_memory_oom_counted_once() {
  SimDevice dev(64 * MiB);
  dev.set_manual_events(true);
  DeviceMemory mem(dev, AllocatorConfig{});
  void* p = mem.allocate(40 * MiB, 1);
  mem.record_stream(p, 2);
  mem.free(p);
  void* q = mem.allocate(40 * MiB, 1);
  CHECK(mem.stats().num_ooms == 0);
  CHECK(dev.synchronizations() == 1);
  CHECK_THROWS(OutOfMemory, mem.allocate(40 * MiB, 1));
  CHECK(mem.stats().num_ooms == 1);
  mem.free(q);
  INVARIANTS(mem);
}

const Test kTests[] = {
    {"device_memory_streams_threads", test_device_memory_streams_threads},
    {"device_memory_pools_threads", test_device_memory_pools_threads},
    {"device_memory_capture_threads", test_device_memory_capture_threads},
    {"device_memory_oom_counted_once", test_device_memory_oom_counted_once},
};

}  // namespace

int main(int argc, char** argv) { return driver::run_tests(argc, argv, kTests); }
