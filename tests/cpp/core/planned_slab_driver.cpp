// Core driver: planned slab (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

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

}  // namespace

std::vector<Test> planned_slab_tests() {
  return {
      {"planned_slab_random", test_planned_slab_random},
      {"planned_slab_random_faults", test_planned_slab_random_faults},
  };
}

}  // namespace core_driver
