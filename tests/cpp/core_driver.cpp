// Reliability driver of the core: the caching allocator (host and sim
// devices, fixed and expandable segments), the arena, the paged block pool,
// the planner, the replayer and the planned slab, driven through random operation sequences,
// several threads, fork() while threads allocate, and injected device failures (tests/cpp/faulty_device.h), with
// the invariant checks of each component after every operation. Pure C++17:
// no Python, no torch. Built and run under sanitizers by scripts/sanitize.sh.
//
//   core_driver [--quick] [--seed N] [--list] [NAME_SUBSTRING ...]
//
// --quick (or TORCHMEM_QUICK=1) shrinks every loop for CI. The exit status is
// the number of failed checks (capped at 125); "N checks, 0 failures" is the
// last line of a clean run.
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/sync/fast_mutex.h"
#include "core/allocators/arena.h"
#include "core/allocators/paged_block_pool.h"
#include "core/policy/native/caching_allocator.h"
#include "core/base/device_allocator.h"
#include "faulty_device.h"
#include "core/sync/fork_safety.h"
#include "core/devices/host_device.h"
#include "core/allocators/memory_resource.h"
#include "core/base/oom_observers.h"
#include "core/allocators/planned_slab.h"
#include "core/planner/buffers.h"
#include "core/planner/lower_bound.h"
#include "core/planner/pipeline/pipeline.h"
#include "core/planner/pipeline/pipeline_unroll.h"
#include "core/planner/planner.h"
#include "core/planner/scheduling.h"
#include "core/planner/pipeline/stage_cut.h"
#include "core/planner/streams/stream_liveness.h"
#include "core/planner/streams/stream_planner.h"
#include "core/planner/streams/streams.h"
#include "core/planner/validate.h"
#include "core/allocators/recording_allocator.h"
#include "core/planner/streams/validate_streams.h"
#include "core/replay/replayer.h"
#include "core/devices/sim_device.h"

#include "device_checks.h"
#include "driver_checks.h"

using namespace torchmem;

namespace {

using namespace driver;

struct LiveBlock {
  size_t size;
  uint8_t tag;
};

// Live blocks by address: the reference model. Insert checks overlap.
struct LiveSet {
  std::map<uintptr_t, LiveBlock> blocks;
  size_t requested = 0;

  bool insert(uintptr_t p, size_t size, uint8_t tag) {
    auto next = blocks.lower_bound(p);
    if (next != blocks.end() && next->first < p + size) return false;
    if (next != blocks.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > p) return false;
    }
    blocks.emplace(p, LiveBlock{size, tag});
    requested += size;
    return true;
  }
  std::pair<uintptr_t, LiveBlock> take(size_t index) {
    auto it = blocks.begin();
    std::advance(it, index % blocks.size());
    auto out = *it;
    requested -= it->second.size;
    blocks.erase(it);
    return out;
  }
};

size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 1 + rng() % 4096;             // small pool, sub-page
    case 1: return 1 + rng() % (2 * MiB);        // around the small/large boundary
    case 2: return MiB + rng() % (9 * MiB);      // 20 MiB segments
    default: return 10 * MiB + rng() % (30 * MiB);  // rounded-to-2 MiB segments
  }
}

// ---------------------------------------------------------------------------
// Caching allocator

enum class Kind { kSim, kHost };

std::unique_ptr<Device> make_device(Kind kind, size_t capacity) {
  if (kind == Kind::kHost) return std::make_unique<HostDevice>(capacity);
  return std::make_unique<SimDevice>(capacity);
}

void check_stats_match(const DeviceAllocator& a, const LiveSet& live) {
  const DeviceStats s = a.stats();
  CHECK(s.allocation[kAggregate].current == static_cast<int64_t>(live.blocks.size()));
  CHECK(s.requested_bytes[kAggregate].current == static_cast<int64_t>(live.requested));
  CHECK(s.reserved_bytes[kAggregate].current >= s.allocated_bytes[kAggregate].current);
  CHECK(s.allocated_bytes[kAggregate].current >= s.requested_bytes[kAggregate].current);
  CHECK(s.allocation[kAggregate].current == s.allocation[kSmallPool].current + s.allocation[kLargePool].current);
  CHECK(s.reserved_bytes[kAggregate].peak >= s.reserved_bytes[kAggregate].current);
}

// Random malloc/free/empty_cache on one allocator (the config's policy:
// native or stitch); faults optional.
void caching_random(Kind kind, const std::string& conf, double fault_probability, uint64_t seed) {
  const size_t capacity = kind == Kind::kHost ? 384 * MiB : 1 * GiB;
  auto inner = make_device(kind, capacity);
  FaultyDevice dev(*inner);
  if (fault_probability > 0) dev.fail_randomly(fault_probability, seed);
  std::mt19937_64 rng(seed);
  LiveSet live;
  {
    std::shared_ptr<DeviceAllocator> owner = make_device_allocator(dev, AllocatorConfig::parse(conf));
    DeviceAllocator& a = *owner;
    const int steps = scaled(2500, 400);
    for (int step = 0; step < steps; ++step) {
      const unsigned op = rng() % 10;
      if (op < 5 || live.blocks.empty()) {
        const size_t size = random_size(rng);
        const Stream stream = rng() % 4 == 0 ? 1 : 0;
        void* p = nullptr;
        try {
          p = a.allocate(size, stream);
        } catch (const OutOfMemory& e) {
          CHECK_MSG(contains(e.what(), "out of memory") && contains(e.what(), "Tried to allocate"), e.what());
          CHECK(e.info().requested == size);
          INVARIANTS(a);
          if (dev.injected_failures() > 0 && dev.free_bytes() > 2 * size + 64 * MiB) {
            // The failure was injected and the device has room: the next request succeeds.
            dev.disarm();
            try {
              p = a.allocate(size, stream);
            } catch (const OutOfMemory& e2) {
              report_failure(__FILE__, __LINE__, std::string("request after an injected failure: ") + e2.what());
            }
            if (fault_probability > 0) dev.fail_randomly(fault_probability, seed + step);
          }
          if (!p) continue;
        }
        const auto addr = reinterpret_cast<uintptr_t>(p);
        CHECK(addr % 512 == 0);
        const uint8_t tag = static_cast<uint8_t>(1 + rng() % 250);
        CHECK_MSG(live.insert(addr, size, tag), "a new block overlaps a live one");
        if (kind == Kind::kHost) fill(addr, size, tag);
      } else if (op < 9) {
        auto [addr, b] = live.take(rng());
        if (kind == Kind::kHost) CHECK_MSG(intact(addr, b.size, b.tag), "a live block was overwritten");
        a.deallocate(reinterpret_cast<void*>(addr));
      } else {
        a.empty_cache();
      }
      INVARIANTS(a);
      check_stats_match(a, live);
      CHECK(static_cast<size_t>(a.stats().reserved_bytes[kAggregate].current) <= capacity);
    }
    dev.disarm();
    while (!live.blocks.empty()) {
      auto [addr, b] = live.take(0);
      if (kind == Kind::kHost) CHECK(intact(addr, b.size, b.tag));
      a.deallocate(reinterpret_cast<void*>(addr));
    }
    a.empty_cache();
    INVARIANTS(a);
    CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
    CHECK(a.segments().empty());
    CHECK(!a.has_live_allocations());
  }
  DEVICE_CLEAN(dev);
}

void test_caching_random() {
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:24", "roundup_power2_divisions:4",
                             "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5"})
      caching_random(kind, conf, 0.0, g_seed + 17);
}

void test_caching_random_faults() {
  uint64_t seed = g_seed * 1000;
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:24"})
      for (double p : {0.1, 0.5}) caching_random(kind, conf, p, ++seed);
}

// The same sequences under policy:stitch (stitch_allocator.h).
void test_stitch_random() {
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (const char* conf : {"policy:stitch", "policy:stitch,per_process_memory_fraction:0.5",
                             "policy:stitch,garbage_collection_threshold:0.6,per_process_memory_fraction:0.5"})
      caching_random(kind, conf, 0.0, g_seed + 17);
}

void test_stitch_random_faults() {
  uint64_t seed = g_seed * 2000;
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (double p : {0.1, 0.5}) caching_random(kind, "policy:stitch", p, ++seed);
}

// The OOM path: a failed device allocation releases cached blocks and retries.
void test_caching_retry_releases_cache() {
  for (bool expandable : {false, true}) {
    SimDevice inner(4 * GiB);
    FaultyDevice dev(inner);
    AllocatorConfig conf;
    conf.expandable_segments = expandable;
    {
      CachingAllocator a(dev, conf);
      void* cached = a.allocate(30 * MiB);
      a.deallocate(cached);  // cached: one segment (or mapped pages) held, nothing live
      const size_t held = dev.live_segments() + dev.mapped_bytes();
      CHECK(held > 0);
      dev.fail_nth(1);  // the next device call fails once
      void* p = a.allocate(50 * MiB);
      CHECK(p != nullptr);
      const DeviceStats s = a.stats();
      CHECK(s.num_alloc_retries == 1);
      CHECK(s.num_ooms == 0);
      CHECK(dev.injected_failures() == 1);
      if (!expandable) {
        CHECK(s.num_device_free == 1);       // the cached 30 MiB segment went back
        CHECK(dev.live_segments() == 1);     // only the new one
      }
      INVARIANTS(a);
      a.deallocate(p);
      a.empty_cache();
      CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
    }
    DEVICE_CLEAN(dev);
  }
}

// Both attempts fail: OutOfMemory with a clear message; the allocator is
// unchanged and the next request succeeds.
void test_caching_oom_is_clear_and_recoverable() {
  for (bool expandable : {false, true}) {
    SimDevice inner(4 * GiB);
    FaultyDevice dev(inner);
    AllocatorConfig conf;
    conf.expandable_segments = expandable;
    {
      CachingAllocator a(dev, conf);
      void* keep = a.allocate(3 * MiB);
      const DeviceStats before = a.stats();
      dev.fail_nth(1, 1000);  // every device call fails
      std::string message;
      CHECK(expect_throw<OutOfMemory>([&] { a.allocate(50 * MiB); }, &message).empty());
      CHECK_MSG(contains(message, "out of memory. Tried to allocate 50.00 MiB"), message);
      CHECK_MSG(contains(message, "total capacity of 4.00 GiB"), message);
      const DeviceStats after = a.stats();
      CHECK(after.num_ooms == 1);
      CHECK(after.allocation[kAggregate].current == before.allocation[kAggregate].current);
      CHECK(after.allocated_bytes[kAggregate].current == before.allocated_bytes[kAggregate].current);
      INVARIANTS(a);
      CHECK(a.owns(keep));
      dev.disarm();
      void* p = nullptr;
      CHECK(expect_throw<OutOfMemory>([&] { p = a.allocate(50 * MiB); }) == "did not throw");
      CHECK(p != nullptr);
      INVARIANTS(a);
      a.deallocate(p);
      a.deallocate(keep);
      a.empty_cache();
      CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
    }
    DEVICE_CLEAN(dev);
  }
}

// Fail the k-th device call, for every k over a fixed script: whatever call
// fails, the allocator stays consistent, nothing leaks, and repeating the
// failed request succeeds.
void test_caching_fail_kth() {
  const int max_k = scaled(60, 20);
  for (bool expandable : {false, true}) {
    for (int k = 1; k <= max_k; ++k) {
      SimDevice inner(8 * GiB);
      FailNthDevice dev(inner, k, 3);  // three in a row: beats the retry inside allocate()
      AllocatorConfig conf;
      conf.expandable_segments = expandable;
      conf.max_split_size = 40 * MiB;
      {
        CachingAllocator a(dev, conf);
        std::mt19937_64 rng(g_seed + k);
        std::vector<void*> live;
        int ooms = 0;
        for (int step = 0; step < 120; ++step) {
          if (rng() % 3 != 0 || live.empty()) {
            const size_t size = random_size(rng) + (rng() % 8 == 0 ? 60 * MiB : 0);
            void* p = nullptr;
            try {
              p = a.allocate(size);
            } catch (const OutOfMemory& e) {
              ++ooms;
              INVARIANTS(a);
              try {
                p = a.allocate(size);  // the injected failures are spent
              } catch (const OutOfMemory& e2) {
                report_failure(__FILE__, __LINE__, std::string("retry after injected failure: ") + e2.what());
              }
            }
            if (p) live.push_back(p);
          } else {
            const size_t i = rng() % live.size();
            a.deallocate(live[i]);
            live.erase(live.begin() + i);
          }
          if (step % 40 == 39) a.empty_cache();
          INVARIANTS(a);
        }
        CHECK(ooms <= 1);
        for (void* p : live) a.deallocate(p);
        a.empty_cache();
        CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
      }
      DEVICE_CLEAN(dev);
    }
  }
}

