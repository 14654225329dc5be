// Core driver: arena (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

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

}  // namespace

std::vector<Test> arena_tests() {
  return {
      {"arena_random", test_arena_random},
      {"arena_faults_and_bad_input", test_arena_faults_and_bad_input},
      {"arena_threads", test_arena_threads},
      {"arena_holes_steps", test_arena_holes_steps},
      {"arena_holes_threads", test_arena_holes_threads},
      {"arena_streams_and_source", test_arena_streams_and_source},
  };
}

}  // namespace core_driver
