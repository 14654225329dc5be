#include "core/planner/bottom_up.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include "core/planner/preorder.h"

namespace torchmem::planner {

namespace {

// Range max and range chmax over sections, iterative. Values at a point
// only grow, so a chmax tag on a node never needs pushing down: a point's
// value is the max of the tags on its root path, and `sub` keeps the max
// over a subtree including the tags inside it.
class Skyline {
 public:
  explicit Skyline(int32_t n) : n_(std::max(n, 1)), tag_(2 * n_, 0), sub_(2 * n_, 0) {}

  Offset query(int32_t l, int32_t r) const {
    Offset res = 0;
    for (int32_t p = (l + n_) >> 1; p >= 1; p >>= 1) res = std::max(res, tag_[p]);
    for (int32_t p = (r - 1 + n_) >> 1; p >= 1; p >>= 1) res = std::max(res, tag_[p]);
    for (int32_t a = l + n_, b = r + n_; a < b; a >>= 1, b >>= 1) {
      if (a & 1) res = std::max(res, sub_[a++]);
      if (b & 1) res = std::max(res, sub_[--b]);
    }
    return res;
  }

  void chmax(int32_t l, int32_t r, Offset v) {
    for (int32_t a = l + n_, b = r + n_; a < b; a >>= 1, b >>= 1) {
      if (a & 1) apply(a++, v);
      if (b & 1) apply(--b, v);
    }
    pull(l + n_);
    pull(r - 1 + n_);
  }

 private:
  void apply(int32_t p, Offset v) {
    tag_[p] = std::max(tag_[p], v);
    sub_[p] = std::max(sub_[p], v);
  }
  void pull(int32_t p) {
    for (p >>= 1; p >= 1; p >>= 1) sub_[p] = std::max({sub_[2 * p], sub_[2 * p + 1], tag_[p]});
  }

  int32_t n_;
  std::vector<Offset> tag_;
  std::vector<Offset> sub_;
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
    sky.chmax(sections.first[b], sections.last[b], now + buffers[b].size);
  }
  return offsets;
}

}  // namespace torchmem::planner