// A device that cannot reserve address ranges: expandable segments report
// OutOfMemory (not another exception) and nothing leaks.
void test_caching_reserve_failure() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  dev.fail_reserve(true);
  {
    AllocatorConfig conf;
    conf.expandable_segments = true;
    CachingAllocator a(dev, conf);
    CHECK_THROWS(OutOfMemory, a.allocate(4 * MiB));
    INVARIANTS(a);
    dev.disarm();
    void* p = a.allocate(4 * MiB);
    CHECK(p != nullptr);
    a.deallocate(p);
  }
  DEVICE_CLEAN(dev);
}

// A real out-of-memory (the device is full), then recovery.
void test_caching_device_full() {
  for (bool expandable : {false, true}) {
    SimDevice inner(200 * MiB);
    FaultyDevice dev(inner);
    AllocatorConfig conf;
    conf.expandable_segments = expandable;
    {
      CachingAllocator a(dev, conf);
      std::vector<void*> live;
      for (;;) {
        try {
          live.push_back(a.allocate(30 * MiB));
        } catch (const OutOfMemory& e) {
          CHECK(e.info().requested == 30 * MiB);
          CHECK(e.info().device_total == 200 * MiB);
          break;
        }
        if (live.size() > 100) break;
      }
      CHECK(live.size() >= 5 && live.size() <= 7);
      INVARIANTS(a);
      a.deallocate(live.back());
      live.pop_back();
      void* p = nullptr;
      CHECK(expect_throw<OutOfMemory>([&] { p = a.allocate(30 * MiB); }) == "did not throw");
      if (p) live.push_back(p);
      for (void* q : live) a.deallocate(q);
      a.empty_cache();
      CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
      CHECK(inner.free_bytes() == 200 * MiB);
    }
    DEVICE_CLEAN(dev);
  }
}

// Destroying an allocator with live blocks gives every segment back.
void test_caching_destructor_returns_everything() {
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (bool expandable : {false, true}) {
      auto inner = make_device(kind, 256 * MiB);
      FaultyDevice dev(*inner);
      {
        AllocatorConfig conf;
        conf.expandable_segments = expandable;
        CachingAllocator a(dev, conf);
        std::mt19937_64 rng(g_seed);
        for (int i = 0; i < 40; ++i) {
          void* p = a.allocate(1 + rng() % (5 * MiB));
          if (i % 3 == 0) a.deallocate(p);
        }
        CHECK(a.has_live_allocations());
      }
      DEVICE_CLEAN(dev);
      CHECK(inner->free_bytes() == 256 * MiB);
    }
}

// Bad input: every misuse is an exception and changes nothing.
void test_caching_bad_input() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  {
    CachingAllocator a(dev);
    CHECK(a.allocate(0) == nullptr);
    void* p = a.allocate(1000);
    const DeviceStats before = a.stats();
    int local = 0;
    CHECK_THROWS(std::invalid_argument, a.deallocate(&local));                                   // foreign
    CHECK_THROWS(std::invalid_argument, a.deallocate(static_cast<char*>(p) + 512));              // interior
    CHECK(!a.try_deallocate(&local));
    a.deallocate(p);
    CHECK_THROWS(std::invalid_argument, a.deallocate(p));                                        // double free
    a.deallocate(nullptr);                                                                       // ignored
    CHECK(a.stats().allocation[kAggregate].current == before.allocation[kAggregate].current - 1);
    CHECK_THROWS(OutOfMemory, a.allocate(std::numeric_limits<size_t>::max()));
    CHECK_THROWS(OutOfMemory, a.allocate(std::numeric_limits<size_t>::max() - 511));
    CHECK_THROWS(OutOfMemory, a.allocate(size_t(1) << 50));
    CHECK_THROWS(OutOfMemory, a.allocate(2 * GiB));
    // PyTorch takes a fraction in [0, 1] (DeviceCachingAllocator::setMemoryFraction): 0 is a limit of 0 bytes.
    for (double f : {-0.5, 1.5, std::nan(""), std::numeric_limits<double>::infinity()})
      CHECK_THROWS(std::invalid_argument, a.set_memory_fraction(f));
    INVARIANTS(a);
    CHECK(a.stats().num_ooms == 4);
  }
  DEVICE_CLEAN(dev);
  for (const char* bad :
       {"max_split_size_mb:abc", "max_split_size_mb:-5", "max_split_size_mb", "nonsense_key:1", "expandable_segments:maybe",
        "garbage_collection_threshold:1.5", "garbage_collection_threshold:nan", "per_process_memory_fraction:-0.1",
        "per_process_memory_fraction:2", "expandable_segments:true", "max_split_size_mb:19", "large_segment_size_mb:10",
        "roundup_power2_divisions:0", "max_split_size_mb:64,,expandable_segments:True", "roundup_power2_divisions:3", "roundup_power2_divisions:[256:1,", "backend:cudaMallocAsync",
        "capacity:lots", "capacity:-1GiB", ":", "max_split_size_mb:99999999999999999999999"}) {
    std::string why = expect_throw<std::invalid_argument>([&] { AllocatorConfig::parse(bad); });
    CHECK_MSG(why.empty(), std::string("config '") + bad + "': " + why);
  }
  for (const char* bad : {"", "GiB", "12XB", "-1", "1e999GiB", "nan", "99999999999999999999999", "1.5.5GiB"}) {
    std::string why = expect_throw<std::invalid_argument>([&] { parse_size(bad); });
    CHECK_MSG(why.empty(), std::string("size '") + bad + "': " + why);
  }
}

// Several threads allocating and freeing on one allocator, with tags written
// into host memory; one thread frees what another allocated; a monitor reads
// stats and checks invariants meanwhile. Optionally with injected faults.
void caching_threads(const std::string& conf_text, double fault_probability, bool history = false) {
  HostDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  if (fault_probability > 0) dev.fail_randomly(fault_probability, g_seed);
  const int threads = 4;
  const int steps = scaled(3000, 400);
  {
    std::shared_ptr<DeviceAllocator> owner = make_device_allocator(dev, AllocatorConfig::parse(conf_text));
    DeviceAllocator& a = *owner;
    std::atomic<uint64_t> contexts{0};
    if (history) a.enable_history(4096, [&] { return ++contexts; });  // a provider called from every thread
    std::mutex handoff_mutex;
    std::vector<std::pair<void*, LiveBlock>> handoff;  // allocated by one thread, freed by another
    std::atomic<bool> done{false};
    std::atomic<int> ooms{0};
    auto worker = [&](int id) {
      std::mt19937_64 rng(g_seed * 31 + id);
      std::vector<std::pair<void*, LiveBlock>> mine;
      for (int step = 0; step < steps; ++step) {
        unsigned op = rng() % 10;
        if (mine.size() > 24 && op < 5) op = 5;  // bounded live memory: OOMs only when injected
        if (op < 5 || mine.empty()) {
          size_t size = rng() % 8 == 0 ? random_size(rng) : 1 + rng() % (256 * KiB);
          void* p = nullptr;
          try {
            p = a.allocate(size, rng() % 5 == 0 ? 1 : 0);
          } catch (const OutOfMemory&) {
            ++ooms;
            continue;
          }
          const uint8_t tag = static_cast<uint8_t>(1 + id * 50 + step % 50);
          fill(reinterpret_cast<uintptr_t>(p), size, tag);
          if (op == 0) {
            std::lock_guard<std::mutex> lock(handoff_mutex);
            handoff.push_back({p, LiveBlock{size, tag}});
          } else {
            mine.push_back({p, LiveBlock{size, tag}});
          }
        } else if (op < 9) {
          std::pair<void*, LiveBlock> victim{nullptr, {}};
          if (op == 8) {
            std::lock_guard<std::mutex> lock(handoff_mutex);
            if (!handoff.empty()) {
              victim = handoff.back();
              handoff.pop_back();
            }
          }
          if (!victim.first) {
            const size_t i = rng() % mine.size();
            victim = mine[i];
            mine[i] = mine.back();
            mine.pop_back();
          }
          CHECK_MSG(intact(reinterpret_cast<uintptr_t>(victim.first), victim.second.size, victim.second.tag),
                    "thread " + std::to_string(id) + ": a live block was overwritten");
          a.deallocate(victim.first);
        } else if (rng() % 8 == 0) {
          a.empty_cache();
        }
      }
      for (auto& [p, b] : mine) {
        CHECK(intact(reinterpret_cast<uintptr_t>(p), b.size, b.tag));
        a.deallocate(p);
      }
    };
    std::thread monitor([&] {
      while (!done.load()) {
        INVARIANTS(a);
        const DeviceStats s = a.stats();
        CHECK(s.reserved_bytes[kAggregate].current >= s.allocated_bytes[kAggregate].current);
        (void)a.segments();
        (void)a.largest_free_block();
        std::this_thread::yield();
      }
    });
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i);
    for (auto& t : pool) t.join();
    done = true;
    monitor.join();
    for (auto& [p, b] : handoff) {
      CHECK(intact(reinterpret_cast<uintptr_t>(p), b.size, b.tag));
      a.deallocate(p);
    }
    INVARIANTS(a);
    const DeviceStats s = a.stats();
    CHECK(s.allocation[kAggregate].current == 0);
    CHECK(s.allocated_bytes[kAggregate].current == 0);
    CHECK(s.requested_bytes[kAggregate].current == 0);
    CHECK(s.num_ooms == ooms.load());
    if (fault_probability == 0) CHECK(ooms.load() == 0);
    dev.disarm();
    a.empty_cache();
    CHECK(a.stats().reserved_bytes[kAggregate].current == 0);
    if (history) {
      const auto entries = a.history_entries();
      CHECK(!entries.empty() && entries.size() <= 4096);
      CHECK(contexts.load() > 0);
    }
  }
  DEVICE_CLEAN(dev);
}

void test_caching_threads() {
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:24,garbage_collection_threshold:0.5,per_process_memory_fraction:0.9"})
    caching_threads(conf, 0.0);
}

void test_caching_threads_history() {
  caching_threads("", 0.0, true);
  caching_threads("expandable_segments:True", 0.0, true);
}

void test_caching_threads_faults() {
  caching_threads("", 0.05);
  caching_threads("expandable_segments:True", 0.05);
}

void test_stitch_threads() {
  caching_threads("policy:stitch", 0.0);
  caching_threads("policy:stitch,per_process_memory_fraction:0.9", 0.0);
  caching_threads("policy:stitch", 0.0, true);
  caching_threads("policy:stitch", 0.05);
}

// std::pmr containers over the caching allocator, from several threads.
void test_pmr_over_caching_threads() {
  HostDevice inner(512 * MiB);
  FaultyDevice dev(inner);
  {
    CachingAllocator a(dev);
    AllocatorResource resource(a);
    std::vector<std::thread> pool;
    for (int t = 0; t < 3; ++t)
      pool.emplace_back([&, t] {
        for (int round = 0; round < scaled(40, 8); ++round) {
          std::pmr::vector<uint64_t> v(&resource);
          for (uint64_t i = 0; i < 20000; ++i) v.push_back(i * (t + 1));
          std::pmr::vector<std::pmr::string> strings(&resource);
          for (int i = 0; i < 200; ++i) strings.emplace_back(std::string(100 + i, char('a' + t)));
          bool ok = true;
          for (uint64_t i = 0; i < v.size(); ++i) ok &= v[i] == i * (t + 1);
          CHECK(ok);
        }
      });
    for (auto& t : pool) t.join();
    CHECK(!a.has_live_allocations());
    INVARIANTS(a);
    a.empty_cache();
  }
  DEVICE_CLEAN(dev);
}

// ---------------------------------------------------------------------------
// Arena

