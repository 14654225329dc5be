// Note [Stitch policy]
// The native policy (caching_allocator.cpp) holds memory in segments: a
// free block can serve a request only if it is large enough by itself, and
// a segment goes back to the device only when all of it is free. Memory
// freed between live blocks is stuck there: a trace needs more capacity than
// the bytes it ever has live at once (6-29% more on real traces). The stitch
// policy separates where a block sits (virtual addresses) from what backs it
// (physical pages), as GMLake does with CUDA's virtual memory calls:
//
// - Per stream and size class (small: up to 1 MiB) a range of virtual
//   addresses is reserved, 4x the device's capacity (capped at 2^19 pages;
//   another range is reserved if one ever fills). Nothing is mapped yet.
// - A request is rounded to 512 B and placed in a free block of its stream
//   and class: at the block's start or at its end. Among the candidates
//   (the best-fitting free blocks by size, and the free tail of each range:
//   a fresh place) the placement chosen is, in order:
//     1. the one that occupies the fewest pages no live block occupies yet
//        (sharing a partly used page with the block before or after it);
//     2. then the one needing the fewest pages mapped (reusing cached pages);
//     3. then the smallest free block (best fit), then the lowest address.
//   The pages it occupies are all the memory it costs, wherever it is.
// - Pages the placement touches that are not mapped are mapped, one device
//   call per page. Pages whose last live byte is freed stay mapped
//   (cached), so a loop that allocates the same shapes again maps nothing.
// - When the device (or the memory fraction's limit) is short, cached pages
//   anywhere are unmapped, highest first, except those under the placement
//   itself: the free physical memory in gaps between live blocks serves a
//   request placed anywhere else. That is the stitching: a large request
//   never waits for one contiguous free block; it needs only as many free
//   pages, wherever they are.
// - A request fails only when the pages its best placement newly occupies
//   exceed what the device has with every cached page unmapped. Then the
//   only memory lost is the free part of pages that also hold live bytes:
//   less than a page per gap between live blocks.
// - Small requests have their own ranges, so the pages of short-lived small
//   tensors empty together and do not pin pages between large blocks.
#include "core/policy/stitch/stitch_allocator.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace torchmem {

namespace {

constexpr size_t kMaxRequest = size_t(1) << 60;
constexpr size_t kRangeCapacityMultiple = 4;  // a range spans 4x the device's capacity
constexpr size_t kMaxRangePages = size_t(1) << 19;
constexpr size_t kMinRangePages = 64;
constexpr int kCandidates = 32;  // best-fit free blocks looked at per request, besides the tails

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

}  // namespace

StitchAllocator::StitchAllocator(Device& device, AllocatorConfig config)
    : PolicyBase(device, config), page_size_(device.page_size()) {
  if (page_size_ == 0 || page_size_ % kMinBlockSize != 0 || page_size_ > (size_t(1) << 31)) {
    throw std::invalid_argument("stitch policy: the device's page size must be a multiple of 512 B, at most 2 GiB");
  }
}

StitchAllocator::~StitchAllocator() {
  free_.clear();
  live_.clear();
  ranges_.clear();  // unmaps what is mapped and releases the ranges
}

StitchAllocator::SBlock* StitchAllocator::make_block() { return new (nodes_.take()) SBlock(); }

void StitchAllocator::destroy_block(SBlock* block) {
  block->~SBlock();
  nodes_.give(block);
}

static_assert(sizeof(void*) * 8 <= NodePool::kChunk, "a block must fit a node-pool chunk");

// ---------------------------------------------------------------------------
// Placement

void StitchAllocator::consider(Placement& best, SBlock* block, size_t size) const {
  const StitchRange& r = *block->range->pages;
  for (uintptr_t addr : {block->addr, block->addr + block->size - size}) {
    const size_t first = r.first_page(addr);
    const size_t end = r.end_page(addr, size);
    size_t fresh = end - first;
    if (r.live(first) > 0) --fresh;
    if (end - 1 != first && r.live(end - 1) > 0) --fresh;
    const size_t maps = (end - first) - r.mapped_in(first, end);
    const bool better = !best.block || fresh < best.new_pages ||
                        (fresh == best.new_pages &&
                         (maps < best.maps ||
                          (maps == best.maps &&
                           (block->size < best.block->size || (block->size == best.block->size && addr < best.addr)))));
    if (better) best = Placement{block, addr, fresh, maps};
    if (block->size == size) break;  // both ends are the same place
  }
}

