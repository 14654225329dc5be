#include "core/expandable_segment.h"

#include <stdexcept>

namespace torchmem {

ExpandableSegment::ExpandableSegment(Device& device, Stream stream, size_t page_size, size_t max_pages)
    : device_(device), stream_(stream), page_size_(page_size), mapped_(max_pages, false) {
  base_ = device_.reserve(page_size_ * max_pages);
  if (base_ == 0) throw std::runtime_error("expandable segment: the device could not reserve an address range");
}

ExpandableSegment::~ExpandableSegment() {
  for (size_t i = 0; i < mapped_.size(); ++i) {
    if (mapped_[i]) device_.unmap(base_ + i * page_size_, page_size_);
  }
  device_.release(base_, size());
}

SegmentRange ExpandableSegment::map(uintptr_t addr, size_t size) {
  const size_t begin = page_left(addr);
  const size_t end = page_right(addr + size);
  std::vector<size_t> newly_mapped;
  for (size_t i = begin; i < end; ++i) {
    if (mapped_[i]) continue;
    if (!device_.map(base_ + i * page_size_, page_size_)) {
      for (size_t j : newly_mapped) {
        device_.unmap(base_ + j * page_size_, page_size_);
        mapped_[j] = false;
      }
      return {addr, 0};
    }
    mapped_[i] = true;
    newly_mapped.push_back(i);
  }
  return pages(begin, end);
}

SegmentRange ExpandableSegment::unmap(uintptr_t addr, size_t size) {
  const size_t begin = page_right(addr);
  const size_t end = page_left(addr + size);
  if (begin >= end) return {addr, 0};
  for (size_t i = begin; i < end; ++i) {
    if (mapped_[i]) device_.unmap(base_ + i * page_size_, page_size_);
    mapped_[i] = false;
  }
  return pages(begin, end);
}

size_t ExpandableSegment::mapped_bytes() const {
  size_t n = 0;
  for (bool m : mapped_) n += m;
  return n * page_size_;
}

}  // namespace torchmem