void test_arena_random() {
  for (Kind kind : {Kind::kSim, Kind::kHost}) {
    auto inner = make_device(kind, 256 * MiB);
    FaultyDevice dev(*inner);
    {
      Arena arena(dev, ArenaOptions{8 * MiB, 64, nullptr});
      std::mt19937_64 rng(g_seed + 5);
      LiveSet live;
      for (int step = 0; step < scaled(4000, 600); ++step) {
        const unsigned op = rng() % 12;
        if (op < 6) {
          const size_t size = 1 + rng() % (rng() % 4 == 0 ? 2 * MiB : 4096);
          const size_t alignment = size_t(1) << (rng() % 13);
          void* p = nullptr;
          try {
            p = arena.allocate_aligned(size, alignment);
          } catch (const OutOfMemory& e) {
            CHECK(contains(e.what(), "Arena out of memory"));
            INVARIANTS(arena);
            continue;
          }
          const auto addr = reinterpret_cast<uintptr_t>(p);
          CHECK(addr % alignment == 0);
          CHECK(addr >= arena.base() && addr + size <= arena.base() + arena.capacity());
          const uint8_t tag = static_cast<uint8_t>(1 + rng() % 250);
          CHECK_MSG(live.insert(addr, size, tag), "arena block overlaps a live one");
          if (kind == Kind::kHost) fill(addr, size, tag);
        } else if (op < 10 && !live.blocks.empty()) {
          auto [addr, b] = live.take(rng());
          if (kind == Kind::kHost) CHECK(intact(addr, b.size, b.tag));
          arena.deallocate(reinterpret_cast<void*>(addr));
        } else if (op == 10) {
          CHECK(arena.rewind() == live.blocks.size());  // every live block becomes a hole
          CHECK(arena.used() == 0);
        } else if (live.blocks.empty()) {
          arena.reset();
          CHECK(arena.used() == 0);
        }
        INVARIANTS(arena);
        CHECK(arena.live_allocations() == live.blocks.size());
        CHECK(arena.stats().live_bytes == live.requested);
        CHECK(arena.used() <= arena.peak() && arena.peak() <= arena.capacity());
      }
    }
    DEVICE_CLEAN(dev);
  }
}

void test_arena_faults_and_bad_input() {
  SimDevice inner(1 * GiB);
  {
    FailNthDevice dev(inner, 1);
    std::string message;
    CHECK(expect_throw<OutOfMemory>([&] { Arena a(dev, ArenaOptions{64 * MiB, 64, nullptr}); }, &message).empty());
    CHECK_MSG(contains(message, "could not provide"), message);
    DEVICE_CLEAN(dev);
  }
  FaultyDevice dev(inner);
  CHECK_THROWS(std::invalid_argument, Arena(dev, ArenaOptions{0, 64, nullptr}));
  CHECK_THROWS(std::invalid_argument, Arena(dev, ArenaOptions{MiB, 32, nullptr}));
  CHECK_THROWS(std::invalid_argument, Arena(dev, ArenaOptions{MiB, 96, nullptr}));
  CHECK_THROWS(OutOfMemory, Arena(dev, ArenaOptions{2 * GiB, 64, nullptr}));
  CHECK_THROWS(OutOfMemory, Arena(dev, ArenaOptions{std::numeric_limits<size_t>::max(), 64, nullptr}));
  DEVICE_CLEAN(dev);
  {
    // The fallback (a caching allocator on a failing device) refuses: the
    // arena reports OutOfMemory and stays consistent.
    SimDevice fallback_inner(1 * GiB);
    FaultyDevice fallback_dev(fallback_inner);
    {
      CachingAllocator fallback(fallback_dev);
      Arena a(dev, ArenaOptions{MiB, 64, &fallback});
      void* in_region = a.allocate(512 * KiB);
      void* spilled = a.allocate(2 * MiB);
      CHECK(spilled != nullptr && fallback.owns(spilled));
      fallback_dev.fail_nth(1, 1000);
      CHECK_THROWS(OutOfMemory, a.allocate(30 * MiB));
      INVARIANTS(a);
      CHECK(a.stats().fallback_live == 1);
      fallback_dev.disarm();
      int local = 0;
      CHECK_THROWS(std::invalid_argument, a.deallocate(&local));
      CHECK_THROWS(std::invalid_argument, a.allocate_aligned(16, 3));
      CHECK_THROWS(std::invalid_argument, a.allocate_aligned(16, 0));
      CHECK(a.allocate(0) == nullptr);
      CHECK_THROWS(OutOfMemory, Arena(dev, ArenaOptions{MiB, 64, nullptr}).allocate(std::numeric_limits<size_t>::max()));
      a.deallocate(in_region);
      CHECK_THROWS(std::invalid_argument, a.deallocate(in_region));  // double free
      a.reset();  // hands the live fallback allocation back
      CHECK(!fallback.has_live_allocations());
      INVARIANTS(a);
      fallback.empty_cache();
    }
    DEVICE_CLEAN(fallback_dev);
  }
  DEVICE_CLEAN(dev);
}

// Threads allocate and free on one arena (with a caching fallback), tags
// checked; frees arrive from other threads.
void test_arena_threads() {
  HostDevice inner(512 * MiB);
  FaultyDevice dev(inner);
  {
    CachingAllocator fallback(dev);
    Arena arena(dev, ArenaOptions{4 * MiB, 64, &fallback});
    std::mutex m;
    std::vector<std::pair<void*, LiveBlock>> shared;
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] {
        std::mt19937_64 rng(g_seed * 7 + t);
        std::vector<std::pair<void*, LiveBlock>> mine;
        for (int step = 0; step < scaled(3000, 400); ++step) {
          if (rng() % 2 == 0 || mine.empty()) {
            const size_t size = 1 + rng() % 8192;
            void* p = arena.allocate(size);
            const uint8_t tag = static_cast<uint8_t>(1 + t * 60 + step % 60);
            fill(reinterpret_cast<uintptr_t>(p), size, tag);
            if (rng() % 4 == 0) {
              std::lock_guard<std::mutex> lock(m);
              shared.push_back({p, LiveBlock{size, tag}});
            } else {
              mine.push_back({p, LiveBlock{size, tag}});
            }
          } else {
            std::pair<void*, LiveBlock> v{nullptr, {}};
            {
              std::lock_guard<std::mutex> lock(m);
              if (!shared.empty() && rng() % 2) {
                v = shared.back();
                shared.pop_back();
              }
            }
            if (!v.first) {
              v = mine.back();
              mine.pop_back();
            }
            CHECK(intact(reinterpret_cast<uintptr_t>(v.first), v.second.size, v.second.tag));
            arena.deallocate(v.first);
          }
          if (step % 100 == 0) arena.rewind();
        }
        for (auto& [p, b] : mine) {
          CHECK(intact(reinterpret_cast<uintptr_t>(p), b.size, b.tag));
          arena.deallocate(p);
        }
      });
    for (auto& t : pool) t.join();
    for (auto& [p, b] : shared) {
      CHECK(intact(reinterpret_cast<uintptr_t>(p), b.size, b.tag));
      arena.deallocate(p);
    }
    INVARIANTS(arena);
    CHECK(arena.live_allocations() == 0 && arena.used() == 0);
    CHECK(!fallback.has_live_allocations());
    fallback.empty_cache();
  }
  DEVICE_CLEAN(dev);
}

// Training-loop passes: each step rewinds, allocates a mix, frees most of it
// in random order, and lets some escape for a few steps (the loop variables
// of a natural loop). Tags catch any reuse of a live block's bytes; the
// region must hold one step plus what is alive, within the alignment and
// the gaps left before holes.
void test_arena_holes_steps() {
  for (Kind kind : {Kind::kSim, Kind::kHost}) {
    auto inner = make_device(kind, 256 * MiB);
    FaultyDevice dev(*inner);
    {
      SimDevice fallback_inner(1 * GiB);
      CachingAllocator fallback(fallback_inner);
      Arena arena(dev, ArenaOptions{16 * MiB, 64, &fallback});
      std::mt19937_64 rng(g_seed + 11);
      LiveSet live;
      std::vector<std::pair<uintptr_t, int>> escaped;  // block, the step it dies in
      std::vector<void*> spilled;
      size_t bound = 0, wraps = 0;
      auto free_block = [&](uintptr_t addr) {
        auto it = live.blocks.find(addr);
        if (kind == Kind::kHost) CHECK(intact(addr, it->second.size, it->second.tag));
        live.requested -= it->second.size;
        live.blocks.erase(it);
        arena.deallocate(reinterpret_cast<void*>(addr));
      };
      for (int step = 0; step < scaled(300, 60); ++step) {
        for (size_t i = 0; i < escaped.size();) {
          if (escaped[i].second > step) {
            ++i;
            continue;
          }
          free_block(escaped[i].first);
          escaped[i] = escaped.back();
          escaped.pop_back();
        }
        const size_t holes = arena.rewind();
        CHECK(holes == live.blocks.size());
        CHECK(arena.stats().block_hole_bytes == live.requested);
        std::vector<uintptr_t> mine;
        size_t step_bytes = 0, largest = 0;
        const int n = 5 + static_cast<int>(rng() % 60);
        for (int i = 0; i < n; ++i) {
          const size_t size = 1 + rng() % (rng() % 8 == 0 ? 512 * KiB : 16 * KiB);
          void* p = arena.allocate(size);
          const auto addr = reinterpret_cast<uintptr_t>(p);
          if (!arena.owns(p) || addr < arena.base() || addr >= arena.base() + arena.capacity()) {
            spilled.push_back(p);  // the fallback served it
            continue;
          }
          const uint8_t tag = static_cast<uint8_t>(1 + rng() % 250);
          CHECK_MSG(live.insert(addr, size, tag), "arena block overlaps a live one");
          if (kind == Kind::kHost) fill(addr, size, tag);
          mine.push_back(addr);
          step_bytes += (size + 63) / 64 * 64;
          largest = std::max(largest, size);
          if (rng() % 3 == 0 && !mine.empty()) {  // a temporary freed at once, or an older one
            const size_t k = rng() % 2 ? mine.size() - 1 : rng() % mine.size();
            free_block(mine[k]);
            mine.erase(mine.begin() + static_cast<long>(k));
          }
          INVARIANTS(arena);
        }
        std::shuffle(mine.begin(), mine.end(), rng);
        const size_t keep = mine.empty() ? 0 : rng() % std::min<size_t>(3, mine.size() + 1);
        for (size_t i = 0; i < mine.size(); ++i) {
          if (i < keep) {
            escaped.push_back({mine[i], step + 1 + static_cast<int>(rng() % 3)});
          } else {
            free_block(mine[i]);
          }
        }
        for (void* p : spilled) arena.deallocate(p);
        spilled.clear();
        INVARIANTS(arena);
        const ArenaStats s = arena.stats();
        CHECK(s.live_allocations == live.blocks.size() && s.live_bytes == live.requested);
        // The cursor covers this step's blocks, the holes it met, and per
        // hole skipped a gap smaller than the largest request; holes lie
        // where earlier cursors were. So the peak stays within the largest
        // such bound of any step (steps that spilled or wrapped aside).
        if (s.block_fallback_allocations == 0 && s.wraps == wraps) {
          bound = std::max(bound, step_bytes + s.block_hole_bytes + s.block_holes_skipped * (largest + 64) + 64);
          CHECK_MSG(s.peak <= bound, "peak " + std::to_string(s.peak) + " beyond " + std::to_string(bound));
        } else {
          bound = std::max(bound, s.peak);
        }
        wraps = s.wraps;
      }
      for (auto& e : escaped) free_block(e.first);
      CHECK(arena.live_allocations() == 0 && arena.used() == 0 && arena.stats().holes == 0);
      INVARIANTS(arena);
      fallback.empty_cache();
    }
    DEVICE_CLEAN(dev);
  }
}

