// The native policy's replay support: CachingAllocator's RecordedSegments
// (replay/recorded_state.h), the segments of a recording's start rebuilt and
// a recording's own releases made. allocate_after_release() is one mode of
// the allocation path (caching_allocator.cpp, allocate_with).
//
// Note [Start state]
// Most snapshots recorded on a GPU begin mid-run: the model, the optimizer
// and a warm-up step were in memory before recording began. A replay starts
// from that state: the segments that existed then, the blocks live in them,
// and every other byte of them cached as free blocks. A snapshot gives the
// place of each such segment and block; it gives a block's size only when
// the block is still live at the end. Otherwise the size comes from the
// policy: the request rounded as the allocator rounds it, plus the tail the
// allocator could not split off (a large-pool remainder of 1 MiB or less;
// for a block of max_split_size or more, which is never split, a remainder
// under max_non_split_rounding).
//
// Note [Start segments' ages]
// Under reuse_order segment (PyTorch's order from torch 2.14), a tie between
// equal free blocks goes to the older segment. A segment restored here takes
// rank 0, older than any made later, which is true; but among restored
// segments the snapshot does not say which is older, and their equal blocks
// tie by address instead. Each allocation that such a tie decided counts in
// start_age_guesses(), so a replay can say where it guessed.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/policy/native/caching_allocator.h"
#include "core/policy/native/expandable_segment.h"

namespace torchmem {

namespace {

std::string where(uintptr_t addr) { return "block at " + hex_address(addr); }

const Block* segment_head(const Block* b) {
  while (b->prev) b = b->prev;
  return b;
}

}  // namespace

// A block live when recording began: in the live map and the statistics, as
// take_block() would have put it.
void CachingAllocator::adopt_live_block(Block* b) {
  live_blocks_.insert(b->addr, b);
  increase_pool(stats_.allocation, b->pool->is_small, 1);
  increase_pool(stats_.allocated_bytes, b->pool->is_small, static_cast<int64_t>(b->size));
  increase_pool(stats_.active, b->pool->is_small, 1);
  increase_pool(stats_.active_bytes, b->pool->is_small, static_cast<int64_t>(b->size));
  increase_pool(stats_.requested_bytes, b->pool->is_small, static_cast<int64_t>(b->requested_size));
  if (b->size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
}

// `chosen`, of rank 0, is the first of its stream and size in the pool's
// order; an equal block of rank 0 after it, in another segment, ties with it.
void CachingAllocator::note_start_age_guess(const BlockPool& pool, BlockSet::const_iterator chosen) {
  const Block* head = segment_head(*chosen);
  for (auto next = std::next(chosen); next != pool.blocks.end(); ++next) {
    const BlockKey& key = next->key;
    if (key.stream != (*chosen)->stream || key.size != (*chosen)->size || key.reuse_rank != 0) return;
    if (!(*next)->expandable && segment_head(*next) != head) {
      ++start_age_guesses_;
      return;
    }
  }
}

void CachingAllocator::restore_segment(const RecordedSegment& seg) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (seg.size == 0 || seg.size % kMinBlockSize != 0 || seg.addr % kMinBlockSize != 0) {
    throw std::invalid_argument("segment at " + hex_address(seg.addr) + ": size " + std::to_string(seg.size) +
                                " or address is not a multiple of 512 bytes");
  }
  const uintptr_t end = seg.addr + seg.size;
  // Sizes first, so that a bad block leaves the allocator unchanged.
  std::vector<RecordedBlock> blocks = seg.live_blocks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    RecordedBlock& b = blocks[i];
    const uintptr_t limit = i + 1 < blocks.size() ? blocks[i + 1].addr : end;
    if (b.addr < seg.addr || b.addr >= limit || b.addr % kMinBlockSize != 0 || (i > 0 && b.addr < blocks[i - 1].addr + blocks[i - 1].size)) {
      throw std::invalid_argument(where(b.addr) + " lies outside its segment, overlaps the block before it, or is unaligned");
    }
    const size_t space = limit - b.addr;
    if (b.size == 0) {
      b.size = round_size(std::max<size_t>(b.requested_size, 1));
      const size_t tail = space >= b.size ? space - b.size : 0;
      const bool unsplittable = b.size >= config_.max_split_size ? tail < config_.max_non_split_rounding : tail <= kSmallSize;
      if (!seg.is_small && unsplittable) b.size = space;
    }
    if (b.size > space || b.size % kMinBlockSize != 0) {
      throw std::invalid_argument(where(b.addr) + " (" + std::to_string(b.size) + " bytes) does not fit before " +
                                  (i + 1 < blocks.size() ? where(limit) : std::string("the end of its segment")));
    }
  }
  BlockPool& pool = seg.is_small ? small_blocks_ : large_blocks_;
  std::vector<Block*> tiles;
  auto add = [&](uintptr_t addr, size_t size, size_t requested, bool allocated) {
    Block* b = make_block();
    b->addr = addr;
    b->size = size;
    b->stream = seg.stream;
    b->pool = &pool;
    b->allocated = allocated;
    b->requested_size = requested;
    if (!tiles.empty()) {
      b->prev = tiles.back();
      tiles.back()->next = b;
    }
    tiles.push_back(b);
  };
  uintptr_t cursor = seg.addr;
  for (const RecordedBlock& b : blocks) {
    if (b.addr > cursor) add(cursor, b.addr - cursor, 0, false);
    add(b.addr, b.size, b.requested_size, true);
    cursor = b.addr + b.size;
  }
  if (cursor < end) add(cursor, end - cursor, 0, false);

