// Time structure shared by the placement algorithms.
//
// Sections: the distinct endpoints t_0 < t_1 < ... < t_S split time into S
// sections [t_k, t_k+1). Buffer b spans sections [first[b], last[b]) and is
// live in exactly those. Two buffers overlap in time iff their section
// ranges intersect.
//
// OverlapIndex enumerates the buffers that overlap one buffer in time,
// output-sensitive: O((k + 1) log n) for k overlaps, O(n) memory, without
// materialising all pairs (a real trace can have 10^8 of them).
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

struct Sections {
  std::vector<Time> times;     // distinct endpoints, ascending
  std::vector<int32_t> first;  // per buffer
  std::vector<int32_t> last;   // per buffer, exclusive
  int32_t count() const { return times.empty() ? 0 : int32_t(times.size()) - 1; }
};

Sections make_sections(const std::vector<Buffer>& buffers);

// Number of pairs of buffers that overlap in time, O(n log n).
int64_t count_overlapping_pairs(const std::vector<Buffer>& buffers);

class OverlapIndex {
 public:
  // all_active: every buffer is reported; otherwise only those passed to
  // activate() (e.g. the buffers placed so far).
  explicit OverlapIndex(const std::vector<Buffer>& buffers, bool all_active = true);

  void activate(int32_t b);

  // Calls fn(j) for every j != b whose lifetime overlaps buffer b's.
  template <typename Fn>
  void for_each_overlap(int32_t b, Fn&& fn) const {
    const Time lo = (*buffers_)[b].lower;
    const Time hi = (*buffers_)[b].upper;
    // Positions [0, r) start before hi; of those, report upper > lo.
    int32_t r = upper_position(hi);
    if (r > 0) visit(1, 0, size_, r, lo, b, fn);
  }

 private:
  int32_t upper_position(Time hi) const;  // first position with lower >= hi
  template <typename Fn>
  void visit(int32_t node, int32_t nl, int32_t nr, int32_t r, Time lo, int32_t b, Fn& fn) const {
    if (nl >= r || max_upper_[node] <= lo) return;
    if (nr - nl == 1) {
      if (order_[nl] != b) fn(order_[nl]);
      return;
    }
    const int32_t mid = (nl + nr) / 2;
    visit(2 * node, nl, mid, r, lo, b, fn);
    visit(2 * node + 1, mid, nr, r, lo, b, fn);
  }

  const std::vector<Buffer>* buffers_;
  int32_t size_ = 0;
  std::vector<int32_t> order_;      // buffer indices by lower
  std::vector<Time> lowers_;        // lowers in that order
  std::vector<Time> max_upper_;     // segment tree over order_ (INT64_MIN: inactive)
  std::vector<int32_t> position_;   // buffer index -> position in order_
};

}  // namespace torchmem::planner