StitchAllocator::Placement StitchAllocator::place(size_t size, Stream stream, bool is_small) {
  // No placement can occupy fewer new pages than this: at most the first and
  // the last page it touches are shared with other blocks.
  const size_t shareable = 2 * (page_size_ - kMinBlockSize);
  const size_t least = size > shareable ? (size - shareable + page_size_ - 1) / page_size_ : 0;
  Placement best;
  SBlock key;
  key.stream = stream;
  key.is_small = is_small;
  key.size = size;
  int looked = 0;
  for (auto it = free_.lower_bound(&key);
       it != free_.end() && (*it)->stream == stream && (*it)->is_small == is_small && looked < kCandidates;
       ++it, ++looked) {
    consider(best, *it, size);
    if (best.new_pages <= least && best.maps == 0) return best;
  }
  for (const auto& range : ranges_) {
    SBlock* tail = range->tail;
    if (tail->stream == stream && tail->is_small == is_small && !tail->allocated && tail->size >= size) {
      consider(best, tail, size);
    }
  }
  return best;
}

StitchAllocator::Range* StitchAllocator::add_range(Stream stream, bool is_small, size_t size) {
  const size_t least = size / page_size_ + 2;
  size_t pages = std::min(kMaxRangePages, device_.total_bytes() / page_size_ * kRangeCapacityMultiple);
  pages = std::max({pages, least, kMinRangePages});
  std::unique_ptr<StitchRange> reserved;
  while (!reserved) {
    try {
      reserved = std::make_unique<StitchRange>(device_, stream, is_small, page_size_, pages);
    } catch (const std::runtime_error&) {
      if (pages == least) return nullptr;
      pages = std::max(least, pages / 2);
    }
  }
  auto range = std::make_unique<Range>();
  range->pages = std::move(reserved);
  SBlock* all = make_block();
  all->addr = range->pages->base();
  all->size = range->pages->size();
  all->stream = stream;
  all->is_small = is_small;
  all->range = range.get();
  range->head = range->tail = all;
  free_.insert(all);
  ranges_.push_back(std::move(range));
  ++counters_.ranges_reserved;
  return ranges_.back().get();
}

// ---------------------------------------------------------------------------
// Pages

void StitchAllocator::account_mapped(const StitchRange& range, int64_t pages) {
  const int64_t bytes = pages * static_cast<int64_t>(page_size_);
  mapped_bytes_ = static_cast<size_t>(static_cast<int64_t>(mapped_bytes_) + bytes);
  if (bytes > 0) increase_pool(stats_.reserved_bytes, range.is_small(), bytes);
  if (bytes < 0) decrease_pool(stats_.reserved_bytes, range.is_small(), -bytes);
  if (pages > 0) stats_.num_device_alloc += pages;
  if (pages < 0) stats_.num_device_free += -pages;
}

// `pages` were unmapped from `range`, in any order: one history entry per run.
void StitchAllocator::record_unmapped_runs(StitchRange& range, std::vector<size_t>& pages) {
  if (pages.empty()) return;
  account_mapped(range, -static_cast<int64_t>(pages.size()));
  counters_.page_unmaps += pages.size();
  if (history_.enabled()) {
    std::sort(pages.begin(), pages.end());
    size_t begin = 0;
    for (size_t i = 1; i <= pages.size(); ++i) {
      if (i == pages.size() || pages[i] != pages[i - 1] + 1) {
        history_.record(Action::kSegmentUnmap, range.page_addr(pages[begin]), (i - begin) * page_size_, range.stream());
        begin = i;
      }
    }
  }
  pages.clear();
}

// Unmaps up to `pages` cached pages, highest first in each range, except the
// pages [keep_begin, keep_end) of `keep`. Returns how many were unmapped.
size_t StitchAllocator::reclaim(size_t pages, const StitchRange* keep, size_t keep_begin, size_t keep_end) {
  if (releases_blocked_) return 0;
  size_t done = 0;
  std::vector<size_t> unmapped;
  for (const auto& range : ranges_) {
    StitchRange& r = *range->pages;
    size_t below = r.pages();
    while (done < pages && r.cached_pages() > 0) {
      size_t i = r.highest_cached_below(below);
      if (&r == keep && i >= keep_begin && i < keep_end) i = r.highest_cached_below(keep_begin);
      if (i >= r.pages()) break;
      r.unmap_page(i);
      unmapped.push_back(i);
      ++done;
      below = i;
    }
    record_unmapped_runs(r, unmapped);
    if (done == pages) break;
  }
  if (done > 0) ++counters_.reclaims;
  return done;
}

void StitchAllocator::unmap_all_cached() {
  std::vector<size_t> unmapped;
  for (const auto& range : ranges_) {
    StitchRange& r = *range->pages;
    for (size_t i = r.highest_cached_below(r.pages()); i < r.pages(); i = r.highest_cached_below(i)) {
      r.unmap_page(i);
      unmapped.push_back(i);
    }
    record_unmapped_runs(r, unmapped);
  }
}

void StitchAllocator::release_empty_ranges() {
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    Range& range = **it;
    if (range.pages->live_blocks == 0 && range.pages->mapped_pages() == 0) {
      free_.erase(range.head);  // the one free block that tiles it
      destroy_block(range.head);
      it = ranges_.erase(it);
    } else {
      ++it;
    }
  }
}

