// Driver of the stitch policy (csrc/core/policy/stitch/stitch_allocator.h): what it does
// beyond the native contract (stitching free pages, packing and reuse, the
// memory fraction, history, injected device failures, the replayer), with
// the allocator's invariants after every operation. Random sequences and
// threads under policy:stitch run in core_driver.cpp, through the same loops
// as the native policy. Pure C++17; built and run by scripts/sanitize.sh.
//
//   stitch_driver [--quick] [--seed N] [--list] [NAME_SUBSTRING ...]
//
// The exit status is the number of failed checks (capped at 125); "N checks,
// 0 failures" is the last line of a clean run.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "faulty_device.h"
#include "core/devices/host_device.h"
#include "core/devices/sim_device.h"
#include "core/policy/stitch/stitch_allocator.h"
#include "core/replay/replayer.h"

#include "device_checks.h"
#include "driver_checks.h"

using namespace torchmem;

namespace {

using namespace driver;

size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 1 + rng() % 4096;
    case 1: return 1 + rng() % (2 * MiB);
    case 2: return MiB + rng() % (9 * MiB);
    default: return 10 * MiB + rng() % (30 * MiB);
  }
}

enum class Kind { kSim, kHost };

std::unique_ptr<Device> make_device(Kind kind, size_t capacity) {
  if (kind == Kind::kHost) return std::make_unique<HostDevice>(capacity);
  return std::make_unique<SimDevice>(capacity);
}

std::unique_ptr<StitchAllocator> make_stitch(Device& dev, const std::string& conf = "") {
  return std::make_unique<StitchAllocator>(dev, AllocatorConfig::parse(conf));
}

// Free memory scattered in gaps between live blocks serves one large request:
// cached pages are unmapped and mapped again at a fresh place.
void test_stitch_stitches_free_pages() {
  for (Kind kind : {Kind::kSim, Kind::kHost}) {
    auto inner = make_device(kind, 64 * MiB);
    FaultyDevice dev(*inner);
    {
      auto a = make_stitch(dev);
      std::vector<void*> blocks;
      for (int i = 0; i < 16; ++i) blocks.push_back(a->allocate(4 * MiB));  // the whole device, packed
      CHECK(a->stats().reserved_bytes[kAggregate].current == static_cast<int64_t>(64 * MiB));
      CHECK_THROWS(OutOfMemory, a->allocate(512));
      INVARIANTS(*a);
      for (int i = 0; i < 16; i += 2) a->deallocate(blocks[i]);  // 32 MiB free, in 4 MiB gaps
      CHECK(a->largest_free_block() == 4 * MiB);
      void* big = a->allocate(30 * MiB);
      INVARIANTS(*a);
      const DeviceStats s = a->stats();
      CHECK(s.num_alloc_retries == 1);
      CHECK(s.num_ooms == 1);
      CHECK(s.reserved_bytes[kAggregate].current <= static_cast<int64_t>(64 * MiB));
      const auto c = a->counters();
      CHECK(c.reclaims == 1);
      CHECK(c.page_unmaps == 15);       // 30 MiB of cached pages moved...
      CHECK(c.page_maps == 32 + 15);    // ...to the new place
      if (kind == Kind::kHost) {
        fill(reinterpret_cast<uintptr_t>(big), 30 * MiB, 7);
        for (int i = 1; i < 16; i += 2) fill(reinterpret_cast<uintptr_t>(blocks[i]), 4 * MiB, static_cast<uint8_t>(i));
        CHECK(intact(reinterpret_cast<uintptr_t>(big), 30 * MiB, 7));
        for (int i = 1; i < 16; i += 2) CHECK(intact(reinterpret_cast<uintptr_t>(blocks[i]), 4 * MiB, static_cast<uint8_t>(i)));
      }
      a->deallocate(big);
      for (int i = 1; i < 16; i += 2) a->deallocate(blocks[i]);
      a->empty_cache();
      CHECK(a->stats().reserved_bytes[kAggregate].current == 0);
      CHECK(a->segments().empty());
      CHECK(a->ranges() == 0);
    }
    DEVICE_CLEAN(dev);
  }
}

