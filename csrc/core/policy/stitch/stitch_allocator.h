// StitchAllocator: the policy that needs the least memory ("policy:stitch"
// in the config; make_device_allocator() builds it). See Note [Stitch
// policy] in stitch_allocator.cpp for how it places blocks, and
// docs/stitch.md for when to use it and what it costs.
//
// In short: per stream and size class (small: up to 1 MiB) one virtual
// range far larger than the device (4x its capacity) is reserved; blocks are
// placed in it at 512 B granularity; a page of device.page_size() is mapped
// when a block first touches it, and pages with no live bytes stay mapped
// (cached) until the device runs short, empty_cache(), or a memory limit.
// Then any cached page anywhere is unmapped to serve a request anywhere, so
// free physical memory never sits stuck in a gap between live blocks.
//
// Contract: DeviceAllocator's (device_allocator.h), with:
// - Pointers are aligned to 512 bytes; blocks are 512 B multiples.
// - Blocks of one stream are never given to another (each stream has its
//   own ranges); physical pages move between streams only through an
//   unmap (on CUDA, unmap() waits for the device).
// - stats(): reserved_bytes are mapped bytes (small/large pool by the
//   range's class); segment and inactive_split stay 0 (as for expandable
//   segments); num_device_alloc / num_device_free count device map() and
//   unmap() calls, one per page; num_alloc_retries counts allocations that
//   had to unmap cached pages first.
// - segments(): each run of mapped pages of a range is one segment
//   (is_expandable), tiled by its blocks (free blocks clipped to the run).
// - History: alloc / free_requested / free_completed per block; one
//   segment_map per run of pages mapped for an allocation, one
//   segment_unmap per run of pages unmapped at once; oom.
// - Requests over 2^60 bytes, or that the device cannot hold even with
//   every cached page unmapped, throw OutOfMemory (the allocator unchanged
//   but for pages it unmapped).
// Thread safety: one internal ForkSafeMutex (rank kAllocator) around every
// public method. Ownership: reserved ranges are released by empty_cache()
// (ranges with no live block) and by the destructor (all of them: live
// blocks are invalidated).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/history.h"
#include "core/base/node_pool.h"
#include "core/base/out_of_memory.h"
#include "core/base/stats.h"
#include "core/policy/policy_base.h"
#include "core/policy/stitch/stitch_range.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class StitchAllocator final : public PolicyBase {
 public:
  explicit StitchAllocator(Device& device, AllocatorConfig config = {});
  ~StitchAllocator() override;
  StitchAllocator(const StitchAllocator&) = delete;
  StitchAllocator& operator=(const StitchAllocator&) = delete;

  void* allocate(size_t size, Stream stream = 0) override;
  void* try_allocate(size_t size, Stream stream = 0) override;
  [[noreturn]] void throw_out_of_memory(size_t size, Stream stream) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override;
  bool try_deallocate(void* ptr) override;

  // Unmaps every cached page and releases ranges with no live block.
  void empty_cache() override;
  // set_releases_blocked, add_free_memory_callback, set_memory_fraction,
  // stats, reset_*_stats, history, config and device: PolicyBase's
  // (policy_base.h). While releases are blocked (a CUDA graph is captured)
  // no page is unmapped: empty_cache() does nothing and a request the
  // mapped and free pages cannot serve fails. Free-memory callbacks are
  // called before pages are mapped for a request; one returning true makes
  // the allocator look for room again. reset_accumulated_stats() also
  // zeroes counters().
  // The largest run of free bytes in mapped pages (served with no new page).
  size_t largest_free_block() const override;
  std::vector<SegmentInfo> segments() const override;
  // Throws std::logic_error naming the first broken invariant: blocks tile
  // each range; no two neighbouring free blocks; the free index holds exactly
  // the free blocks and the live map the allocated ones; each page's live
  // bytes equal the blocks on it and every such page is mapped; stats equal
  // a recomputation (reserved = mapped pages).
  void check_invariants() const override;
  // What the policy has done, beyond DeviceStats.
  struct Counters {
    uint64_t page_maps = 0;      // device map() calls (one page each)
    uint64_t page_unmaps = 0;    // device unmap() calls (one page each)
    uint64_t reclaims = 0;       // times cached pages were unmapped to make room for a request
    uint64_t ranges_reserved = 0;
    uint64_t placements_on_cached = 0;  // allocations served with no new page mapped
  };
  Counters counters() const;
  // counters() by name: page_maps, page_unmaps, reclaims, ranges_reserved,
  // placements_on_cached.
  std::vector<std::pair<const char*, uint64_t>> policy_counters() const override;
  // Ranges held now and the virtual bytes they span.
  size_t ranges() const;

 private:
  struct Range;
  struct SBlock {
    uintptr_t addr = 0;
    size_t size = 0;
    size_t requested = 0;
    Stream stream = 0;
    bool is_small = false;
    bool allocated = false;
    SBlock* prev = nullptr;
    SBlock* next = nullptr;
    Range* range = nullptr;
  };
  // Free blocks: by stream, class, size, address (best fit first).
  struct BySize {
    bool operator()(const SBlock* a, const SBlock* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->is_small != b->is_small) return a->is_small < b->is_small;
      if (a->size != b->size) return a->size < b->size;
      return a->addr < b->addr;
    }
  };
  using FreeSet = std::set<SBlock*, BySize, PoolAllocator<SBlock*>>;
  struct Range {
    std::unique_ptr<StitchRange> pages;
    SBlock* head = nullptr;  // blocks tile the range, head to tail
    SBlock* tail = nullptr;
  };
  // Where a request would go and what it costs.
  struct Placement {
    SBlock* block = nullptr;   // the free block it goes in
    uintptr_t addr = 0;
    size_t new_pages = 0;      // pages that hold no live byte yet
    size_t maps = 0;           // pages to map
  };

  void on_reset_accumulated() override { counters_ = Counters{}; }
  void* allocate_locked(size_t size, Stream stream, uint64_t context);  // nullptr: out of memory, nothing counted
  Placement place(size_t size, Stream stream, bool is_small);
  void consider(Placement& best, SBlock* block, size_t size) const;
  Range* add_range(Stream stream, bool is_small, size_t size);
  bool map_placement(const Placement& p, size_t size, Stream stream);
  size_t reclaim(size_t pages, const StitchRange* keep, size_t keep_begin, size_t keep_end);
  void record_unmapped_runs(StitchRange& range, std::vector<size_t>& pages);
  void unmap_all_cached();
  void release_empty_ranges();
  SBlock* carve(const Placement& p, size_t size);
  void free_block(SBlock* block);
  SBlock* merge(SBlock* left, SBlock* right);
  void account_mapped(const StitchRange& range, int64_t pages);
  size_t largest_free_block_locked() const;
  std::vector<SegmentInfo> segments_locked() const;
  [[noreturn]] void throw_oom(size_t requested, size_t rounded, Stream stream);

  SBlock* make_block();
  void destroy_block(SBlock* block);

  const size_t page_size_;
  NodePool nodes_;
  FreeSet free_{BySize{}, PoolAllocator<SBlock*>(&nodes_)};
  using LiveMap = std::unordered_map<uintptr_t, SBlock*, std::hash<uintptr_t>, std::equal_to<uintptr_t>,
                                     PoolAllocator<std::pair<const uintptr_t, SBlock*>>>;
  LiveMap live_{64, std::hash<uintptr_t>{}, std::equal_to<uintptr_t>{},
                PoolAllocator<std::pair<const uintptr_t, SBlock*>>(&nodes_)};
  std::vector<std::unique_ptr<Range>> ranges_;  // in the order they were reserved
  Counters counters_;
  size_t mapped_bytes_ = 0;
};

}  // namespace torchmem
