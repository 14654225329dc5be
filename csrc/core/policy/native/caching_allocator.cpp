// Note [Caching policy]
// The rules of PyTorch's native CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator), in the order
// a request meets them:
// - Sizes round up to 512 B, or to the next 1/n of a power of two when
//   roundup_power2_divisions gives n > 1 for the size's interval and the size
//   is over n * 512 B (round_size).
// - Requests up to 1 MiB are served from the small pool, whose segments are
//   2 MiB; larger ones from the large pool, whose segments are
//   large_segment_size (20 MiB) for requests under 10 MiB and the request
//   rounded up to 2 MiB above (get_allocation_size).
// - Best fit: the smallest cached block of the same stream that is large
//   enough, lowest address among equals. A block of max_split_size or more is
//   never given to a request under max_split_size, and a request of
//   max_split_size or more only takes a block less than
//   max_non_split_rounding larger than itself (get_free_block).
// - A found block is split when the remainder is at least 512 B (small pool,
//   expandable segments) or more than 1 MiB and the request is under
//   max_split_size (large pool) (should_split).
// - On a miss: free-memory callbacks and another search; garbage collection
//   (only under a memory fraction below 1 and with a threshold); a new
//   segment, refused when it would take reserved memory over the fraction's
//   limit; on failure, release cached blocks of max_split_size or more and
//   retry (release_available_cached_blocks); then release every unsplit
//   cached segment and retry once more, counted in num_alloc_retries; then
//   out of memory (malloc).
// - A freed block merges with free neighbours of its segment (free_block).
#include "core/policy/native/caching_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

