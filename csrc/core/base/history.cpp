#include "core/base/history.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace torchmem {

const char* action_name(Action action) {
  switch (action) {
    case Action::kAlloc: return "alloc";
    case Action::kFreeRequested: return "free_requested";
    case Action::kFreeCompleted: return "free_completed";
    case Action::kSegmentAlloc: return "segment_alloc";
    case Action::kSegmentFree: return "segment_free";
    case Action::kSegmentMap: return "segment_map";
    case Action::kSegmentUnmap: return "segment_unmap";
    case Action::kOom: return "oom";
    case Action::kSnapshot: return "snapshot";
  }
  return "unknown";
}

void History::enable(size_t max_entries, ContextProvider provider) {
  max_entries_ = max_entries;
  std::shared_ptr<const ContextProvider> next;
  if (provider && max_entries != 0) next = std::make_shared<const ContextProvider>(std::move(provider));
  const bool has_provider = next != nullptr;
  {
    std::lock_guard<ForkSafeMutex> lock(provider_mutex_);
    provider_.swap(next);
  }
  has_provider_.store(has_provider, std::memory_order_release);
  clear();
  if (max_entries_ != 0) ring_.reserve(std::min<size_t>(max_entries_, 1 << 20));
}

std::shared_ptr<const History::ContextProvider> History::current_provider() const {
  std::lock_guard<ForkSafeMutex> lock(provider_mutex_);
  return provider_;
}

void History::clear() {
  ring_.clear();
  next_ = 0;
}

void History::record_slow(Action action, uintptr_t addr, size_t size, Stream stream, uint64_t context) {
  const int64_t clock = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  static std::atomic<int64_t> last{0};  // every History's: times never repeat (history.h)
  int64_t prev = last.load(std::memory_order_relaxed);
  int64_t now;
  do {
    now = std::max(clock, prev + 1);
  } while (!last.compare_exchange_weak(prev, now, std::memory_order_relaxed));
  TraceEntry entry{action, addr, size, stream, now, context};
  if (ring_.size() < max_entries_) {
    ring_.push_back(entry);
  } else {
    ring_[next_] = entry;
    next_ = (next_ + 1) % max_entries_;
  }
}

std::vector<TraceEntry> History::entries() const {
  std::vector<TraceEntry> out;
  out.reserve(ring_.size());
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

}  // namespace torchmem
