// The primitive layer every allocator in torchmem sits on.
//
// A Device hands out segments of address space, optionally backed by memory.
// Implementations: HostDevice (host memory, host_device.h), SimDevice (an
// address space with a capacity and nothing behind it, sim_device.h), and the
// CUDA device (csrc/cuda/, the only code that includes CUDA headers).
//
// Contract, for every implementation:
// - Addresses are plain integers (uintptr_t); 0 means "no memory".
// - allocate() returns 0 when the device cannot provide `size` bytes (the way
//   cudaMalloc reports cudaErrorMemoryAllocation); it never throws for that.
// - free()/unmap()/release() receive exactly what allocate()/map()/reserve()
//   returned or were given; anything else is undefined behaviour.
// - Segments from allocate() are aligned to at least kSegmentAlignment.
// - Thread safety: implementations are internally synchronised; the caching
//   allocator still calls them under its own lock. A device's lock is a
//   ForkSafeMutex of rank kDevice (core/sync/fork_safety.h) unless no forked child
//   may use the device (CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchmem {

using Stream = uint64_t;
using EventId = uint64_t;

constexpr size_t kSegmentAlignment = 512;

class Device {
 public:
  virtual ~Device() = default;

  // Short name used in messages and snapshots: "cpu", "sim", "cuda:0".
  virtual std::string name() const = 0;

  // Whole segments.
  virtual uintptr_t allocate(size_t size) = 0;
  virtual void free(uintptr_t addr, size_t size) = 0;

  // Virtual memory, for expandable segments: reserve an address range with no
  // memory behind it, map and unmap pages of page_size() inside it, release it.
  // map() returns false when the device is out of memory (nothing mapped).
  virtual size_t page_size() const = 0;
  virtual uintptr_t reserve(size_t size) = 0;
  virtual bool map(uintptr_t addr, size_t size) = 0;
  virtual void unmap(uintptr_t addr, size_t size) = 0;
  virtual void release(uintptr_t addr, size_t size) = 0;

  // Events on a stream, for blocks used on several streams. On host and sim
  // devices there is no asynchrony: an event is complete once recorded.
  virtual EventId record_event(Stream) { return ++last_event_; }
  virtual bool event_complete(EventId) { return true; }
  virtual void synchronize_event(EventId) {}
  virtual void destroy_event(EventId) {}

  // Capacity: total bytes the device may hold, and how many are still free.
  virtual size_t total_bytes() const = 0;
  virtual size_t free_bytes() const = 0;

 private:
  EventId last_event_ = 0;
};

}  // namespace torchmem
