// Core driver: caching (tests/cpp/core_driver.cpp runs it).
// The caching allocator (native, and policy:stitch in the same loops): random
// sequences on sim and host devices, the OOM path, injected faults, threads,
// and pmr over it.
#include "core_checks.h"

namespace core_driver {

namespace {

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

// A memory fraction limits the device's reserved bytes across allocators
// that share them (a private pool and the default pool, as PyTorch's
// total_allocated_memory), and each one's own when they do not.
void test_caching_fraction_counts_every_pool() {
  for (bool expandable : {false, true}) {
    SimDevice dev(1 * GiB);
    AllocatorConfig conf = AllocatorConfig::parse("per_process_memory_fraction:0.5");
    conf.expandable_segments = expandable;
    CachingAllocator main_pool(dev, conf), graph_pool(dev, conf), alone(dev, conf);
    graph_pool.share_reserved(main_pool.device_reserved());
    void* p = main_pool.allocate(300 * MiB);
    CHECK(main_pool.device_reserved()->bytes() == 300 * MiB);
    CHECK_THROWS(OutOfMemory, graph_pool.allocate(300 * MiB));  // 600 MiB of the device's: over 512 MiB
    void* q = alone.allocate(200 * MiB);                         // its own 200 MiB: under its limit
    void* r = graph_pool.allocate(200 * MiB);                    // 500 MiB with the default pool's
    CHECK(main_pool.device_reserved()->bytes() == 500 * MiB && alone.device_reserved()->bytes() == 200 * MiB);
    main_pool.deallocate(p);
    main_pool.empty_cache();
    CHECK(graph_pool.device_reserved()->bytes() == 200 * MiB);
    graph_pool.deallocate(r);
    alone.deallocate(q);
    graph_pool.empty_cache();
    alone.empty_cache();
    CHECK(main_pool.device_reserved()->bytes() == 0 && alone.device_reserved()->bytes() == 0);
    INVARIANTS(main_pool);
    INVARIANTS(graph_pool);
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

}  // namespace

std::vector<Test> caching_tests() {
  return {
      {"caching_random", test_caching_random},
      {"caching_random_faults", test_caching_random_faults},
      {"caching_retry_releases_cache", test_caching_retry_releases_cache},
      {"caching_oom_is_clear_and_recoverable", test_caching_oom_is_clear_and_recoverable},
      {"caching_fail_kth", test_caching_fail_kth},
      {"caching_reserve_failure", test_caching_reserve_failure},
      {"caching_device_full", test_caching_device_full},
      {"caching_destructor_returns_everything", test_caching_destructor_returns_everything},
      {"caching_bad_input", test_caching_bad_input},
      {"caching_fraction_counts_every_pool", test_caching_fraction_counts_every_pool},
      {"stitch_random", test_stitch_random},
      {"stitch_random_faults", test_stitch_random_faults},
      {"stitch_threads", test_stitch_threads},
      {"caching_threads", test_caching_threads},
      {"caching_threads_faults", test_caching_threads_faults},
      {"caching_threads_history", test_caching_threads_history},
      {"pmr_over_caching_threads", test_pmr_over_caching_threads},
  };
}

}  // namespace core_driver
