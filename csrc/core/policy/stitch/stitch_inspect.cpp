// The stitch policy's views of itself: segments for snapshots, the largest
// free run, and the invariants. Off the hot path.
#include <algorithm>
#include <string>

#include "core/policy/stitch/stitch_allocator.h"

namespace torchmem {

std::vector<SegmentInfo> StitchAllocator::segments() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return segments_locked();
}

std::vector<SegmentInfo> StitchAllocator::segments_locked() const {
  std::vector<const Range*> order;
  for (const auto& range : ranges_) order.push_back(range.get());
  std::sort(order.begin(), order.end(), [](const Range* a, const Range* b) { return a->pages->base() < b->pages->base(); });
  std::vector<SegmentInfo> out;
  for (const Range* range : order) {
    const StitchRange& r = *range->pages;
    const SBlock* b = range->head;
    for (size_t i = r.next_mapped(0); i < r.pages(); i = r.next_mapped(i)) {
      size_t j = i;
      while (j < r.pages() && r.mapped(j)) ++j;
      const uintptr_t begin = r.page_addr(i);
      const uintptr_t end = r.page_addr(j);
      while (b && b->addr + b->size <= begin) b = b->next;
      SegmentInfo seg;
      seg.addr = begin;
      seg.total_size = end - begin;
      seg.stream = r.stream();
      seg.is_small = r.is_small();
      seg.is_expandable = true;
      for (const SBlock* c = b; c && c->addr < end; c = c->next) {
        const uintptr_t lo = std::max(c->addr, begin);
        const uintptr_t hi = std::min(c->addr + c->size, end);
        seg.blocks.push_back(BlockInfo{lo, hi - lo, c->allocated ? c->requested : 0, c->allocated, true});
        if (c->allocated) {
          seg.allocated_size += c->size;
          seg.requested_size += c->requested;
        }
      }
      out.push_back(std::move(seg));
      i = j;
    }
  }
  return out;
}

size_t StitchAllocator::largest_free_block() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return largest_free_block_locked();
}

size_t StitchAllocator::largest_free_block_locked() const {
  size_t largest = 0;
  for (const SBlock* b : free_) {
    const StitchRange& r = *b->range->pages;
    const size_t end = r.end_page(b->addr, b->size);
    for (size_t i = r.next_mapped(r.first_page(b->addr)); i < end; i = r.next_mapped(i)) {
      size_t j = i;
      while (j < end && r.mapped(j)) ++j;
      const uintptr_t lo = std::max(b->addr, r.page_addr(i));
      const uintptr_t hi = std::min(b->addr + b->size, r.page_addr(j));
      largest = std::max(largest, static_cast<size_t>(hi - lo));
      i = j;
    }
  }
  return largest;
}

void StitchAllocator::check_invariants() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error("stitch allocator invariant broken: " + what); };
  DeviceStats expect;
  size_t free_seen = 0;
  size_t live_seen = 0;
  size_t mapped = 0;
  for (const auto& range : ranges_) {
    const StitchRange& r = *range->pages;
    r.check();
    std::vector<uint32_t> live(r.pages(), 0);
    uintptr_t cursor = r.base();
    size_t live_blocks = 0;
    const SBlock* last = nullptr;
    for (const SBlock* b = range->head; b; last = b, b = b->next) {
      if (b->range != range.get() || b->prev != last) fail("block links of the range at " + hex_address(r.base()) + " are broken at " + hex_address(b->addr));
      if (b->addr != cursor) fail("blocks do not tile the range at " + hex_address(r.base()) + " at " + hex_address(b->addr));
      if (b->size == 0 || b->size % kMinBlockSize != 0) fail("block at " + hex_address(b->addr) + " has size " + std::to_string(b->size));
      if (b->stream != r.stream() || b->is_small != r.is_small()) fail("block at " + hex_address(b->addr) + " has another stream or class than its range");
      if (!b->allocated && last && !last->allocated) fail("two neighbouring free blocks at " + hex_address(b->addr));
      cursor += b->size;
      if (b->allocated) {
        ++live_blocks;
        ++live_seen;
        auto it = live_.find(b->addr);
        if (it == live_.end() || it->second != b) fail("allocated block at " + hex_address(b->addr) + " is not in the live map");
        if (b->requested == 0 || b->requested > b->size) fail("allocated block at " + hex_address(b->addr) + " has requested size " + std::to_string(b->requested));
        for (size_t i = r.first_page(b->addr); i < r.end_page(b->addr, b->size); ++i) {
          const uintptr_t lo = std::max(b->addr, r.page_addr(i));
          const uintptr_t hi = std::min(b->addr + b->size, r.page_addr(i) + r.page_size());
          live[i] += static_cast<uint32_t>(hi - lo);
        }
        for (size_t t : {size_t(kAggregate), size_t(b->is_small ? kSmallPool : kLargePool)}) {
          expect.allocation[t].current += 1;
          expect.allocated_bytes[t].current += static_cast<int64_t>(b->size);
          expect.requested_bytes[t].current += static_cast<int64_t>(b->requested);
        }
      } else {
        ++free_seen;
        auto it = free_.find(const_cast<SBlock*>(b));
        if (it == free_.end() || *it != b) fail("free block at " + hex_address(b->addr) + " is not in the free index");
      }
    }
    if (cursor != r.end() || range->tail != last) fail("blocks do not reach the end of the range at " + hex_address(r.base()));
    if (live_blocks != r.live_blocks) fail("the live block count of the range at " + hex_address(r.base()) + " is out of step");
    for (size_t i = 0; i < r.pages(); ++i) {
      if (live[i] != r.live(i)) fail("page " + hex_address(r.page_addr(i)) + " counts " + std::to_string(r.live(i)) + " live bytes, its blocks hold " + std::to_string(live[i]));
    }
    mapped += r.mapped_pages();
    for (size_t t : {size_t(kAggregate), size_t(r.is_small() ? kSmallPool : kLargePool)}) {
      expect.reserved_bytes[t].current += static_cast<int64_t>(r.mapped_pages() * page_size_);
    }
  }
  if (live_seen != live_.size()) fail("live block map out of step with the ranges");
  if (free_seen != free_.size()) fail("free index out of step with the ranges");
  if (mapped * page_size_ != mapped_bytes_) fail("mapped bytes out of step with the pages");
  expect.active = expect.allocation;
  expect.active_bytes = expect.allocated_bytes;
  const std::string stats_differ = stats_.current_difference(expect);
  if (!stats_differ.empty()) fail(stats_differ);
}

}  // namespace torchmem
