#include "core/replayer.h"

#include <algorithm>
#include <stdexcept>

namespace torchmem {

Replayer::Replayer(size_t capacity, size_t in_use_by_others, const AllocatorConfig& config, uint64_t sample_every,
                   bool skip_bad_events)
    : device_(std::make_unique<SimDevice>(capacity, 2u << 20, in_use_by_others)),
      allocator_(std::make_unique<CachingAllocator>(*device_, config)),
      sample_every_(std::max<uint64_t>(1, sample_every)),
      skip_bad_events_(skip_bad_events) {}

void Replayer::bad_event(const std::string& what) const {
  throw std::invalid_argument("event " + std::to_string(events_) + ": " + what);
}

void Replayer::sample(int64_t allocated, int64_t reserved) {
  window_allocated_ = std::max(window_allocated_, allocated);
  window_reserved_ = std::max(window_reserved_, reserved);
  if ((events_ + 1) % sample_every_ == 0) {
    timeline_.push_back({events_, window_allocated_, window_reserved_});
    window_allocated_ = window_reserved_ = 0;
  }
}

size_t Replayer::run(const uint8_t* ops, const uint64_t* ids, const uint64_t* sizes, const uint64_t* streams, size_t n) {
  size_t i = 0;
  for (; i < n && !oom_; ++i, ++events_) {
    const uint64_t id = ids[i];
    if (ops[i] == static_cast<uint8_t>(ReplayOp::kAlloc)) {
      if (live_.count(id)) {
        if (!skip_bad_events_) bad_event("alloc of id " + std::to_string(id) + ", which is already live");
        ++skipped_;
        continue;
      }
      try {
        live_.emplace(id, allocator_->allocate(sizes[i], streams[i]));
      } catch (const OutOfMemory& e) {
        oom_ = std::make_unique<ReplayOom>(ReplayOom{events_, e.info(), e.what()});
        break;
      }
    } else if (ops[i] == static_cast<uint8_t>(ReplayOp::kFree)) {
      auto it = live_.find(id);
      if (it == live_.end()) {
        if (!skip_bad_events_) bad_event("free of id " + std::to_string(id) + ", which is not live (never allocated, or freed twice)");
        ++skipped_;
        continue;
      }
      allocator_->deallocate(it->second);
      live_.erase(it);
    } else {
      bad_event("unknown operation code " + std::to_string(ops[i]));
    }
    const DeviceStats& s = allocator_->stats_ref();
    sample(s.allocated_bytes[kAggregate].current, s.reserved_bytes[kAggregate].current);
  }
  return i;
}

}  // namespace torchmem
