#include "core/allocators/recording_allocator.h"

namespace torchmem {

RecordingAllocator::RecordingAllocator(std::shared_ptr<Allocator> target) : target_(std::move(target)) {}

void* RecordingAllocator::allocate(size_t size, Stream stream) {
  void* ptr = target_->allocate(size, stream);
  if (ptr) {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    live_.emplace(ptr, allocations_);
    events_.push_back({true, allocations_++, size, stream});
  }
  return ptr;
}

void RecordingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it != live_.end()) {
      events_.push_back({false, it->second, 0, 0});
      live_.erase(it);
    }
  }
  target_->deallocate(ptr);
}

bool RecordingAllocator::owns(const void* ptr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return live_.count(ptr) != 0;
}

bool RecordingAllocator::has_live_allocations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return !live_.empty();
}

std::vector<RecordedEvent> RecordingAllocator::events() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return events_;
}

}  // namespace torchmem