// One thread runs steps (rewind, allocate, free, hand some blocks on); the
// others free what they are handed, while the steps go on. The freeing
// threads check the tags first, so any reuse of a live block shows.
void test_arena_holes_threads() {
  HostDevice inner(512 * MiB);
  FaultyDevice dev(inner);
  {
    CachingAllocator fallback(dev);
    Arena arena(dev, ArenaOptions{8 * MiB, 64, &fallback});
    std::mutex m;
    std::vector<std::pair<void*, LiveBlock>> handed;
    std::atomic<bool> done{false};
    std::vector<std::thread> freers;
    for (int t = 0; t < 3; ++t)
      freers.emplace_back([&] {
        for (;;) {
          std::pair<void*, LiveBlock> v{nullptr, {}};
          {
            std::lock_guard<std::mutex> lock(m);
            if (!handed.empty()) {
              v = handed.back();
              handed.pop_back();
            }
          }
          if (!v.first) {
            if (done) break;
            std::this_thread::yield();
            continue;
          }
          CHECK(intact(reinterpret_cast<uintptr_t>(v.first), v.second.size, v.second.tag));
          arena.deallocate(v.first);
        }
      });
    std::mt19937_64 rng(g_seed * 13);
    std::vector<std::pair<void*, LiveBlock>> kept;
    for (int step = 0; step < scaled(400, 60); ++step) {
      arena.rewind();
      std::vector<std::pair<void*, LiveBlock>> mine;
      for (int i = 0; i < 40; ++i) {
        const size_t size = 1 + rng() % (64 * KiB);
        void* p = arena.allocate(size);
        const uint8_t tag = static_cast<uint8_t>(1 + (step * 40 + i) % 250);
        fill(reinterpret_cast<uintptr_t>(p), size, tag);
        mine.push_back({p, LiveBlock{size, tag}});
        if (rng() % 4 == 0) {
          auto v = mine.back();
          mine.pop_back();
          CHECK(intact(reinterpret_cast<uintptr_t>(v.first), v.second.size, v.second.tag));
          arena.deallocate(v.first);
        }
      }
      for (auto& [p, b] : kept) CHECK(intact(reinterpret_cast<uintptr_t>(p), b.size, b.tag));
      std::lock_guard<std::mutex> lock(m);
      for (auto& v : kept) handed.push_back(v);
      kept.clear();
      for (auto& v : mine) (rng() % 8 == 0 ? kept : handed).push_back(v);
    }
    {
      std::lock_guard<std::mutex> lock(m);
      for (auto& v : kept) handed.push_back(v);
    }
    done = true;
    for (auto& t : freers) t.join();
    INVARIANTS(arena);
    CHECK(arena.live_allocations() == 0 && arena.used() == 0);
    CHECK(!fallback.has_live_allocations());
    fallback.empty_cache();
  }
  DEVICE_CLEAN(dev);
}

// The CUDA arena's shape on a simulated device: the region is one block of a
// caching allocator, on one stream; other streams go to the caching
// allocator; faults in the source or the fallbacks leave everything
// consistent and give every byte back.
void test_arena_streams_and_source() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  {
    CachingAllocator caching(dev);
    const Stream s1 = 7, s2 = 9;
    dev.fail_nth(1, 1000);
    CHECK_THROWS(OutOfMemory, Arena(dev, ArenaOptions{4 * MiB, 64, nullptr, s1, &caching, &caching}));
    dev.disarm();
    {
      Arena arena(dev, ArenaOptions{4 * MiB, 64, nullptr, s1, &caching, &caching});
      CHECK(caching.owns(reinterpret_cast<void*>(arena.base())));  // one block of the source
      void* a = arena.allocate(MiB, s1);
      void* b = arena.allocate(MiB, s2);
      CHECK(arena.owns(a) && arena.owns(b) && caching.owns(b));
      CHECK(reinterpret_cast<uintptr_t>(a) == arena.base());
      CHECK(arena.stats().other_stream_allocations == 1 && arena.used() == MiB);
      CHECK_THROWS(OutOfMemory, arena.allocate(4 * MiB, s1));  // no overflow fallback
      INVARIANTS(arena);
      dev.fail_nth(1, 1000);
      CHECK_THROWS(OutOfMemory, arena.allocate(64 * MiB, s2));  // the other-streams allocator fails
      dev.disarm();
      INVARIANTS(arena);
      CHECK(arena.rewind() == 1 && arena.live_allocations() == 2);  // the forwarded block is no hole
      void* c = arena.allocate(MiB, s1);
      CHECK(reinterpret_cast<uintptr_t>(c) == arena.base() + MiB);
      arena.deallocate(b);
      CHECK(!caching.owns(b));
      arena.deallocate(a);
      arena.deallocate(c);
      CHECK(arena.live_allocations() == 0);
      INVARIANTS(arena);
    }
    CHECK(!caching.has_live_allocations());  // the region went back
    Arena strict(dev, ArenaOptions{MiB, 64, nullptr, s1, nullptr, nullptr});
    CHECK_THROWS(std::invalid_argument, strict.allocate(64, s2));
    CHECK(strict.allocate(64, s1) != nullptr);
    strict.reset();
  }
  DEVICE_CLEAN(dev);
}

// ---------------------------------------------------------------------------
// Paged block pool: random operations against a reference count model.

struct PoolModel {
  std::vector<int32_t> ref;
  explicit PoolModel(int n) : ref(n, 0) {}
};

void check_pool_matches(const PagedBlockPool& pool, const PoolModel& model) {
  int used = 0;
  bool ok = true;
  for (int32_t i = 0; i < pool.num_blocks(); ++i) {
    ok &= pool.ref_count(i) == model.ref[i];
    used += model.ref[i] > 0;
  }
  CHECK_MSG(ok, "reference counts differ from the model");
  CHECK(pool.num_used() == used);
  INVARIANTS(pool);
}

void test_block_pool_random() {
  for (int round = 0; round < scaled(20, 4); ++round) {
    const int n = 4 + round % 13;
    PagedBlockPool pool(n);
    PoolModel model(n);
    std::mt19937_64 rng(g_seed * 101 + round);
    uint64_t next_hash = 1;
    auto used_ids = [&] {
      std::vector<BlockId> out;
      for (int i = 0; i < n; ++i)
        if (model.ref[i] > 0) out.push_back(i);
      return out;
    };
    for (int step = 0; step < scaled(3000, 500); ++step) {
      const unsigned op = rng() % 12;
      std::vector<BlockId> used = used_ids();
      if (op == 0) {
        const BlockId b = pool.try_allocate();
        if (b == kNoBlock) {
          CHECK(pool.num_free() == 0);
        } else {
          CHECK(model.ref[b] == 0);
          model.ref[b] = 1;
        }
      } else if (op == 1) {
        const size_t k = rng() % 4;
        std::vector<BlockId> out(k + 1, kNoBlock);
        if (pool.try_allocate_n(k, out.data())) {
          for (size_t i = 0; i < k; ++i) {
            CHECK(model.ref[out[i]] == 0);
            model.ref[out[i]] = 1;
          }
        } else {
          CHECK(static_cast<size_t>(pool.num_free()) < k);
        }
      } else if ((op == 2 || op == 3) && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        pool.release(b);
        --model.ref[b];
      } else if (op == 4 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        pool.retain(b);
        ++model.ref[b];
      } else if (op == 5 && !used.empty()) {
        std::vector<BlockId> batch;
        for (BlockId b : used)
          if (rng() % 2) batch.push_back(b);
        pool.release_n(batch.data(), batch.size());
        for (BlockId b : batch) --model.ref[b];
      } else if (op == 6 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        const bool throwing = rng() % 4 == 0;
        const int before = model.ref[b];
        try {
          const BlockId w = pool.make_writable(b, [&](BlockId, BlockId) {
            if (throwing) throw std::runtime_error("copy failed");
          });
          if (w != b) {
            CHECK(before > 1 && model.ref[w] == 0);
            --model.ref[b];
            model.ref[w] = 1;
          } else {
            CHECK(before == 1);
          }
        } catch (const OutOfBlocks&) {
          CHECK(before > 1 && pool.num_free() == 0);  // no block for the copy; the pool is unchanged
        } catch (const std::runtime_error&) {
          CHECK(throwing);  // the pool is unchanged: checked below
        }
      } else if (op == 7 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        if (pool.has_hash(b)) {
          CHECK_THROWS(std::invalid_argument, pool.set_hash(b, 1000 + next_hash++));
        } else {
          const uint64_t h = next_hash++ % 7;
          const BlockId holder = pool.lookup(h);
          CHECK(pool.set_hash(b, h) == (holder == kNoBlock));
        }
      } else if (op == 8) {
        const BlockId b = pool.acquire_cached(rng() % 7);
        if (b != kNoBlock) ++model.ref[b];
      } else if (op == 9) {
        // Misuse: out of range, not in use, a batch that over-releases.
        const int32_t before_free = pool.num_free();
        CHECK_THROWS(std::invalid_argument, pool.release(n));
        CHECK_THROWS(std::invalid_argument, pool.release(-1));
        CHECK_THROWS(std::invalid_argument, pool.retain(n + 5));
        for (int i = 0; i < n; ++i)
          if (model.ref[i] == 0) {
            CHECK_THROWS(std::invalid_argument, pool.release(i));
            CHECK_THROWS(std::invalid_argument, pool.retain(i));
            break;
          }
        if (!used.empty()) {
          const BlockId b = used[0];
          std::vector<BlockId> twice(model.ref[b] + 1, b);
          CHECK_THROWS(std::invalid_argument, pool.release_n(twice.data(), twice.size()));
        }
        CHECK(pool.num_free() == before_free);
      } else if (op == 10) {
        const size_t k = pool.num_free() + 1;
        std::vector<BlockId> out(k);
        CHECK_THROWS(OutOfBlocks, pool.allocate_n(k, out.data()));
      } else if (op == 11 && !used.empty()) {
        std::vector<BlockId> last;
        for (BlockId b : used)
          if (rng() % 3 == 0) last.push_back(b);
        const size_t n_new = rng() % 3;
        std::vector<BlockId> fresh(n_new + 1);
        std::vector<PagedBlockPool::Copy> copies;
        std::vector<BlockId> orig = last;
        try {
          pool.allocate_and_make_writable(n_new, fresh.data(), last.data(), last.size(), &copies);
          for (size_t i = 0; i < n_new; ++i) model.ref[fresh[i]] = 1;
          for (size_t i = 0; i < last.size(); ++i)
            if (last[i] != orig[i]) {
              --model.ref[orig[i]];
              model.ref[last[i]] = 1;
            }
        } catch (const OutOfBlocks&) {
          CHECK(last == orig);
        } catch (const std::invalid_argument&) {
          CHECK(last == orig);  // duplicates in `last`: all or nothing
        }
      }
      check_pool_matches(pool, model);
    }
  }
  CHECK_THROWS(std::invalid_argument, PagedBlockPool(0));
  CHECK_THROWS(std::invalid_argument, PagedBlockPool(-3));
}

// ---------------------------------------------------------------------------
// Planner

using planner::Buffer;
using planner::Offset;

std::vector<Buffer> random_instance(std::mt19937_64& rng, int max_buffers) {
  const int n = rng() % (max_buffers + 1);
  std::vector<Buffer> out;
  for (int i = 0; i < n; ++i) {
    const int64_t lo = rng() % 40;
    const int64_t len = 1 + rng() % 12;
    const int64_t size = rng() % 5 == 0 ? 0 : 1 + rng() % (rng() % 3 == 0 ? 4096 : 64);
    out.push_back(Buffer{i, lo, lo + len, size});
  }
  return out;
}

Offset brute_lower_bound(const std::vector<Buffer>& bs) {
  Offset best = 0;
  for (const Buffer& t : bs) {
    Offset live = 0;
    for (const Buffer& b : bs)
      if (b.lower <= t.lower && t.lower < b.upper) live += b.size;
    best = std::max(best, live);
  }
  return best;
}

bool brute_valid(const std::vector<Buffer>& bs, const std::vector<Offset>& off) {
  for (size_t i = 0; i < bs.size(); ++i) {
    if (off[i] < 0) return false;
    for (size_t j = i + 1; j < bs.size(); ++j) {
      const bool time = bs[i].lower < bs[j].upper && bs[j].lower < bs[i].upper;
      const bool space = off[i] < off[j] + bs[j].size && off[j] < off[i] + bs[i].size;
      if (time && space && bs[i].size > 0 && bs[j].size > 0) return false;
    }
  }
  return true;
}

void test_planner_random() {
  std::mt19937_64 rng(g_seed * 13);
  const std::vector<std::string> methods = {"naive", "greedy", "sweep", "bottom_up", "portfolio", "auto", "search"};
  for (int round = 0; round < scaled(150, 25); ++round) {
    const auto bs = random_instance(rng, round % 5 == 0 ? 60 : 14);
    const Offset lb = planner::lower_bound(bs);
    CHECK(lb == brute_lower_bound(bs));
    for (const std::string& m : methods) {
      planner::SolveOptions options;
      options.method = m;
      options.time_limit = 0.2;
      options.alignment = rng() % 3 == 0 ? 8 : 1;
      planner::Solution s;
      try {
        s = planner::solve(bs, options);
      } catch (const std::exception& e) {
        report_failure(__FILE__, __LINE__, "solve(" + m + "): " + e.what());
        continue;
      }
      CHECK(s.offsets.size() == bs.size());
      const auto padded = planner::pad_sizes(bs, options.alignment);
      CHECK_MSG(brute_valid(padded, s.offsets), "method " + m);
      CHECK(planner::validate(padded, s.offsets).ok);
      CHECK_MSG(s.height >= s.lower_bound, "method " + m);
      CHECK(s.lower_bound >= lb);
      if (options.alignment == 1) CHECK(s.lower_bound == lb);
      CHECK(s.height == planner::height_of(padded, s.offsets));
      if (s.optimal && options.alignment == 1 && bs.size() <= 8) {
        // Optimal means no placement is lower: compare with naive search over
        // canonical placements is too slow here; at least the bound holds.
        CHECK(s.height >= lb);
      }
    }
    // validate() agrees with a brute-force check on random (mostly wrong) placements.
    for (int k = 0; k < 5 && !bs.empty(); ++k) {
      std::vector<Offset> off(bs.size());
      for (auto& o : off) o = static_cast<Offset>(rng() % 200) - (rng() % 50 == 0 ? 5 : 0);
      const auto v = planner::validate(bs, off);
      CHECK_MSG(v.ok == brute_valid(bs, off), v.message);
    }
  }
}

