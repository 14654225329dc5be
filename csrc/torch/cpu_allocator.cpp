#include "torch/cpu_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace torchmem::glue {

namespace {
thread_local std::vector<std::shared_ptr<torchmem::Allocator>> thread_allocators;
}  // namespace

CpuAllocator& CpuAllocator::instance() {
  static CpuAllocator* allocator = new CpuAllocator();  // never destroyed, on purpose
  return *allocator;
}

void CpuAllocator::install(const AllocatorConfig& config) {
  auto stale = [&] { return !caching_ || caching_->config().to_string() != config.to_string(); };
  bool make_new = false;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    make_new = stale();
  }
  std::shared_ptr<HostDevice> device;
  std::shared_ptr<DeviceAllocator> fresh;
  if (make_new) {  // made (and, if another install won, dropped) outside the lock: see the header
    device = std::make_shared<HostDevice>(config.capacity);
    fresh = make_device_allocator(*device, config);
  }
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (fresh && stale()) {
    if (caching_) {
      caching_->empty_cache();
      retired_.push_back(caching_);
      retired_devices_.push_back(device_);
    }
    device_ = device;
    caching_ = fresh;
  }
  if (installed_) return;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current != this) {
    previous_ = current;
    previous_deleter_ = current->raw_deleter();
  }
  c10::SetAllocator(c10::DeviceType::CPU, this, 0);
  if (c10::GetAllocator(c10::DeviceType::CPU) != this) {
    throw std::runtime_error(
        "torchmem: PyTorch kept its current CPU allocator: another allocator was registered with a higher "
        "priority, so torchmem cannot replace it");
  }
  installed_ = true;
}

void CpuAllocator::uninstall() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (!installed_) return;
  c10::SetAllocator(c10::DeviceType::CPU, previous_, 0);
  installed_ = false;
  caching_->empty_cache();
}

std::shared_ptr<DeviceAllocator> CpuAllocator::caching() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return caching_;
}

void CpuAllocator::push_thread_allocator(std::shared_ptr<torchmem::Allocator> allocator) {
  CpuAllocator& self = instance();
  std::shared_ptr<const RoutedList> replaced;  // dropped outside the lock
  {
    std::lock_guard<ForkSafeMutex> lock(self.mutex_);
    if (std::find(self.routed_->begin(), self.routed_->end(), allocator) == self.routed_->end()) {
      auto next = std::make_shared<RoutedList>(*self.routed_);
      next->push_back(allocator);
      replaced = std::exchange(self.routed_, std::move(next));
    }
  }
  thread_allocators.push_back(std::move(allocator));
}

void CpuAllocator::pop_thread_allocator() {
  if (thread_allocators.empty()) throw std::logic_error("torchmem: pop_thread_allocator without a matching push");
  thread_allocators.pop_back();
  CpuAllocator& self = instance();
  std::shared_ptr<const RoutedList> replaced;  // may hold the last reference to an allocator: dropped outside the lock
  std::lock_guard<ForkSafeMutex> lock(self.mutex_);
  auto next = std::make_shared<RoutedList>();
  for (const auto& a : *self.routed_) {
    if (a.use_count() > 1 || a->has_live_allocations()) next->push_back(a);  // counted before copying
  }
  if (next->size() != self.routed_->size()) replaced = std::exchange(self.routed_, std::move(next));
}

c10::DataPtr CpuAllocator::allocate(size_t n) {
  void* ptr = nullptr;
  if (n != 0) {
    torchmem::Allocator* target = thread_allocators.empty() ? nullptr : thread_allocators.back().get();
    std::shared_ptr<DeviceAllocator> caching;
    if (!target) {
      caching = this->caching();
      TORCH_CHECK(caching, "torchmem: the CPU allocator was used before torchmem.install()");
      target = caching.get();
    }
    try {
      ptr = target->allocate(n);
    } catch (const OutOfMemory& e) {
      const std::string notes = oom_observers_.notify(0, e.info());  // the allocator's lock is released here
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what(), notes);
    }
  }
  return {ptr, ptr, &delete_pointer, c10::Device(c10::DeviceType::CPU)};
}

void CpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

void CpuAllocator::delete_pointer(void* ptr) {
  if (ptr) instance().release(ptr);
}

// Called from deleters, which must not throw: tries every owner in turn.
// Thread allocators come first: they may wrap the caching allocator (a
// recorder, a planned slab's fallback) and must see their own frees.
void CpuAllocator::release(void* ptr) {
  std::shared_ptr<const RoutedList> routed;
  std::shared_ptr<DeviceAllocator> current;
  c10::DeleterFnPtr previous_deleter;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    routed = routed_;
    current = caching_;
    previous_deleter = previous_deleter_;
  }
  auto hand_to = [&](torchmem::Allocator& owner) {
    try {
      owner.deallocate(ptr);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torchmem: %s\n", e.what());
    }
  };
  for (const auto& owner : *routed) {
    if (owner->owns(ptr)) return hand_to(*owner);
  }
  if (current && current->try_deallocate(ptr)) return;
  std::vector<std::shared_ptr<DeviceAllocator>> retired;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    retired.assign(retired_.begin(), retired_.end());
  }
  for (auto& owner : retired) {
    if (owner->try_deallocate(ptr)) return;
  }
  if (previous_deleter) {
    previous_deleter(ptr);
  } else {
    std::fprintf(stderr, "torchmem: ignoring free of %p, which no allocator owns\n", ptr);
  }
}

}  // namespace torchmem::glue
