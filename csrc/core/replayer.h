// Replayer: runs an allocation trace through a CachingAllocator on a
// SimDevice of any capacity, to reproduce (and try fixes for) out-of-memory
// failures without the GPU. It is the allocator itself, not a model of it.
//
// Events arrive in chunks (run() may be called many times), so memory grows
// with the number of live allocations, never with the length of the trace.
// Each event is an alloc (id, size, stream) or a free (id). Ids are the
// trace's names for allocations; an id may be reused after it is freed.
//
// Contract:
// - run() stops at the first out-of-memory and records it; later calls do
//   nothing. Returns the number of events consumed from this chunk.
// - A free of an unknown id, or an alloc of a live id, throws
//   std::invalid_argument naming the event index, unless skip_bad_events is
//   set, in which case the event is skipped and counted.
// - The timeline holds one point per `sample_every` events: the largest
//   allocated and reserved bytes seen in that window, so peaks are exact.
// Not thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/caching_allocator.h"
#include "core/node_pool.h"
#include "core/sim_device.h"

namespace torchmem {

enum class ReplayOp : uint8_t { kAlloc = 0, kFree = 1 };

struct ReplayOom {
  uint64_t index = 0;  // event index in the whole trace
  OomInfo info;
  std::string message;
};

struct TimelinePoint {
  uint64_t index;       // last event of the window
  int64_t allocated;    // largest in the window
  int64_t reserved;
};

class Replayer {
 public:
  Replayer(size_t capacity, size_t in_use_by_others, const AllocatorConfig& config, uint64_t sample_every,
           bool skip_bad_events);

  size_t run(const uint8_t* ops, const uint64_t* ids, const uint64_t* sizes, const uint64_t* streams, size_t n);

  bool stopped() const { return oom_ != nullptr; }
  const ReplayOom* oom() const { return oom_.get(); }
  uint64_t events() const { return events_; }
  uint64_t skipped() const { return skipped_; }
  const std::vector<TimelinePoint>& timeline() const { return timeline_; }
  CachingAllocator& allocator() { return *allocator_; }
  SimDevice& device() { return *device_; }

 private:
  void sample(int64_t allocated, int64_t reserved);
  [[noreturn]] void bad_event(const std::string& what) const;

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  NodePool nodes_;  // the live map's nodes: no heap allocation per event once warm
  using LiveMap = std::unordered_map<uint64_t, void*, std::hash<uint64_t>, std::equal_to<uint64_t>,
                                     PoolAllocator<std::pair<const uint64_t, void*>>>;
  LiveMap live_{1024, std::hash<uint64_t>{}, std::equal_to<uint64_t>{}, PoolAllocator<std::pair<const uint64_t, void*>>(&nodes_)};
  std::unique_ptr<ReplayOom> oom_;
  std::vector<TimelinePoint> timeline_;
  uint64_t sample_every_;
  bool skip_bad_events_;
  uint64_t events_ = 0;
  uint64_t skipped_ = 0;
  int64_t window_allocated_ = 0;
  int64_t window_reserved_ = 0;
};

}  // namespace torchmem
