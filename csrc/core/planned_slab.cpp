#include "core/planned_slab.h"

#include <stdexcept>
#include <string>

#include "core/out_of_memory.h"

namespace torchmem {

PlannedSlab::PlannedSlab(std::shared_ptr<Device> device, std::vector<size_t> sizes, std::vector<uint64_t> offsets,
                         size_t height, std::shared_ptr<Allocator> fallback)
    : device_(std::move(device)), fallback_(std::move(fallback)), sizes_(std::move(sizes)), offsets_(std::move(offsets)),
      height_(height) {
  if (!device_ || !fallback_) throw std::invalid_argument("planned slab: a device and a fallback allocator are required");
  if (sizes_.size() != offsets_.size()) throw std::invalid_argument("planned slab: sizes and offsets differ in length");
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (offsets_[i] != kUnplanned && (offsets_[i] % 64 != 0 || offsets_[i] + sizes_[i] > height_)) {
      throw std::invalid_argument("planned slab: slot " + std::to_string(i) + " is misaligned or outside the slab");
    }
  }
  if (height_ > 0) {
    base_ = device_->allocate(height_);
    if (base_ == 0) {
      OomInfo info;
      info.requested = height_;
      info.device_total = device_->total_bytes();
      info.device_free = device_->free_bytes();
      throw OutOfMemory("planned slab: the device cannot provide " + format_size(height_), info);
    }
  }
  stats_.slab_bytes = height_;
}

PlannedSlab::~PlannedSlab() {
  if (base_) device_->free(base_, height_);
}

void PlannedSlab::begin_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  cursor_ = 0;
  stats_.step_hits = stats_.step_misses = 0;
  ++stats_.steps;
}

size_t PlannedSlab::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_ranges_.size();
}

bool PlannedSlab::overlaps_live(uintptr_t begin, uintptr_t end) const {
  auto it = live_ranges_.lower_bound(begin);
  if (it != live_ranges_.end() && it->first < end) return true;
  return it != live_ranges_.begin() && std::prev(it)->second > begin;
}

void* PlannedSlab::allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t slot = cursor_++;
    if (slot < sizes_.size() && sizes_[slot] == size && offsets_[slot] != kUnplanned) {
      const uintptr_t begin = base_ + offsets_[slot];
      if (!overlaps_live(begin, begin + size)) {
        live_ranges_.emplace(begin, begin + size);
        ++stats_.hits;
        ++stats_.step_hits;
        return reinterpret_cast<void*>(begin);
      }
    }
    ++stats_.misses;
    ++stats_.step_misses;
  }
  void* ptr = fallback_->allocate(size, stream);
  std::lock_guard<std::mutex> lock(mutex_);
  fallback_live_.insert(ptr);
  return ptr;
}

void PlannedSlab::deallocate(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = live_ranges_.find(addr);
    if (it != live_ranges_.end()) {
      live_ranges_.erase(it);
      return;
    }
    if (fallback_live_.erase(ptr) == 0) {
      throw std::invalid_argument("planned slab: free of a pointer it did not hand out");
    }
  }
  fallback_->deallocate(ptr);
}

bool PlannedSlab::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_ranges_.count(reinterpret_cast<uintptr_t>(ptr)) || fallback_live_.count(ptr);
}

bool PlannedSlab::has_live_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !live_ranges_.empty() || !fallback_live_.empty();
}

PlannedSlabStats PlannedSlab::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PlannedSlabStats s = stats_;
  s.live_in_slab = live_ranges_.size();
  return s;
}

}  // namespace torchmem
