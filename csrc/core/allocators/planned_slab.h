// PlannedSlab: serves repeating allocation sequences from one region at
// offsets planned ahead (torchmem.plan), with no search on the hot path.
//
// A plan is a list of slots in allocation order: slot i has the size and
// stream the i-th allocation of a recorded step asked for, and an offset in
// the region (or kUnplanned: that allocation outlived the step or ran on
// another stream, so it always goes to the fallback). A slab holds any
// number of plans (one per shape bucket, say); only one step runs at a time,
// so they all share one region, as tall as the tallest plan.
//
// Each step: begin_step(plan), then the i-th allocate() is a hit when its
// size and stream equal slot i's and the slot's bytes are free. When slot i
// is unplanned and the request has its size and stream, the allocation is
// the one the plan expects to outlive the step (a returned loss, gradients
// kept until the next zero_grad): the fallback serves it, as planned, and it
// counts as `unplanned`, not as a miss. Anything
// else (another size, an allocation beyond the plan, bytes still held by a
// live allocation because frees came in another order, or by a tensor that
// escaped an earlier step) is a miss served by the fallback allocator.
// Misses never corrupt: a slot is used only when no live slab allocation
// overlaps it, checked in an ordered map of live ranges. Outside a step,
// every allocation goes to the fallback.
//
// The region is one allocation of the fallback allocator, so the fallback's
// statistics (reserved, allocated, peaks) include it. It is allocated on
// the stream of the plan's first planned slot (its main stream), and slots
// on that stream hit. It grows to a plan's height (or moves to the plan's
// main stream) when that plan is added or its step begins, provided no slab
// allocation is live then; until it can (live allocations, or the fallback
// is out of memory) that plan's steps are served by the fallback.
// The region grows to the tallest plan's height (so steps of other plans
// need not grow it again). It goes back to the fallback when the last plan
// is removed and nothing in it is live, on release_idle_region() (a step is
// about to be recorded: it may reuse those bytes through the fallback's
// cache), and in the destructor.
//
// Thread safety: one internal mutex (a ForkSafeMutex of rank kWrapper, see
// fork_safety.h), held while growing the region (a call into the fallback). The fallback must outlive the slab, and must not call
// back into it.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/base/allocator.h"
#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

struct PlannedSlabStats {
  uint64_t steps = 0;
  uint64_t hits = 0;            // allocations served from the region
  uint64_t misses = 0;          // served by the fallback during steps, against the plan
  uint64_t unplanned = 0;       // served by the fallback during steps, as planned (unplanned slots)
  uint64_t step_hits = 0;       // in the current (or last) step
  uint64_t step_misses = 0;
  uint64_t step_unplanned = 0;
  uint64_t grow_failures = 0;   // the fallback could not provide a taller region
  size_t region_bytes = 0;      // the region's size now
  size_t plans = 0;
  size_t live_in_slab = 0;      // region allocations not yet freed
};

struct PlannedSlot {
  size_t size;
  uint64_t offset;              // in the region, a multiple of 64; or kUnplanned
  Stream stream;
};

class PlannedSlab final : public Allocator {
 public:
  static constexpr uint64_t kUnplanned = std::numeric_limits<uint64_t>::max();
  using PlanId = uint64_t;

  explicit PlannedSlab(std::shared_ptr<Allocator> fallback);
  ~PlannedSlab() override;

  // Adds a plan; every planned slot must fit in `height` (else
  // std::invalid_argument). Tries to grow the region to `height` now.
  PlanId add_plan(std::vector<PlannedSlot> slots, size_t height);
  // Removes a plan (std::invalid_argument for an unknown id, or the plan of
  // a step under way). Live allocations keep their bytes until freed.
  void remove_plan(PlanId id);

  // Returns the region to the fallback when nothing in it is live and no
  // step is under way; the next add_plan() or begin_step() draws it again.
  // Returns whether it did.
  bool release_idle_region();

  // Starts a step served by plan `id` (std::invalid_argument for an unknown
  // id, std::logic_error when a step is under way).
  void begin_step(PlanId id);
  // Ends the step; returns how many region allocations are still live (they
  // escaped the step; their bytes stay reserved until they are freed).
  size_t end_step();

  void* allocate(size_t size, Stream stream = 0) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override;
  PlannedSlabStats stats() const;

 private:
  struct Plan {
    std::vector<PlannedSlot> slots;
    size_t height;
    Stream stream;  // the main stream: the first planned slot's
  };

  bool overlaps_live(uintptr_t begin, uintptr_t end) const;
  // Makes the region at least `height` bytes (the tallest plan's, when the
  // fallback can give that) on `stream`; false when it cannot.
  bool try_grow_locked(size_t height, Stream stream);
  bool try_region_locked(size_t height, Stream stream);
  void release_region_locked();

  std::shared_ptr<Allocator> fallback_;
  mutable ForkSafeMutex mutex_{LockRank::kWrapper};
  std::unordered_map<PlanId, Plan> plans_;
  PlanId next_plan_ = 0;
  const Plan* current_ = nullptr;                       // the step's plan, null outside a step
  bool step_open_ = false;
  PlanId current_id_ = 0;
  size_t cursor_ = 0;
  uintptr_t base_ = 0;
  size_t region_bytes_ = 0;
  Stream region_stream_ = 0;
  std::map<uintptr_t, uintptr_t> live_ranges_;          // region allocations: begin -> end
  std::unordered_set<const void*> fallback_live_;
  PlannedSlabStats stats_;
};

}  // namespace torchmem
