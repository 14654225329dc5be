#include "core/planner/bottom_up.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include "core/planner/preorder.h"

namespace torchmem::planner {

namespace {

// Range max, range assign (the assigned value is >= every value in range).
class Skyline {
 public:
  explicit Skyline(int32_t n) : n_(std::max(n, 1)), max_(4 * n_, 0), lazy_(4 * n_, -1) {}
  Offset query(int32_t l, int32_t r) { return query(1, 0, n_, l, r); }
  void assign(int32_t l, int32_t r, Offset v) { assign(1, 0, n_, l, r, v); }

 private:
  void push(int32_t node) {
    if (lazy_[node] < 0) return;
    for (int32_t c : {2 * node, 2 * node + 1}) max_[c] = lazy_[c] = lazy_[node];
    lazy_[node] = -1;
  }
  Offset query(int32_t node, int32_t nl, int32_t nr, int32_t l, int32_t r) {
    if (r <= nl || nr <= l) return 0;
    if (l <= nl && nr <= r) return max_[node];
    push(node);
    const int32_t m = (nl + nr) / 2;
    return std::max(query(2 * node, nl, m, l, r), query(2 * node + 1, m, nr, l, r));
  }
  void assign(int32_t node, int32_t nl, int32_t nr, int32_t l, int32_t r, Offset v) {
    if (r <= nl || nr <= l) return;
    if (l <= nl && nr <= r) {
      max_[node] = lazy_[node] = v;
      return;
    }
    push(node);
    const int32_t m = (nl + nr) / 2;
    assign(2 * node, nl, m, l, r, v);
    assign(2 * node + 1, m, nr, l, r, v);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]);
  }

  int32_t n_;
  std::vector<Offset> max_;
  std::vector<Offset> lazy_;
};

}  // namespace

std::vector<Offset> place_bottom_up(const std::vector<Buffer>& buffers, const Sections& sections,
                                    const std::vector<int32_t>& order) {
  const std::vector<int32_t> rank = ranks_of(order);
  std::vector<Offset> offsets(buffers.size(), 0);
  Skyline sky(sections.count());
  using Entry = std::tuple<Offset, int32_t, int32_t>;  // (floor, rank, index)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int32_t b : order) {
    if (buffers[b].size > 0) heap.emplace(0, rank[b], b);
  }
  while (!heap.empty()) {
    const auto [floor, r, b] = heap.top();
    heap.pop();
    const Offset now = sky.query(sections.first[b], sections.last[b]);
    if (now > floor) {
      heap.emplace(now, r, b);
      continue;
    }
    offsets[b] = now;
    sky.assign(sections.first[b], sections.last[b], now + buffers[b].size);
  }
  return offsets;
}

}  // namespace torchmem::planner
