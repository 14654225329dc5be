// Allocator statistics, the same fields as c10::CachingDeviceAllocator's
// DeviceStats, so torch.cuda.memory_stats() keys map one to one.
//
// Invariant after every public call: each Stat's current equals its
// recomputation from the blocks (CachingAllocator::check_invariants), the
// aggregates' once with_pool_sums() has filled them in.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace torchmem {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // sum of all increases
  int64_t freed = 0;      // sum of all decreases

  void increase(int64_t amount) {
    current += amount;
    peak = std::max(peak, current);
    allocated += amount;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

enum StatType : size_t { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kNumStatTypes = 3 };
using StatArray = std::array<Stat, kNumStatTypes>;

// The allocators keep each StatArray pool by pool, the way their hot paths
// change it: increase_pool() and decrease_pool() update the pool's Stat and
// the aggregate's peak (the pools' total, as it stood at its highest), and
// leave the aggregate's current, allocated and freed alone. Those are the
// pools' sums, filled in by DeviceStats::with_pool_sums() when read. Half
// the bookkeeping of an allocation and a free (benchmarks/bench_malloc.py).
inline void increase_pool(StatArray& a, bool is_small, int64_t amount) {
  Stat& pool = a[is_small ? kSmallPool : kLargePool];
  const int64_t total = pool.current + amount + a[is_small ? kLargePool : kSmallPool].current;
  pool.increase(amount);
  if (total > a[kAggregate].peak) a[kAggregate].peak = total;
}
inline void decrease_pool(StatArray& a, bool is_small, int64_t amount) {
  a[is_small ? kSmallPool : kLargePool].decrease(amount);
}

struct DeviceStats {
  StatArray allocation;            // live allocations
  StatArray segment;               // segments taken from the device
  StatArray active;                // allocated or waiting on stream events
  StatArray inactive_split;        // free blocks inside split segments
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;       // bytes asked for, before rounding
  int64_t num_alloc_retries = 0;   // device allocations retried after freeing the cache
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  Stat oversize_allocations;       // allocations of max_split_size or more
  Stat oversize_segments;
  int64_t max_split_size = 0;

  template <typename F>
  void for_each_stat_array(F f) {
    for (StatArray* a : {&allocation, &segment, &active, &inactive_split, &allocated_bytes, &reserved_bytes,
                         &active_bytes, &inactive_split_bytes, &requested_bytes}) {
      f(*a);
    }
  }

  // A copy whose aggregates' current, allocated and freed are the sums of
  // the pools' (stats kept with increase_pool / decrease_pool).
  DeviceStats with_pool_sums() const {
    DeviceStats out = *this;
    out.for_each_stat_array([](StatArray& a) {
      a[kAggregate].current = a[kSmallPool].current + a[kLargePool].current;
      a[kAggregate].allocated = a[kSmallPool].allocated + a[kLargePool].allocated;
      a[kAggregate].freed = a[kSmallPool].freed + a[kLargePool].freed;
    });
    return out;
  }

  // The first current value that differs from `expect` (a recomputation),
  // described for check_invariants(); "" when none does.
  std::string current_difference(DeviceStats expect) const {
    static const char* const names[] = {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                                        "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"};
    DeviceStats actual = with_pool_sums();
    std::vector<StatArray*> want, have;
    expect.for_each_stat_array([&](StatArray& a) { want.push_back(&a); });
    actual.for_each_stat_array([&](StatArray& a) { have.push_back(&a); });
    for (size_t i = 0; i < want.size(); ++i) {
      for (size_t t = 0; t < kNumStatTypes; ++t) {
        if ((*want[i])[t].current != (*have[i])[t].current) {
          return std::string(names[i]) + "[" + std::to_string(t) + "].current is " +
                 std::to_string((*have[i])[t].current) + ", recomputed " + std::to_string((*want[i])[t].current);
        }
      }
    }
    return "";
  }

  // torch.cuda.reset_peak_memory_stats(): every peak to its current value
  // (pool-kept stats: the aggregates' peaks to the pools' totals).
  void reset_peaks() {
    *this = with_pool_sums();
    for_each_stat_array([](StatArray& a) {
      for (Stat& s : a) s.reset_peak();
    });
    oversize_allocations.reset_peak();
    oversize_segments.reset_peak();
  }
  // torch.cuda.reset_accumulated_memory_stats(): sums and event counts to 0.
  void reset_accumulated() {
    for_each_stat_array([](StatArray& a) {
      for (Stat& s : a) s.reset_accumulated();
    });
    oversize_allocations.reset_accumulated();
    oversize_segments.reset_accumulated();
    num_alloc_retries = num_ooms = num_sync_all_streams = 0;
    num_device_alloc = num_device_free = 0;
  }
};

// dst += src, stat by stat (peaks too: a bound, not the peak of the sum).
inline void add_stats(DeviceStats& dst, const DeviceStats& src) {
  std::vector<StatArray*> d;
  std::vector<StatArray*> s;
  dst.for_each_stat_array([&](StatArray& a) { d.push_back(&a); });
  const_cast<DeviceStats&>(src).for_each_stat_array([&](StatArray& a) { s.push_back(&a); });
  auto add = [](Stat& a, const Stat& b) {
    a.current += b.current;
    a.peak += b.peak;
    a.allocated += b.allocated;
    a.freed += b.freed;
  };
  for (size_t i = 0; i < d.size(); ++i) {
    for (size_t t = 0; t < kNumStatTypes; ++t) add((*d[i])[t], (*s[i])[t]);
  }
  add(dst.oversize_allocations, src.oversize_allocations);
  add(dst.oversize_segments, src.oversize_segments);
  dst.num_alloc_retries += src.num_alloc_retries;
  dst.num_ooms += src.num_ooms;
  dst.num_sync_all_streams += src.num_sync_all_streams;
  dst.num_device_alloc += src.num_device_alloc;
  dst.num_device_free += src.num_device_free;
  dst.max_split_size = src.max_split_size;
}

}  // namespace torchmem