void test_planner_bad_input() {
  planner::SolveOptions options;
  CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 3, 3, 4}}, options));
  CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 5, 2, 4}}, options));
  CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 0, 2, -1}}, options));
  options.method = "fastest";
  CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 0, 2, 1}}, options));
  options.method = "auto";
  for (double t : {0.0, -1.0, std::nan("")}) {
    options.time_limit = t;
    CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 0, 2, 1}}, options));
  }
  options.time_limit = 1;
  options.alignment = 0;
  CHECK_THROWS(std::invalid_argument, planner::solve({Buffer{0, 0, 2, 1}}, options));
  options.alignment = 1;
  const auto v = planner::validate({Buffer{0, 0, 2, 1}}, {});
  CHECK(!v.ok && contains(v.message, "offsets"));
  CHECK(planner::solve({}, options).height == 0);
  // Cancellation before the start stops the search at once with a valid plan.
  std::atomic<bool> cancel{true};
  options.cancel = &cancel;
  options.method = "search";
  std::mt19937_64 rng(3);
  const auto bs = random_instance(rng, 30);
  const auto s = planner::solve(bs, options);
  CHECK(planner::validate(bs, s.offsets).ok);
}

// Scheduling: a random DAG; the result is a topological permutation never
// worse than the initial order.
void test_planner_schedule() {
  std::mt19937_64 rng(g_seed * 29);
  for (int round = 0; round < scaled(200, 40); ++round) {
    planner::Graph g;
    g.num_nodes = 1 + rng() % 12;
    g.out_bytes.resize(g.num_nodes);
    g.users.resize(g.num_nodes);
    for (int64_t v = 0; v < g.num_nodes; ++v) {
      g.out_bytes[v] = rng() % 3 == 0 ? 0 : rng() % 100;
      for (int64_t u = v + 1; u < g.num_nodes; ++u)
        if (rng() % 4 == 0) {
          g.edges.push_back({v, u});
          g.users[v].push_back(u);
        }
    }
    std::vector<int64_t> initial(g.num_nodes);
    for (int64_t v = 0; v < g.num_nodes; ++v) initial[v] = v;
    planner::ScheduleResult r;
    try {
      r = planner::schedule(g, initial);
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string("schedule: ") + e.what());
      continue;
    }
    CHECK(r.peak_after <= r.peak_before);
    CHECK(r.peak_before == planner::schedule_peak(g, initial));
    CHECK(r.peak_after == planner::schedule_peak(g, r.order));
    std::vector<int64_t> pos(g.num_nodes, -1);
    bool perm = static_cast<int64_t>(r.order.size()) == g.num_nodes;
    for (size_t i = 0; perm && i < r.order.size(); ++i) {
      perm = r.order[i] >= 0 && r.order[i] < g.num_nodes && pos[r.order[i]] < 0;
      if (perm) pos[r.order[i]] = static_cast<int64_t>(i);
    }
    CHECK(perm);
    if (perm)
      for (auto [u, v] : g.edges) CHECK(pos[u] < pos[v]);
    if (g.num_nodes >= 2 && !g.edges.empty()) {
      std::vector<int64_t> reversed(initial.rbegin(), initial.rend());
      CHECK_THROWS(std::invalid_argument, planner::schedule(g, reversed));
    }
  }
  planner::Graph bad;
  bad.num_nodes = 2;
  bad.out_bytes = {1, 1};
  bad.users = {{1}, {}};
  bad.edges = {{0, 5}};
  CHECK_THROWS(std::invalid_argument, planner::schedule(bad, {0, 1}));
  bad.edges = {{0, 1}, {1, 0}};
  CHECK_THROWS(std::invalid_argument, planner::schedule(bad, {0, 1}));
  bad.edges = {};
  bad.users = {{7}, {}};
  CHECK_THROWS(std::invalid_argument, planner::schedule(bad, {0, 1}));
  bad.users = {{}, {}};
  CHECK_THROWS(std::invalid_argument, planner::schedule_peak(bad, {0, 0}));
  CHECK_THROWS(std::invalid_argument, planner::schedule_peak(bad, {0}));
}

// solve() is reentrant: several threads plan at once.
void test_planner_threads() {
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([t] {
      std::mt19937_64 rng(g_seed * 97 + t);
      for (int i = 0; i < scaled(40, 8); ++i) {
        const auto bs = random_instance(rng, 20);
        planner::SolveOptions options;
        options.time_limit = 0.05;
        options.method = i % 2 ? "auto" : "portfolio";
        const auto s = planner::solve(bs, options);
        CHECK(brute_valid(bs, s.offsets));
        CHECK(s.height >= s.lower_bound);
      }
    });
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------
// Planner with streams. A brute-force happens-before (a fixpoint over the
// syncs, independent of the vector clocks of streams.cpp) decides which
// buffers can be live at once: A and B can, unless every use of one happens
// before the other's producer.

using planner::Sync;
using planner::Time;

bool brute_before(const std::vector<Sync>& syncs, int32_t s, Time u, int32_t x, Time t) {
  if (s == x) return u < t;
  std::map<int32_t, Time> reach;  // stream -> first step from which it knows (events after it carry it)
  reach[s] = u;
  for (bool changed = true; changed;) {
    changed = false;
    for (const Sync& y : syncs) {
      const auto from = reach.find(y.from);
      if (from == reach.end() || y.after < from->second) continue;
      const auto to = reach.find(y.to);
      if (to == reach.end() || y.before < to->second) {
        reach[y.to] = y.before;
        changed = true;
      }
    }
  }
  const auto it = reach.find(x);
  return it != reach.end() && it->second <= t;
}

struct StreamCase {
  std::vector<Buffer> buffers;
  planner::StreamSchedule schedule;
};

std::vector<std::pair<int32_t, Time>> uses_of(const StreamCase& c, size_t b) {
  std::vector<std::pair<int32_t, Time>> out = {{c.schedule.home_of(b), c.buffers[b].lower},
                                               {c.schedule.home_of(b), c.buffers[b].upper - 1}};
  for (const auto& r : c.schedule.reads)
    if (size_t(r.buffer) == b) out.emplace_back(r.stream, r.step);
  return out;
}

bool brute_ordered(const StreamCase& c, size_t a, size_t b) {  // every use of a before b's producer
  for (const auto& [s, u] : uses_of(c, a))
    if (!brute_before(c.schedule.syncs, s, u, c.schedule.home_of(b), c.buffers[b].lower)) return false;
  return true;
}

bool brute_live_at_once(const StreamCase& c, size_t a, size_t b) {
  return c.buffers[a].size > 0 && c.buffers[b].size > 0 && !brute_ordered(c, a, b) && !brute_ordered(c, b, a);
}

bool brute_valid_streams(const StreamCase& c, const std::vector<Offset>& off) {
  for (size_t i = 0; i < c.buffers.size(); ++i) {
    if (off[i] < 0) return false;
    for (size_t j = i + 1; j < c.buffers.size(); ++j) {
      const bool space = off[i] < off[j] + c.buffers[j].size && off[j] < off[i] + c.buffers[i].size;
      if (space && brute_live_at_once(c, i, j)) return false;
    }
  }
  return true;
}

// Random streams, syncs and buffers; reads get the syncs they need (from the
// producer before the read, back to the home stream after it) most of the time.
StreamCase random_stream_case(std::mt19937_64& rng, int max_buffers, int32_t streams, bool repair = true) {
  StreamCase c;
  const Time horizon = 30;
  for (int k = int(rng() % 10); k > 0 && streams > 1; --k) {
    const int32_t a = int32_t(rng() % streams), b = int32_t((a + 1 + rng() % (streams - 1)) % streams);
    const Time after = Time(rng() % horizon);
    c.schedule.syncs.push_back({a, after, b, after + 1 + Time(rng() % 8)});
  }
  const int n = int(rng() % (max_buffers + 1));
  for (int i = 0; i < n; ++i) {
    const Time lo = Time(rng() % horizon);
    const int64_t size = rng() % 6 == 0 ? 0 : 1 + int64_t(rng() % (rng() % 3 == 0 ? 512 : 32));
    c.buffers.push_back(Buffer{i, lo, lo + 1 + Time(rng() % 6), size});
    c.schedule.home.push_back(int32_t(rng() % streams));
  }
  for (int i = 0; i < n && streams > 1; ++i) {
    for (int k = int(rng() % 3); k > 0; --k) {
      const int32_t home = c.schedule.home[i];
      const int32_t s = int32_t((home + 1 + rng() % (streams - 1)) % streams);
      const Time step = c.buffers[i].lower + 1 + Time(rng() % 8);
      if (repair && !brute_before(c.schedule.syncs, home, c.buffers[i].lower, s, step))
        c.schedule.syncs.push_back({home, c.buffers[i].lower, s, step});
      c.schedule.reads.push_back({i, s, step});
    }
  }
  if (repair) {
    std::map<std::pair<int32_t, int32_t>, Time> last;  // (buffer, stream) -> last read
    for (const auto& r : c.schedule.reads) {
      auto& t = last[{r.buffer, r.stream}];
      t = std::max(t, r.step);
    }
    for (const auto& [key, step] : last) {
      const int32_t home = c.schedule.home[key.first];
      if (!brute_before(c.schedule.syncs, key.second, step, home, Time(1) << 40))
        c.schedule.syncs.push_back({key.second, step + Time(rng() % 3), home, step + 4 + Time(rng() % 6)});
    }
  }
  return c;
}

void test_planner_streams_random() {
  std::mt19937_64 rng(g_seed * 31);
  const std::vector<std::string> methods = {"naive", "greedy", "sweep", "bottom_up", "portfolio", "auto"};
  const std::vector<std::string> sharings = {"shared", "per_stream", "auto"};
  for (int round = 0; round < scaled(120, 20); ++round) {
    const StreamCase c = random_stream_case(rng, round % 4 == 0 ? 30 : 10, 1 + int32_t(rng() % 3));
    planner::StreamLifetimes life;
    try {
      life = planner::StreamLiveness(c.buffers, c.schedule).lifetimes();
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string("lifetimes: ") + e.what());
      continue;
    }
    for (size_t b = 0; b < c.buffers.size(); ++b) {
      CHECK(c.buffers[b].upper <= life.bound[b] && life.bound[b] <= life.own[b]);
      CHECK(life.own[b] <= life.shared[b] && life.shared[b] <= life.horizon);
    }
    // The bound's buffers at one step are pairwise live at once: a true bound.
    for (const Buffer& t : c.buffers) {
      std::vector<size_t> at;
      for (size_t b = 0; b < c.buffers.size(); ++b)
        if (c.buffers[b].lower <= t.lower && t.lower < life.bound[b] && c.buffers[b].size > 0) at.push_back(b);
      for (size_t i = 0; i < at.size(); ++i)
        for (size_t j = i + 1; j < at.size(); ++j) CHECK(brute_live_at_once(c, at[i], at[j]));
    }
    for (const std::string& m : methods) {
      for (const std::string& sh : sharings) {
        planner::SolveOptions options;
        options.method = m;
        options.sharing = sh;
        options.time_limit = 0.1;
        options.alignment = rng() % 3 == 0 ? 4 : 1;
        planner::Solution s;
        try {
          s = planner::solve(c.buffers, c.schedule, options);
        } catch (const std::exception& e) {
          report_failure(__FILE__, __LINE__, "solve(" + m + ", " + sh + "): " + e.what());
          continue;
        }
        StreamCase padded = c;
        padded.buffers = planner::pad_sizes(c.buffers, options.alignment);
        CHECK_MSG(brute_valid_streams(padded, s.offsets), "method " + m + ", sharing " + sh);
        CHECK(s.height >= s.lower_bound);
        CHECK(s.height == planner::height_of(padded.buffers, s.offsets));
        if (!c.schedule.single_stream()) CHECK(sh == "auto" ? !s.sharing.empty() : s.sharing == sh);
      }
    }
    // validate_streams() agrees with the brute force on random placements.
    for (int k = 0; k < 6 && !c.buffers.empty(); ++k) {
      std::vector<Offset> off(c.buffers.size());
      for (auto& o : off) o = Offset(rng() % 300);
      const auto v = planner::validate_streams(c.buffers, c.schedule, off);
      CHECK_MSG(v.ok == brute_valid_streams(c, off), v.message);
    }
    // Happens-before agrees with the brute force.
    const planner::HappensBefore hb({0, 1, 2}, c.schedule.syncs);
    for (int k = 0; k < 40; ++k) {
      const int32_t s = int32_t(rng() % 3), x = int32_t(rng() % 3);
      const Time u = Time(rng() % 40), t = Time(rng() % 40);
      CHECK(hb.before(s, u, x, t) == brute_before(c.schedule.syncs, s, u, x, t));
    }
  }
}

