// SimDevice: a simulated accelerator. An address space with a capacity and no
// memory behind it, so a trace recorded on an 80 GiB GPU replays on a laptop.
//
// allocate() and map() count bytes against the capacity and fail (return
// 0 / false) exactly when the request exceeds what is free, as cudaMalloc
// does. Addresses are never reused, so a stale address cannot alias a new
// segment. Addresses must never be dereferenced.
#pragma once

#include <mutex>

#include "core/device.h"

namespace torchmem {

class SimDevice final : public Device {
 public:
  // in_use_by_others: bytes of the capacity held outside the allocator (a
  // CUDA context, communication buffers, other processes): never free.
  explicit SimDevice(size_t capacity_bytes, size_t page_size = 2u << 20, size_t in_use_by_others = 0);

  std::string name() const override { return "sim"; }
  uintptr_t allocate(size_t size) override;
  void free(uintptr_t addr, size_t size) override;
  size_t page_size() const override { return page_size_; }
  uintptr_t reserve(size_t size) override;
  bool map(uintptr_t addr, size_t size) override;
  void unmap(uintptr_t addr, size_t size) override;
  void release(uintptr_t addr, size_t size) override;
  size_t total_bytes() const override { return capacity_; }
  size_t free_bytes() const override;

  // Segments from allocate() not yet freed (for leak checks; mapped pages
  // show in total_bytes() - free_bytes()).
  size_t live_segments() const;

 private:
  uintptr_t take_addresses(size_t size);

  const size_t capacity_;
  const size_t page_size_;
  mutable std::mutex mutex_;
  size_t used_ = 0;          // bytes allocated or mapped
  size_t live_ = 0;          // allocate() calls not yet freed
  uintptr_t next_address_;   // bump pointer of the address space
};

}  // namespace torchmem
