#include "core/planner/intervals.h"

#include <algorithm>
#include <numeric>

namespace torchmem::planner {

Sections make_sections(const std::vector<Buffer>& buffers) {
  Sections s;
  s.times.reserve(buffers.size() * 2);
  for (const Buffer& b : buffers) {
    s.times.push_back(b.lower);
    s.times.push_back(b.upper);
  }
  std::sort(s.times.begin(), s.times.end());
  s.times.erase(std::unique(s.times.begin(), s.times.end()), s.times.end());
  s.first.resize(buffers.size());
  s.last.resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    s.first[i] = int32_t(std::lower_bound(s.times.begin(), s.times.end(), buffers[i].lower) - s.times.begin());
    s.last[i] = int32_t(std::lower_bound(s.times.begin(), s.times.end(), buffers[i].upper) - s.times.begin());
  }
  return s;
}

int64_t count_overlapping_pairs(const std::vector<Buffer>& buffers) {
  std::vector<std::pair<Time, int>> events;
  events.reserve(buffers.size() * 2);
  for (const Buffer& b : buffers) {
    events.emplace_back(b.lower, 1);
    events.emplace_back(b.upper, -1);
  }
  std::sort(events.begin(), events.end());  // ends (-1) before starts at equal times
  int64_t live = 0, pairs = 0;
  for (const auto& [t, d] : events) {
    if (d > 0) pairs += live;
    live += d;
  }
  return pairs;
}

OverlapIndex::OverlapIndex(const std::vector<Buffer>& buffers, bool all_active) : buffers_(&buffers) {
  const int32_t n = int32_t(buffers.size());
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return buffers[a].lower != buffers[b].lower ? buffers[a].lower < buffers[b].lower : a < b;
  });
  lowers_.resize(n);
  for (int32_t i = 0; i < n; ++i) lowers_[i] = buffers[order_[i]].lower;
  size_ = std::max(n, 1);
  max_upper_.assign(4 * size_, INT64_MIN);
  struct Build {
    const std::vector<Buffer>& bs;
    const std::vector<int32_t>& order;
    std::vector<Time>& tree;
    void operator()(int32_t node, int32_t l, int32_t r) {
      if (r - l == 1) {
        tree[node] = l < int32_t(order.size()) ? bs[order[l]].upper : INT64_MIN;
        return;
      }
      const int32_t m = (l + r) / 2;
      (*this)(2 * node, l, m);
      (*this)(2 * node + 1, m, r);
      tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
    }
  };
  position_.resize(n);
  for (int32_t i = 0; i < n; ++i) position_[order_[i]] = i;
  if (all_active) Build{buffers, order_, max_upper_}(1, 0, size_);
}

void OverlapIndex::activate(int32_t b) {
  const Time upper = (*buffers_)[b].upper;
  int32_t node = 1, l = 0, r = size_;
  const int32_t pos = position_[b];
  while (true) {
    max_upper_[node] = std::max(max_upper_[node], upper);
    if (r - l == 1) break;
    const int32_t m = (l + r) / 2;
    if (pos < m) {
      node = 2 * node;
      r = m;
    } else {
      node = 2 * node + 1;
      l = m;
    }
  }
}

int32_t OverlapIndex::upper_position(Time hi) const {
  return int32_t(std::lower_bound(lowers_.begin(), lowers_.end(), hi) - lowers_.begin());
}

}  // namespace torchmem::planner
