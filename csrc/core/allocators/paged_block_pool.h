// PagedBlockPool: the paged block allocator behind a paged KV cache.
//
// A fixed number of equal blocks, identified by 0 <= id < num_blocks; the
// memory they stand for lives elsewhere (one tensor cut into pages): the pool
// only decides who holds which block. Allocation pops a free stack, release
// pushes it (O(1) each); reference counts let sequences share blocks (fork,
// shared prefixes, beam search), and make_writable() copies a shared block
// through a callback before it is written (copy-on-write).
//
// Prefix cache: a full block can be registered under a hash of its contents
// (set_hash). When its last reference goes, a registered block is not freed
// but parked in an LRU list: it still counts as free, and acquire_cached()
// can revive it for a new sequence with the same prefix. Allocation takes the
// free stack first and only then evicts parked blocks, least recently
// released first (release order within one release_n call is list order).
//
// Block states and invariants (check_invariants()):
//   free:    ref == 0, no hash, on the free stack
//   parked:  ref == 0, hash,    in the LRU list, in the hash index
//   used:    ref >  0, hash or not (hashed ones are in the hash index)
//   num_free() = #free + #parked;  num_used() = num_blocks - num_free()
//   the hash index maps each registered hash to exactly one block, and back.
//
// Errors: an id out of range, releasing or retaining a block that is not in
// use, releasing more references than a block holds (also across one batch):
// std::invalid_argument with the id, and the pool unchanged (batch calls
// validate the whole list before touching anything). Exhaustion: OutOfBlocks
// (an OutOfMemory) from the throwing calls, kNoBlock / false from try_*;
// batch calls are all or nothing.
//
// Thread safety: none; one owner (the scheduler's thread) drives the pool.
// That keeps allocate + release at a few nanoseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base/out_of_memory.h"

namespace torchmem {

using BlockId = int32_t;
constexpr BlockId kNoBlock = -1;

class OutOfBlocks : public OutOfMemory {
 public:
  OutOfBlocks(const std::string& message, const OomInfo& info) : OutOfMemory(message, info) {}
};

struct PagedBlockPoolStats {
  int64_t allocations = 0;   // blocks handed out (copies included)
  int64_t releases = 0;      // references dropped
  int64_t copies = 0;        // copy-on-write copies
  int64_t cache_hits = 0;    // acquire_cached() that found a block
  int64_t cache_misses = 0;  // acquire_cached() that did not
  int64_t evictions = 0;     // parked blocks taken back for allocation
};

class PagedBlockPool {
 public:
  using CopyFn = std::function<void(BlockId src, BlockId dst)>;
  using Copy = std::pair<BlockId, BlockId>;  // (src, dst)

  explicit PagedBlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return free_top_ + num_parked_; }
  int32_t num_parked() const { return num_parked_; }
  int32_t num_used() const { return num_blocks_ - num_free(); }
  int32_t ref_count(BlockId id) const;

  // Single blocks. allocate() pops the free stack (lowest ids first on a
  // fresh pool), else evicts the least recently parked block.
  BlockId allocate();
  BlockId try_allocate();
  void release(BlockId id);
  void retain(BlockId id);  // one more reference to a used block (fork)

  // Batches: all or nothing.
  void allocate_n(size_t n, BlockId* out);
  bool try_allocate_n(size_t n, BlockId* out);
  void release_n(const BlockId* ids, size_t n);
  void retain_n(const BlockId* ids, size_t n);

  // Copy-on-write. If `id` is used by one holder it is returned as is (and
  // loses its hash: its contents are about to change). Otherwise a new block
  // is allocated, copy(id, new) is called, the caller's reference to `id` is
  // dropped and the new block returned. If allocation or copy throws, the
  // pool is unchanged.
  BlockId make_writable(BlockId id, const CopyFn& copy);
  // Batch form for one step: allocates n_new fresh blocks into new_out and
  // makes each of last[0..n_last) writable in place (entries are processed in
  // order, as n_last calls would be); the copies to perform are appended to
  // `copies` for the caller to do (one tensor copy for the whole batch).
  // All or nothing: on OutOfBlocks or invalid_argument nothing changed.
  void allocate_and_make_writable(size_t n_new, BlockId* new_out, BlockId* last, size_t n_last,
                                  std::vector<Copy>* copies);

  // Prefix cache. set_hash registers a used block under `hash`; it returns
  // false (and changes nothing) if another block already holds that hash.
  bool set_hash(BlockId id, uint64_t hash);
  // Looks `hash` up; on a hit takes one reference (reviving a parked block)
  // and returns the block, else kNoBlock.
  BlockId acquire_cached(uint64_t hash);
  BlockId lookup(uint64_t hash) const;
  bool has_hash(BlockId id) const;

  const PagedBlockPoolStats& stats() const { return stats_; }
  // Throws std::logic_error describing the first broken invariant.
  void check_invariants() const;

 private:
  void check_id(BlockId id, const char* what) const;
  void check_used(BlockId id, const char* what) const;
  [[noreturn]] void throw_exhausted(size_t wanted) const;
  BlockId pop_block();
  void drop_ref(BlockId id);
  void unhash(BlockId id);
  void lru_push_back(BlockId id);
  void lru_unlink(BlockId id);
  // Validates that ids[0..n) can each drop (or take) one reference.
  void validate_batch(const BlockId* ids, size_t n, const char* what, bool releasing) const;

  const int32_t num_blocks_;
  std::vector<int32_t> ref_;
  std::vector<BlockId> free_;    // free stack, free_[0..free_top_)
  int32_t free_top_ = 0;
  // Parked blocks: a doubly linked LRU list through prev_/next_, with a
  // sentinel at index num_blocks_ (head = least recently parked).
  std::vector<BlockId> prev_, next_;
  int32_t num_parked_ = 0;
  std::vector<uint64_t> hash_;
  std::vector<uint8_t> hashed_;
  std::unordered_map<uint64_t, BlockId> index_;
  mutable std::vector<int32_t> scratch_;  // per-block counters for batch checks
  PagedBlockPoolStats stats_;
};

}  // namespace torchmem
