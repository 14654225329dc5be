// LiveBlockMap: the caching allocator's allocated blocks, by address.
//
// A flat open-addressing hash table (linear probing, backward-shift
// deletion, no tombstones): one probe into one array on the hot path, and
// no heap allocation except when it grows. Keys are block addresses, never 0
// (0 marks an empty slot); each address is in the map at most once.
// Capacity is a power of two, kept at most three quarters full (16 bytes a
// slot: 21-43 bytes per live block), so a lookup touches one or two cache
// lines.
//
// Not thread safe: the owner uses it under its own lock. Iteration order is
// unspecified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/always_inline.h"

namespace torchmem {

struct Block;

class LiveBlockMap {
 public:
  LiveBlockMap() : slots_(kInitialCapacity) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // `addr` must not be in the map, and must not be 0.
  TORCHMEM_ALWAYS_INLINE void insert(uintptr_t addr, Block* block) {
    if (size_ >= limit_) grow();
    place(addr, block);
    ++size_;
  }

  // The block at `addr`, or null.
  Block* find(uintptr_t addr) const {
    const size_t mask = mask_;
    for (size_t i = index(addr); ; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.addr == addr) return s.block;
      if (s.addr == 0) return nullptr;
    }
  }

  // Removes the block at `addr` and returns it, or returns null.
  TORCHMEM_ALWAYS_INLINE Block* take(uintptr_t addr) {
    const size_t mask = mask_;
    size_t i = index(addr);
    while (slots_[i].addr != addr) {
      if (slots_[i].addr == 0) return nullptr;
      i = (i + 1) & mask;
    }
    Block* block = slots_[i].block;
    close_gap(i);
    --size_;
    return block;
  }

  template <typename F>
  void for_each(F f) const {
    for (const Slot& s : slots_) {
      if (s.addr != 0) f(s.block);
    }
  }

 private:
  struct Slot {
    uintptr_t addr = 0;
    Block* block = nullptr;
  };
  static constexpr size_t kInitialCapacity = 256;

  // Blocks are at least 64-byte aligned: drop those bits, then mix.
  size_t index(uintptr_t addr) const {
    return static_cast<size_t>(((addr >> 6) * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }

  void place(uintptr_t addr, Block* block) {
    const size_t mask = mask_;
    size_t i = index(addr);
    while (slots_[i].addr != 0) i = (i + 1) & mask;
    slots_[i] = Slot{addr, block};
  }

  // Backward-shift deletion: moves later entries of the probe run into the
  // gap at `hole` when their home slot allows it.
  void close_gap(size_t hole) {
    const size_t mask = mask_;
    for (size_t j = (hole + 1) & mask; slots_[j].addr != 0; j = (j + 1) & mask) {
      const size_t home = index(slots_[j].addr);
      const bool movable = ((j - home) & mask) >= ((j - hole) & mask);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    limit_ = slots_.size() / 4 * 3;
    for (const Slot& s : old) {
      if (s.addr != 0) place(s.addr, s.block);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = kInitialCapacity - 1;          // slots_.size() - 1
  size_t limit_ = kInitialCapacity / 4 * 3;     // the size at which insert() grows the table first
  size_t size_ = 0;
};

}  // namespace torchmem
