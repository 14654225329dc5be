// RangeMaxTree<T>: add a value to every cell of a range, and ask the largest
// cell of a range, over cells [0, n): a lazy segment tree, O(log n) a call.
// Ranges are half-open [l, r); max() of an empty range is the lowest T.
// Not thread safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace torchmem::planner {

template <typename T>
class RangeMaxTree {
 public:
  // Cells start at 0.
  explicit RangeMaxTree(int32_t cells) : RangeMaxTree(std::vector<T>(std::max<int32_t>(cells, 1), T(0))) {}
  // Cells start at values (n = values.size()).
  explicit RangeMaxTree(const std::vector<T>& values)
      : n_(std::max<int32_t>(int32_t(values.size()), 1)), max_(4 * size_t(n_), T(0)), add_(4 * size_t(n_), T(0)) {
    build(1, 0, n_, values);
  }

  T max(int32_t l, int32_t r) const { return max(1, 0, n_, l, r); }
  void add(int32_t l, int32_t r, T v) { add(1, 0, n_, l, r, v); }

 private:
  void build(int32_t node, int32_t nl, int32_t nr, const std::vector<T>& values) {
    if (nr - nl == 1) {
      max_[node] = nl < int32_t(values.size()) ? values[nl] : T(0);
      return;
    }
    const int32_t m = (nl + nr) / 2;
    build(2 * node, nl, m, values);
    build(2 * node + 1, m, nr, values);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]);
  }
  T max(int32_t node, int32_t nl, int32_t nr, int32_t l, int32_t r) const {
    if (r <= nl || nr <= l) return std::numeric_limits<T>::lowest();
    if (l <= nl && nr <= r) return max_[node];
    const int32_t m = (nl + nr) / 2;
    return add_[node] + std::max(max(2 * node, nl, m, l, r), max(2 * node + 1, m, nr, l, r));
  }
  void add(int32_t node, int32_t nl, int32_t nr, int32_t l, int32_t r, T v) {
    if (r <= nl || nr <= l) return;
    if (l <= nl && nr <= r) {
      max_[node] += v;
      add_[node] += v;
      return;
    }
    const int32_t m = (nl + nr) / 2;
    add(2 * node, nl, m, l, r, v);
    add(2 * node + 1, m, nr, l, r, v);
    max_[node] = add_[node] + std::max(max_[2 * node], max_[2 * node + 1]);
  }

  int32_t n_;
  std::vector<T> max_, add_;  // max_[node]: largest cell below node, with node's own add_ included
};

}  // namespace torchmem::planner
