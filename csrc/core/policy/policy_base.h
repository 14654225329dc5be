// PolicyBase: what every policy that owns a device's memory shares, so that
// a policy's own files hold only its decisions: the lock, the statistics,
// the history, the memory fraction and its limit, the free-memory
// callbacks, the releases-blocked flag, the config and the device.
//
// A policy derives from PolicyBase (not from DeviceAllocator directly),
// implements allocate/deallocate/try_deallocate/owns/has_live_allocations,
// empty_cache, largest_free_block, segments and check_invariants, and is
// registered with one line in policy/policies.cpp ("adding a policy" in
// docs/design.md).
//
// Contract for a derived policy:
// - mutex_ (a ForkSafeMutex of rank kAllocator) guards every member here
//   and the policy's own state; the accessors below take it, so a policy
//   must not call them while holding it.
// - stats_ is kept pool by pool (stats.h, increase_pool): stats() fills in
//   the aggregates.
// - trigger_free_memory_callbacks() and limit_bytes() are called under the
//   lock.
// - reset_accumulated_stats() resets the statistics' accumulated fields and
//   then calls on_reset_accumulated() under the lock, for a policy's own
//   counters.
#pragma once

#include <functional>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/history.h"
#include "core/base/stats.h"
#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class PolicyBase : public DeviceAllocator {
 public:
  // Called on a miss before new device memory is taken; a callback returns
  // true when it freed memory the allocator may now find cached. Callbacks
  // run under the allocator's lock and must not call back into it.
  void add_free_memory_callback(std::function<bool()> callback) override;
  // Limits reserved memory to fraction * device.total_bytes() (and, in the
  // native policy, enables the garbage collection threshold) when
  // fraction < 1; 1 lifts the limit (torch.cuda.set_per_process_memory_fraction).
  // Throws std::invalid_argument outside [0, 1].
  void set_memory_fraction(double fraction) override;
  void set_releases_blocked(bool blocked) override;
  std::shared_ptr<DeviceReserved> device_reserved() const override { return device_reserved_; }
  // Moves what this allocator holds into `shared`, and counts there from now on.
  void share_reserved(std::shared_ptr<DeviceReserved> shared) override;

  DeviceStats stats() const override;
  const DeviceStats& stats_ref() const override { return stats_; }
  void reset_peak_stats() override;
  void reset_accumulated_stats() override;

  void enable_history(size_t max_entries, History::ContextProvider provider = nullptr) override;
  std::vector<TraceEntry> history_entries() const override;
  bool history_enabled() const override;
  History& history() override { return history_; }

  const AllocatorConfig& config() const override { return config_; }
  Device& device() override { return device_; }

 protected:
  // Sets max_split_size in the statistics and the config's memory fraction.
  PolicyBase(Device& device, AllocatorConfig config);

  // The bytes a memory fraction allows: fraction * device.total_bytes().
  size_t limit_bytes() const {
    return static_cast<size_t>(memory_fraction_ * static_cast<double>(device_.total_bytes()));
  }
  // The reserved bytes of the device (every pool's), which limit_bytes() bounds.
  size_t device_reserved_bytes() const { return device_reserved_->bytes(); }
  // Runs every free-memory callback; true when one of them freed memory.
  bool trigger_free_memory_callbacks();
  // Under the lock, after reset_accumulated_stats() reset the statistics.
  virtual void on_reset_accumulated() {}

  Device& device_;
  AllocatorConfig config_;
  mutable ForkSafeMutex mutex_{LockRank::kAllocator};
  DeviceStats stats_;  // kept pool by pool (stats.h, increase_pool); stats() fills in the aggregates
  double memory_fraction_ = 1.0;
  bool fraction_set_ = false;  // a limit applies: memory_fraction_ < 1
  bool releases_blocked_ = false;
  History history_;
  std::vector<std::function<bool()>> free_memory_callbacks_;
  std::shared_ptr<DeviceReserved> device_reserved_ = std::make_shared<DeviceReserved>();
  size_t own_reserved_ = 0;  // this allocator's part of device_reserved_ (policies keep it with reserve/unreserve)
  void reserve(size_t n) {
    own_reserved_ += n;
    device_reserved_->add(n);
  }
  void unreserve(size_t n) {
    own_reserved_ -= n;
    device_reserved_->sub(n);
  }
};

}  // namespace torchmem
