// DeviceAllocator: what every policy that owns a device's memory offers
// beyond the Allocator interface: a cache to empty, PyTorch's statistics,
// segments for snapshots, history, a memory fraction and invariants.
//
// Implementations: CachingAllocator (PyTorch's native policy,
// caching_allocator.h; config policy:native, the default) and
// StitchAllocator (the least-memory policy, stitch_allocator.h; config
// policy:stitch). Glue (CPU, CUDA) and the per-device policy of
// streams and pools hold allocators through this interface and make them
// with make_device_allocator(), so a policy chosen by the config serves
// wherever the native one does.
//
// Contract (in addition to Allocator's):
// - Thread safe: every method may be called from any thread.
// - try_deallocate(ptr) is deallocate() that returns false, changing
//   nothing, for a pointer the allocator does not own.
// - empty_cache() gives back to the device every cached byte it can.
// - stats() follows stats.h (torch.cuda.memory_stats()'s fields);
//   segments() lists the memory held, in address order; both are consistent
//   with each other after every public call (check_invariants() throws
//   std::logic_error naming the first broken invariant).
// - Free-memory callbacks run under the allocator's lock and must not call
//   back into it.
// - set_memory_fraction(f) limits reserved bytes to f * device.total_bytes()
//   (f = 1: no limit); std::invalid_argument outside [0, 1].
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "core/alloc_config.h"
#include "core/allocator.h"
#include "core/block.h"
#include "core/device.h"
#include "core/history.h"
#include "core/stats.h"

namespace torchmem {

class DeviceAllocator : public Allocator {
 public:
  virtual bool try_deallocate(void* ptr) = 0;
  virtual void empty_cache() = 0;
  virtual void add_free_memory_callback(std::function<bool()> callback) = 0;
  virtual void set_memory_fraction(double fraction) = 0;

  virtual DeviceStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void reset_accumulated_stats() = 0;
  virtual size_t largest_free_block() const = 0;
  virtual std::vector<SegmentInfo> segments() const = 0;

  // History under the allocator's lock; enable_history(0) stops recording
  // and drops the entries.
  virtual void enable_history(size_t max_entries, History::ContextProvider provider = nullptr) = 0;
  virtual std::vector<TraceEntry> history_entries() const = 0;
  virtual bool history_enabled() const = 0;

  virtual void check_invariants() const = 0;
  virtual const AllocatorConfig& config() const = 0;
  virtual Device& device() = 0;
};

// The allocator the config asks for, on `device` (which must outlive it).
std::shared_ptr<DeviceAllocator> make_device_allocator(Device& device, const AllocatorConfig& config);

}  // namespace torchmem