  reserve(seg.size);
  increase_pool(stats_.segment, seg.is_small, 1);
  increase_pool(stats_.reserved_bytes, seg.is_small, static_cast<int64_t>(seg.size));
  if (seg.size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  const bool split = tiles.size() > 1;
  for (Block* b : tiles) {
    if (b->allocated) {
      adopt_live_block(b);
    } else {
      pool.insert(b);
      if (split) {
        increase_pool(stats_.inactive_split, seg.is_small, 1);
        increase_pool(stats_.inactive_split_bytes, seg.is_small, static_cast<int64_t>(b->size));
      }
    }
  }
}

void CachingAllocator::restore_expandable(const RecordedRange& range) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const size_t page = range.is_small ? kSmallBuffer : config_.large_segment_size;
  const size_t max_pages = expandable_pages(device_.total_bytes(), page);
  const uintptr_t end = range.base + page * max_pages;
  for (size_t i = 0; i < range.mapped.size(); ++i) {
    const SegmentRange& run = range.mapped[i];
    if (run.addr < range.base || (run.addr - range.base) % page != 0 || run.size == 0 || run.size % page != 0 ||
        run.addr + run.size > end || (i > 0 && run.addr < range.mapped[i - 1].addr + range.mapped[i - 1].size)) {
      throw std::invalid_argument("expandable range at " + hex_address(range.base) + ": mapped pages at " +
                                  hex_address(run.addr) + " are off its page grid, overlap, or pass its end");
    }
  }
  // Live blocks with their sizes, each inside one mapped run.
  std::vector<RecordedBlock> blocks = range.live_blocks;
  size_t run = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    RecordedBlock& b = blocks[i];
    if (b.size == 0) b.size = round_size(std::max<size_t>(b.requested_size, 1));
    while (run < range.mapped.size() && range.mapped[run].addr + range.mapped[run].size <= b.addr) ++run;
    const bool inside = run < range.mapped.size() && b.addr >= range.mapped[run].addr &&
                        b.addr + b.size <= range.mapped[run].addr + range.mapped[run].size;
    if (!inside || b.addr % kMinBlockSize != 0 || (i > 0 && b.addr < blocks[i - 1].addr + blocks[i - 1].size)) {
      throw std::invalid_argument(where(b.addr) + " lies outside the mapped pages of its expandable range, "
                                  "overlaps the block before it, or is unaligned");
    }
  }
  auto segment = std::make_unique<ExpandableSegment>(device_, range.stream, page, max_pages);
  if (segment->base() != range.base) {
    throw std::invalid_argument("expandable range at " + hex_address(range.base) +
                                ": that address range is taken (another segment overlaps it)");
  }
  size_t mapped_bytes = 0;
  for (const SegmentRange& r : range.mapped) {
    if (segment->map(r.addr, r.size).size == 0) {
      throw std::invalid_argument("expandable range at " + hex_address(range.base) +
                                  ": its mapped pages do not fit in the capacity");
    }
    mapped_bytes += r.size;
  }
  BlockPool& pool = range.is_small ? small_blocks_ : large_blocks_;
  Block* last = nullptr;
  auto add = [&](uintptr_t addr, size_t size, size_t requested, bool allocated, bool mapped) {
    Block* b = make_block();
    b->addr = addr;
    b->size = size;
    b->stream = range.stream;
    b->pool = &pool;
    b->allocated = allocated;
    b->mapped = mapped;
    b->requested_size = requested;
    b->expandable = segment.get();
    b->prev = last;
    if (last) last->next = b;
    last = b;
    if (allocated) {
      adopt_live_block(b);
    } else if (mapped) {
      pool.insert(b);
    } else {
      pool.unmapped.insert(b);
    }
  };
  uintptr_t cursor = range.base;
  size_t next_block = 0;
  for (const SegmentRange& r : range.mapped) {
    if (r.addr > cursor) add(cursor, r.addr - cursor, 0, false, false);
    cursor = r.addr;
    for (; next_block < blocks.size() && blocks[next_block].addr < r.addr + r.size; ++next_block) {
      const RecordedBlock& b = blocks[next_block];
      if (b.addr > cursor) add(cursor, b.addr - cursor, 0, false, true);
      add(b.addr, b.size, b.requested_size, true, true);
      cursor = b.addr + b.size;
    }
    if (cursor < r.addr + r.size) add(cursor, r.addr + r.size - cursor, 0, false, true);
    cursor = r.addr + r.size;
  }
  if (cursor < end) add(cursor, end - cursor, 0, false, false);
  reserve(mapped_bytes);
  increase_pool(stats_.reserved_bytes, range.is_small, static_cast<int64_t>(mapped_bytes));
  expandable_segments_.push_back(std::move(segment));
}

bool CachingAllocator::release_cached_segment(uintptr_t addr) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  for (BlockPool* pool : {&large_blocks_, &small_blocks_}) {
    for (Block* block : pool->blocks) {
      if (addr < block->addr || addr >= block->addr + block->size) continue;
      if (block->expandable) {
        const size_t reserved = own_reserved_;
        unmap_block(block);
        if (own_reserved_ == reserved) return false;
        release_expandable_segment(block);
        return true;
      }
      if (block->is_split() || block->addr != addr) return false;
      release_block(block);
      return true;
    }
  }
  return false;
}

}  // namespace torchmem
