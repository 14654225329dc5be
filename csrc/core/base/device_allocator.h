// DeviceAllocator: what every policy that owns a device's memory offers
// beyond the Allocator interface: a cache to empty, PyTorch's statistics,
// segments for snapshots, history, a memory fraction and invariants.
//
// Implementations derive from PolicyBase (policy/policy_base.h: the lock,
// statistics, history, memory fraction and callbacks every policy shares)
// and are registered in policy/policies.cpp: CachingAllocator (PyTorch's
// native policy, policy/native/; config policy:native, the default) and
// StitchAllocator (the least-memory policy, policy/stitch/; policy:stitch).
// Glue (CPU, CUDA), the replayer and the per-device policy of streams and
// pools hold allocators through this interface and make them with
// make_device_allocator(), so a policy chosen by the config serves wherever
// the native one does; none of them names a policy's class.
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
// - allocate(size, stream) is try_allocate() or else
//   throw_out_of_memory(size, stream): a caller that has other places to
//   look (a pool used on OOM) calls the two itself, so an out of memory is
//   counted (num_ooms, the trace's oom entry) once, when it is raised.
//   try_allocate() counts nothing when it returns nullptr.
// - A free in two steps, for memory still used on other streams (PyTorch's
//   record_stream): request_free(ptr) ends the allocation (allocation,
//   allocated_bytes and oversize_allocations drop, free_requested is
//   recorded; false, changing nothing, when ptr is not a live allocation)
//   but keeps the block active and out of the cache until complete_free(ptr)
//   (free_completed; active, active_bytes and requested_bytes drop; the
//   block is cached). complete_free throws std::logic_error for a pointer
//   whose free was not requested. try_deallocate is the two at once.
// - Releases blocked (set_releases_blocked(true), while a CUDA graph is
//   captured): no cached segment goes back to the device and no page is
//   unmapped: empty_cache() does nothing, garbage collection and the out of
//   memory retry's releases are skipped. Allocation still maps and allocates.
// - The pending-free waiter, when set, is called under the allocator's lock
//   (releases not blocked) just before the out-of-memory retry releases every
//   cached segment; it returns the pointers whose free it may now complete
//   (their streams' work done), which the allocator completes first, as
//   PyTorch synchronises its events there. It must not call back into the
//   allocator.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/allocator.h"
#include "core/base/device_reserved.h"
#include "core/base/history.h"
#include "core/base/out_of_memory.h"
#include "core/base/segment_info.h"
#include "core/base/stats.h"
#include "core/devices/device.h"

namespace torchmem {

class RecordedSegments;  // replay/recorded_state.h

class DeviceAllocator : public Allocator {
 public:
  using PendingFreeWaiter = std::function<std::vector<void*>()>;

  // The defaults below keep a policy that does not implement these correct
  // but coarser: its two-step free frees at complete_free(), it cannot say
  // a pointer's stream (uses are kept on every stream), it has no cached
  // fast path, no pending frees to wait for, and no replay support.
  // CachingAllocator implements them all.

  // nullptr where allocate() would throw OutOfMemory; nothing is counted.
  virtual void* try_allocate(size_t size, Stream stream = 0) = 0;
  // A cached free block only (no device call), else nullptr; nothing counted.
  virtual void* allocate_cached(size_t, Stream = 0) { return nullptr; }
  // Counts the out of memory of a request for `size` on `stream` and throws
  // it, with the message allocate() would give.
  [[noreturn]] virtual void throw_out_of_memory(size_t size, Stream stream) = 0;
  virtual bool try_deallocate(void* ptr) = 0;
  virtual bool request_free(void* ptr) { return owns(ptr); }
  virtual void complete_free(void* ptr) { deallocate(ptr); }
  // The stream a live allocation was made on (false: not a live allocation,
  // or the policy does not know).
  virtual bool allocation_stream(const void*, Stream*) const { return false; }
  virtual void set_releases_blocked(bool blocked) = 0;
  virtual void set_pending_free_waiter(PendingFreeWaiter) {}
  virtual void empty_cache() = 0;
  virtual void add_free_memory_callback(std::function<bool()> callback) = 0;
  virtual void set_memory_fraction(double fraction) = 0;
  // The device's reserved bytes this allocator counts into (DeviceReserved):
  // its own until share_reserved() joins it to another allocator's, which a
  // private pool of the same device does before its first allocation.
  virtual std::shared_ptr<DeviceReserved> device_reserved() const = 0;
  virtual void share_reserved(std::shared_ptr<DeviceReserved> shared) = 0;

  virtual DeviceStats stats() const = 0;
  // The live statistics without the lock, kept pool by pool (their
  // aggregates hold only peaks: stats.h, increase_pool): only for an owner
  // that is the allocator's sole user (the replayer).
  virtual const DeviceStats& stats_ref() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void reset_accumulated_stats() = 0;
  virtual size_t largest_free_block() const = 0;
  virtual std::vector<SegmentInfo> segments() const = 0;

  // History under the allocator's lock; enable_history(0) stops recording
  // and drops the entries.
  virtual void enable_history(size_t max_entries, History::ContextProvider provider = nullptr) = 0;
  virtual std::vector<TraceEntry> history_entries() const = 0;
  virtual bool history_enabled() const = 0;
  // The history itself, for a sole user (the replayer, single-threaded tests).
  virtual History& history() = 0;

  // What the policy counts beyond DeviceStats (name, value), in a fixed
  // order; empty when nothing (the native policy).
  virtual std::vector<std::pair<const char*, uint64_t>> policy_counters() const { return {}; }
  // The replay support of a policy that can rebuild a recording's segments
  // (replay/recorded_state.h), else nullptr.
  virtual RecordedSegments* recorded_segments() { return nullptr; }

  virtual void check_invariants() const = 0;
  virtual const AllocatorConfig& config() const = 0;
  virtual Device& device() = 0;
};

// The allocator the config's policy asks for, on `device` (which must
// outlive it): the registration of that name (base/policy_registry.h).
std::shared_ptr<DeviceAllocator> make_device_allocator(Device& device, const AllocatorConfig& config);

}  // namespace torchmem
