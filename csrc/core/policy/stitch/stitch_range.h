// StitchRange: one reserved virtual range of the stitch policy
// (stitch_allocator.h) and the state of its pages.
//
// The range is [base, base + pages * page_size), reserved from the device at
// construction and released by the destructor (which unmaps what is still
// mapped). Per page it knows:
//   live[i]     bytes of live blocks in the page (0 .. page_size)
//   mapped[i]   whether physical memory is mapped there
// and keeps two counts over page indices, each a Fenwick tree so a sum over
// a span and "the k-th such page" cost O(log pages):
//   mapped pages, and cached pages (mapped with live[i] == 0).
// Invariant (check() throws std::logic_error naming the first broken one):
//   live[i] > 0  =>  mapped[i];  the trees equal their recomputation.
// Not thread safe: the owning allocator calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/devices/device.h"

namespace torchmem {

// Counts over 0..n-1 with O(log n) point updates, prefix sums and k-th search.
class Fenwick {
 public:
  explicit Fenwick(size_t n = 0) : tree_(n + 1, 0) {}
  void add(size_t i, int32_t delta) {
    for (size_t j = i + 1; j < tree_.size(); j += j & (~j + 1)) tree_[j] += delta;
  }
  // Sum over [0, i).
  int64_t prefix(size_t i) const {
    int64_t s = 0;
    for (size_t j = i; j > 0; j -= j & (~j + 1)) s += tree_[j];
    return s;
  }
  int64_t sum(size_t begin, size_t end) const { return prefix(end) - prefix(begin); }
  int64_t total() const { return prefix(tree_.size() - 1); }
  // The index of the k-th counted element (k >= 1, counts are 0 or 1), or n.
  size_t find_kth(int64_t k) const;
  bool operator==(const Fenwick& o) const { return tree_ == o.tree_; }

 private:
  std::vector<int32_t> tree_;
};

class StitchRange {
 public:
  // Reserves pages * page_size bytes; throws std::runtime_error when the
  // device refuses (the caller treats that as out of memory).
  StitchRange(Device& device, Stream stream, bool is_small, size_t page_size, size_t pages);
  ~StitchRange();
  StitchRange(const StitchRange&) = delete;
  StitchRange& operator=(const StitchRange&) = delete;

  uintptr_t base() const { return base_; }
  uintptr_t end() const { return base_ + size(); }
  size_t size() const { return pages_ * page_size_; }
  size_t pages() const { return pages_; }
  size_t page_size() const { return page_size_; }
  Stream stream() const { return stream_; }
  bool is_small() const { return is_small_; }

  size_t page_of(uintptr_t addr) const { return (addr - base_) / page_size_; }
  uintptr_t page_addr(size_t i) const { return base_ + i * page_size_; }
  // Pages touched by [addr, addr + size): [first, last).
  size_t first_page(uintptr_t addr) const { return page_of(addr); }
  size_t end_page(uintptr_t addr, size_t size) const { return (addr + size - base_ + page_size_ - 1) / page_size_; }

  bool mapped(size_t i) const { return mapped_[i] != 0; }
  uint32_t live(size_t i) const { return live_[i]; }
  size_t mapped_pages() const { return static_cast<size_t>(mapped_tree_.total()); }
  size_t mapped_in(size_t begin, size_t end) const { return static_cast<size_t>(mapped_tree_.sum(begin, end)); }
  size_t cached_pages() const { return static_cast<size_t>(cached_tree_.total()); }
  size_t cached_in(size_t begin, size_t end) const { return static_cast<size_t>(cached_tree_.sum(begin, end)); }
  // The highest cached page below `below` (exclusive), or pages() if none.
  size_t highest_cached_below(size_t below) const;
  // The first mapped page at or after `from`, or pages() if none.
  size_t next_mapped(size_t from) const;

  // Adds (or removes) the bytes of a live block to the pages it touches.
  void add_live(uintptr_t addr, size_t size);
  void remove_live(uintptr_t addr, size_t size);

  // One device call per page. map_page() returns false when the device is
  // out of memory (nothing changes then).
  bool map_page(size_t i);
  void unmap_page(size_t i);

  size_t live_blocks = 0;  // allocated blocks in the range, kept by the allocator

  void check() const;

 private:
  void set_live(size_t i, uint32_t value);

  Device& device_;
  Stream stream_;
  bool is_small_;
  size_t page_size_;
  size_t pages_;
  uintptr_t base_ = 0;
  std::vector<uint32_t> live_;
  std::vector<uint8_t> mapped_;
  Fenwick mapped_tree_;
  Fenwick cached_tree_;
};

}  // namespace torchmem