// Maps the pages under the placement that are not mapped, making room first
// (memory fraction, garbage collection threshold, device) by unmapping
// cached pages elsewhere. False when the device cannot give them; pages
// mapped by then stay mapped (cached).
bool StitchAllocator::map_placement(const Placement& p, size_t size, Stream stream) {
  if (p.maps == 0) return true;
  StitchRange& r = *p.block->range->pages;
  const size_t first = r.first_page(p.addr);
  const size_t end = r.end_page(p.addr, size);
  const size_t need = p.maps * page_size_;
  bool retried = false;
  auto make_room = [&](size_t bytes) {
    const size_t got = reclaim((bytes + page_size_ - 1) / page_size_, &r, first, end);
    retried |= got > 0;
    return got * page_size_ >= bytes;
  };
  if (fraction_set_) {
    const size_t limit = limit_bytes();
    if (config_.garbage_collection_threshold > 0.0) {
      const auto threshold = static_cast<size_t>(config_.garbage_collection_threshold * static_cast<double>(limit));
      if (mapped_bytes_ + need > threshold) make_room(mapped_bytes_ + need - threshold);
    }
    if (mapped_bytes_ + need > limit && !make_room(mapped_bytes_ + need - limit)) {
      if (retried) ++stats_.num_alloc_retries;
      return false;
    }
  }
  const size_t device_free = device_.free_bytes();
  if (need > device_free) make_room(need - device_free);
  bool ok = true;
  size_t run_begin = end;
  auto close_run = [&](size_t i) {
    if (run_begin < i) history_.record(Action::kSegmentMap, r.page_addr(run_begin), (i - run_begin) * page_size_, stream);
    run_begin = end;
  };
  for (size_t i = first; i < end && ok; ++i) {
    if (r.mapped(i)) {
      close_run(i);
      continue;
    }
    while (!r.map_page(i)) {
      if (!make_room(page_size_)) {
        ok = false;
        break;
      }
    }
    if (!ok) {
      close_run(i);
      break;
    }
    account_mapped(r, 1);
    ++counters_.page_maps;
    if (run_begin == end) run_begin = i;
  }
  if (ok) close_run(end);
  if (retried) ++stats_.num_alloc_retries;
  return ok;
}

// ---------------------------------------------------------------------------
// Blocks

// Cuts the placement out of its free block; the rest stays free.
StitchAllocator::SBlock* StitchAllocator::carve(const Placement& p, size_t size) {
  SBlock* block = p.block;
  Range* range = block->range;
  free_.erase(block);
  auto piece = [&](uintptr_t addr, size_t bytes) {
    SBlock* b = make_block();
    b->addr = addr;
    b->size = bytes;
    b->stream = block->stream;
    b->is_small = block->is_small;
    b->range = range;
    return b;
  };
  if (p.addr > block->addr) {
    SBlock* left = piece(block->addr, p.addr - block->addr);
    left->prev = block->prev;
    left->next = block;
    if (left->prev) left->prev->next = left;
    else range->head = left;
    block->prev = left;
    block->size -= left->size;
    block->addr = p.addr;
    free_.insert(left);
  }
  if (block->size > size) {
    SBlock* right = piece(block->addr + size, block->size - size);
    right->next = block->next;
    right->prev = block;
    if (right->next) right->next->prev = right;
    else range->tail = right;
    block->next = right;
    block->size = size;
    free_.insert(right);
  }
  block->allocated = true;
  range->pages->add_live(block->addr, block->size);
  ++range->pages->live_blocks;
  return block;
}

// Absorbs `right` (free, just after `left`) into `left`.
StitchAllocator::SBlock* StitchAllocator::merge(SBlock* left, SBlock* right) {
  free_.erase(left);
  free_.erase(right);
  left->size += right->size;
  left->next = right->next;
  if (left->next) left->next->prev = left;
  else left->range->tail = left;
  destroy_block(right);
  return left;
}

void StitchAllocator::free_block(SBlock* block) {
  Range* range = block->range;
  range->pages->remove_live(block->addr, block->size);
  --range->pages->live_blocks;
  block->allocated = false;
  block->requested = 0;
  if (block->prev && !block->prev->allocated) block = merge(block->prev, block);
  if (block->next && !block->next->allocated) block = merge(block, block->next);
  free_.insert(block);
}

void* StitchAllocator::allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  const uint64_t context = history_.context();  // before the lock: a provider may wait (for the GIL)
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  void* ptr = allocate_locked(size, stream, context);
  if (ptr == nullptr) throw_oom(size, size > kMaxRequest ? 0 : round_up(size, kMinBlockSize), stream);
  return ptr;
}