// Small blocks share pages; a page is cached when its last byte is freed, and
// the same shapes again map nothing.
void test_stitch_packs_and_reuses() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  {
    auto a = make_stitch(dev);
    std::vector<void*> small;
    for (int i = 0; i < 64; ++i) small.push_back(a->allocate(32 * KiB));  // 2 MiB: one page
    CHECK(a->stats().reserved_bytes[kSmallPool].current == static_cast<int64_t>(2 * MiB));
    for (void* p : small) a->deallocate(p);
    CHECK(a->stats().reserved_bytes[kAggregate].current == static_cast<int64_t>(2 * MiB));  // cached
    const auto before = a->counters();
    for (int step = 0; step < 3; ++step) {
      std::vector<void*> live;
      for (size_t size : {3 * MiB + 512, 7 * MiB, 512 * KiB, 11 * MiB}) live.push_back(a->allocate(size));
      for (void* p : live) a->deallocate(p);
    }
    const auto after = a->counters();
    CHECK(after.page_unmaps == before.page_unmaps);
    CHECK(after.page_maps - before.page_maps <= 12);  // the first step only: 22 MiB + 512 KiB
    INVARIANTS(*a);
    // Streams: a block freed on stream 0 is never given to stream 1.
    void* p0 = a->allocate(5 * MiB, 0);
    a->deallocate(p0);
    void* p1 = a->allocate(5 * MiB, 1);
    CHECK(p1 != p0);
    const auto segs = a->segments();
    bool on_stream_1 = false;
    for (const SegmentInfo& seg : segs) {
      for (const BlockInfo& b : seg.blocks) {
        if (b.allocated) on_stream_1 |= seg.stream == 1 && b.addr == reinterpret_cast<uintptr_t>(p1);
      }
      CHECK(seg.is_expandable);
    }
    CHECK(on_stream_1);
    a->deallocate(p1);
    a->empty_cache();
  }
  DEVICE_CLEAN(dev);
}

// Every device call fails: OutOfMemory with PyTorch's wording; the allocator
// keeps its blocks and serves the same request once the device recovers.
void test_stitch_oom_is_clear_and_recoverable() {
  SimDevice inner(4 * GiB);
  FaultyDevice dev(inner);
  {
    auto a = make_stitch(dev);
    void* keep = a->allocate(3 * MiB);
    const DeviceStats before = a->stats();
    dev.fail_nth(1, 1000);
    std::string message;
    CHECK(expect_throw<OutOfMemory>([&] { a->allocate(50 * MiB); }, &message).empty());
    CHECK_MSG(contains(message, "out of memory. Tried to allocate 50.00 MiB"), message);
    CHECK_MSG(contains(message, "total capacity of 4.00 GiB"), message);
    const DeviceStats after = a->stats();
    CHECK(after.num_ooms == 1);
    CHECK(after.allocation[kAggregate].current == before.allocation[kAggregate].current);
    CHECK(after.allocated_bytes[kAggregate].current == before.allocated_bytes[kAggregate].current);
    INVARIANTS(*a);
    CHECK(a->owns(keep));
    dev.disarm();
    void* p = nullptr;
    CHECK(expect_throw<OutOfMemory>([&] { p = a->allocate(50 * MiB); }) == "did not throw");
    CHECK(p != nullptr);
    INVARIANTS(*a);
    a->deallocate(p);
    a->deallocate(keep);
    // A range the device will not reserve is an OutOfMemory too.
    a->empty_cache();
    dev.fail_reserve(true);
    CHECK_THROWS(OutOfMemory, a->allocate(4 * MiB));
    INVARIANTS(*a);
    dev.disarm();
    a->deallocate(a->allocate(4 * MiB));
    a->empty_cache();
    CHECK(a->stats().reserved_bytes[kAggregate].current == 0);
  }
  DEVICE_CLEAN(dev);
}

