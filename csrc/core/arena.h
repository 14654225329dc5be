// Arena: a bump allocator over one region taken from a Device at creation.
//
// Allocation rounds the current offset up to the requested alignment and
// bumps it; freeing one object releases nothing; reset() releases everything
// at once. This is the allocator for per-step scratch memory: no search, no
// free lists, no device calls after construction.
//
// Data (see Note [Arena live tracking] in arena.cpp):
//   base_                  region start (aligned to >= kSegmentAlignment)
//   offset_                bytes handed out so far, 0 <= offset_ <= capacity_
//   peak_                  max offset_ since construction or reset_peak()
//   live_                  allocations not yet deallocated, in address order
// Invariants (check_invariants()):
//   every live entry lies inside [base_, base_ + offset_), entries ascend and
//   do not overlap; live_count_ = #live entries + #live fallback pointers;
//   live_bytes_ = their sizes summed; used() = offset_ <= peak_ <= capacity_.
//
// Beyond capacity: allocate() throws OutOfMemory with the arena's figures, or,
// when a fallback Allocator is configured (e.g. a CachingAllocator), forwards
// the request there and counts it (fallback_allocations(), fallback_bytes()).
// deallocate() of a fallback pointer forwards it back.
//
// Escapes: an allocation still live when the arena is reset would point at
// memory the next step reuses. reset() is the classic arena reset: it forgets
// live allocations (the caller promises none escaped; fallback allocations
// still live are returned to the fallback). reset_when_unused() is the safe
// form: it resets now when nothing is live, otherwise it leaves memory intact
// and the arena resets itself when the last live allocation is deallocated.
//
// Ownership: the arena owns its region and returns it to the device in its
// destructor; the device (and the fallback) must outlive the arena.
// Thread safety: every public method takes one internal mutex, so
// deallocations may arrive from any thread. It is a ForkSafeMutex of rank
// kWrapper (the fallback is called under it; see fork_safety.h).
// Alignment: allocate() aligns to default_alignment (>= 64, the Allocator
// contract); allocate_aligned() to any power of two. On a SimDevice the
// returned pointers are addresses only and must never be dereferenced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/fork_safety.h"
#include "core/out_of_memory.h"

namespace torchmem {

struct ArenaOptions {
  size_t capacity = 0;              // bytes taken from the device at creation
  size_t default_alignment = 64;    // for allocate(); a power of two >= 64
  Allocator* fallback = nullptr;    // serves requests beyond capacity if set
};

struct ArenaStats {
  size_t capacity = 0;
  size_t used = 0;                  // current offset, padding included
  size_t peak = 0;                  // max used since creation / reset_peak()
  size_t live_allocations = 0;      // allocations not yet deallocated
  size_t live_bytes = 0;            // their requested sizes
  size_t allocations = 0;           // served from the region, cumulative
  size_t resets = 0;                // resets performed (deferred ones included)
  size_t fallback_allocations = 0;  // served by the fallback, cumulative
  size_t fallback_bytes = 0;        // bytes requested from the fallback, cumulative
  size_t fallback_live = 0;         // fallback allocations not yet deallocated
  bool reset_pending = false;       // reset_when_unused() waits for live ones
};

class Arena final : public Allocator {
 public:
  // Takes options.capacity bytes from `device` (throws OutOfMemory if the
  // device refuses; std::invalid_argument for a zero capacity or a bad
  // alignment).
  Arena(Device& device, ArenaOptions options);
  // Same, and keeps the device (and the fallback, which then replaces
  // options.fallback) alive for as long as the arena.
  Arena(std::shared_ptr<Device> device, ArenaOptions options, std::shared_ptr<Allocator> fallback = nullptr);
  ~Arena() override;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Allocator interface.
  void* allocate(size_t size, Stream stream = 0) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override { return live_allocations() != 0; }

  // alignment: a power of two (any size). allocate_aligned(0, a) == nullptr.
  void* allocate_aligned(size_t size, size_t alignment);

  // Classic reset: every allocation is released (live ones forgotten, live
  // fallback ones handed back to the fallback); used() becomes 0.
  void reset();
  // Safe reset: returns true if the arena was reset now; false if live
  // allocations remain, in which case nothing moves and the arena resets
  // itself when the last of them is deallocated.
  bool reset_when_unused();
  void reset_peak();

  size_t capacity() const { return capacity_; }
  size_t used() const;
  size_t peak() const;
  size_t live_allocations() const;
  ArenaStats stats() const;
  uintptr_t base() const { return base_; }
  Device& device() { return device_; }

  // Throws std::logic_error describing the first broken invariant.
  void check_invariants() const;

 private:
  struct Live {
    uintptr_t addr;
    size_t size;  // 0 once deallocated (entries are compacted lazily)
  };

  void* allocate_locked(size_t size, size_t alignment);
  void* allocate_fallback_locked(size_t size, size_t alignment);
  void reset_locked();
  void release_fallback_locked();
  bool in_region(uintptr_t p) const { return p >= base_ && p < base_ + capacity_; }

  std::shared_ptr<Device> owned_device_;
  std::shared_ptr<Allocator> owned_fallback_;
  Device& device_;
  const size_t capacity_;
  const size_t default_alignment_;
  Allocator* fallback_;
  uintptr_t base_ = 0;

  mutable ForkSafeMutex mutex_{LockRank::kWrapper};
  size_t offset_ = 0;
  size_t peak_ = 0;
  std::vector<Live> live_;
  size_t dead_entries_ = 0;
  size_t live_count_ = 0;
  size_t live_bytes_ = 0;
  // returned pointer -> (pointer from the fallback, requested size)
  std::unordered_map<void*, std::pair<void*, size_t>> fallback_live_;
  bool reset_pending_ = false;
  size_t allocations_ = 0;
  size_t resets_ = 0;
  size_t fallback_allocations_ = 0;
  size_t fallback_bytes_ = 0;
};

}  // namespace torchmem
