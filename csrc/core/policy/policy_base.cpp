#include "core/policy/policy_base.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

namespace torchmem {

PolicyBase::PolicyBase(Device& device, AllocatorConfig config) : device_(device), config_(std::move(config)) {
  stats_.max_split_size = static_cast<int64_t>(
      std::min<size_t>(config_.max_split_size, std::numeric_limits<int64_t>::max()));
  PolicyBase::set_memory_fraction(config_.per_process_memory_fraction);
}

void PolicyBase::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("memory fraction must be in [0.0, 1.0], got " + std::to_string(fraction));
  }
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  memory_fraction_ = fraction;
  fraction_set_ = fraction < 1.0;  // 1: no limit, as PyTorch's setMemoryFraction
}

void PolicyBase::add_free_memory_callback(std::function<bool()> callback) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  free_memory_callbacks_.push_back(std::move(callback));
}

bool PolicyBase::trigger_free_memory_callbacks() {
  bool freed = false;
  for (auto& callback : free_memory_callbacks_) freed |= callback();
  return freed;
}

void PolicyBase::share_reserved(std::shared_ptr<DeviceReserved> shared) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (!shared || shared == device_reserved_) return;
  device_reserved_->sub(own_reserved_);
  shared->add(own_reserved_);
  device_reserved_ = std::move(shared);
}

void PolicyBase::set_releases_blocked(bool blocked) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  releases_blocked_ = blocked;
}

DeviceStats PolicyBase::stats() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return stats_.with_pool_sums();
}

void PolicyBase::reset_peak_stats() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  stats_.reset_peaks();
}

void PolicyBase::reset_accumulated_stats() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  stats_.reset_accumulated();
  on_reset_accumulated();
}

void PolicyBase::enable_history(size_t max_entries, History::ContextProvider provider) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  history_.enable(max_entries, std::move(provider));
}

std::vector<TraceEntry> PolicyBase::history_entries() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return history_.entries();
}

bool PolicyBase::history_enabled() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return history_.enabled();
}

}  // namespace torchmem