// Fail the k-th device call for every k over a fixed script, three in a row.
void test_stitch_fail_kth() {
  const int max_k = scaled(60, 20);
  for (int k = 1; k <= max_k; ++k) {
    SimDevice inner(8 * GiB);
    FailNthDevice dev(inner, k, 3);
    {
      auto a = make_stitch(dev);
      std::mt19937_64 rng(g_seed + k);
      std::vector<void*> live;
      int ooms = 0;
      for (int step = 0; step < 120; ++step) {
        if (rng() % 3 != 0 || live.empty()) {
          const size_t size = random_size(rng);
          void* p = nullptr;
          try {
            p = a->allocate(size, rng() % 4 == 0);
          } catch (const OutOfMemory&) {
            ++ooms;
            INVARIANTS(*a);
          }
          if (p) live.push_back(p);
        } else {
          const size_t i = rng() % live.size();
          a->deallocate(live[i]);
          live.erase(live.begin() + i);
        }
        if (step % 40 == 39) a->empty_cache();
        INVARIANTS(*a);
      }
      CHECK(ooms <= 3);  // one per injected failure at most: the device has room for everything
      CHECK(a->stats().num_ooms == ooms);
      for (void* p : live) a->deallocate(p);
      a->empty_cache();
      CHECK(a->stats().reserved_bytes[kAggregate].current == 0);
    }
    DEVICE_CLEAN(dev);
  }
}

// The memory fraction limits mapped bytes; cached pages are unmapped to stay
// under it; garbage collection keeps the cache under its threshold.
void test_stitch_memory_fraction() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  {
    auto a = make_stitch(dev, "per_process_memory_fraction:0.25,garbage_collection_threshold:0.5");
    void* x = a->allocate(100 * MiB);
    a->deallocate(x);
    CHECK(a->stats().reserved_bytes[kAggregate].current == static_cast<int64_t>(100 * MiB));  // cached
    void* y = a->allocate(200 * MiB + 512);  // over the threshold (128 MiB) with the cache: some goes
    CHECK(a->stats().reserved_bytes[kAggregate].current <= static_cast<int64_t>(256 * MiB));
    CHECK_THROWS(OutOfMemory, a->allocate(60 * MiB));  // over the limit (256 MiB)
    INVARIANTS(*a);
    a->deallocate(y);
    a->set_memory_fraction(1.0);
    void* z = a->allocate(600 * MiB);
    CHECK(z != nullptr);
    a->deallocate(z);
    for (double f : {-0.5, 1.5, std::nan("")}) CHECK_THROWS(std::invalid_argument, a->set_memory_fraction(f));
    a->empty_cache();
    CHECK(a->stats().reserved_bytes[kAggregate].current == 0);
  }
  DEVICE_CLEAN(dev);
}

// Bad input and history: the native contract, and one segment_map per run of
// pages mapped for an allocation, one segment_unmap per run unmapped at once.
void test_stitch_bad_input_and_history() {
  SimDevice inner(1 * GiB);
  FaultyDevice dev(inner);
  {
    auto a = make_stitch(dev);
    a->enable_history(1000);
    CHECK(a->history_enabled());
    CHECK(a->allocate(0) == nullptr);
    void* p = a->allocate(1000);
    int local = 0;
    CHECK_THROWS(std::invalid_argument, a->deallocate(&local));
    CHECK_THROWS(std::invalid_argument, a->deallocate(static_cast<char*>(p) + 512));
    CHECK(!a->try_deallocate(&local));
    a->deallocate(p);
    CHECK_THROWS(std::invalid_argument, a->deallocate(p));
    a->deallocate(nullptr);
    CHECK_THROWS(OutOfMemory, a->allocate(std::numeric_limits<size_t>::max()));
    CHECK_THROWS(OutOfMemory, a->allocate(size_t(1) << 50));
    CHECK_THROWS(OutOfMemory, a->allocate(2 * GiB));
    CHECK(a->stats().num_ooms == 3);
    void* big = a->allocate(9 * MiB);  // 5 pages after the small range's page
    a->deallocate(big);
    a->empty_cache();
    std::vector<std::string> actions;
    size_t mapped = 0, unmapped = 0;
    for (const TraceEntry& e : a->history_entries()) {
      actions.push_back(action_name(e.action));
      if (e.action == Action::kSegmentMap) mapped += e.size;
      if (e.action == Action::kSegmentUnmap) unmapped += e.size;
    }
    CHECK(mapped == 6 * 2 * MiB && unmapped == mapped);
    CHECK(std::count(actions.begin(), actions.end(), "segment_map") == 2);    // one page, then a run of five
    CHECK(std::count(actions.begin(), actions.end(), "segment_unmap") == 2);  // each range's run
    CHECK(std::count(actions.begin(), actions.end(), "oom") == 3);
    CHECK(std::count(actions.begin(), actions.end(), "alloc") == 2);
    INVARIANTS(*a);
  }
  DEVICE_CLEAN(dev);
  std::string why = expect_throw<std::invalid_argument>([&] { AllocatorConfig::parse("policy:compact"); });
  CHECK_MSG(why.empty(), why);
  CHECK(AllocatorConfig::parse("policy:stitch").policy == "stitch");
  CHECK(AllocatorConfig::parse("policy:native").to_string().empty());
  CHECK(AllocatorConfig::parse("policy:stitch").to_string() == "policy:stitch");
}

