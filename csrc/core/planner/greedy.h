// Offline placement heuristics that place buffers one at a time.
//
// naive: no reuse; offsets are prefix sums of sizes in input order.
// best_fit: visits buffers in a given order; each goes into the smallest gap
//   (between buffers already placed that overlap it in time) that holds it,
//   the lowest such gap on ties, else on top of them all. With the order
//   "size descending" this is the classic size-first best-fit greedy
//   (TFLite's greedy-by-size). O(sum of overlaps * log) time, O(n) memory.
#pragma once

#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

std::vector<Offset> place_naive(const std::vector<Buffer>& buffers);

std::vector<Offset> place_best_fit(const std::vector<Buffer>& buffers, const std::vector<int32_t>& order);

// The same, but the first `fixed` buffers of `order` keep their offsets in
// `offsets` (which must not conflict) and the rest are placed around them.
std::vector<Offset> place_best_fit_around(const std::vector<Buffer>& buffers, const std::vector<int32_t>& order,
                                          std::vector<Offset> offsets, size_t fixed);

// Orders for best_fit; ties broken by index so results are deterministic.
enum class Order { kSizeDesc, kAreaDesc, kLengthDesc, kLowerAsc, kConflictDesc };
std::vector<int32_t> make_order(const std::vector<Buffer>& buffers, Order order);

// Size-first best fit.
std::vector<Offset> place_greedy(const std::vector<Buffer>& buffers);

}  // namespace torchmem::planner
