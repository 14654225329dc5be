#include "core/allocators/paged_block_pool.h"

#include <stdexcept>
#include <string>

namespace torchmem {

PagedBlockPool::PagedBlockPool(int32_t num_blocks)
    : num_blocks_(num_blocks),
      ref_(num_blocks > 0 ? num_blocks : 0, 0),
      free_(num_blocks > 0 ? num_blocks : 0),
      prev_(num_blocks > 0 ? num_blocks + 1 : 1),
      next_(num_blocks > 0 ? num_blocks + 1 : 1),
      hash_(num_blocks > 0 ? num_blocks : 0, 0),
      hashed_(num_blocks > 0 ? num_blocks : 0, 0),
      scratch_(num_blocks > 0 ? num_blocks : 0, 0) {
  if (num_blocks <= 0) throw std::invalid_argument("PagedBlockPool: num_blocks must be positive");
  // The top of the stack is the end: push ids descending so 0 comes out first.
  for (int32_t i = 0; i < num_blocks; ++i) free_[i] = num_blocks - 1 - i;
  free_top_ = num_blocks;
  prev_[num_blocks] = next_[num_blocks] = num_blocks;
}

void PagedBlockPool::check_id(BlockId id, const char* what) const {
  if (id < 0 || id >= num_blocks_)
    throw std::invalid_argument(std::string("PagedBlockPool.") + what + ": block id " + std::to_string(id) +
                                " out of range [0, " + std::to_string(num_blocks_) + ")");
}

void PagedBlockPool::check_used(BlockId id, const char* what) const {
  check_id(id, what);
  if (ref_[id] == 0)
    throw std::invalid_argument(std::string("PagedBlockPool.") + what + ": block " + std::to_string(id) +
                                " is not in use (already released, or never allocated)");
}

void PagedBlockPool::throw_exhausted(size_t wanted) const {
  OomInfo info;
  info.requested = wanted;
  info.allocated = static_cast<size_t>(num_used());
  info.reserved = static_cast<size_t>(num_blocks_);
  info.device_total = static_cast<size_t>(num_blocks_);
  info.device_free = static_cast<size_t>(num_free());
  throw OutOfBlocks("PagedBlockPool out of blocks: " + std::to_string(wanted) + " requested, " +
                        std::to_string(num_free()) + " free of " + std::to_string(num_blocks_),
                    info);
}

int32_t PagedBlockPool::ref_count(BlockId id) const {
  check_id(id, "ref_count");
  return ref_[id];
}

// Callers have checked that num_free() > 0.
BlockId PagedBlockPool::pop_block() {
  BlockId id;
  if (free_top_ > 0) {
    id = free_[--free_top_];
  } else {
    id = next_[num_blocks_];
    lru_unlink(id);
    unhash(id);
    ++stats_.evictions;
  }
  ref_[id] = 1;
  ++stats_.allocations;
  return id;
}

void PagedBlockPool::drop_ref(BlockId id) {
  ++stats_.releases;
  if (--ref_[id] != 0) return;
  if (hashed_[id])
    lru_push_back(id);
  else
    free_[free_top_++] = id;
}

void PagedBlockPool::unhash(BlockId id) {
  if (!hashed_[id]) return;
  index_.erase(hash_[id]);
  hashed_[id] = 0;
  hash_[id] = 0;
}

void PagedBlockPool::lru_push_back(BlockId id) {
  const BlockId tail = prev_[num_blocks_];
  prev_[id] = tail;
  next_[id] = num_blocks_;
  next_[tail] = id;
  prev_[num_blocks_] = id;
  ++num_parked_;
}

void PagedBlockPool::lru_unlink(BlockId id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  --num_parked_;
}

BlockId PagedBlockPool::allocate() {
  if (num_free() == 0) throw_exhausted(1);
  return pop_block();
}

BlockId PagedBlockPool::try_allocate() { return num_free() == 0 ? kNoBlock : pop_block(); }

void PagedBlockPool::release(BlockId id) {
  check_used(id, "release");
  drop_ref(id);
}

void PagedBlockPool::retain(BlockId id) {
  check_used(id, "retain");
  ++ref_[id];
}

void PagedBlockPool::allocate_n(size_t n, BlockId* out) {
  if (n > static_cast<size_t>(num_free())) throw_exhausted(n);
  for (size_t i = 0; i < n; ++i) out[i] = pop_block();
}

bool PagedBlockPool::try_allocate_n(size_t n, BlockId* out) {
  if (n > static_cast<size_t>(num_free())) return false;
  for (size_t i = 0; i < n; ++i) out[i] = pop_block();
  return true;
}

void PagedBlockPool::validate_batch(const BlockId* ids, size_t n, const char* what, bool releasing) const {
  size_t i = 0;
  try {
    for (; i < n; ++i) {
      check_used(ids[i], what);
      if (releasing && ++scratch_[ids[i]] > ref_[ids[i]])
        throw std::invalid_argument(std::string("PagedBlockPool.") + what + ": block " + std::to_string(ids[i]) +
                                    " released more times than it is referenced (" +
                                    std::to_string(ref_[ids[i]]) + ")");
    }
  } catch (...) {
    if (releasing)
      for (size_t j = 0; j <= i && j < n; ++j)
        if (ids[j] >= 0 && ids[j] < num_blocks_) scratch_[ids[j]] = 0;
    throw;
  }
  if (releasing)
    for (size_t j = 0; j < n; ++j) scratch_[ids[j]] = 0;
}

void PagedBlockPool::release_n(const BlockId* ids, size_t n) {
  validate_batch(ids, n, "release", true);
  for (size_t i = 0; i < n; ++i) drop_ref(ids[i]);
}

void PagedBlockPool::retain_n(const BlockId* ids, size_t n) {
  validate_batch(ids, n, "retain", false);
  for (size_t i = 0; i < n; ++i) ++ref_[ids[i]];
}

BlockId PagedBlockPool::make_writable(BlockId id, const CopyFn& copy) {
  check_used(id, "make_writable");
  if (ref_[id] == 1) {
    unhash(id);
    return id;
  }
  if (num_free() == 0) throw_exhausted(1);
  const BlockId dst = pop_block();
  try {
    copy(id, dst);
  } catch (...) {
    drop_ref(dst);
    --stats_.releases;
    --stats_.allocations;
    throw;
  }
  --ref_[id];  // stays >= 1
  ++stats_.copies;
  ++stats_.releases;
  return dst;
}

void PagedBlockPool::allocate_and_make_writable(size_t n_new, BlockId* new_out, BlockId* last, size_t n_last,
                                           std::vector<Copy>* copies) {
  // Count the copies n_last sequential make_writable calls would make: the
  // k-th occurrence of a block with ref r copies iff r - k > 1.
  size_t needed = n_new;
  size_t i = 0;
  try {
    for (; i < n_last; ++i) {
      check_used(last[i], "make_writable");
      if (ref_[last[i]] - scratch_[last[i]]++ > 1) ++needed;
    }
  } catch (...) {
    for (size_t j = 0; j < i; ++j) scratch_[last[j]] = 0;
    throw;
  }
  for (size_t j = 0; j < n_last; ++j) scratch_[last[j]] = 0;
  if (needed > static_cast<size_t>(num_free())) throw_exhausted(needed);
  if (copies) copies->reserve(copies->size() + (needed - n_new));
  for (size_t j = 0; j < n_new; ++j) new_out[j] = pop_block();
  for (size_t j = 0; j < n_last; ++j) {
    const BlockId id = last[j];
    if (ref_[id] == 1) {
      unhash(id);
      continue;
    }
    const BlockId dst = pop_block();
    --ref_[id];
    ++stats_.copies;
    ++stats_.releases;
    if (copies) copies->emplace_back(id, dst);
    last[j] = dst;
  }
}

bool PagedBlockPool::set_hash(BlockId id, uint64_t hash) {
  check_used(id, "set_hash");
  auto it = index_.find(hash);
  if (it != index_.end()) return it->second == id;
  if (hashed_[id])
    throw std::invalid_argument("PagedBlockPool.set_hash: block " + std::to_string(id) +
                                " is already registered under another hash");
  index_.emplace(hash, id);
  hash_[id] = hash;
  hashed_[id] = 1;
  return true;
}

BlockId PagedBlockPool::acquire_cached(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++stats_.cache_misses;
    return kNoBlock;
  }
  const BlockId id = it->second;
  if (ref_[id] == 0) lru_unlink(id);
  ++ref_[id];
  ++stats_.cache_hits;
  return id;
}