void test_planner_streams_bad_input() {
  planner::StreamSchedule s;
  const std::vector<Buffer> bs = {Buffer{0, 0, 2, 8}, Buffer{1, 1, 3, 8}};
  s.home = {0, 1};
  s.reads = {{0, 1, 4}};  // no sync from stream 0 after step 0 reaches it
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s));
  s.syncs = {{0, 0, 1, 4}};  // now ordered, but nothing syncs back to stream 0
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s));
  try {
    planner::solve(bs, s);
  } catch (const std::invalid_argument& e) {
    CHECK_MSG(contains(e.what(), "buffer 0") && contains(e.what(), "never be released"), e.what());
  }
  s.syncs.push_back({1, 4, 0, 6});
  CHECK(planner::solve(bs, s).height == 16);
  for (const Sync& bad : {Sync{0, 3, 0, 5}, Sync{0, 5, 1, 5}, Sync{-1, 0, 1, 2}}) {
    planner::StreamSchedule t = s;
    t.syncs.push_back(bad);
    CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  }
  planner::StreamSchedule t = s;
  t.reads.push_back({7, 0, 1});
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.reads.push_back({1, 1, 0});  // on its home stream before its producer
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.home = {0};
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.home = {0, -2};
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  planner::SolveOptions options;
  options.sharing = "sometimes";
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s, options));
  // The read in flight keeps buffer 0 until the sync back at step 6.
  const auto life = planner::StreamLiveness(bs, s).lifetimes();
  CHECK(life.own[0] == 6 && life.own[1] == 3);
}

planner::PipelineGraph random_graph(std::mt19937_64& rng, int32_t n) {
  planner::PipelineGraph g;
  for (int32_t v = 0; v < n; ++v) {
    g.names.push_back("n" + std::to_string(v));
    g.cost.push_back(double(rng() % 5));
  }
  for (int32_t v = 0; v < n; ++v) {
    if (rng() % 4 == 0) continue;
    planner::GraphBuffer b;
    b.name = "b" + std::to_string(v);
    b.producer = v;
    for (int32_t r = v + 1; r < n; ++r)
      if (rng() % 4 == 0 || r == v + 1) b.readers.push_back(r);
    b.returned = rng() % 7 == 0;
    b.size = 1 + int64_t(rng() % 64);
    for (int32_t r : b.readers) g.edges.emplace_back(v, r);
    g.buffers.push_back(b);
  }
  return g;
}

void test_planner_pipeline() {
  std::mt19937_64 rng(g_seed * 37);
  for (int round = 0; round < scaled(60, 12); ++round) {
    const int32_t n = 2 + int32_t(rng() % 9);
    const planner::PipelineGraph g = random_graph(rng, n);
    const int32_t stages = 1 + int32_t(rng() % std::min(n, 4));
    planner::PipelineOptions options;
    options.stages = stages;
    options.in_flight = 1 + int32_t(rng() % 3);
    options.solve.time_limit = 0.1;
    options.solve.alignment = rng() % 2 ? 1 : 8;
    planner::PipelinePlan p;
    try {
      p = planner::plan_pipeline(g, options);
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string("plan_pipeline: ") + e.what());
      continue;
    }
    Offset sum = 0, bounds = 0;
    for (const auto& s : p.stage) {
      sum += s.plan.height;
      bounds += s.plan.lower_bound;
    }
    CHECK(p.height == sum + p.slot_bytes && p.lower_bound == bounds + p.slot_bytes && p.height >= p.lower_bound);
    CHECK(p.speedup >= 1 - 1e-9 && p.speedup <= stages + 1e-9);
    for (size_t v = 1; v < p.stage_of.size(); ++v) CHECK(p.stage_of[v - 1] <= p.stage_of[v]);
    for (const auto& slot : p.slots) CHECK(slot.copies == slot.to_stage - slot.from_stage + options.in_flight - 1);
    // The steady state, checked by brute force; a copy moved onto its neighbour must fail.
    const auto run = planner::unroll_pipeline(g, p, planner::steady_items(p));
    StreamCase c{run.buffers, run.schedule};
    if (run.buffers.size() <= 120) CHECK(brute_valid_streams(c, run.offsets));
    CHECK(planner::validate_streams(run.buffers, run.schedule, run.offsets).ok);
    for (const auto& slot : p.slots) {
      if (slot.size == 0 || slot.copies < 2) continue;
      std::vector<Offset> bad = run.offsets;
      const size_t nb = g.buffers.size();
      bad[nb + size_t(slot.buffer)] = bad[size_t(slot.buffer)];  // item 1 into item 0's copy
      CHECK(!planner::validate_streams(run.buffers, run.schedule, bad).ok);
      break;
    }
    // With in_flight >= 2, the stages of one slot are unordered: all busy.
    if (options.in_flight >= 2 && stages >= 2) {
      const int32_t slot = stages;  // stage k works on item slot - k
      for (int32_t k = 0; k < stages; ++k)
        for (int32_t j = 0; j < stages; ++j) {
          if (k == j) continue;
          const int32_t vk = p.stage[k].nodes.back(), vj = p.stage[j].nodes.front();
          const Time tk = run.node_step[size_t(slot - k) * size_t(n) + size_t(vk)];
          const Time tj = run.node_step[size_t(slot - j) * size_t(n) + size_t(vj)];
          CHECK(!brute_before(run.schedule.syncs, k, tk, j, tj));
        }
    }
  }
  // Bad input names what is wrong.
  planner::PipelineGraph g;
  g.names = {"a", "b", "c"};
  g.cost = {1, 1, 1};
  g.buffers = {{"x", 0, {1, 2}, false, 8}, {"y", 1, {2}, true, 8}};
  g.edges = {{0, 1}, {1, 2}};
  planner::PipelineOptions options;
  options.in_flight = 0;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.in_flight = 2;
  options.stages = 0;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.stages = 4;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.stages = 2;
  options.stage_of = {1, 0, 1};
  try {
    planner::plan_pipeline(g, options);
    report_failure(__FILE__, __LINE__, "a cut that breaks a dependency was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_MSG(contains(e.what(), "breaks a dependency") && contains(e.what(), "node b"), e.what());
  }
  options.stage_of = {0, 0, 0};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));  // stage 1 empty
  options.stage_of = {0, 1, 1};
  const auto p = planner::plan_pipeline(g, options);
  CHECK(p.slots.size() == 2 && p.slots[0].copies == 2 && p.slots[1].copies == 2);
  g.cost = {1, -1, 1};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  g.cost = {1, 1, 1};
  g.edges = {{2, 1}};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  // The balanced cut: equal costs in two halves, the cut where the fewest bytes cross.
  planner::PipelineGraph line;
  for (int v = 0; v < 8; ++v) {
    line.names.push_back("v" + std::to_string(v));
    line.cost.push_back(1);
  }
  for (int v = 0; v + 1 < 8; ++v) line.buffers.push_back({"o" + std::to_string(v), v, {v + 1}, false, v == 3 ? 1 : 100});
  const auto cut = planner::cut_stages(line, 2, 0.3);
  CHECK(cut == std::vector<int32_t>({0, 0, 0, 0, 1, 1, 1, 1}));
}

// ---------------------------------------------------------------------------
// Planned slab: random plans whose offsets overlap at random (the slab must
// stay safe whatever a plan says), steps that follow, diverge from or escape
// their plan, plans added and removed, device failures when the region grows
// or a miss reaches the fallback.

std::vector<PlannedSlot> random_plan(std::mt19937_64& rng, size_t height) {
  std::vector<PlannedSlot> slots(4 + rng() % 40);
  for (PlannedSlot& s : slots) {
    s.size = 1 + rng() % std::min<size_t>(height, 2 * MiB);
    s.offset = rng() % 10 == 0 ? PlannedSlab::kUnplanned : 64 * (rng() % ((height - s.size) / 64 + 1));
    s.stream = rng() % 8 == 0 ? 1 : 0;
  }
  return slots;
}

void planned_slab_random(Kind kind, double fault_probability, uint64_t seed) {
  auto inner = make_device(kind, kind == Kind::kHost ? 384 * MiB : 1 * GiB);
  FaultyDevice dev(*inner);
  std::mt19937_64 rng(seed);
  LiveSet live;
  {
    auto fallback = std::make_shared<CachingAllocator>(dev, AllocatorConfig{});
    PlannedSlab slab(fallback);
    std::map<PlannedSlab::PlanId, std::vector<PlannedSlot>> plans;
    if (fault_probability > 0) dev.fail_randomly(fault_probability, seed);
    const int steps = scaled(300, 60);
    for (int step = 0; step < steps; ++step) {
      if (plans.empty() || rng() % 6 == 0) {
        const size_t height = 64 * (1 + rng() % (32 * MiB / 64));
        std::vector<PlannedSlot> slots = random_plan(rng, height);
        plans.emplace(slab.add_plan(slots, height), slots);
      } else if (plans.size() > 1 && rng() % 6 == 0) {
        auto it = std::next(plans.begin(), rng() % plans.size());
        slab.remove_plan(it->first);
        plans.erase(it);
      }
      if (rng() % 7 == 0) {
        const PlannedSlabStats before = slab.stats();
        const bool idle = before.live_in_slab == 0 && before.region_bytes > 0;
        CHECK(slab.release_idle_region() == idle);
        CHECK(slab.stats().region_bytes == (idle ? 0 : before.region_bytes));
      }
      auto plan = std::next(plans.begin(), rng() % plans.size());
      slab.begin_step(plan->first);
      const std::vector<PlannedSlot>& slots = plan->second;
      uint64_t made = 0;
      for (size_t i = 0; i < slots.size() + rng() % 4; ++i) {
        if (!live.blocks.empty() && rng() % 3 == 0) {
          auto [addr, b] = live.take(rng());
          if (kind == Kind::kHost) CHECK_MSG(intact(addr, b.size, b.tag), "a live block was overwritten");
          slab.deallocate(reinterpret_cast<void*>(addr));
        }
        const bool follow = i < slots.size() && rng() % 5 != 0;
        const size_t size = follow ? slots[i].size : 1 + rng() % (2 * MiB);
        const Stream stream = follow ? slots[i].stream : rng() % 2;
        void* p = nullptr;
        try {
          p = slab.allocate(size, stream);
        } catch (const OutOfMemory&) {
          ++made;  // a miss the fallback could not serve
          continue;
        }
        ++made;
        const auto addr = reinterpret_cast<uintptr_t>(p);
        CHECK(addr % 64 == 0);
        const uint8_t tag = static_cast<uint8_t>(1 + rng() % 250);
        CHECK_MSG(live.insert(addr, size, tag), "a new allocation overlaps a live one");
        if (kind == Kind::kHost) fill(addr, size, tag);
      }
      slab.end_step();
      const PlannedSlabStats st = slab.stats();
      CHECK(st.step_hits + st.step_misses + st.step_unplanned == made);
      CHECK(st.plans == plans.size());
      INVARIANTS(*fallback);
    }
    dev.disarm();
    while (!live.blocks.empty()) {
      auto [addr, b] = live.take(0);
      if (kind == Kind::kHost) CHECK(intact(addr, b.size, b.tag));
      slab.deallocate(reinterpret_cast<void*>(addr));
    }
    for (const auto& [id, slots] : plans) slab.remove_plan(id);
    CHECK(slab.stats().region_bytes == 0 && !slab.has_live_allocations());
    CHECK(fallback->stats().allocated_bytes[kAggregate].current == 0);
    fallback->empty_cache();
  }
  DEVICE_CLEAN(dev);
}

