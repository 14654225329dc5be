#include "core/sim_device.h"

#include <stdexcept>

namespace torchmem {

namespace {
constexpr uintptr_t kSimBase = uintptr_t(1) << 40;  // well away from 0
constexpr uintptr_t kSimAlign = 2u << 20;
}  // namespace

SimDevice::SimDevice(size_t capacity_bytes, size_t page_size, size_t in_use_by_others)
    : capacity_(capacity_bytes), page_size_(page_size), used_(in_use_by_others), next_address_(kSimBase) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    throw std::invalid_argument("SimDevice: page_size must be a power of two");
  }
  if (in_use_by_others > capacity_bytes) {
    throw std::invalid_argument("SimDevice: memory in use by others exceeds the capacity");
  }
}

uintptr_t SimDevice::take_addresses(size_t size) {
  uintptr_t addr = next_address_;
  next_address_ += (size + kSimAlign - 1) / kSimAlign * kSimAlign + kSimAlign;
  return addr;
}

uintptr_t SimDevice::allocate(size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (size == 0 || size > capacity_ - used_) return 0;
  used_ += size;
  ++live_;
  return take_addresses(size);
}

void SimDevice::free(uintptr_t, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= size;
  --live_;
}

uintptr_t SimDevice::reserve(size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  return take_addresses(size);
}

bool SimDevice::map(uintptr_t, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (size > capacity_ - used_) return false;
  used_ += size;
  return true;
}

void SimDevice::unmap(uintptr_t, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= size;
}

void SimDevice::release(uintptr_t, size_t) {}

size_t SimDevice::free_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capacity_ - used_;
}

size_t SimDevice::live_segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

}  // namespace torchmem
