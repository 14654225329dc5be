// DeviceReserved: the bytes that all the allocators of one device hold
// together: the default pool's and every private pool's (a CUDA graph's, a
// torch.cuda.MemPool's), as PyTorch's DeviceCachingAllocator counts them in
// total_allocated_memory. A memory fraction's limit and the garbage
// collection threshold apply to this total, not to one pool's share: a
// pool's new segment is refused when the device's reserved bytes would pass
// the limit.
//
// Contract: add() and sub() may be called from any thread (each pool has
// its own lock); bytes() is a snapshot.
#pragma once

#include <atomic>
#include <cstddef>

namespace torchmem {

class DeviceReserved {
 public:
  void add(size_t n) { bytes_.fetch_add(n, std::memory_order_relaxed); }
  void sub(size_t n) { bytes_.fetch_sub(n, std::memory_order_relaxed); }
  size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<size_t> bytes_{0};
};

}  // namespace torchmem