void test_planned_slab_random() {
  for (Kind kind : {Kind::kSim, Kind::kHost}) planned_slab_random(kind, 0.0, g_seed + 31);
}

void test_planned_slab_random_faults() {
  for (Kind kind : {Kind::kSim, Kind::kHost})
    for (double p : {0.2, 0.6}) planned_slab_random(kind, p, g_seed * 77 + static_cast<uint64_t>(p * 10));
}

// ---------------------------------------------------------------------------
// Fork safety (Note [Fork safety] in core/sync/fork_safety.h): a child forked while
// other threads are inside the allocators must find every lock free and the
// allocators consistent. Each child runs its checks and reports through its
// exit status; the parent kills a child still running after kChildTimeout
// and counts it as hung.

constexpr double kChildTimeout = 30.0;  // seconds: TSan children are slow, a healthy one takes milliseconds

enum class ChildEnd { kExited, kHung };

// Waits for `pid`; a child still running after `timeout` seconds is killed.
ChildEnd wait_child(pid_t pid, double timeout, int* exit_code) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return ChildEnd::kExited;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return ChildEnd::kHung;
}

// fork() without running the pthread_atfork handlers: what a child got
// before torchmem took its locks around fork (the control experiment).
pid_t fork_without_handlers() { return static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0)); }

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// Exit statuses of the children.
constexpr int kChildOk = 0, kChildBroken = 1, kChildThrew = 2;

// In a child: frees the parent's blocks, allocates and frees its own through
// every allocator, and checks invariants and statistics.
int fork_child_checks(CachingAllocator& a, CachingAllocator& b, Arena& arena, RecordingAllocator& recorder,
                      const std::vector<void*>& parents_a, const std::vector<void*>& parents_b) {
  try {
    const auto count = [](const CachingAllocator& x) { return x.stats().allocation[kAggregate].current; };
    const int64_t live_a = count(a), live_b = count(b);
    for (void* p : parents_a) a.deallocate(p);
    for (void* p : parents_b) recorder.deallocate(p);
    if (count(a) != live_a - static_cast<int64_t>(parents_a.size())) return kChildBroken;
    if (count(b) != live_b - static_cast<int64_t>(parents_b.size())) return kChildBroken;
    std::vector<std::pair<Allocator*, void*>> mine;
    for (size_t size : {size_t(4 * KiB), size_t(700 * KiB), size_t(3 * MiB), size_t(24 * MiB)}) {
      for (Allocator* x : std::initializer_list<Allocator*>{&a, &recorder, &arena}) {
        void* p = x->allocate(size);
        std::memset(p, 0x5a, size);
        mine.push_back({x, p});
      }
    }
    for (auto& [x, p] : mine) x->deallocate(p);
    a.check_invariants();
    b.check_invariants();
    arena.check_invariants();
    if (count(a) != live_a - static_cast<int64_t>(parents_a.size())) return kChildBroken;
    return kChildOk;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fork child: %s\n", e.what());
    return kChildThrew;
  }
}

// Threads allocate and free through two caching allocators (one with
// expandable segments, behind a recording allocator), an arena whose
// fallback is the first, with a history context provider on every
// allocation, while another thread forks again and again.
void test_fork_while_threads_allocate() {
  const size_t mutexes_before = fork_safe_mutex_count();
  {
    HostDevice dev_a(1 * GiB), dev_b(1 * GiB), dev_arena(64 * MiB);
    CachingAllocator a(dev_a);
    CachingAllocator b(dev_b, AllocatorConfig::parse("expandable_segments:True"));
    Arena arena(dev_arena, ArenaOptions{4 * MiB, 64, &a});
    auto b_shared = std::shared_ptr<Allocator>(&b, [](Allocator*) {});
    RecordingAllocator recorder(b_shared);
    CHECK(fork_safe_mutex_count() == mutexes_before + 3 + 2 + 2 + 1 + 1);  // devices, allocators + histories, arena, recorder
    std::atomic<uint64_t> contexts{0};
    a.history().enable(1024, [&] { return ++contexts; });

    std::vector<void*> parents_a, parents_b;  // live in the parent; each child frees its copies
    for (size_t size : {size_t(512), size_t(100 * KiB), size_t(2 * MiB), size_t(30 * MiB)}) {
      parents_a.push_back(a.allocate(size));
      parents_b.push_back(recorder.allocate(size));
    }

    std::atomic<bool> stop{false};
    auto worker = [&](int id) {
      std::mt19937_64 rng(g_seed * 131 + id);
      std::vector<std::pair<Allocator*, void*>> mine;
      while (!stop.load(std::memory_order_relaxed)) {
        if (mine.size() < 16 && rng() % 3 != 0) {
          Allocator* x = rng() % 3 == 0 ? static_cast<Allocator*>(&arena)
                                        : rng() % 2 ? static_cast<Allocator*>(&a) : static_cast<Allocator*>(&recorder);
          try {
            mine.push_back({x, x->allocate(1 + rng() % (rng() % 8 == 0 ? 12 * MiB : 256 * KiB))});
          } catch (const OutOfMemory&) {
          }
        } else if (!mine.empty()) {
          const size_t i = rng() % mine.size();
          mine[i].first->deallocate(mine[i].second);
          mine[i] = mine.back();
          mine.pop_back();
        }
        if (rng() % 64 == 0) arena.rewind();
        if (rng() % 512 == 0) a.empty_cache();
      }
      for (auto& [x, p] : mine) x->deallocate(p);
    };

    const int forks = scaled(200, 20);
    int hung = 0, bad = 0;
    std::vector<std::thread> pool;
    for (int i = 0; i < 3; ++i) pool.emplace_back(worker, i);
    std::thread forker([&] {
      for (int i = 0; i < forks && hung < 3; ++i) {  // three hangs are enough to fail: stop waiting
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        const pid_t pid = fork();
        if (pid == 0) _exit(fork_child_checks(a, b, arena, recorder, parents_a, parents_b));
        if (pid < 0) {
          ++bad;
          continue;
        }
        int code = 0;
        if (wait_child(pid, kChildTimeout, &code) == ChildEnd::kHung) {
          ++hung;
        } else if (code != kChildOk) {
          ++bad;
          report_failure(__FILE__, __LINE__, "fork child " + std::to_string(i) + " exited with " + std::to_string(code));
        }
      }
    });
    forker.join();
    stop = true;
    for (auto& t : pool) t.join();
    CHECK_MSG(hung == 0, std::to_string(hung) + " of " + std::to_string(forks) + " children hung");
    CHECK(bad == 0);

    for (void* p : parents_a) a.deallocate(p);
    for (void* p : parents_b) recorder.deallocate(p);
    arena.reset();
    INVARIANTS(a);
    INVARIANTS(b);
    INVARIANTS(arena);
    CHECK(a.stats().allocation[kAggregate].current == 0);
    CHECK(b.stats().allocation[kAggregate].current == 0);
    CHECK(contexts.load() > 0);
    a.empty_cache();
    b.empty_cache();
  }
  CHECK_MSG(fork_safe_mutex_count() == mutexes_before,
            std::to_string(fork_safe_mutex_count()) + " mutexes registered, " + std::to_string(mutexes_before) + " before");
}

// One thread holds the allocator's lock (a free-memory callback runs under
// it, sleeping) when another forks. fork() waits for the lock, so the child
// sees the callback finished and allocates at once; the control, a fork that
// skips the handlers, leaves the lock held in the child, which hangs.
void fork_with_lock_held(bool run_handlers) {
  HostDevice dev(256 * MiB);
  CachingAllocator a(dev);
  std::atomic<bool> in_callback{false}, callback_done{false};
  a.add_free_memory_callback([&] {
    in_callback = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    callback_done = true;
    return false;
  });
  std::thread holder([&] { a.deallocate(a.allocate(1 * MiB)); });  // a miss: the callback runs under the lock
  while (!in_callback.load()) std::this_thread::yield();
  const pid_t pid = run_handlers ? fork() : fork_without_handlers();
  if (pid == 0) {
    const bool waited = callback_done.load();
    void* p = a.allocate(4 * KiB);
    a.deallocate(p);
    _exit(waited ? kChildOk : kChildBroken);
  }
  holder.join();
  CHECK(pid > 0);
  if (pid <= 0) return;
  int code = -1;
  const ChildEnd end = wait_child(pid, run_handlers ? kChildTimeout : 2.0, &code);
  if (run_handlers) {
    CHECK_MSG(end == ChildEnd::kExited, "the child hung on the allocator's lock");
    CHECK_MSG(code == kChildOk, "child exit " + std::to_string(code) + " (1: fork did not wait for the lock)");
  } else {
    CHECK_MSG(end == ChildEnd::kHung, "the control did not reproduce the hang (child exit " + std::to_string(code) + ")");
  }
  INVARIANTS(a);
  a.empty_cache();
}

