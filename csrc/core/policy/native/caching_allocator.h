// CachingAllocator: PyTorch's native CUDA caching allocator policy, on any
// Device. See Note [Caching policy] in caching_allocator.cpp for the rules.
//
// Thread safety: every public method takes one internal mutex, a
// ForkSafeMutex (rank kAllocator): a forked child finds it free and the
// allocator consistent (Note [Fork safety] in fork_safety.h).
// Ownership: the allocator owns every segment it took from the device and
// gives them back in empty_cache() and in its destructor (live allocations
// included: destroying an allocator with live blocks invalidates them).
// Pointers returned by allocate() are aligned to config().min_block_size
// bytes (512 in the native policy; at least 64).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/allocator.h"
#include "core/base/device_allocator.h"
#include "core/base/history.h"
#include "core/base/live_block_map.h"
#include "core/base/node_pool.h"
#include "core/base/out_of_memory.h"
#include "core/base/stats.h"
#include "core/devices/device.h"
#include "core/policy/native/block.h"
#include "core/policy/native/expandable_segment.h"
#include "core/policy/policy_base.h"
#include "core/replay/recorded_state.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class CachingAllocator final : public PolicyBase, public RecordedSegments {
 public:
  // Throws std::invalid_argument for a config whose policy is not native
  // (make_device_allocator() makes the others).
  explicit CachingAllocator(Device& device, AllocatorConfig config = {});
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Allocator interface. allocate() throws OutOfMemory after releasing cached
  // blocks and retrying once; deallocate() throws std::invalid_argument for a
  // pointer that is not a live allocation (double free, foreign pointer).
  void* allocate(size_t size, Stream stream = 0) override;
  void* try_allocate(size_t size, Stream stream = 0) override;
  void* allocate_cached(size_t size, Stream stream = 0) override;
  [[noreturn]] void throw_out_of_memory(size_t size, Stream stream) override;
  void deallocate(void* ptr) override;
  bool owns(const void* ptr) const override;
  bool has_live_allocations() const override;

  // Like deallocate(), but returns false for a pointer this allocator does
  // not own instead of throwing (used by deleters that hand foreign pointers on).
  bool try_deallocate(void* ptr) override;
  // Two-step free (device_allocator.h): the block stays active, uncached.
  bool request_free(void* ptr) override;
  void complete_free(void* ptr) override;
  bool allocation_stream(const void* ptr, Stream* stream) const override;
  void set_pending_free_waiter(PendingFreeWaiter waiter) override;

  // Returns every cached, unsplit segment (and unmapped expandable pages) to
  // the device.
  void empty_cache() override;

  // add_free_memory_callback, set_memory_fraction, set_releases_blocked,
  // stats, reset_*_stats, history, config and device: PolicyBase's
  // (policy_base.h). Callbacks run on a miss before a new segment is
  // allocated; a fraction below 1 also enables the garbage collection
  // threshold.
  size_t largest_free_block() const override;

  // Segments and blocks as they stand (address order), for snapshots.
  std::vector<SegmentInfo> segments() const override;
  // Throws std::logic_error describing the first broken invariant:
  // blocks tile each segment exactly; no two neighbouring blocks are both
  // free; pools hold exactly the free blocks; stats equal a recomputation;
  // no two live blocks overlap.
  void check_invariants() const override;

  // RecordedSegments (replay/recorded_state.h): what a replay needs, in
  // caching_replay.cpp.
  //
  // Releases the cached segment that begins at `addr` (a free, unsplit
  // segment), or unmaps the wholly free pages of the free block of an
  // expandable segment that holds `addr`, as empty_cache() would. Returns
  // false and changes nothing when no such free memory is there. Used by
  // replays to make a recording's own segment_free / segment_unmap.
  bool release_cached_segment(uintptr_t addr) override;
  void* allocate_after_release(size_t size, Stream stream) override;

  // Rebuilds a segment that existed before a recorded run began: live
  // blocks as given (sizes inferred where 0), free blocks in the gaps,
  // statistics as if the blocks had been allocated here. The caller has
  // already taken [addr, addr + size) from the device (SimDevice::adopt);
  // the allocator frees it like any other segment. Throws
  // std::invalid_argument naming the block when blocks overlap, leave the
  // segment, or are unaligned; the allocator is unchanged then.
  void restore_segment(const RecordedSegment& segment) override;
  // The same for an expandable segment: reserves its range at `base` (the
  // device must give that address: SimDevice::offer), maps the recorded
  // pages, tiles them with the live blocks and free blocks, and leaves the
  // rest of the range unmapped. Sizes inferred where 0 (expandable blocks
  // split whenever 512 B remain). Throws std::invalid_argument naming the
  // problem (address taken, capacity, pages off the grid, blocks outside the
  // mapped pages or overlapping); the allocator is unchanged then.
  void restore_expandable(const RecordedRange& range) override;
  RecordedSegments* recorded_segments() override { return this; }
  uint64_t start_age_guesses() const override { return start_age_guesses_; }

 private:
  // One allocation request as it goes through the policy.
  struct Request {
    size_t requested;   // bytes asked for
    size_t size;        // rounded
    size_t alloc_size;  // segment size if a new segment is needed
    Stream stream;
    BlockPool* pool;
    Block* block = nullptr;
    bool pooled = false;  // the block found is still in pool->blocks (find_free_block)
  };

  // Where a request looks for memory: a cached block only; the cache, then
  // a new segment and the releases and retries of a miss (allocate()); or
  // the miss alone, for a search the replay made ahead (allocate_after_release).
  enum class Search { kCachedOnly, kAll, kAfterRelease };

  Request make_request(size_t size, Stream stream);
  // The one allocation path; `throws`: throw_oom() where it would return nullptr.
  void* allocate_with(size_t size, Stream stream, Search search, bool throws);
  Block* allocate_locked(Request& r);  // nullptr: out of memory (nothing counted)
  Block* allocate_on_miss(Request& r);  // allocate_locked() when no cached block fits
  void* hand_out(Request& r, Block* block, uint64_t context);
  bool free_locked(void* ptr);  // try_deallocate() under the lock
  void request_free_locked(Block* block);
  void complete_free_locked(Block* block);  // block already taken from live_blocks_
  Block* find_free_block(Request& r);
  void note_start_age_guess(const BlockPool& pool, BlockSet::const_iterator chosen);
  bool allocate_segment(Request& r, bool is_retry);
  Block* allocate_expandable(Request& r);
  Block* find_expandable_space(const Request& r);
  bool map_block(Block* block, size_t size);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);
  bool release_available_cached_blocks(const Request& r);
  void release_cached_blocks();
  void release_pool(BlockPool& pool);
  void release_block(Block* block);
  void garbage_collect_cached_blocks();
  Block* take_block(Request& r, Block* block);
  void free_block(Block* block);
  size_t merge(Block* dst, Block* src, BlockPool& pool);
  bool should_split(const Block* block, size_t size) const;
  BlockPool& pool_for(size_t size) { return size <= kSmallSize ? small_blocks_ : large_blocks_; }
  size_t round_size(size_t size) const {
    const size_t granule = config_.min_block_size;  // a power of two
    if (size < granule) return granule;
    if (rounds_power2_divisions_) return round_request(size, config_);
    return (size + granule - 1) & ~(granule - 1);
  }
  [[noreturn]] void throw_oom(const Request& r);
  size_t largest_free_block_locked() const;
  std::vector<SegmentInfo> segments_locked() const;

  Block* make_block() { return new (nodes_.take()) Block(); }
  void destroy_block(Block* block) {
    block->~Block();
    nodes_.give(block);
  }
  void adopt_live_block(Block* block);

  const bool rounds_power2_divisions_;  // some interval of roundup_power2_divisions is over 1
  NodePool nodes_;  // blocks and container nodes; outlives the containers below
  BlockPool large_blocks_{false, &nodes_, config_.reuse_order};
  BlockPool small_blocks_{true, &nodes_, config_.reuse_order};
  LiveBlockMap live_blocks_;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;
  PendingFreeWaiter pending_free_waiter_;
  uint64_t start_age_guesses_ = 0;  // RecordedSegments::start_age_guesses
};

}  // namespace torchmem
