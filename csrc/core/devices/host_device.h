// HostDevice: segments of host memory, for the CPU install.
//
// Segments come straight from mmap, aligned to 2 MiB and advised as
// transparent huge pages, and stay mapped until the caching allocator
// releases them: the point of a caching host allocator is to stop paying
// page faults for memory that is freed and reused.
//
// The capacity defaults to the machine's physical memory; allocate() and
// map() fail (0 / false) past it, or when the kernel refuses.
// Expandable segments: reserve() maps PROT_NONE, map() makes pages
// read-write, unmap() returns them to the kernel (MADV_DONTNEED) and
// protects them again.
// Thread safety: the byte count is under a ForkSafeMutex of rank kDevice;
// the mappings are private, so a forked child has its own copy of them.
#pragma once

#include <mutex>

#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class HostDevice final : public Device {
 public:
  // capacity_bytes == 0 means "physical memory".
  explicit HostDevice(size_t capacity_bytes = 0);

  std::string name() const override { return "cpu"; }
  uintptr_t allocate(size_t size) override;
  void free(uintptr_t addr, size_t size) override;
  size_t page_size() const override { return 2u << 20; }
  uintptr_t reserve(size_t size) override;
  bool map(uintptr_t addr, size_t size) override;
  void unmap(uintptr_t addr, size_t size) override;
  void release(uintptr_t addr, size_t size) override;
  size_t total_bytes() const override { return capacity_; }
  size_t free_bytes() const override;

 private:
  bool charge(size_t size);
  void refund(size_t size);

  const size_t capacity_;
  mutable ForkSafeMutex mutex_{LockRank::kDevice};
  size_t used_ = 0;
};

// Physical memory of this machine in bytes.
size_t physical_memory_bytes();

}  // namespace torchmem
