#include "core/policy/stitch/stitch_range.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace torchmem {

size_t Fenwick::find_kth(int64_t k) const {
  const size_t n = tree_.size() - 1;
  size_t step = 1;
  while (step * 2 <= n) step *= 2;
  size_t pos = 0;
  for (; step > 0; step >>= 1) {
    if (pos + step <= n && tree_[pos + step] < k) {
      pos += step;
      k -= tree_[pos];
    }
  }
  return pos;  // 0-based index of the element; n when k exceeds the total
}

StitchRange::StitchRange(Device& device, Stream stream, bool is_small, size_t page_size, size_t pages)
    : device_(device),
      stream_(stream),
      is_small_(is_small),
      page_size_(page_size),
      pages_(pages),
      live_(pages, 0),
      mapped_(pages, 0),
      mapped_tree_(pages),
      cached_tree_(pages) {
  base_ = device_.reserve(pages * page_size);
  if (base_ == 0) throw std::runtime_error("stitch policy: the device could not reserve an address range");
  if (base_ % page_size != 0) {
    device_.release(base_, pages * page_size);
    throw std::runtime_error("stitch policy: the device reserved a range off its page grid");
  }
}

StitchRange::~StitchRange() {
  for (size_t i = 0; i < pages_; ++i) {
    if (mapped_[i]) device_.unmap(page_addr(i), page_size_);
  }
  device_.release(base_, size());
}

size_t StitchRange::highest_cached_below(size_t below) const {
  const int64_t k = cached_tree_.prefix(below);
  return k == 0 ? pages_ : cached_tree_.find_kth(k);
}

size_t StitchRange::next_mapped(size_t from) const {
  if (from >= pages_) return pages_;
  if (mapped_[from]) return from;
  return mapped_tree_.find_kth(mapped_tree_.prefix(from) + 1);
}

void StitchRange::set_live(size_t i, uint32_t value) {
  const bool was_cached = mapped_[i] && live_[i] == 0;
  live_[i] = value;
  const bool is_cached = mapped_[i] && value == 0;
  if (was_cached != is_cached) cached_tree_.add(i, is_cached ? 1 : -1);
}

void StitchRange::add_live(uintptr_t addr, size_t size) {
  const uintptr_t end = addr + size;
  for (size_t i = first_page(addr); i < end_page(addr, size); ++i) {
    const uintptr_t lo = std::max(addr, page_addr(i));
    const uintptr_t hi = std::min(end, page_addr(i) + page_size_);
    set_live(i, live_[i] + static_cast<uint32_t>(hi - lo));
  }
}

void StitchRange::remove_live(uintptr_t addr, size_t size) {
  const uintptr_t end = addr + size;
  for (size_t i = first_page(addr); i < end_page(addr, size); ++i) {
    const uintptr_t lo = std::max(addr, page_addr(i));
    const uintptr_t hi = std::min(end, page_addr(i) + page_size_);
    set_live(i, live_[i] - static_cast<uint32_t>(hi - lo));
  }
}

bool StitchRange::map_page(size_t i) {
  if (mapped_[i]) return true;
  if (!device_.map(page_addr(i), page_size_)) return false;
  mapped_[i] = 1;
  mapped_tree_.add(i, 1);
  if (live_[i] == 0) cached_tree_.add(i, 1);
  return true;
}

void StitchRange::unmap_page(size_t i) {
  if (!mapped_[i]) return;
  if (live_[i] != 0) throw std::logic_error("stitch policy: unmap of a page that holds live blocks");
  device_.unmap(page_addr(i), page_size_);
  mapped_[i] = 0;
  mapped_tree_.add(i, -1);
  cached_tree_.add(i, -1);
}

void StitchRange::check() const {
  auto fail = [&](const std::string& what) {
    throw std::logic_error("stitch range invariant broken: " + what);
  };
  Fenwick mapped(pages_), cached(pages_);
  for (size_t i = 0; i < pages_; ++i) {
    if (live_[i] > page_size_) fail("page " + std::to_string(i) + " holds more live bytes than a page");
    if (live_[i] > 0 && !mapped_[i]) fail("page " + std::to_string(i) + " holds live bytes and is not mapped");
    if (mapped_[i]) mapped.add(i, 1);
    if (mapped_[i] && live_[i] == 0) cached.add(i, 1);
  }
  if (!(mapped == mapped_tree_)) fail("the mapped-page counts differ from the pages");
  if (!(cached == cached_tree_)) fail("the cached-page counts differ from the pages");
}

}  // namespace torchmem