namespace torchmem {

namespace {

// reuse_order segment: each segment takes the next rank, process-wide, as
// PyTorch's registration_counter_global (torch 2.14).
uint64_t next_segment_rank() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

constexpr size_t kMaxRequest = size_t(1) << 60;

}  // namespace

CachingAllocator::CachingAllocator(Device& device, AllocatorConfig config)
    : PolicyBase(device, config),
      rounds_power2_divisions_(std::any_of(config.roundup_power2_divisions.begin(),
                                           config.roundup_power2_divisions.end(), [](size_t d) { return d > 1; })) {
  if (config_.policy != kNativePolicy) {
    throw std::invalid_argument("CachingAllocator is the native policy; '" + config_.to_string() +
                                "' asks for another: make it with make_device_allocator()");
  }
}

CachingAllocator::~CachingAllocator() {
  std::vector<Block*> all;
  for (auto* pool : {&large_blocks_, &small_blocks_}) {
    all.insert(all.end(), pool->blocks.begin(), pool->blocks.end());
    all.insert(all.end(), pool->unmapped.begin(), pool->unmapped.end());
  }
  live_blocks_.for_each([&](Block* b) { all.push_back(b); });
  for (Block* b : all) {
    if (b->prev == nullptr && b->expandable == nullptr) {
      size_t total = 0;
      for (Block* s = b; s; s = s->next) total += s->size;
      device_.free(b->addr, total);
    }
  }
  for (Block* b : all) destroy_block(b);
  expandable_segments_.clear();  // unmaps and releases their ranges
}

static_assert(sizeof(Block) <= NodePool::kChunk, "a Block must fit a node-pool chunk");

inline CachingAllocator::Request CachingAllocator::make_request(size_t size, Stream stream) {
  Request r{size, 0, 0, stream, nullptr};
  if (size > kMaxRequest) return r;  // r.pool null: refused before any rounding
  r.size = round_size(size);
  r.pool = &pool_for(r.size);
  r.alloc_size = allocation_size(r.size, config_.large_segment_size);
  return r;
}

// The hot path (inline): a cached block. allocate_on_miss() does the rest.
TORCHMEM_ALWAYS_INLINE Block* CachingAllocator::allocate_locked(Request& r) {
  Block* block = r.pool ? find_free_block(r) : nullptr;
  return block ? block : allocate_on_miss(r);
}

Block* CachingAllocator::allocate_on_miss(Request& r) {
  if (r.pool == nullptr) return nullptr;
  if (trigger_free_memory_callbacks()) {
    if (Block* block = find_free_block(r)) return block;
  }
  // Releases are blocked while a CUDA graph is captured (device_allocator.h).
  if (!releases_blocked_ && fraction_set_ && config_.garbage_collection_threshold > 0.0) {
    garbage_collect_cached_blocks();
  }
  if (allocate_segment(r, false)) return r.block;
  if (releases_blocked_) return nullptr;
  if (release_available_cached_blocks(r) && allocate_segment(r, false)) return r.block;
  if (pending_free_waiter_) {
    for (void* ptr : pending_free_waiter_()) {
      Block* pending = live_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
      if (pending && pending->free_requested) complete_free_locked(live_blocks_.take(pending->addr));
    }
  }
  release_cached_blocks();
  return allocate_segment(r, true) ? r.block : nullptr;
}

TORCHMEM_ALWAYS_INLINE void* CachingAllocator::hand_out(Request& r, Block* block, uint64_t context) {
  block = take_block(r, block);
  live_blocks_.insert(block->addr, block);
  history_.record(Action::kAlloc, block->addr, r.requested, r.stream, context);  // the requested size, as PyTorch
  return reinterpret_cast<void*>(block->addr);
}

// The one allocation path: every entry point below is allocate_with() with
// fixed arguments. The request is made before the lock (it reads only the
// config, which never changes), then the search, then the hand-out, under one
// lock. Nothing is counted when it returns nullptr.
TORCHMEM_ALWAYS_INLINE void* CachingAllocator::allocate_with(size_t size, Stream stream, Search search, bool throws) {
  if (size == 0) return nullptr;
  const uint64_t context = history_.context();  // before the lock: a provider may wait (for the GIL)
  Request r = make_request(size, stream);
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  Block* block = nullptr;
  switch (search) {
    case Search::kCachedOnly: block = r.pool ? find_free_block(r) : nullptr; break;
    case Search::kAll: block = allocate_locked(r); break;
    case Search::kAfterRelease: block = allocate_on_miss(r); break;
  }
  if (block) return hand_out(r, block, context);
  if (throws) throw_oom(r);
  return nullptr;
}

void* CachingAllocator::allocate(size_t size, Stream stream) { return allocate_with(size, stream, Search::kAll, true); }

void* CachingAllocator::allocate_after_release(size_t size, Stream stream) {
  return allocate_with(size, stream, Search::kAfterRelease, true);
}

void* CachingAllocator::try_allocate(size_t size, Stream stream) {
  return allocate_with(size, stream, Search::kAll, false);
}

void* CachingAllocator::allocate_cached(size_t size, Stream stream) {
  return allocate_with(size, stream, Search::kCachedOnly, false);
}

void CachingAllocator::throw_out_of_memory(size_t size, Stream stream) {
  const Request r = make_request(size, stream);
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  throw_oom(r);
}

TORCHMEM_ALWAYS_INLINE Block* CachingAllocator::find_free_block(Request& r) {
  BlockPool& pool = *r.pool;
  if (fraction_set_ && config_.garbage_collection_threshold > 0.0) ++pool.get_free_blocks_call_count;
  auto it = pool.blocks.lower_bound(BlockKey{r.stream, r.size});
  if (it == pool.blocks.end() || (*it)->stream != r.stream) return nullptr;
  if ((*it)->expandable) {
    if (config_.expandable_segments) {
      // Best fit counts what a block of an expandable segment can grow into.
      auto growable = [](const Block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
      for (auto next = std::next(it); (*it)->expandable && next != pool.blocks.end() && (*next)->stream == r.stream &&
                                      growable(*next) < growable(*it);
           ++next) {
        it = next;
      }
    } else {
      do {
        ++it;
      } while (it != pool.blocks.end() && (*it)->expandable && (*it)->stream == r.stream);
      if (it == pool.blocks.end() || (*it)->stream != r.stream) return nullptr;
    }
  }
  const size_t max_split = config_.max_split_size;
  if (r.size < max_split && (*it)->size >= max_split) return nullptr;
  if (r.size >= max_split && (*it)->size >= r.size + config_.max_non_split_rounding) return nullptr;
  if (pool.blocks.key_comp().by_rank && (*it)->reuse_rank == 0 && !(*it)->expandable) note_start_age_guess(pool, it);
  r.pooled = true;  // take_block() takes it out of the pool
  return *it;
}

bool CachingAllocator::allocate_segment(Request& r, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  const size_t size = r.alloc_size;
  if (fraction_set_ && device_reserved_bytes() + size > limit_bytes()) return false;  // every pool's, as PyTorch
  if (config_.expandable_segments) {
    r.block = allocate_expandable(r);
    return r.block != nullptr;
  }
  const uintptr_t addr = device_.allocate(size);
  if (addr == 0) return false;
  reserve(size);
  Block* block = make_block();
  block->addr = addr;
  block->size = size;
  block->stream = r.stream;
  block->pool = r.pool;
  block->reuse_rank = next_segment_rank();
  r.block = block;
  increase_pool(stats_.segment, r.pool->is_small, 1);
  increase_pool(stats_.reserved_bytes, r.pool->is_small, static_cast<int64_t>(size));
  if (size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  history_.record(Action::kSegmentAlloc, addr, size, r.stream);
  return true;
}

// Frees cached blocks of max_split_size or more: the smallest single one that
// covers the request, or else the largest ones until their sum does.
bool CachingAllocator::release_available_cached_blocks(const Request& r) {
  if (config_.max_split_size == std::numeric_limits<size_t>::max()) return false;
  BlockPool& pool = *r.pool;
  const BlockKey key{r.stream, std::max(r.size, config_.max_split_size)};
  auto it = pool.blocks.lower_bound(key);
  // Only whole cached segments can go back to the device. Under the native
  // policy a free block of max_split_size or more always is one; a state
  // rebuilt from a recording made under other settings may hold split ones.
  if (it != pool.blocks.end() && (*it)->stream == r.stream && !(*it)->expandable && !(*it)->is_split()) {
    release_block(*it);
    return true;
  }
  if (it == pool.blocks.begin()) return false;
  size_t released = 0;
  --it;
  while (released < key.size && (*it)->size >= config_.max_split_size && (*it)->stream == r.stream) {
    auto cur = it;
    const bool is_first = cur == pool.blocks.begin();
    if (!is_first) --it;
    if (!(*cur)->expandable && !(*cur)->is_split()) {
      released += (*cur)->size;
      release_block(*cur);
    }
    if (is_first) break;
  }
  return released >= key.size;
}

// PyTorch's release_cached_blocks first waits for every stream's events
// (synchronize_and_free_events), which counts num_sync_all_streams.
void CachingAllocator::release_cached_blocks() {
  ++stats_.num_sync_all_streams;
  release_pool(large_blocks_);
  release_pool(small_blocks_);
}

void CachingAllocator::release_pool(BlockPool& pool) {
  std::vector<Block*> to_unmap;  // unmapping changes the pool: collect first
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* block = *it++;
    if (block->expandable) {
      to_unmap.push_back(block);
    } else if (!block->is_split()) {
      release_block(block);
    }
  }
  for (Block* block : to_unmap) {
    unmap_block(block);
    release_expandable_segment(block);
  }
}

void CachingAllocator::release_block(Block* block) {
  device_.free(block->addr, block->size);
  unreserve(block->size);
  decrease_pool(stats_.segment, block->pool->is_small, 1);
  decrease_pool(stats_.reserved_bytes, block->pool->is_small, static_cast<int64_t>(block->size));
  if (block->size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
  ++stats_.num_device_free;
  history_.record(Action::kSegmentFree, block->addr, block->size, block->stream);
  block->pool->erase(block);
  destroy_block(block);
}

// Frees unsplit large cached segments, oldest (least reused) first, until
// reserved memory is back under garbage_collection_threshold * limit.
void CachingAllocator::garbage_collect_cached_blocks() {
  const size_t threshold = static_cast<size_t>(config_.garbage_collection_threshold * limit_bytes());
  const size_t reserved = device_reserved_bytes();  // every pool's, as PyTorch's total_allocated_memory
  if (reserved <= threshold) return;
  const size_t target = reserved - threshold;
  auto age = [&](const Block* b) { return static_cast<double>(large_blocks_.get_free_blocks_call_count - b->gc_count_base); };
  double total_age = 0.0;
  int freeable = 0;
  for (Block* b : large_blocks_.blocks) {
    if (!b->is_split()) {
      total_age += age(b);
      ++freeable;
    }
  }
  size_t reclaimed = 0;
  bool freed_one = true;
  while (reclaimed < target && freed_one && freeable > 0) {
    const double age_threshold = total_age / freeable;
    freed_one = false;
    for (auto it = large_blocks_.blocks.begin(); it != large_blocks_.blocks.end();) {
      Block* b = *it++;
      if (!b->is_split() && !b->expandable && age(b) >= age_threshold) {
        freed_one = true;
        reclaimed += b->size;
        total_age -= age(b);
        --freeable;
        release_block(b);
      }
    }
  }
}

inline bool CachingAllocator::should_split(const Block* block, size_t size) const {
  const size_t remaining = block->size - size;
  if (block->pool->is_small || config_.expandable_segments) return remaining >= config_.min_block_size;
  return size < config_.max_split_size && remaining > kSmallSize;
}

// Turns a free block into an allocation of r.size, splitting off the
// remainder when the rules allow. The block is still in r.pool's free set
// when r.pooled (find_free_block): a split moves its entry to the remainder,
// otherwise it is erased.
TORCHMEM_ALWAYS_INLINE Block* CachingAllocator::take_block(Request& r, Block* block) {
  const bool already_split = block->is_split() && !block->expandable;
  const bool is_small = r.pool->is_small;
  if (should_split(block, r.size)) {
    Block* remaining = block;
    block = make_block();
    block->addr = remaining->addr;
    block->size = r.size;
    block->stream = r.stream;
    block->pool = r.pool;
    block->reuse_rank = remaining->reuse_rank;  // reuse_order segment: the segment's rank
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    if (r.pooled) {
      r.pool->move(remaining, remaining->addr + r.size, remaining->size - r.size);
    } else {
      remaining->addr += r.size;
      remaining->size -= r.size;
      r.pool->insert(remaining);
    }
    if (block->expandable) {
      // expandable segments keep no inactive_split statistics (as PyTorch)
    } else if (already_split) {
      decrease_pool(stats_.inactive_split_bytes, is_small, static_cast<int64_t>(r.size));
    } else {
      increase_pool(stats_.inactive_split_bytes, is_small, static_cast<int64_t>(remaining->size));
      increase_pool(stats_.inactive_split, is_small, 1);
    }
  } else {
    if (r.pooled) r.pool->erase(block);
    if (already_split) {
      decrease_pool(stats_.inactive_split_bytes, is_small, static_cast<int64_t>(block->size));
      decrease_pool(stats_.inactive_split, is_small, 1);
    }
  }
  block->allocated = true;
  block->requested_size = r.requested;
  increase_pool(stats_.allocation, is_small, 1);
  increase_pool(stats_.allocated_bytes, is_small, static_cast<int64_t>(block->size));
  increase_pool(stats_.active, is_small, 1);
  increase_pool(stats_.active_bytes, is_small, static_cast<int64_t>(block->size));
  increase_pool(stats_.requested_bytes, is_small, static_cast<int64_t>(r.requested));
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
  return block;
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const Block* block = live_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  return block && !block->free_requested;
}

bool CachingAllocator::has_live_allocations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return !live_blocks_.empty();
}

bool CachingAllocator::allocation_stream(const void* ptr, Stream* stream) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  Block* block = live_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (!block || block->free_requested) return false;
  *stream = block->stream;
  return true;
}

void CachingAllocator::set_pending_free_waiter(PendingFreeWaiter waiter) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  pending_free_waiter_ = std::move(waiter);
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  bool freed;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    freed = free_locked(ptr);
  }
  if (!freed) {
    throw std::invalid_argument("free of " + hex_address(reinterpret_cast<uintptr_t>(ptr)) +
                                ", which is not a live allocation of this allocator "
                                "(a double free, or a pointer from elsewhere)");
  }
}

