// DeviceMemory: the memory policy of one accelerator, as PyTorch's
// DeviceCachingAllocator: a main allocator, private pools (private_pools.h),
// blocks used on several streams (stream_uses.h), allocators a thread routes
// to (torchmem.planned() on CUDA), and the rules of a CUDA graph capture.
// The CUDA glue (csrc/torch/cuda_allocator.cpp) is a translation of torch's
// calls onto this class; tests drive it on a SimDevice (tests/allocator/test_device_memory.py,
// tests/cpp/core_driver.cpp).
//
// Allocation (allocate): the private pool whose route takes the stream,
// else the thread's routed allocator (when given), else the main allocator;
// out of memory in the main allocator first borrows a cached block from the
// use_on_oom pools, then is raised (counted once). A pool out of memory
// empties the main allocator's cache (outside a capture) and retries once,
// as PyTorch's retry releases the device's whole cache. Memory fractions
// limit each allocator on its own (PyTorch: the device's total). Before choosing, frees
// whose streams' work completed are completed (not during a capture).
// Frees (free): a pool block goes back to its pool, a routed allocator's
// block to it, anything else to the main allocator. A block with stream
// uses (record_stream) ends its allocation at once (allocated bytes drop, as
// PyTorch) and is reused once the events on its streams complete.
//
// Note [Capture rules]
// While a route marked as a capture is open (a CUDA graph is captured),
// nothing may invalidate the capture or free addresses baked into it, as
// PyTorch guards with captures_underway:
// - no cached segment is released and no page unmapped: empty_cache() and
//   empty_pool_cache() do nothing, the out-of-memory retry's releases and
//   garbage collection are skipped (set_releases_blocked on every allocator);
// - no event is recorded, queried or synchronised: frees with stream uses
//   are deferred without events, and pending frees are neither polled nor
//   waited for, until the capture ends;
// - nothing throws for these: the calls do less and say nothing.
// Allocation goes on: segments may be allocated and pages mapped.
// Routes that are not captures (torch.cuda.use_mem_pool) change nothing of
// this: empty_cache, deferred frees and the out-of-memory retry work inside
// them as outside.
//
// Errors: allocate() throws OutOfMemory; pool calls throw
// std::invalid_argument for a misuse PyTorch rejects too (a second route to a
// pool, ending a route that is not open). free(), release_pool(),
// set_use_on_oom() and empty_pool_cache() never throw (deleters and
// destructors call them): what they refuse they report through the return
// value.
//
// Thread safety: every method may be called from any thread. One
// ForkSafeMutex (rank kRouting) guards pools, routes, pool blocks and routed
// allocators; allocators are called under it (their own locks rank below)
// or without it on the fast paths, and are made and destroyed outside it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/history.h"
#include "core/base/stats.h"
#include "core/device_memory/private_pools.h"
#include "core/device_memory/stream_uses.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

constexpr PoolId kDefaultPool{0, 0};

class DeviceMemory {
 public:
  using Filter = PrivatePools::Filter;

  DeviceMemory(Device& device, AllocatorConfig config);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  Device& device() { return device_; }
  std::shared_ptr<DeviceAllocator> main() const;
  AllocatorConfig config() const;
  // A new config for an unused device (no live allocation, no pool): false,
  // changing nothing, otherwise.
  bool reconfigure(const AllocatorConfig& config);

  void* allocate(size_t size, Stream stream, const std::shared_ptr<Allocator>& thread_allocator = nullptr);
  // False when nothing here owns ptr (nothing changes). Refusals of a
  // routed allocator are reported the same way.
  bool free(void* ptr);
  bool owns(const void* ptr) const;
  // A use of a live allocation on `stream` (ignored on its own stream);
  // false when ptr is not a live allocation here.
  bool record_stream(void* ptr, Stream stream);
  size_t pending_frees() const { return uses_.pending(); }

  void empty_cache();
  bool empty_pool_cache(PoolId id);
  void set_memory_fraction(double fraction);
  double memory_fraction() const;  // the config's until set

  void create_or_incref_pool(PoolId id);
  void begin_allocate_to_pool(PoolId id, Filter filter, bool capture);
  void end_allocate_to_pool(PoolId id);
  bool release_pool(PoolId id);
  bool set_use_on_oom(PoolId id, bool use_on_oom);
  int pool_use_count(PoolId id) const;
  size_t pool_count() const;
  bool capture_underway() const { return capturing_.load(std::memory_order_acquire); }
  // A capture begun or ended outside any route (torch 2.14's
  // markCaptureBegin/End); the capture rules hold while any is underway.
  void mark_capture(bool begin);

  // Routed allocators: kept (so frees find them) until nobody else holds
  // them and they have no live allocation.
  void add_routed(std::shared_ptr<Allocator> allocator);
  void drop_unused_routed();

  // Statistics add up the main allocator and the pools (peaks summed: an
  // upper bound while pools exist).
  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  size_t largest_free_block() const;
  // The main allocator (kDefaultPool), the live pools, then the retired ones.
  std::vector<PrivatePools::Entry> allocators() const;
  // History for every allocator, now and made later; `clear` drops what
  // was recorded. max_entries 0 stops recording.
  void enable_history(size_t max_entries, History::ContextProvider provider, bool clear);
  void check_invariants() const;

 private:
  using Graveyard = std::vector<std::shared_ptr<void>>;  // destroyed after the lock is released
  // Who frees a pointer: a pool or the main allocator, or a routed one.
  struct Owner {
    DeviceAllocator* pool_or_main;
    Allocator* routed;
  };
  std::shared_ptr<DeviceAllocator> make_allocator() const;  // outside mutex_
  void* allocate_main(DeviceAllocator& main, size_t size, Stream stream);
  bool release_for_pool();  // a pool ran out of memory: false when nothing was released
  Owner owner_locked(const void* ptr);
  bool free_locked(void* ptr, Graveyard& graveyard);
  bool deallocate_routed_locked(Allocator* routed, void* ptr, Graveyard& graveyard);
  void after_pool_free_locked(DeviceAllocator* pool, void* ptr, Graveyard& graveyard);
  void complete_locked(const std::vector<StreamUses::Pending>& done, Graveyard& graveyard);
  void drop_empty_retired_locked(Graveyard& graveyard);
  void drop_unused_routed_locked(Graveyard& graveyard);
  void set_capturing_locked(Graveyard& graveyard);
  bool capturing_locked() const { return marked_captures_ > 0 || pools_.capturing(); }
  void update_slow_locked();
  std::vector<std::shared_ptr<DeviceAllocator>> all_locked() const;

  Device& device_;
  mutable ForkSafeMutex mutex_{LockRank::kRouting};
  AllocatorConfig config_;
  std::shared_ptr<DeviceAllocator> main_;
  std::vector<std::shared_ptr<DeviceAllocator>> old_mains_;  // replaced by reconfigure(), kept
  double fraction_ = -1.0;  // < 0: the config's
  size_t history_entries_ = 0;
  History::ContextProvider history_provider_;
  PrivatePools pools_;
  int marked_captures_ = 0;  // mark_capture(true) not yet ended
  std::unordered_map<void*, DeviceAllocator*> pool_blocks_;  // live blocks of pools (may be stale: checked)
  std::vector<std::shared_ptr<Allocator>> routed_;          // oldest first
  StreamUses uses_;
  // Fast paths read these without the lock.
  std::atomic<DeviceAllocator*> main_fast_{nullptr};
  std::atomic<bool> capturing_{false};
  std::atomic<bool> routing_{false};    // a route is open
  std::atomic<size_t> slow_frees_{0};   // pool blocks + routed allocators
};

}  // namespace torchmem
