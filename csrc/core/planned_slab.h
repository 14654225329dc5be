// PlannedSlab: serves a repeating allocation sequence from one slab at
// offsets planned ahead (torchmem.plan), with no search on the hot path.
//
// A plan is a list of slots in allocation order: slot i has the size the
// i-th allocation of the recorded step asked for, and an offset in the slab
// (or kUnplanned: that allocation outlived the step, so it always goes to
// the fallback). Each step: begin_step(), then the i-th allocate() is a hit
// when its size equals slot i's and the slot's bytes are free; anything else
// (another size, an allocation beyond the plan, bytes still held by a live
// allocation because frees came in another order, or by a tensor that
// escaped an earlier step) is a miss served by the fallback allocator.
// Misses never corrupt: a slot is used only when no live slab allocation
// overlaps it, checked in an ordered map of live ranges.
//
// Thread safety: one internal mutex. The fallback must outlive the slab.
// The slab's memory comes from `device` and returns to it in the destructor.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace torchmem {

struct PlannedSlabStats {
  uint64_t steps = 0;
  uint64_t hits = 0;            // allocations served from the slab
  uint64_t misses = 0;          // served by the fallback
  uint64_t step_hits = 0;       // in the current (or last) step
  uint64_t step_misses = 0;
  size_t slab_bytes = 0;
  size_t live_in_slab = 0;      // slab allocations not yet freed
};

class PlannedSlab final : public Allocator {
 public:
  static constexpr uint64_t kUnplanned = std::numeric_limits<uint64_t>::max();

  // sizes[i], offsets[i]: slot i. Every planned slot must fit in height.
  // Throws std::invalid_argument for inconsistent slots, OutOfMemory when
  // the device cannot provide the slab.
  PlannedSlab(std::shared_ptr<Device> device, std::vector<size_t> sizes, std::vector<uint64_t> offsets, size_t height,
              std::shared_ptr<Allocator> fallback);
  ~PlannedSlab() override;

  void begin_step();
  // Ends the step; returns how many slab allocations are still live (they
  // escaped the step; their bytes stay reserved until they are freed).
  size_t end_step();

  void* allocate(size_t size, Stream stream = 0) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override;
  PlannedSlabStats stats() const;

 private:
  bool overlaps_live(uintptr_t begin, uintptr_t end) const;

  std::shared_ptr<Device> device_;
  std::shared_ptr<Allocator> fallback_;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> offsets_;
  size_t height_;
  uintptr_t base_ = 0;
  mutable std::mutex mutex_;
  size_t cursor_ = 0;
  std::map<uintptr_t, uintptr_t> live_ranges_;          // slab allocations: begin -> end
  std::unordered_set<const void*> fallback_live_;
  PlannedSlabStats stats_;
};

}  // namespace torchmem
