#include "core/allocators/planned_slab.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/base/out_of_memory.h"

namespace torchmem {

PlannedSlab::PlannedSlab(std::shared_ptr<Allocator> fallback) : fallback_(std::move(fallback)) {
  if (!fallback_) throw std::invalid_argument("planned slab: a fallback allocator is required");
}

PlannedSlab::~PlannedSlab() {
  if (base_) fallback_->deallocate(reinterpret_cast<void*>(base_));
}

PlannedSlab::PlanId PlannedSlab::add_plan(std::vector<PlannedSlot> slots, size_t height) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const PlannedSlot& s = slots[i];
    if (s.offset != kUnplanned && (s.offset % 64 != 0 || s.offset > height || s.size > height - s.offset)) {
      throw std::invalid_argument("planned slab: slot " + std::to_string(i) + " is misaligned or outside the plan's height");
    }
  }
  Stream stream = 0;
  for (const PlannedSlot& s : slots) {
    if (s.offset != kUnplanned) {
      stream = s.stream;
      break;
    }
  }
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const PlanId id = next_plan_++;
  plans_.emplace(id, Plan{std::move(slots), height, stream});
  try_grow_locked(height, stream);
  return id;
}

void PlannedSlab::remove_plan(PlanId id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (!plans_.count(id)) throw std::invalid_argument("planned slab: no plan " + std::to_string(id));
  if (step_open_ && current_id_ == id) throw std::invalid_argument("planned slab: its step is under way");
  plans_.erase(id);
  if (plans_.empty() && live_ranges_.empty()) release_region_locked();
}

void PlannedSlab::begin_step(PlanId id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = plans_.find(id);
  if (it == plans_.end()) throw std::invalid_argument("planned slab: no plan " + std::to_string(id));
  if (step_open_) throw std::logic_error("planned slab: a step is under way");
  step_open_ = true;
  current_id_ = id;
  current_ = try_grow_locked(it->second.height, it->second.stream) ? &it->second : nullptr;
  cursor_ = 0;
  stats_.step_hits = stats_.step_misses = stats_.step_unplanned = 0;
  ++stats_.steps;
}

size_t PlannedSlab::end_step() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  step_open_ = false;
  current_ = nullptr;
  return live_ranges_.size();
}

bool PlannedSlab::release_idle_region() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (step_open_ || !live_ranges_.empty() || !base_) return false;
  release_region_locked();
  return true;
}

bool PlannedSlab::try_grow_locked(size_t height, Stream stream) {
  if (height <= region_bytes_ && (stream == region_stream_ || height == 0)) return true;
  if (!live_ranges_.empty()) return false;
  size_t tallest = height;
  for (const auto& [id, plan] : plans_) tallest = std::max(tallest, plan.height);
  return try_region_locked(tallest, stream) || (tallest > height && try_region_locked(height, stream));
}

bool PlannedSlab::try_region_locked(size_t height, Stream stream) {
  release_region_locked();
  try {
    base_ = reinterpret_cast<uintptr_t>(fallback_->allocate(height, stream));
  } catch (const OutOfMemory&) {
    ++stats_.grow_failures;
    return false;
  }
  region_bytes_ = height;
  region_stream_ = stream;
  return true;
}

void PlannedSlab::release_region_locked() {
  if (base_) fallback_->deallocate(reinterpret_cast<void*>(base_));
  base_ = 0;
  region_bytes_ = 0;
}

bool PlannedSlab::overlaps_live(uintptr_t begin, uintptr_t end) const {
  auto it = live_ranges_.lower_bound(begin);
  if (it != live_ranges_.end() && it->first < end) return true;
  return it != live_ranges_.begin() && std::prev(it)->second > begin;
}

void* PlannedSlab::allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    bool expected = false;  // the plan's unplanned slot: the fallback serves it by design
    if (current_) {
      const size_t slot = cursor_++;
      if (slot < current_->slots.size()) {
        const PlannedSlot& s = current_->slots[slot];
        expected = s.offset == kUnplanned && s.size == size && s.stream == stream;
        if (s.size == size && s.stream == stream && stream == region_stream_ && s.offset != kUnplanned) {
          const uintptr_t begin = base_ + s.offset;
          if (!overlaps_live(begin, begin + size)) {
            live_ranges_.emplace(begin, begin + size);
            ++stats_.hits;
            ++stats_.step_hits;
            return reinterpret_cast<void*>(begin);
          }
        }
      }
    }
    if (step_open_ && expected) {
      ++stats_.unplanned;
      ++stats_.step_unplanned;
    } else if (step_open_) {
      ++stats_.misses;
      ++stats_.step_misses;
    }
  }
  void* ptr = fallback_->allocate(size, stream);
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  fallback_live_.insert(ptr);
  return ptr;
}

void PlannedSlab::deallocate(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = live_ranges_.find(addr);
    if (it != live_ranges_.end()) {
      live_ranges_.erase(it);
      if (plans_.empty() && live_ranges_.empty()) release_region_locked();
      return;
    }
    if (fallback_live_.erase(ptr) == 0) {
      throw std::invalid_argument("planned slab: free of a pointer it did not hand out");
    }
  }
  fallback_->deallocate(ptr);
}

bool PlannedSlab::owns(const void* ptr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return live_ranges_.count(reinterpret_cast<uintptr_t>(ptr)) || fallback_live_.count(ptr);
}

bool PlannedSlab::has_live_allocations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return !live_ranges_.empty() || !fallback_live_.empty();
}

PlannedSlabStats PlannedSlab::stats() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  PlannedSlabStats s = stats_;
  s.region_bytes = region_bytes_;
  s.plans = plans_.size();
  s.live_in_slab = live_ranges_.size();
  return s;
}

}  // namespace torchmem
