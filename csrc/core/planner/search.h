// Exact search for placements (branch and bound over canonical placements).
//
// Decision problem: place every buffer below `capacity`. A placement is
// canonical when buffers are placed in non-decreasing offset order, each at
// its floor (the highest top among placed buffers that overlap it in time);
// every feasible placement can be pushed down into a canonical one, so the
// search is complete over canonical placements. At each node the candidates
// are the unplaced buffers ordered by (floor, preorder rank); the search
// prunes by:
//   - canonical order: a candidate must not precede the previous choice in
//     (floor, rank) order;
//   - dominance: a candidate whose floor is at or above the lowest top some
//     other unplaced buffer could reach would leave a gap that buffer fits in;
//   - section inference: in every section, max(floor of the section, the
//     current offset) + the bytes still unplaced there must fit in capacity,
//     where a section's floor is at least the lowest floor of the unplaced
//     buffers that live in it;
//   - decomposition: when no unplaced buffer crosses a section boundary, the
//     two sides are independent subproblems, solved one after the other.
// Several preorders are raced round robin under a node limit that doubles.
//
// Memory is O(pairs of buffers overlapping in time); callers check
// count_overlapping_pairs() first.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

enum class SearchStatus { kFound, kInfeasible, kLimit };

struct SearchLimits {
  double deadline = 0;        // steady-clock seconds (seconds_now()); 0 = none
  int64_t node_limit = -1;    // total search nodes for this call; -1 = none
  const std::atomic<bool>* cancel = nullptr;
};

// steady_clock seconds, the clock SearchLimits::deadline uses.
double seconds_now();

struct SearchResult {
  SearchStatus status = SearchStatus::kLimit;
  std::vector<Offset> offsets;  // when kFound: a placement with height <= capacity
  int64_t nodes = 0;
};

// Zero-size buffers are placed at 0. Preorders are letter strings (preorder.h).
SearchResult search_capacity(const std::vector<Buffer>& buffers, Offset capacity,
                             const std::vector<std::string>& preorders, const SearchLimits& limits);

// Minimisation: starting from an incumbent placement, repeatedly solves the
// decision problem below the incumbent's height until the deadline, a proof
// of optimality (decision infeasible at incumbent - granularity, or the
// incumbent reaches lower_bound), or cancellation. `on_improve(height)` is
// called after every improvement.
struct MinimizeResult {
  std::vector<Offset> offsets;
  Offset height = 0;
  bool optimal = false;
  int64_t nodes = 0;
};

// Large instances (over kLargeInstance buffers) skip the attempts at the
// bound and search with small node budgets (a dive with a little
// backtracking) under preorder "AZ", the first target halfway from the
// incumbent down to the bound. `preorders` empty: the defaults.
constexpr size_t kLargeInstance = 2000;

MinimizeResult search_minimize(const std::vector<Buffer>& buffers, std::vector<Offset> incumbent,
                               Offset lower_bound, const SearchLimits& limits,
                               const std::function<void(Offset)>& on_improve = {},
                               const std::vector<std::string>& preorders = {});

}  // namespace torchmem::planner
