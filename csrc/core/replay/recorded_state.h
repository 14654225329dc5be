// The state of a policy's segments when a recording began (Note [Start
// state] in policy/native/caching_replay.cpp), as a replay rebuilds it,
// and what a policy offers a replay that follows the recording.
//
// Plain data: RecordedBlock, RecordedSegment, RecordedRange. A policy whose
// segments a replay can rebuild and release one by one implements
// RecordedSegments and returns it from DeviceAllocator::recorded_segments()
// (the native policy does); for another policy the replayer allocates the
// recorded live blocks instead (replay/replayer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/segment_info.h"
#include "core/devices/device.h"

namespace torchmem {

// A segment as it stood when a recording began (Note [Start state]): its
// place, and the blocks live in it in address order. A live block whose
// size is 0 gets the size the policy would have given its request.
struct RecordedBlock {
  uintptr_t addr = 0;
  size_t size = 0;            // 0: infer from requested_size
  size_t requested_size = 0;
};

struct RecordedSegment {
  uintptr_t addr = 0;
  size_t size = 0;
  Stream stream = 0;
  bool is_small = false;
  std::vector<RecordedBlock> live_blocks;
};

// The range of an expandable segment as it stood when a recording began:
// where it begins, the runs of pages mapped then (sorted, disjoint, on the
// pool's page grid from base), and the blocks live in them.
struct RecordedRange {
  uintptr_t base = 0;
  Stream stream = 0;
  bool is_small = false;
  std::vector<SegmentRange> mapped;
  std::vector<RecordedBlock> live_blocks;
};

// Replay support: the contracts are CachingAllocator's
// (policy/native/caching_allocator.h). Not thread safe beyond the policy's
// own lock; used by a replay, the policy's sole user.
class RecordedSegments {
 public:
  // Rebuilds a segment that existed before the recording began.
  virtual void restore_segment(const RecordedSegment& segment) = 0;
  // The same for the range of an expandable segment.
  virtual void restore_expandable(const RecordedRange& range) = 0;
  // Releases the cached segment (or unmaps the free pages) at `addr`, as
  // the recording's segment_free / segment_unmap did; false when no such
  // free memory is there.
  virtual bool release_cached_segment(uintptr_t addr) = 0;
  // allocate() for a request that searched the cache and missed before a
  // retry's releases, which a replay makes ahead of it (kRecordedRetry): no
  // search now, a new segment, as PyTorch's alloc_block after
  // release_cached_blocks. A release may leave a usable free block, the
  // partial pages at the ends of an unmapped oversize block.
  virtual void* allocate_after_release(size_t size, Stream stream) = 0;
  // Allocations served by a free block of a restored segment over an equal
  // free block of another restored segment (reuse_order segment). PyTorch
  // serves the older segment's; a snapshot does not hold the ages of the
  // segments made before recording began, so the lower address is a guess.
  // The replayer reads it after each allocation (Note [Start segments' ages]).
  virtual uint64_t start_age_guesses() const = 0;

 protected:
  ~RecordedSegments() = default;
};

}  // namespace torchmem
