// Blocks and free-block pools of the caching allocator.
//
// A segment is one range taken from the device; it is tiled by a doubly
// linked list of blocks in address order (prev/next). A block is either
// allocated (in CachingAllocator::live_blocks_; free_requested while its
// free waits for other streams) or free (in exactly one BlockPool). Invariants (checked by CachingAllocator::check_invariants):
//   block.addr + block.size == block.next->addr
//   !(free(block) && free(block.next))           -- free neighbours merge
//   block in pool  <=>  !block.allocated  (pool.blocks if mapped, else pool.unmapped)
//   block in pool.blocks  =>  block.pool_pos->block == block, its key key_of(block)
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <set>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/always_inline.h"
#include "core/base/node_pool.h"
#include "core/base/segment_info.h"
#include "core/devices/device.h"

namespace torchmem {

struct Block;
struct BlockPool;
class ExpandableSegment;

// What the best-fit order compares, of a block or of a search. A search
// key with reuse_rank and addr 0 comes before every block of its stream and
// size.
struct BlockKey {
  Stream stream = 0;
  size_t size = 0;
  uint64_t reuse_rank = 0;
  uintptr_t addr = 0;
  bool operator==(const BlockKey& o) const {
    return stream == o.stream && size == o.size && reuse_rank == o.reuse_rank && addr == o.addr;
  }
};

// An entry of a pool's free set: a block and its key. The key sits in the
// entry so that a search compares without loading the block (one load less
// at each level of the tree). It is mutable so that BlockPool::move() can
// change it in place where the order allows. Reads as the Block* it holds.
struct PoolEntry {
  mutable BlockKey key;
  Block* block = nullptr;
  operator Block*() const { return block; }
  Block* operator->() const { return block; }
};

// Best fit: the smallest block of the request's stream that is large enough,
// lowest address first among equals (native), most recently cached first
// (reuse_order recent, Note [CPU settings]), or oldest segment first, then
// lowest address (reuse_order segment: reuse_rank is the segment's rank).
// Transparent: a pool's free set is searched with a BlockKey.
struct BlockBySize {
  using is_transparent = void;
  bool by_rank = false;  // recent or segment
  bool operator()(const BlockKey& a, const BlockKey& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    if (by_rank && a.reuse_rank != b.reuse_rank) return a.reuse_rank < b.reuse_rank;
    return a.addr < b.addr;
  }
  bool operator()(const PoolEntry& a, const PoolEntry& b) const { return (*this)(a.key, b.key); }
  bool operator()(const PoolEntry& a, const BlockKey& b) const { return (*this)(a.key, b); }
  bool operator()(const BlockKey& a, const PoolEntry& b) const { return (*this)(a, b.key); }
};

using BlockSet = std::set<PoolEntry, BlockBySize, PoolAllocator<PoolEntry>>;

struct Block {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested_size = 0;   // what the caller asked for (allocated blocks)
  Stream stream = 0;
  BlockPool* pool = nullptr;
  bool allocated = false;      // in use: handed out, or its free waits (free_requested)
  bool free_requested = false; // allocated, freed by the caller, still in use on other streams
  bool mapped = true;          // false: pages of an expandable segment not backed yet
  Block* prev = nullptr;
  Block* next = nullptr;
  int64_t gc_count_base = 0;   // pool's get_free_blocks_call_count when cached
  uint64_t reuse_rank = 0;     // recent: smaller is cached more recently (BlockPool::insert); segment: its
                               // segment's rank, kept by splits (0: an expandable segment's, by address)
  ExpandableSegment* expandable = nullptr;
  BlockSet::iterator pool_pos; // its entry in pool->blocks, while it is there (BlockPool::insert)

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

inline BlockKey key_of(const Block* b) { return BlockKey{b->stream, b->size, b->reuse_rank, b->addr}; }

// Address order, for the unmapped tails of expandable segments.
struct BlockByAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->addr < b->addr;
  }
};

// The free blocks of one pool. Every change to `blocks` goes through
// insert(), erase() and move(), which keep each block's pool_pos: erasing
// or moving a block needs no search.
struct BlockPool {
  BlockPool(bool small, NodePool* nodes, ReuseOrder order = ReuseOrder::kAddress)
      : blocks(BlockBySize{order != ReuseOrder::kAddress}, PoolAllocator<PoolEntry>(nodes)),
        unmapped(BlockByAddress{}, PoolAllocator<Block*>(nodes)),
        is_small(small),
        ranks_by_recency(order == ReuseOrder::kRecent) {}
  BlockSet blocks;                                                    // free, mapped blocks
  std::set<Block*, BlockByAddress, PoolAllocator<Block*>> unmapped;   // free, unmapped ranges of expandable segments
  const bool is_small;
  const bool ranks_by_recency;             // reuse_order recent: insert() ranks the block as the newest
  int64_t get_free_blocks_call_count = 0;  // ages blocks for garbage collection
  uint64_t next_reuse_rank = UINT64_MAX;   // counts down: the newest block ranks first

  // Caches a free, mapped block: it ages from now and ranks as the newest.
  void insert(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    if (ranks_by_recency) block->reuse_rank = --next_reuse_rank;
    block->pool_pos = blocks.insert(PoolEntry{key_of(block), block}).first;
  }
  // Takes a cached block out (of `unmapped` when it is not mapped).
  void erase(Block* block) {
    if (block->mapped) blocks.erase(block->pool_pos);
    else unmapped.erase(block);
  }
  // A cached, mapped block takes the bounds [addr, addr + size), size !=
  // block->size (a split's remainder, or a merge): the same state as
  // erase(), the change, then insert(). The entry stays where it
  // is, with no tree change, when the new key keeps its place between its
  // neighbours in the order (the common split and merge).
  TORCHMEM_ALWAYS_INLINE void move(Block* block, uintptr_t addr, size_t size) {
    const BlockKey key{block->stream, size, ranks_by_recency ? next_reuse_rank - 1 : block->reuse_rank,
                       addr};  // the rank insert() would give
    // Size comes before the rank and the address in the order: a smaller
    // block can only pass its lower neighbour, a larger one its upper one.
    const BlockBySize& less = blocks.key_comp();
    const auto pos = block->pool_pos;
    bool keeps_place;
    if (size < block->size) {
      keeps_place = pos == blocks.begin() || less(*std::prev(pos), key);
    } else {
      const auto after = std::next(pos);
      keeps_place = after == blocks.end() || less(key, *after);
    }
    block->addr = addr;
    block->size = size;
    if (!keeps_place) return reinsert(block);
    block->gc_count_base = get_free_blocks_call_count;
    if (ranks_by_recency) --next_reuse_rank;
    block->reuse_rank = key.reuse_rank;
    pos->key = key;
  }

 private:
  // move()'s other case: the block's entry goes, and insert() places it anew.
  void reinsert(Block* block) {
    blocks.erase(block->pool_pos);
    insert(block);
  }
};

}  // namespace torchmem