// Destroying a stitch allocator with live blocks gives every page and range back.
void test_stitch_destructor_returns_everything() {
  for (Kind kind : {Kind::kSim, Kind::kHost}) {
    auto inner = make_device(kind, 256 * MiB);
    FaultyDevice dev(*inner);
    {
      auto a = make_device_allocator(dev, AllocatorConfig::parse("policy:stitch"));
      CHECK(dynamic_cast<StitchAllocator*>(a.get()) != nullptr);
      std::mt19937_64 rng(g_seed);
      for (int i = 0; i < 40; ++i) {
        void* p = a->allocate(1 + rng() % (5 * MiB), i % 2);
        if (i % 3 == 0) a->deallocate(p);
      }
      CHECK(a->has_live_allocations());
    }
    DEVICE_CLEAN(dev);
    CHECK(inner->free_bytes() == 256 * MiB);
  }
}

// The replayer under policy:stitch: the start state is allocated, then the trace.
void test_stitch_replayer() {
  Replayer r(240 * MiB, 0, AllocatorConfig::parse("policy:stitch"), 1, false);
  CHECK(r.native() == nullptr);
  RecordedSegment seg;
  seg.addr = uintptr_t(1) << 41;
  seg.size = 20 * MiB;
  seg.live_blocks = {{seg.addr, 0, 3 * MiB}, {seg.addr + 4 * MiB, 0, 5 * MiB}};
  r.restore(seg, {100, 101});
  const uint8_t ops[] = {1, 0, 0, 1, 2};
  const uint64_t ids[] = {100, 1, 2, 1, 0};
  const uint64_t sizes[] = {0, 200 * MiB, 40 * MiB, 0, 0};
  const uint64_t streams[] = {0, 0, 0, 0, 0};
  CHECK(r.run(ops, ids, sizes, streams, nullptr, 5) == 2);  // 5 + 200 + 40 MiB do not fit
  CHECK(r.stopped());
  INVARIANTS(r.allocator());
  Replayer big(1 * GiB, 0, AllocatorConfig::parse("policy:stitch"), 1, false);
  big.restore(seg, {100, 101});
  CHECK(big.run(ops, ids, sizes, streams, nullptr, 5) == 5);
  CHECK(!big.stopped());
  INVARIANTS(big.allocator());
  const DeviceStats bs = big.allocator().stats();  // the kEmptyCache at the end left the live blocks' pages only
  CHECK(bs.reserved_bytes[kAggregate].current <= bs.allocated_bytes[kAggregate].current + static_cast<int64_t>(4 * MiB));
  Replayer tiny(4 * MiB, 0, AllocatorConfig::parse("policy:stitch"), 1, false);
  std::string message;
  CHECK(expect_throw<std::invalid_argument>([&] { tiny.restore(seg, {100, 101}); }, &message).empty());
  CHECK_MSG(contains(message, "does not fit in the capacity"), message);
  INVARIANTS(tiny.allocator());
}


const Test kTests[] = {
    {"stitch_stitches_free_pages", test_stitch_stitches_free_pages},
    {"stitch_packs_and_reuses", test_stitch_packs_and_reuses},
    {"stitch_oom_is_clear_and_recoverable", test_stitch_oom_is_clear_and_recoverable},
    {"stitch_fail_kth", test_stitch_fail_kth},
    {"stitch_memory_fraction", test_stitch_memory_fraction},
    {"stitch_bad_input_and_history", test_stitch_bad_input_and_history},
    {"stitch_destructor_returns_everything", test_stitch_destructor_returns_everything},
    {"stitch_replayer", test_stitch_replayer},
};

}  // namespace

int main(int argc, char** argv) { return driver::run_tests(argc, argv, kTests); }