BlockId PagedBlockPool::lookup(uint64_t hash) const {
  auto it = index_.find(hash);
  return it == index_.end() ? kNoBlock : it->second;
}

bool PagedBlockPool::has_hash(BlockId id) const {
  check_id(id, "has_hash");
  return hashed_[id] != 0;
}

void PagedBlockPool::check_invariants() const {
  auto fail = [](const std::string& what) { throw std::logic_error("PagedBlockPool invariant broken: " + what); };
  std::vector<uint8_t> seen(num_blocks_, 0);  // 1 = free stack, 2 = parked
  if (free_top_ < 0 || free_top_ > num_blocks_) fail("free stack size");
  for (int32_t i = 0; i < free_top_; ++i) {
    const BlockId id = free_[i];
    if (id < 0 || id >= num_blocks_) fail("free stack holds an id out of range");
    if (seen[id]) fail("block " + std::to_string(id) + " twice on the free stack");
    seen[id] = 1;
    if (ref_[id] != 0) fail("block " + std::to_string(id) + " on the free stack with references");
    if (hashed_[id]) fail("block " + std::to_string(id) + " on the free stack with a hash");
  }
  int32_t parked = 0;
  BlockId prev = num_blocks_;
  for (BlockId id = next_[num_blocks_]; id != num_blocks_; id = next_[id]) {
    if (id < 0 || id >= num_blocks_ || seen[id]) fail("LRU list corrupt");
    if (prev_[id] != prev) fail("LRU back link of block " + std::to_string(id));
    seen[id] = 2;
    if (ref_[id] != 0) fail("parked block " + std::to_string(id) + " has references");
    if (!hashed_[id]) fail("parked block " + std::to_string(id) + " has no hash");
    prev = id;
    if (++parked > num_blocks_) fail("LRU list cycles");
  }
  if (prev_[num_blocks_] != prev) fail("LRU tail");
  if (parked != num_parked_) fail("parked count");
  size_t hashed = 0;
  for (BlockId id = 0; id < num_blocks_; ++id) {
    if (ref_[id] < 0) fail("negative reference count");
    if (ref_[id] == 0 && !seen[id]) fail("block " + std::to_string(id) + " unreferenced but neither free nor parked");
    if (ref_[id] > 0 && seen[id]) fail("block " + std::to_string(id) + " referenced but free or parked");
    if (scratch_[id] != 0) fail("scratch counters not cleared");
    if (hashed_[id]) {
      ++hashed;
      auto it = index_.find(hash_[id]);
      if (it == index_.end() || it->second != id) fail("hash index misses block " + std::to_string(id));
    }
  }
  if (hashed != index_.size()) fail("hash index holds stale entries");
}

}  // namespace torchmem