// FastMutex: mutual exclusion through its spinning and its sleeping paths.
// Holders that sometimes sleep make waiters give up spinning and sleep on
// the futex, so a lost wake-up hangs this test (the driver's timeout).
void test_fast_mutex() {
  torchmem::FastMutex mutex;
  const int threads = 4;
  const int rounds = scaled(20000, 4000);
  long counter = 0;  // plain: a broken lock loses increments (and ThreadSanitizer reports the race)
  std::atomic<int> inside{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<torchmem::FastMutex> lock(mutex);
        if (inside.fetch_add(1) != 0) CHECK(false);
        ++counter;
        if ((i + t) % 997 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(counter == static_cast<long>(threads) * rounds);
  CHECK(mutex.try_lock());
  CHECK(!mutex.try_lock());
  mutex.unlock();
}

void test_fork_waits_for_a_held_lock() {
  // Only without ThreadSanitizer: the control forks behind its back, and under it the child of the
  // real fork has been seen not to observe the holder's write (it passes in the plain and ASan builds;
  // the 200-fork test runs under TSan).
  if (kThreadSanitizer) return;
  fork_with_lock_held(true);
  fork_with_lock_held(false);
}

// ---------------------------------------------------------------------------
// Replayer

void test_replayer() {
  // Bad events: the error names the event; with skip_bad_events they are counted.
  for (bool skip : {false, true}) {
    Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, skip);
    const uint8_t ops[] = {0, 1, 1, 0, 0, 7};
    const uint64_t ids[] = {1, 1, 1, 2, 2, 3};
    const uint64_t sizes[] = {4096, 0, 0, 8192, 8192, 1};
    const uint64_t streams[] = {0, 0, 0, 0, 0, 0};
    std::string message;
    if (!skip) {
      CHECK(expect_throw<std::invalid_argument>([&] { r.run(ops, ids, sizes, streams, nullptr, 6); }, &message).empty());
      CHECK_MSG(contains(message, "event 2") && contains(message, "free of id 1"), message);
    } else {
      CHECK(expect_throw<std::invalid_argument>([&] { r.run(ops, ids, sizes, streams, nullptr, 6); }, &message).empty());
      CHECK_MSG(contains(message, "unknown operation code 7"), message);
      CHECK(r.skipped() == 2);
    }
    INVARIANTS(r.allocator());
  }
  // A trace that does not fit stops at the first OOM and records it.
  Replayer r(100 * MiB, 10 * MiB, AllocatorConfig{}, 4, false);
  std::vector<uint8_t> ops;
  std::vector<uint64_t> ids, sizes, streams;
  for (uint64_t i = 0; i < 10; ++i) {
    ops.push_back(0);
    ids.push_back(i);
    sizes.push_back(30 * MiB);
    streams.push_back(0);
  }
  const size_t consumed = r.run(ops.data(), ids.data(), sizes.data(), streams.data(), nullptr, ops.size());
  CHECK(r.stopped() && r.oom() && r.oom()->index == 3 && consumed == 3);
  CHECK(r.run(ops.data(), ids.data(), sizes.data(), streams.data(), nullptr, ops.size()) == 0);
  INVARIANTS(r.allocator());
  // Sizes the device can never hold are an OOM, not a crash.
  Replayer big(1 * GiB, 0, AllocatorConfig{}, 1, false);
  const uint8_t op = 0;
  const uint64_t id = 1, huge = std::numeric_limits<uint64_t>::max(), stream = 0;
  big.run(&op, &id, &huge, &stream, nullptr, 1);
  CHECK(big.stopped());
  CHECK_THROWS(std::invalid_argument, Replayer(1 * GiB, 2 * GiB, AllocatorConfig{}, 1, false));
}

// A recorded run replayed from its midpoint: the state then restored, the rest
// of the history turned into events (recorded addresses, releases), every
// placement compared. Then restore_segment's bad input.
void test_replayer_follows_recording() {
  for (const char* conf : {"", "max_split_size_mb:24", "expandable_segments:True"}) {
    SimDevice device(4 * GiB);
    CachingAllocator a(device, AllocatorConfig::parse(conf));
    std::mt19937_64 rng(11);
    std::vector<void*> live;
    auto step = [&] {
      if (!live.empty() && rng() % 100 < 45) {
        const size_t k = rng() % live.size();
        a.deallocate(live[k]);
        live[k] = live.back();
        live.pop_back();
      } else if (rng() % 200 == 0) {
        a.empty_cache();
      } else {
        const size_t kinds[] = {700, 70000, 3 * MiB, 30 * MiB};
        live.push_back(a.allocate(kinds[rng() % 4] + rng() % 4096));
      }
    };
    for (int i = 0; i < 1500; ++i) step();
    const std::vector<SegmentInfo> start = a.segments();
    a.enable_history(1 << 20);
    for (int i = 0; i < 1500; ++i) step();

    Replayer r(4 * GiB, 0, AllocatorConfig::parse(conf), 64, false, true);
    std::unordered_map<uintptr_t, uint64_t> id_of;
    uint64_t next_id = 0;
    RecordedRange ranges[2];  // expandable: one range per pool, beginning at its lowest mapped page
    std::vector<uint64_t> range_ids[2];
    for (const SegmentInfo& seg : start) {
      RecordedSegment rs{seg.addr, seg.total_size, seg.stream, seg.is_small, {}};
      std::vector<uint64_t> ids;
      for (const BlockInfo& b : seg.blocks) {
        if (!b.allocated) continue;
        rs.live_blocks.push_back({b.addr, b.size, b.requested_size});
        ids.push_back(id_of[b.addr] = next_id++);
      }
      if (!seg.is_expandable) {
        r.restore(rs, ids);
        continue;
      }
      RecordedRange& range = ranges[seg.is_small];
      if (range.mapped.empty()) range.base = seg.addr;
      range.is_small = seg.is_small;
      range.mapped.push_back({seg.addr, seg.total_size});
      range.live_blocks.insert(range.live_blocks.end(), rs.live_blocks.begin(), rs.live_blocks.end());
      range_ids[seg.is_small].insert(range_ids[seg.is_small].end(), ids.begin(), ids.end());
    }
    for (int k = 0; k < 2; ++k) {
      if (!ranges[k].mapped.empty()) r.restore_expandable(ranges[k], range_ids[k]);
    }
    INVARIANTS(r.allocator());
    std::vector<uint8_t> ops;
    std::vector<uint64_t> ids, sizes, streams, addrs;
    auto add = [&](ReplayOp op, uint64_t id, uint64_t size, uint64_t addr) {
      ops.push_back(static_cast<uint8_t>(op));
      ids.push_back(id);
      sizes.push_back(size);
      streams.push_back(0);
      addrs.push_back(addr);
    };
    for (const TraceEntry& e : a.history_entries()) {
      switch (e.action) {
        case Action::kAlloc: add(ReplayOp::kAlloc, id_of[e.addr] = next_id++, e.size, e.addr); break;
        case Action::kFreeCompleted: {
          auto it = id_of.find(e.addr);
          if (it != id_of.end()) add(ReplayOp::kFree, it->second, 0, 0);
          if (it != id_of.end()) id_of.erase(it);
          break;
        }
        case Action::kSegmentAlloc: add(ReplayOp::kSegmentAddress, 0, e.size, e.addr); break;
        case Action::kSegmentMap: add(ReplayOp::kSegmentAddress, 0, 0, e.addr); break;
        case Action::kSegmentFree:
        case Action::kSegmentUnmap: add(ReplayOp::kReleaseSegment, 0, e.size, e.addr); break;
        default: break;
      }
    }
    r.run(ops.data(), ids.data(), sizes.data(), streams.data(), addrs.data(), ops.size());
    const ReplayFidelity& f = r.fidelity();
    CHECK_MSG(!r.stopped() && f.placements_differed == 0 && f.segments_missed == 0 && f.releases_missed == 0,
              std::string(conf) + ": first difference at event " + std::to_string(f.first_difference));
    CHECK(f.placements_matched > 500);
    INVARIANTS(r.allocator());
    CHECK(r.allocator().stats().reserved_bytes[kAggregate].current == a.stats().reserved_bytes[kAggregate].current);
  }
  // restore_segment: a bad layout is refused and leaves the allocator as it was.
  Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, false);
  const uintptr_t base = uintptr_t(1) << 44;
  RecordedSegment seg{base, 20 * MiB, 0, false, {{base, 4 * MiB, 3 * MiB}, {base + 2 * MiB, 0, MiB}}};
  CHECK_THROWS(std::invalid_argument, r.restore(seg, {1, 2}));  // overlapping blocks
  CHECK(r.allocator().stats().reserved_bytes[kAggregate].current == 0 && r.device().live_segments() == 0);
  seg.live_blocks = {{base, 0, 3 * MiB}, {base + 4 * MiB, 0, 15 * MiB}};
  r.restore(seg, {1, 2});  // sizes inferred: each absorbs the 1 MiB tail it could not split off
  const std::vector<SegmentInfo> got = r.allocator().segments();
  CHECK(got.size() == 1 && got[0].blocks.size() == 2 && got[0].blocks[0].size == 4 * MiB && got[0].blocks[1].size == 16 * MiB);
  CHECK_THROWS(std::invalid_argument, r.restore(seg, {3, 4}));  // overlaps the segment already there
  CHECK_THROWS(std::invalid_argument, r.restore(RecordedSegment{base + GiB, 2 * GiB, 0, false, {}}, {}));  // too big
  INVARIANTS(r.allocator());
}


// ---------------------------------------------------------------------------
// OOM observers: notes in order, failures reported and never thrown, an OOM
// inside an observer not reported again, changes during a notify, threads,
// and the glue's pattern (notify after the allocator's OutOfMemory left it,
// so an observer can read the allocator's segments and history).

void test_oom_observers() {
  OomObservers obs;
  OomInfo info;
  info.requested = 3 * MiB;
  CHECK(obs.empty());
  CHECK(obs.notify(0, info).empty());
  const uint64_t a = obs.add([](int device, const OomInfo& i) { return "a " + std::to_string(device) + " " + std::to_string(i.requested); });
  const uint64_t b = obs.add([](int, const OomInfo&) { return std::string(); });
  const uint64_t c = obs.add([](int, const OomInfo&) -> std::string { throw std::runtime_error("disk full"); });
  const uint64_t d = obs.add([](int, const OomInfo&) { return std::string("d"); });
  CHECK(!obs.empty());
  std::string notes = obs.notify(2, info);
  CHECK_MSG(notes == "\na 2 " + std::to_string(3 * MiB) + "\ntorchmem: an out-of-memory observer failed: disk full\nd", notes);
  CHECK(obs.remove(c));
  CHECK(!obs.remove(c));
  CHECK(obs.remove(b));
  CHECK_MSG(obs.notify(0, info) == "\na 0 " + std::to_string(3 * MiB) + "\nd", obs.notify(0, info));
  CHECK(obs.remove(a) && obs.remove(d) && obs.empty());

  // Re-entry on the same thread (an OOM inside an observer) is not reported again.
  int calls = 0;
  const uint64_t r = obs.add([&](int, const OomInfo& i) {
    ++calls;
    return "outer(" + obs.notify(0, i) + ")";
  });
  CHECK_MSG(obs.notify(0, info) == "\nouter()", obs.notify(0, info));
  CHECK(calls == 1);
  obs.remove(r);

  // An observer may add and remove observers: the change applies from the next notify.
  uint64_t self = 0;
  self = obs.add([&](int, const OomInfo&) {
    obs.remove(self);
    obs.add([](int, const OomInfo&) { return std::string("late"); });
    return std::string("once");
  });
  CHECK(obs.notify(0, info) == "\nonce");
  CHECK(obs.notify(0, info) == "\nlate");
}

void test_oom_observers_threads() {
  OomObservers obs;
  std::atomic<int> told{0};
  std::atomic<bool> stop{false};
  obs.add([&](int, const OomInfo&) {
    told.fetch_add(1);
    return std::string("x");
  });
  std::vector<std::thread> threads;
  const int rounds = scaled(20000, 2000);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      OomInfo info;
      for (int i = 0; i < rounds; ++i) {
        const std::string notes = obs.notify(0, info);
        if (notes.rfind("\nx", 0) != 0) CHECK_MSG(false, notes);
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      const uint64_t id = obs.add([](int, const OomInfo&) { return std::string("y"); });
      obs.remove(id);
    }
  });
  for (int t = 0; t < 3; ++t) threads[t].join();
  stop = true;
  threads.back().join();
  CHECK(told.load() == 3 * rounds);
}

void test_oom_observers_after_allocator_oom() {
  SimDevice dev(64 * MiB);
  CachingAllocator a(dev);
  a.enable_history(1000);
  void* keep = a.allocate(40 * MiB);
  OomObservers obs;
  size_t seen_segments = 0;
  TraceEntry last{};
  obs.add([&](int, const OomInfo& info) {
    seen_segments = a.segments().size();  // takes the allocator's lock: must not be held now
    const auto entries = a.history_entries();
    if (!entries.empty()) last = entries.back();
    return "snapshot taken, " + format_size(info.requested) + " refused";
  });
  std::string message;
  try {
    a.allocate(40 * MiB);
  } catch (const OutOfMemory& e) {
    message = std::string(e.what()) + obs.notify(0, e.info());
  }
  CHECK_MSG(contains(message, "out of memory. Tried to allocate 40.00 MiB") &&
                contains(message, "\nsnapshot taken, 40.00 MiB refused"),
            message);
  CHECK(seen_segments == 1);
  CHECK(last.action == Action::kOom && last.size == 40 * MiB && last.addr == 24 * MiB);  // addr: device_free
  a.deallocate(keep);
  INVARIANTS(a);
}

// ---------------------------------------------------------------------------

const Test kTests[] = {
    {"caching_random", test_caching_random},
    {"caching_random_faults", test_caching_random_faults},
    {"caching_retry_releases_cache", test_caching_retry_releases_cache},
    {"caching_oom_is_clear_and_recoverable", test_caching_oom_is_clear_and_recoverable},
    {"caching_fail_kth", test_caching_fail_kth},
    {"caching_reserve_failure", test_caching_reserve_failure},
    {"caching_device_full", test_caching_device_full},
    {"caching_destructor_returns_everything", test_caching_destructor_returns_everything},
    {"caching_bad_input", test_caching_bad_input},
    {"stitch_random", test_stitch_random},
    {"stitch_random_faults", test_stitch_random_faults},
    {"stitch_threads", test_stitch_threads},
    {"caching_threads", test_caching_threads},
    {"caching_threads_faults", test_caching_threads_faults},
    {"caching_threads_history", test_caching_threads_history},
    {"pmr_over_caching_threads", test_pmr_over_caching_threads},
    {"arena_random", test_arena_random},
    {"arena_faults_and_bad_input", test_arena_faults_and_bad_input},
    {"arena_threads", test_arena_threads},
    {"arena_holes_steps", test_arena_holes_steps},
    {"arena_holes_threads", test_arena_holes_threads},
    {"arena_streams_and_source", test_arena_streams_and_source},
    {"block_pool_random", test_block_pool_random},
    {"planner_random", test_planner_random},
    {"planner_bad_input", test_planner_bad_input},
    {"planner_schedule", test_planner_schedule},
    {"planner_threads", test_planner_threads},
    {"planner_streams_random", test_planner_streams_random},
    {"planner_streams_bad_input", test_planner_streams_bad_input},
    {"planner_pipeline", test_planner_pipeline},
    {"replayer", test_replayer},
    {"replayer_follows_recording", test_replayer_follows_recording},
    {"planned_slab_random", test_planned_slab_random},
    {"planned_slab_random_faults", test_planned_slab_random_faults},
    {"oom_observers", test_oom_observers},
    {"oom_observers_threads", test_oom_observers_threads},
    {"oom_observers_after_allocator_oom", test_oom_observers_after_allocator_oom},
    {"fast_mutex", test_fast_mutex},
    {"fork_while_threads_allocate", test_fork_while_threads_allocate},
    {"fork_waits_for_a_held_lock", test_fork_waits_for_a_held_lock},
};

}  // namespace

int main(int argc, char** argv) { return driver::run_tests(argc, argv, kTests); }
