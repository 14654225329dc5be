// The caching allocator's side of expandable segments: finding room in a
// reserved range, mapping pages under free blocks and unmapping wholly free
// pages. See Note [Expandable segments] in expandable_segment.h.
#include <algorithm>

#include "core/policy/native/caching_allocator.h"

namespace torchmem {

namespace {

void copy_identity(Block* b, const Block& like, uintptr_t addr, size_t size, bool mapped) {
  b->addr = addr;
  b->size = size;
  b->stream = like.stream;
  b->pool = like.pool;
  b->expandable = like.expandable;
  b->mapped = mapped;
}

// Links `b` between `prev` and `next` (either may be null).
void link_between(Block* b, Block* prev, Block* next) {
  b->prev = prev;
  b->next = next;
  if (prev) prev->next = b;
  if (next) next->prev = b;
}

}  // namespace

// A free block from which enough free or unmapped address space follows to
// hold r.size, in an existing range of this pool and stream, or else the
// whole (unmapped) range of a new expandable segment.
Block* CachingAllocator::find_expandable_space(const Request& r) {
  BlockPool& pool = *r.pool;
  auto allocatable = [&](const Block* b) { return b && b->expandable && !b->allocated && b->stream == r.stream; };
  auto has_room = [&](const Block* b) {
    size_t bytes = 0;
    for (; bytes < r.size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= r.size;
  };
  Block key;
  key.stream = r.stream;
  for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == r.stream; ++it) {
    Block* candidate = allocatable((*it)->prev) ? (*it)->prev : *it;
    if (has_room(candidate)) return candidate;
  }
  const size_t page = pool.is_small ? kSmallBuffer : config_.large_segment_size;
  const size_t max_pages = expandable_pages(device_.total_bytes(), page);
  try {
    expandable_segments_.push_back(std::make_unique<ExpandableSegment>(device_, r.stream, page, max_pages));
  } catch (const std::runtime_error&) {
    return nullptr;
  }
  ExpandableSegment* segment = expandable_segments_.back().get();
  Block* range = make_block();
  range->addr = segment->base();
  range->size = segment->size();
  range->stream = r.stream;
  range->pool = &pool;
  range->mapped = false;
  range->expandable = segment;
  pool.unmapped.insert(range);
  return range;
}

Block* CachingAllocator::allocate_expandable(Request& r) {
  Block* candidate = find_expandable_space(r);
  if (!candidate) return nullptr;
  // candidate is unmapped, or free and followed by unmapped space.
  if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, r.size))) return nullptr;
  while (candidate->size < r.size) {
    Block* next = candidate->next;  // unmapped: mapping it merges candidate into it
    if (!map_block(next, std::min(r.size - candidate->size, next->size))) return nullptr;
    candidate = next;
  }
  r.pool->erase(candidate);
  return candidate;
}

// Maps the pages under the first `size` bytes of an unmapped block; the
// mapped part joins its free neighbours in the pool.
bool CachingAllocator::map_block(Block* block, size_t size) {
  const SegmentRange mapped = block->expandable->map(block->addr, size);
  if (mapped.size == 0) return false;
  BlockPool& pool = *block->pool;
  pool.unmapped.erase(block);
  block->mapped = true;
  if (mapped.size < block->size) {
    Block* rest = make_block();
    copy_identity(rest, *block, block->addr + mapped.size, block->size - mapped.size, false);
    link_between(rest, block, block->next);
    pool.unmapped.insert(rest);
    block->size = mapped.size;
  }
  merge(block, block->prev, pool);
  merge(block, block->next, pool);
  pool.insert(block);
  reserve(mapped.size);
  increase_pool(stats_.reserved_bytes, pool.is_small, static_cast<int64_t>(mapped.size));
  ++stats_.num_device_alloc;
  history_.record(Action::kSegmentMap, mapped.addr, mapped.size, block->stream);
  return true;
}

// Unmaps the pages lying wholly inside a free block; the partial pages at
// either end stay mapped as free blocks.
void CachingAllocator::unmap_block(Block* block) {
  const SegmentRange unmapped = block->expandable->unmap(block->addr, block->size);
  if (unmapped.size == 0) return;
  BlockPool& pool = *block->pool;
  pool.erase(block);
  const size_t before = unmapped.addr - block->addr;
  const size_t after = block->size - before - unmapped.size;
  if (before > 0) {
    Block* head = make_block();
    copy_identity(head, *block, block->addr, before, true);
    link_between(head, block->prev, block);
    pool.insert(head);
  }
  if (after > 0) {
    Block* tail = make_block();
    copy_identity(tail, *block, unmapped.addr + unmapped.size, after, true);
    link_between(tail, block, block->next);
    pool.insert(tail);
  }
  block->addr = unmapped.addr;
  block->size = unmapped.size;
  block->mapped = false;
  merge(block, block->prev, pool);
  merge(block, block->next, pool);
  pool.unmapped.insert(block);
  unreserve(unmapped.size);
  decrease_pool(stats_.reserved_bytes, pool.is_small, static_cast<int64_t>(unmapped.size));
  ++stats_.num_device_free;
  history_.record(Action::kSegmentUnmap, unmapped.addr, unmapped.size, block->stream);
}

// Gives a wholly unmapped range back to the device.
void CachingAllocator::release_expandable_segment(Block* block) {
  if (block->mapped || block->prev || block->next) return;
  ExpandableSegment* segment = block->expandable;
  block->pool->unmapped.erase(block);
  destroy_block(block);
  auto it = std::find_if(expandable_segments_.begin(), expandable_segments_.end(),
                         [&](const std::unique_ptr<ExpandableSegment>& s) { return s.get() == segment; });
  expandable_segments_.erase(it);
}

}  // namespace torchmem
