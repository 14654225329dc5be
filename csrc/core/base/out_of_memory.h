// OutOfMemory: thrown by allocators when a request cannot be served.
// Carries the figures PyTorch's message states, so glue code can rethrow it
// as c10::OutOfMemoryError (torch.OutOfMemoryError in Python) unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace torchmem {

struct OomInfo {
  size_t requested = 0;         // bytes asked for by the caller
  size_t alloc_size = 0;        // the segment the allocator tried to get (else requested)
  size_t allocated = 0;         // bytes in live allocations
  size_t reserved = 0;          // bytes held from the device
  size_t largest_free = 0;      // largest free cached block
  size_t device_total = 0;      // device capacity
  size_t device_free = 0;       // what the device still had free
  size_t allowed = 0;           // the memory limit (a memory fraction), else device_total
};

class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(const std::string& message, const OomInfo& info)
      : std::runtime_error(message), info_(info) {}
  const OomInfo& info() const { return info_; }

 private:
  OomInfo info_;
};

// "2.00 GiB", "512 bytes": the size format of PyTorch's messages.
std::string format_size(size_t bytes);

// "0x7f0000000000": how the core's messages name an address.
std::string hex_address(uintptr_t addr);

// PyTorch's out-of-memory message up to what the allocator holds: the
// device's own total and free, the limit a memory fraction sets ("N
// allowed; ", when `limited`), then "Of the allocated memory A is allocated
// by PyTorch, and R is reserved by PyTorch but unallocated". Each policy
// appends its own ending.
std::string oom_message_head(const std::string& device_name, const OomInfo& info, bool limited);

}  // namespace torchmem
