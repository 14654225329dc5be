// Blocks and free-block pools of the caching allocator.
//
// A segment is one range taken from the device; it is tiled by a doubly
// linked list of blocks in address order (prev/next). A block is either
// allocated (in CachingAllocator::live_blocks_; free_requested while its
// free waits for other streams) or free (in exactly one BlockPool). Invariants (checked by CachingAllocator::check_invariants):
//   block.addr + block.size == block.next->addr
//   !(free(block) && free(block.next))           -- free neighbours merge
//   block in pool  <=>  !block.allocated  (pool.blocks if mapped, else pool.unmapped)
//   block in pool.blocks  =>  *block.pool_pos == block
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <set>
#include <vector>

#include "core/alloc_config.h"
#include "core/device.h"
#include "core/node_pool.h"

namespace torchmem {

struct Block;
struct BlockPool;
class ExpandableSegment;

// Best fit: the smallest block of the request's stream that is large enough,
// lowest address first among equals (native), or most recently cached first
// (reuse_order recent, Note [CPU settings]). A search key with addr and
// reuse_rank 0 comes before every block of its stream and size.
struct BlockBySize {
  bool most_recent_first = false;
  bool operator()(const Block* a, const Block* b) const;
};

using BlockSet = std::set<Block*, BlockBySize, PoolAllocator<Block*>>;

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
  uint64_t reuse_rank = 0;     // smaller: cached more recently (BlockPool::insert; reuse_order recent)
  ExpandableSegment* expandable = nullptr;
  BlockSet::iterator pool_pos; // its entry in pool->blocks, while it is there (BlockPool::insert)

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

inline bool BlockBySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  if (most_recent_first) return a->reuse_rank < b->reuse_rank;
  return a->addr < b->addr;
}

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
      : blocks(BlockBySize{order == ReuseOrder::kRecent}, PoolAllocator<Block*>(nodes)),
        unmapped(BlockByAddress{}, PoolAllocator<Block*>(nodes)),
        is_small(small) {}
  BlockSet blocks;                                                    // free, mapped blocks
  std::set<Block*, BlockByAddress, PoolAllocator<Block*>> unmapped;   // free, unmapped ranges of expandable segments
  const bool is_small;
  int64_t get_free_blocks_call_count = 0;  // ages blocks for garbage collection
  uint64_t next_reuse_rank = UINT64_MAX;   // counts down: the newest block ranks first

  // Caches a free, mapped block: it ages from now and ranks as the newest.
  void insert(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    block->reuse_rank = --next_reuse_rank;
    block->pool_pos = blocks.insert(block).first;
  }
  // Takes a cached block out (of `unmapped` when it is not mapped).
  void erase(Block* block) {
    if (block->mapped) blocks.erase(block->pool_pos);
    else unmapped.erase(block);
  }
  // A cached, mapped block takes the bounds [addr, addr + size): the same
  // state as erase(), the change, then insert(). The entry stays where it
  // is, with no tree change, when the new key keeps its place between its
  // neighbours in the order (the common split and merge).
  void move(Block* block, uintptr_t addr, size_t size) {
    Block key;
    key.stream = block->stream;
    key.size = size;
    key.addr = addr;
    key.reuse_rank = next_reuse_rank - 1;  // the rank insert() would give
    // Size comes before the rank and the address in the order: a smaller
    // block can only pass its lower neighbour, a larger one its upper one.
    const BlockBySize& less = blocks.key_comp();
    const auto pos = block->pool_pos;
    const bool below_next = size < block->size || block == *blocks.rbegin() || less(&key, *std::next(pos));
    const bool above_prev = size > block->size || pos == blocks.begin() || less(*std::prev(pos), &key);
    const bool keeps_place = below_next && above_prev;
    if (!keeps_place) blocks.erase(pos);
    block->addr = addr;
    block->size = size;
    if (keeps_place) {
      block->gc_count_base = get_free_blocks_call_count;
      block->reuse_rank = --next_reuse_rank;
    } else {
      insert(block);
    }
  }
};

// Plain data for snapshots (torch.cuda.memory._snapshot()'s segments).
struct BlockInfo {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested_size = 0;
  bool allocated = false;      // live: handed out and not freed
  bool mapped = true;
  bool active = false;         // allocated, or freed and waiting for other streams
};

struct SegmentInfo {
  uintptr_t addr = 0;
  size_t total_size = 0;
  Stream stream = 0;
  bool is_small = false;
  bool is_expandable = false;
  size_t allocated_size = 0;
  size_t requested_size = 0;
  std::vector<BlockInfo> blocks;
};

}  // namespace torchmem
