// The native policy's views of itself: segments for snapshots, the largest
// free block, the out-of-memory report and the invariants. Off the hot path.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/policy/native/caching_allocator.h"

namespace torchmem {

size_t CachingAllocator::largest_free_block_locked() const {
  size_t largest = 0;
  for (const BlockPool* pool : {&large_blocks_, &small_blocks_}) {
    for (const Block* b : pool->blocks) largest = std::max(largest, b->size);
  }
  return largest;
}

size_t CachingAllocator::largest_free_block() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return largest_free_block_locked();
}

void CachingAllocator::throw_oom(const Request& r) {
  ++stats_.num_ooms;
  const size_t device_free = device_.free_bytes();
  // PyTorch's malloc records the rounded size in the trace and reports the
  // segment it tried to get (alloc_size) in the message and to observers. A
  // request over kMaxRequest fails before either is worked out.
  history_.record(Action::kOom, device_free, r.size ? r.size : r.requested, r.stream);
  OomInfo info;
  info.requested = r.requested;
  info.alloc_size = r.alloc_size ? r.alloc_size : r.requested;
  const DeviceStats now = stats_.with_pool_sums();
  info.allocated = static_cast<size_t>(now.allocated_bytes[kAggregate].current);
  info.reserved = static_cast<size_t>(now.reserved_bytes[kAggregate].current);
  info.largest_free = largest_free_block_locked();
  info.device_total = device_.total_bytes();
  info.device_free = device_free;
  info.allowed = fraction_set_ ? limit_bytes() : info.device_total;
  throw OutOfMemory(oom_message_head(device_.name(), info, fraction_set_) + "; the largest free block is " +
                        format_size(info.largest_free) +
                        ". If reserved but unallocated memory is large try setting "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (TORCHMEM_ALLOC_CONF for torchmem) to "
                        "avoid fragmentation.",
                    info);
}

std::vector<SegmentInfo> CachingAllocator::segments() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return segments_locked();
}

std::vector<SegmentInfo> CachingAllocator::segments_locked() const {
  // A segment starts at a mapped block with no mapped block before it: for
  // expandable segments, each mapped run of the range is one segment.
  auto is_head = [](const Block* b) { return b->mapped && (!b->prev || !b->prev->mapped); };
  std::vector<const Block*> heads;
  for (const BlockPool* pool : {&large_blocks_, &small_blocks_}) {
    for (const Block* b : pool->blocks) {
      if (is_head(b)) heads.push_back(b);
    }
  }
  live_blocks_.for_each([&](const Block* b) {
    if (is_head(b)) heads.push_back(b);
  });
  std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) { return a->addr < b->addr; });
  std::vector<SegmentInfo> out;
  out.reserve(heads.size());
  for (const Block* head : heads) {
    SegmentInfo seg;
    seg.addr = head->addr;
    seg.stream = head->stream;
    seg.is_small = head->pool->is_small;
    seg.is_expandable = head->expandable != nullptr;
    for (const Block* b = head; b && b->mapped; b = b->next) {
      seg.total_size += b->size;
      const bool live = b->allocated && !b->free_requested;
      if (live) seg.allocated_size += b->size;
      if (b->allocated) seg.requested_size += b->requested_size;  // active blocks, as PyTorch
      seg.blocks.push_back(BlockInfo{b->addr, b->size, b->requested_size, live, b->mapped, b->allocated});
    }
    out.push_back(std::move(seg));
  }
  return out;
}

void CachingAllocator::check_invariants() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error("caching allocator invariant broken: " + what); };
  DeviceStats expect;
  size_t free_blocks_seen = 0;
  size_t live_blocks_seen = 0;
  uintptr_t previous_end = 0;
  for (const SegmentInfo& seg : segments_locked()) {
    if (seg.addr < previous_end) fail("segment at " + hex_address(seg.addr) + " overlaps the previous one");
    previous_end = seg.addr + seg.total_size;
    const size_t pool_stat = seg.is_small ? kSmallPool : kLargePool;
    for (size_t t : {size_t(kAggregate), pool_stat}) {
      if (!seg.is_expandable) expect.segment[t].current += 1;  // mapped pages are not segments
      expect.reserved_bytes[t].current += static_cast<int64_t>(seg.total_size);
    }
    uintptr_t cursor = seg.addr;
    bool previous_free = false;
    for (const BlockInfo& b : seg.blocks) {
      if (b.addr != cursor) fail("blocks of segment " + hex_address(seg.addr) + " do not tile it at " + hex_address(b.addr));
      cursor += b.size;
      if (b.size == 0 || b.size % config_.min_block_size != 0) fail("block at " + hex_address(b.addr) + " has size " + std::to_string(b.size));
      const bool is_free = !b.active;
      if (is_free && previous_free) fail("two neighbouring free blocks at " + hex_address(b.addr));
      if (b.allocated && !b.active) fail("block at " + hex_address(b.addr) + " is allocated but not active");
      previous_free = is_free;
      for (size_t t : {size_t(kAggregate), pool_stat}) {
        if (b.active) {
          expect.active[t].current += 1;
          expect.active_bytes[t].current += static_cast<int64_t>(b.size);
          expect.requested_bytes[t].current += static_cast<int64_t>(b.requested_size);
        }
        if (b.allocated) {
          expect.allocation[t].current += 1;
          expect.allocated_bytes[t].current += static_cast<int64_t>(b.size);
        } else if (!b.active && seg.blocks.size() > 1 && !seg.is_expandable) {
          expect.inactive_split[t].current += 1;
          expect.inactive_split_bytes[t].current += static_cast<int64_t>(b.size);
        }
      }
      (b.active ? live_blocks_seen : free_blocks_seen) += 1;
    }
  }
  if (live_blocks_seen != live_blocks_.size()) fail("live block map out of step with the segments");
  if (free_blocks_seen != large_blocks_.blocks.size() + small_blocks_.blocks.size()) fail("pools out of step with the segments");
  size_t mapped_expandable = 0;
  for (const auto& es : expandable_segments_) mapped_expandable += es->mapped_bytes();
  size_t expandable_reserved = 0;
  for (const BlockPool* pool : {&large_blocks_, &small_blocks_}) {
    for (const PoolEntry& entry : pool->blocks) {
      const Block* b = entry.block;
      if (b->allocated || b->pool != pool || !b->mapped) fail("pool holds a block that is allocated, unmapped or belongs elsewhere");
      if (b->pool_pos->block != b || !(entry.key == key_of(b))) fail("block at " + hex_address(b->addr) + " has a stale pool entry");
      if (b->expandable) expandable_reserved += b->size;
    }
    for (const Block* b : pool->unmapped) {
      if (b->allocated || b->mapped || !b->expandable) fail("unmapped set holds a mapped or allocated block");
      if (b->next && !b->next->mapped && !b->next->allocated) fail("two neighbouring unmapped blocks at " + hex_address(b->addr));
    }
  }
  live_blocks_.for_each([&](const Block* b) {
    if (b->expandable) expandable_reserved += b->size;
  });
  if (expandable_reserved != mapped_expandable) {
    fail("mapped pages (" + std::to_string(mapped_expandable) + " bytes) differ from the blocks in them (" +
         std::to_string(expandable_reserved) + ")");
  }
  const std::string stats_differ = stats_.current_difference(expect);
  if (!stats_differ.empty()) fail(stats_differ);
  if (static_cast<int64_t>(own_reserved_) != expect.reserved_bytes[kAggregate].current) fail("total reserved out of step");
}

}  // namespace torchmem
