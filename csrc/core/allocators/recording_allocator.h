// RecordingAllocator: forwards every call to a target allocator and records
// the sequence of allocations and frees, so one step of a program can be
// planned (planned_slab.h). Allocation i is named by its index in the step.
//
// Thread safety: one internal mutex (a ForkSafeMutex of rank kWrapper, held
// while calling the target; see fork_safety.h). The target must outlive the
// recorder.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/base/allocator.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

struct RecordedEvent {
  bool is_alloc;
  uint64_t index;  // which allocation (0, 1, ... in allocation order)
  size_t size;     // requested bytes (allocs only)
  Stream stream;   // the allocation's stream (allocs only)
};

class RecordingAllocator final : public Allocator {
 public:
  explicit RecordingAllocator(std::shared_ptr<Allocator> target);

  void* allocate(size_t size, Stream stream = 0) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override;

  // Events so far, in order; frees of allocations made before recording
  // began are not recorded.
  std::vector<RecordedEvent> events() const;

 private:
  std::shared_ptr<Allocator> target_;
  mutable ForkSafeMutex mutex_{LockRank::kWrapper};
  std::vector<RecordedEvent> events_;
  std::unordered_map<const void*, uint64_t> live_;
  uint64_t allocations_ = 0;
};

}  // namespace torchmem