bool CachingAllocator::try_deallocate(void* ptr) {
  if (ptr == nullptr) return true;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return free_locked(ptr);
}

TORCHMEM_ALWAYS_INLINE bool CachingAllocator::free_locked(void* ptr) {
  Block* block = live_blocks_.take(reinterpret_cast<uintptr_t>(ptr));  // one probe on the hot path
  if (!block) return false;
  if (block->free_requested) {  // pending on other streams: complete_free() ends it
    live_blocks_.insert(block->addr, block);
    return false;
  }
  request_free_locked(block);
  complete_free_locked(block);
  return true;
}

bool CachingAllocator::request_free(void* ptr) {
  if (ptr == nullptr) return false;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  Block* block = live_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (!block || block->free_requested) return false;
  request_free_locked(block);
  return true;
}

void CachingAllocator::complete_free(void* ptr) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  Block* block = live_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (!block || !block->free_requested) {
    throw std::logic_error("complete_free of " + hex_address(reinterpret_cast<uintptr_t>(ptr)) +
                           ", whose free was not requested");
  }
  complete_free_locked(live_blocks_.take(block->addr));
}

// As PyTorch's free(): the allocation ends here, the block stays active.
TORCHMEM_ALWAYS_INLINE void CachingAllocator::request_free_locked(Block* block) {
  history_.record(Action::kFreeRequested, block->addr, block->requested_size, block->stream);
  block->free_requested = true;
  decrease_pool(stats_.allocation, block->pool->is_small, 1);
  decrease_pool(stats_.allocated_bytes, block->pool->is_small, static_cast<int64_t>(block->size));
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
}