void* StitchAllocator::try_allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  const uint64_t context = history_.context();
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return allocate_locked(size, stream, context);
}

void StitchAllocator::throw_out_of_memory(size_t size, Stream stream) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  throw_oom(size, size > kMaxRequest ? 0 : round_up(size, kMinBlockSize), stream);
}

void* StitchAllocator::allocate_locked(size_t size, Stream stream, uint64_t context) {
  if (size > kMaxRequest) return nullptr;
  const size_t rounded = round_up(size, kMinBlockSize);
  if (rounded > device_.total_bytes()) return nullptr;  // no range of pages could hold it
  const bool is_small = rounded <= kSmallSize;
  Placement p = place(rounded, stream, is_small);
  if (p.block && p.maps > 0 && !free_memory_callbacks_.empty()) {
    if (trigger_free_memory_callbacks()) p = place(rounded, stream, is_small);
  }
  if (!p.block) {
    if (!add_range(stream, is_small, rounded)) return nullptr;
    p = place(rounded, stream, is_small);
  }
  if (!map_placement(p, rounded, stream)) return nullptr;
  if (p.maps == 0) ++counters_.placements_on_cached;
  SBlock* block = carve(p, rounded);
  block->requested = size;
  increase_pool(stats_.allocation, is_small, 1);
  increase_pool(stats_.allocated_bytes, is_small, static_cast<int64_t>(rounded));
  increase_pool(stats_.active, is_small, 1);
  increase_pool(stats_.active_bytes, is_small, static_cast<int64_t>(rounded));
  increase_pool(stats_.requested_bytes, is_small, static_cast<int64_t>(size));
  if (rounded >= config_.max_split_size) stats_.oversize_allocations.increase(1);
  live_.emplace(block->addr, block);
  history_.record(Action::kAlloc, block->addr, size, stream, context);
  return reinterpret_cast<void*>(block->addr);
}

bool StitchAllocator::owns(const void* ptr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return live_.count(reinterpret_cast<uintptr_t>(ptr)) != 0;
}

bool StitchAllocator::has_live_allocations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return !live_.empty();
}

void StitchAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  if (!try_deallocate(ptr)) {
    throw std::invalid_argument("free of " + hex_address(reinterpret_cast<uintptr_t>(ptr)) +
                                ", which is not a live allocation of this allocator "
                                "(a double free, or a pointer from elsewhere)");
  }
}

bool StitchAllocator::try_deallocate(void* ptr) {
  if (ptr == nullptr) return true;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end()) return false;
  SBlock* block = it->second;
  live_.erase(it);
  history_.record(Action::kFreeRequested, block->addr, block->requested, block->stream);
  decrease_pool(stats_.allocation, block->is_small, 1);
  decrease_pool(stats_.allocated_bytes, block->is_small, static_cast<int64_t>(block->size));
  decrease_pool(stats_.active, block->is_small, 1);
  decrease_pool(stats_.active_bytes, block->is_small, static_cast<int64_t>(block->size));
  decrease_pool(stats_.requested_bytes, block->is_small, static_cast<int64_t>(block->requested));
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
  history_.record(Action::kFreeCompleted, block->addr, block->requested, block->stream);
  free_block(block);
  return true;
}

void StitchAllocator::empty_cache() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (releases_blocked_) return;
  unmap_all_cached();
  release_empty_ranges();
}

void StitchAllocator::throw_oom(size_t requested, size_t rounded, Stream stream) {
  ++stats_.num_ooms;
  const size_t device_free = device_.free_bytes();
  history_.record(Action::kOom, device_free, rounded ? rounded : requested, stream);
  OomInfo info;
  info.requested = requested;
  info.alloc_size = rounded ? rounded : requested;
  info.allocated = static_cast<size_t>(stats_.with_pool_sums().allocated_bytes[kAggregate].current);
  info.reserved = mapped_bytes_;
  info.largest_free = largest_free_block_locked();
  info.device_total = device_.total_bytes();
  info.device_free = device_free;
  info.allowed = fraction_set_ ? limit_bytes() : info.device_total;
  throw OutOfMemory(oom_message_head(device_.name(), info, fraction_set_) +
                        " (policy:stitch: free bytes in pages that also hold live blocks; every wholly free page "
                        "was unmapped).",
                    info);
}

// ---------------------------------------------------------------------------
// Counters

StitchAllocator::Counters StitchAllocator::counters() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return counters_;
}

std::vector<std::pair<const char*, uint64_t>> StitchAllocator::policy_counters() const {
  const Counters c = counters();
  return {{"page_maps", c.page_maps},
          {"page_unmaps", c.page_unmaps},
          {"reclaims", c.reclaims},
          {"ranges_reserved", c.ranges_reserved},
          {"placements_on_cached", c.placements_on_cached}};
}

size_t StitchAllocator::ranges() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return ranges_.size();
}

}  // namespace torchmem
