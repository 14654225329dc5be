#include "core/policy/native/expandable_segment.h"

#include <stdexcept>

namespace torchmem {

ExpandableSegment::ExpandableSegment(Device& device, Stream stream, size_t page_size, size_t max_pages)
    : device_(device), stream_(stream), page_size_(page_size), mapped_(max_pages, false) {
  base_ = device_.reserve(page_size_ * max_pages);
  if (base_ == 0) throw std::runtime_error("expandable segment: the device could not reserve an address range");
}

ExpandableSegment::~ExpandableSegment() {
  unmap_runs(0, mapped_.size());
  device_.release(base_, size());
}

// Calls f(first, last) for each run of pages [first, last) in [begin, end)
// whose mapped state is `mapped`.
template <typename F>
void ExpandableSegment::for_each_run(size_t begin, size_t end, bool mapped, F f) const {
  for (size_t i = begin; i < end;) {
    if (mapped_[i] != mapped) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < end && mapped_[j] == mapped) ++j;
    f(i, j);
    i = j;
  }
}

// One device call per run of mapped pages (one wait for the device each).
void ExpandableSegment::unmap_runs(size_t begin, size_t end) {
  for_each_run(begin, end, true, [&](size_t first, size_t last) {
    device_.unmap(base_ + first * page_size_, (last - first) * page_size_);
  });
  for (size_t i = begin; i < end; ++i) mapped_[i] = false;
}

SegmentRange ExpandableSegment::map(uintptr_t addr, size_t size) {
  const size_t begin = page_left(addr);
  const size_t end = page_right(addr + size);
  // One device call per run of unmapped pages, so the device maps them in
  // one batch; on failure the runs mapped by this call are unmapped.
  std::vector<std::pair<size_t, size_t>> runs;
  for_each_run(begin, end, false, [&](size_t first, size_t last) { runs.emplace_back(first, last); });
  for (size_t k = 0; k < runs.size(); ++k) {
    auto [first, last] = runs[k];
    if (!device_.map(base_ + first * page_size_, (last - first) * page_size_)) {
      for (size_t m = 0; m < k; ++m) {
        device_.unmap(base_ + runs[m].first * page_size_, (runs[m].second - runs[m].first) * page_size_);
        for (size_t i = runs[m].first; i < runs[m].second; ++i) mapped_[i] = false;
      }
      return {addr, 0};
    }
    for (size_t i = first; i < last; ++i) mapped_[i] = true;
  }
  return pages(begin, end);
}

SegmentRange ExpandableSegment::unmap(uintptr_t addr, size_t size) {
  const size_t begin = page_right(addr);
  const size_t end = page_left(addr + size);
  if (begin >= end) return {addr, 0};
  unmap_runs(begin, end);
  return pages(begin, end);
}

size_t ExpandableSegment::mapped_bytes() const {
  size_t n = 0;
  for (bool m : mapped_) n += m;
  return n * page_size_;
}

}  // namespace torchmem
