// Arena: a bump allocator over one region, for per-step scratch memory.
//
// The region is taken once, at creation: from a Device, or as one allocation
// of another Allocator (on CUDA the device's caching allocator, so PyTorch's
// statistics count the region as one block). After that the arena makes no
// device calls; requests it does not serve from the region are forwarded
// (see Fallbacks).
//
// Passes (Note [Arena passes] in arena.cpp). rewind() starts a pass, one per
// block of torchmem.arena (one training step): the cursor goes back to the
// region's start, and every allocation still live (one that escaped an
// earlier pass) becomes a hole the cursor skips. An allocation rounds the
// cursor up to its alignment and bumps it; when those bytes would overlap the
// next live hole, the cursor jumps past the hole and tries again (the gap it
// leaves is reused from the next rewind on). Freeing during a pass:
//   - a freed hole stops being skipped (at once when it lies ahead);
//   - freeing the pass's newest allocation pulls the cursor back to the end
//     of its newest live one (a stack's free);
//   - when nothing in the region is live, the cursor returns to the start;
//   - when the cursor reaches the end, and the pass has freed at least the
//     request's size behind it since the last rewind, the arena rewinds
//     within the pass (a wrap) and tries once more from the start.
// So a loop whose steps each begin with rewind() holds one step plus what
// escaped, however long it runs.
//
// Safety: the bytes of a live allocation are never handed out again, whatever
// the order of frees, rewinds, wraps and threads. Only reset() breaks the
// rule, on the caller's word that nothing escaped.
//
// Cost (n = entries tracked, live or dead; h = holes of the pass):
//   allocate  O(1) while no live hole lies ahead of the cursor (one compare
//             and one push_back); with holes, O(1 + k) for the k holes the
//             cursor passes. Each hole is passed once per pass, again only
//             after a free pulls the cursor back over it. A wrap costs one
//             rewind.
//   deallocate, owns  O(log n): a binary search in the pass's or the holes'
//             list (freeing the newest allocation adds O(log h) to find the
//             next hole again).
//   rewind    O(n): merges the live entries of two sorted lists.
//   memory    16 bytes per tracked allocation; dead entries are compacted
//             when they outnumber live ones, and at each rewind.
//   region    a pass spans about what it allocates in total, less the
//             pull-backs (bytes freed behind the cursor come back only by a
//             wrap or at the next pass): more than the most it holds at once.
//
// Data:
//   base_            region start (aligned to >= 64)
//   offset_          the cursor, bytes from base_: 0 <= offset_ <= capacity_
//   pass_            this pass's allocations in address order (size 0: freed)
//   holes_           allocations live at the last rewind or wrap, in address
//                    order (size 0: freed since)
//   next_hole_       the first hole the cursor may still meet
//   peak_            max extent since creation or reset_peak()
//   block_peak_      max extent since the last rewind()
// where extent = max(offset_, end of the highest live hole) - the bytes of
// the region that hold or held something since.
// Invariants (check_invariants()):
//   pass_ and holes_ ascend and do not overlap, and their live entries do
//   not overlap each other; every pass entry ends at or before the cursor;
//   the newest pass entry is live; every hole below next_hole_ is freed or
//   ends at or before the cursor; the counts and byte sums below match the
//   lists; extent <= peak_, extent <= block_peak_, both <= capacity_.
//
// Fallbacks. A request beyond what the region can hold throws OutOfMemory
// with the arena's figures, or, when options.fallback is set, is served
// there and counted. A request on a stream the arena does not serve (see
// Streams) goes to options.other_streams. Forwarded allocations are tracked,
// so deallocate() hands them back to whoever served them.
//
// Streams (Note [Arena streams]). On an asynchronous device, freed bytes may
// still be in use by kernels queued on the stream that used them; reusing
// them on that same stream is safe (the stream runs in order), on another
// it is not. So an arena serves one stream, options.stream: requests on any
// other stream go to options.other_streams (std::invalid_argument when it is
// null), and a tensor used on other streams (record_stream) must be freed
// only once their work is done (the CUDA glue defers such frees until then).
// kAnyStream (the default) serves every stream from the region: for host
// and simulated memory, where nothing runs asynchronously.
//
// Ownership: the arena owns its region and gives it back in its destructor;
// the device, the source and the fallbacks must outlive the arena (the
// ArenaOwners form keeps them alive). Thread safety: every public method
// takes one internal mutex, so frees may arrive from any thread; calls into
// the source and fallbacks are made under it (lock order: arena, then them).
// The mutex is a ForkSafeMutex of rank kWrapper (see fork_safety.h).
// Alignment: allocate() aligns to default_alignment (>= 64, the Allocator
// contract); allocate_aligned() to any power of two. On a SimDevice the
// returned pointers are addresses only and must never be dereferenced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/base/allocator.h"
#include "core/base/out_of_memory.h"
#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

constexpr Stream kAnyStream = std::numeric_limits<Stream>::max();

struct ArenaOptions {
  size_t capacity = 0;              // bytes of the region
  size_t default_alignment = 64;    // for allocate(); a power of two >= 64
  Allocator* fallback = nullptr;    // serves requests beyond the region if set
  Stream stream = kAnyStream;       // the stream served from the region
  Allocator* other_streams = nullptr;  // serves requests on other streams
  Allocator* source = nullptr;      // the region's source; null: the device
};

// Shared ownership, for bindings: each pointer set here lives as long as the
// arena and replaces the matching raw pointer of ArenaOptions.
struct ArenaOwners {
  std::shared_ptr<Device> device;   // required
  std::shared_ptr<Allocator> source;
  std::shared_ptr<Allocator> fallback;
  std::shared_ptr<Allocator> other_streams;
};