// As PyTorch's free_block(): back to the cache. The block is already out of live_blocks_.
TORCHMEM_ALWAYS_INLINE void CachingAllocator::complete_free_locked(Block* block) {
  history_.record(Action::kFreeCompleted, block->addr, block->requested_size, block->stream);
  decrease_pool(stats_.requested_bytes, block->pool->is_small, static_cast<int64_t>(block->requested_size));
  block->allocated = false;
  block->free_requested = false;
  free_block(block);
}

// The freed block joins its free neighbours. A neighbour already cached
// holds the merged range (BlockPool::move: usually no tree change), and the
// freed block's own record goes.
TORCHMEM_ALWAYS_INLINE void CachingAllocator::free_block(Block* block) {
  const size_t original_size = block->size;
  BlockPool& pool = *block->pool;
  auto joins = [&](const Block* n) { return n && !n->allocated && n->mapped == block->mapped; };
  Block* prev = joins(block->prev) ? block->prev : nullptr;
  Block* next = joins(block->next) ? block->next : nullptr;
  int64_t net_inactive_blocks = 0;
  int64_t net_inactive_bytes = 0;
  for (const Block* n : {prev, next}) {
    if (n) {
      net_inactive_blocks -= 1;
      net_inactive_bytes -= static_cast<int64_t>(n->size);
    }
  }
  block->requested_size = 0;
  Block* merged = block;
  if (!prev && !next) {
    pool.insert(block);
  } else {
    Block* first = prev ? prev : block;
    Block* last = next ? next : block;
    const uintptr_t addr = first->addr;
    const size_t size = last->addr + last->size - addr;
    merged = next ? next : prev;
    merged->prev = first->prev;
    merged->next = last->next;
    if (merged->prev) merged->prev->next = merged;
    if (merged->next) merged->next->prev = merged;
    if (prev && merged != prev) {
      pool.erase(prev);
      destroy_block(prev);
    }
    pool.move(merged, addr, size);
    destroy_block(block);
  }
  if (merged->is_split()) {
    net_inactive_blocks += 1;
    net_inactive_bytes += static_cast<int64_t>(merged->size);
  }
  if (merged->expandable) net_inactive_blocks = net_inactive_bytes = 0;
  if (net_inactive_blocks > 0) increase_pool(stats_.inactive_split, pool.is_small, net_inactive_blocks);
  if (net_inactive_blocks < 0) decrease_pool(stats_.inactive_split, pool.is_small, -net_inactive_blocks);
  if (net_inactive_bytes > 0) increase_pool(stats_.inactive_split_bytes, pool.is_small, net_inactive_bytes);
  if (net_inactive_bytes < 0) decrease_pool(stats_.inactive_split_bytes, pool.is_small, -net_inactive_bytes);
  decrease_pool(stats_.active, pool.is_small, 1);
  decrease_pool(stats_.active_bytes, pool.is_small, static_cast<int64_t>(original_size));
}

// Absorbs the free neighbour src into dst; returns the bytes absorbed.
size_t CachingAllocator::merge(Block* dst, Block* src, BlockPool& pool) {
  if (!src || src->allocated || dst->mapped != src->mapped) return 0;
  if (dst->prev == src) {
    dst->addr = src->addr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const size_t subsumed = src->size;
  dst->size += subsumed;
  pool.erase(src);
  destroy_block(src);
  return subsumed;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (releases_blocked_) return;
  release_cached_blocks();
}

}  // namespace torchmem
