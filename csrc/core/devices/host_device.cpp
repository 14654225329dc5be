#include "core/devices/host_device.h"

#include <sys/mman.h>
#include <unistd.h>

namespace torchmem {

namespace {

constexpr size_t kHugePage = 2u << 20;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// An address range of `size` bytes aligned to 2 MiB, with the given protection.
uintptr_t map_aligned(size_t size, int prot) {
  const size_t span = size + kHugePage;
  void* raw = mmap(nullptr, span, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return 0;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + span;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  return aligned;
}

}  // namespace

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

HostDevice::HostDevice(size_t capacity_bytes)
    : capacity_(capacity_bytes ? capacity_bytes : physical_memory_bytes()) {}

bool HostDevice::charge(size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (size > capacity_ - used_) return false;
  used_ += size;
  return true;
}

void HostDevice::refund(size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  used_ -= size;
}

uintptr_t HostDevice::allocate(size_t size) {
  if (size == 0 || !charge(size)) return 0;
  const uintptr_t addr = map_aligned(size, PROT_READ | PROT_WRITE);
  if (addr == 0) {
    refund(size);
    return 0;
  }
  madvise(reinterpret_cast<void*>(addr), size, MADV_HUGEPAGE);
  return addr;
}

void HostDevice::free(uintptr_t addr, size_t size) {
  munmap(reinterpret_cast<void*>(addr), size);
  refund(size);
}

uintptr_t HostDevice::reserve(size_t size) { return map_aligned(size, PROT_NONE); }

bool HostDevice::map(uintptr_t addr, size_t size) {
  if (!charge(size)) return false;
  void* p = reinterpret_cast<void*>(addr);
  if (mprotect(p, size, PROT_READ | PROT_WRITE) != 0) {
    refund(size);
    return false;
  }
  madvise(p, size, MADV_HUGEPAGE);
  return true;
}

void HostDevice::unmap(uintptr_t addr, size_t size) {
  void* p = reinterpret_cast<void*>(addr);
  madvise(p, size, MADV_DONTNEED);
  mprotect(p, size, PROT_NONE);
  refund(size);
}

void HostDevice::release(uintptr_t addr, size_t size) { munmap(reinterpret_cast<void*>(addr), size); }

size_t HostDevice::free_bytes() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return capacity_ - used_;
}

}  // namespace torchmem
