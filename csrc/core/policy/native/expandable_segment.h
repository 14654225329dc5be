// Note [Expandable segments]
// With expandable_segments:True, the caching allocator does not ask the
// device for one segment per miss. It reserves one large address range per
// pool and stream (9/8 of the device's capacity, so it never runs out) and
// maps pages into it as the pool grows: 2 MiB pages for the small pool,
// large_segment_size pages (20 MiB by default) for the large pool. Blocks
// of a range are split and merged as usual; pages that become wholly free can
// be unmapped (empty_cache, the out-of-memory retry) without moving anything,
// so one range grows and shrinks instead of leaving fixed-size holes between
// segments.
//
// ExpandableSegment tracks which pages of its range are mapped. Contract:
// - map(addr, size) maps every page touching [addr, addr+size) that is not
//   mapped yet and returns the page-aligned range covering it; on device
//   exhaustion it maps nothing and returns a range of size 0.
// - unmap(addr, size) unmaps only the pages lying wholly inside the range
//   and returns them as one range (size 0 when there are none).
// - The destructor unmaps what is mapped and releases the address range.
// - The device is called once per run of contiguous pages (map and unmap
//   alike), so a multi-page map is one batch and an unmap waits for the
//   device once (CudaDevice), not once per page.
// Not thread safe: the owning allocator calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/segment_info.h"
#include "core/devices/device.h"

namespace torchmem {

class ExpandableSegment {
 public:
  ExpandableSegment(Device& device, Stream stream, size_t page_size, size_t max_pages);
  ~ExpandableSegment();
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  SegmentRange map(uintptr_t addr, size_t size);
  SegmentRange unmap(uintptr_t addr, size_t size);

  uintptr_t base() const { return base_; }
  size_t size() const { return page_size_ * mapped_.size(); }
  size_t page_size() const { return page_size_; }
  size_t mapped_bytes() const;
  Stream stream() const { return stream_; }

 private:
  size_t page_left(uintptr_t addr) const { return (addr - base_) / page_size_; }
  size_t page_right(uintptr_t addr) const { return (addr - base_ + page_size_ - 1) / page_size_; }
  SegmentRange pages(size_t begin, size_t end) const { return {base_ + begin * page_size_, (end - begin) * page_size_}; }
  template <typename F>
  void for_each_run(size_t begin, size_t end, bool mapped, F f) const;
  void unmap_runs(size_t begin, size_t end);

  Device& device_;
  Stream stream_;
  size_t page_size_;
  uintptr_t base_;
  std::vector<bool> mapped_;
};

}  // namespace torchmem