struct ArenaStats {
  size_t capacity = 0;
  size_t used = 0;                  // the cursor: bytes up to the newest allocation
  size_t peak = 0;                  // max extent since creation / reset_peak()
  size_t live_allocations = 0;      // not yet deallocated (forwarded ones included)
  size_t live_bytes = 0;            // their requested sizes
  size_t holes = 0;                 // live allocations made before the last rewind or wrap
  size_t hole_bytes = 0;            // their requested sizes
  size_t holes_skipped = 0;         // jumps of the cursor over a live hole, cumulative
  size_t allocations = 0;           // served from the region, cumulative
  size_t rewinds = 0;               // rewind() calls
  size_t wraps = 0;                 // rewinds within a pass, at the region's end
  size_t resets = 0;                // reset() calls
  size_t fallback_allocations = 0;  // beyond the region, served by the fallback, cumulative
  size_t fallback_bytes = 0;        // their requested sizes, cumulative
  size_t other_stream_allocations = 0;  // served by other_streams, cumulative
  size_t fallback_live = 0;         // forwarded allocations not yet deallocated
  size_t fallback_live_bytes = 0;   // their requested sizes
  // Since the last rewind() (the current block):
  size_t block_peak = 0;            // max extent
  size_t block_allocations = 0;     // served from the region
  size_t block_holes = 0;           // holes at its start: allocations kept from earlier blocks
  size_t block_hole_bytes = 0;      // their requested sizes: what escapes held
  size_t block_holes_skipped = 0;
  size_t block_fallback_allocations = 0;
  size_t block_fallback_bytes = 0;
};

class Arena final : public Allocator {
 public:
  // Takes options.capacity bytes from options.source (on options.stream, or
  // stream 0 for kAnyStream) when set, else from `device`. Throws
  // OutOfMemory when the region cannot be had, std::invalid_argument for a
  // zero capacity or a bad alignment.
  Arena(Device& device, ArenaOptions options);
  Arena(ArenaOwners owners, ArenaOptions options);
  ~Arena() override;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Allocator interface.
  void* allocate(size_t size, Stream stream = 0) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override { return live_allocations() != 0; }

  // From the region, for the arena's own stream. alignment: a power of two
  // (any size). allocate_aligned(0, a) == nullptr.
  void* allocate_aligned(size_t size, size_t alignment);

  // Starts a pass (a block): cursor to the start, live allocations become
  // holes, block figures restart. Always safe. Returns the number of holes.
  size_t rewind();
  // Classic reset: every allocation is released (live ones forgotten, live
  // forwarded ones handed back); the cursor goes to the start, no holes.
  void reset();
  void reset_peak();

  size_t capacity() const { return capacity_; }
  Stream stream() const { return stream_; }
  size_t used() const;
  size_t peak() const;
  size_t live_allocations() const;
  ArenaStats stats() const;
  uintptr_t base() const { return base_; }
  Device& device() { return device_; }

  // Throws std::logic_error describing the first broken invariant.
  void check_invariants() const;

 private:
  struct Entry {
    uintptr_t addr;
    size_t size;  // 0 once deallocated
    bool live() const { return size != 0; }
    uintptr_t end() const { return addr + size; }
  };
  struct Forwarded {
    void* raw;             // what the serving allocator returned
    size_t size;
    Allocator* allocator;  // who served it
  };

  void* allocate_locked(size_t size, size_t alignment, Stream stream);
  void* allocate_slow_locked(size_t size, size_t alignment, Stream stream);
  void* allocate_other_stream_locked(size_t size, Stream stream);
  void* bump_locked(size_t size, size_t alignment);
  void* place_locked(uintptr_t start, size_t size, size_t next_hole, size_t skipped);
  void* forward_locked(Allocator* to, size_t size, size_t alignment, Stream stream);
  [[noreturn]] void throw_out_of_memory_locked(size_t size, size_t alignment) const;
  void release_pass_entry_locked(size_t index);
  void release_hole_locked(size_t index);
  void after_region_free_locked();
  void rewind_locked(bool new_block);
  void reset_locked();
  void release_forwarded_locked();
  size_t extent_locked() const;
  size_t largest_gap_ahead_locked() const;
  Stream region_stream() const { return stream_ == kAnyStream ? 0 : stream_; }
  bool in_region(uintptr_t p) const { return p >= base_ && p < base_ + capacity_; }

  std::shared_ptr<Device> owned_device_;
  std::shared_ptr<Allocator> owned_source_;
  std::shared_ptr<Allocator> owned_fallback_;
  std::shared_ptr<Allocator> owned_other_streams_;
  Device& device_;
  const size_t capacity_;
  const size_t default_alignment_;
  Allocator* fallback_;
  Allocator* other_streams_;
  Allocator* source_;
  const Stream stream_;
  uintptr_t base_ = 0;

  mutable ForkSafeMutex mutex_{LockRank::kWrapper};
  size_t offset_ = 0;
  size_t peak_ = 0;
  size_t block_peak_ = 0;
  std::vector<Entry> pass_;
  size_t pass_dead_ = 0;
  size_t pass_live_bytes_ = 0;
  std::vector<Entry> holes_;
  size_t next_hole_ = 0;
  size_t hole_count_ = 0;
  size_t hole_bytes_ = 0;
  size_t freed_behind_ = 0;  // region bytes freed behind the cursor since the last rewind
  std::vector<Entry> scratch_;  // rewind()'s merge target, kept to avoid a heap allocation per pass
  std::unordered_map<void*, Forwarded> forwarded_;
  size_t forwarded_bytes_ = 0;
  ArenaStats counters_;      // only the cumulative and block counters are kept here
  size_t block_start_allocations_ = 0;  // counters_.allocations at the last rewind()
};

}  // namespace torchmem
