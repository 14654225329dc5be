// The planner's entry point: validate input, pad for alignment, run one
// method, validate the placement.
//
// Methods:
//   naive      no reuse (prefix sums)
//   greedy     size-first best fit
//   sweep      the online sweep line (time order, best-fit free list)
//   bottom_up  one canonical bottom-up placement (preorder "TLZ")
//   portfolio  the best of the fast methods (portfolio.h)
//   search     portfolio (stopping after the member running at a third of
//              the time limit), then branch and bound (search.h) until
//              optimal or the time limit
//   auto       search when the instance is small enough for it (pairs of
//              time-overlapping buffers <= kSearchMaxPairs; the search
//              keeps its overlap lists in memory), else portfolio
//
// Thread safety: solve() is reentrant; `progress` is called from the
// calling thread. Throws std::invalid_argument for bad input (check_buffers)
// or an unknown method, and std::logic_error if a placement fails
// validation (a bug).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

constexpr int64_t kSearchMaxPairs = 20'000'000;
constexpr double kDefaultTimeLimit = 10.0;

struct Progress {
  double seconds = 0;
  Offset height = 0;
  Offset lower_bound = 0;
  std::string phase;
};

struct SolveOptions {
  std::string method = "auto";
  double time_limit = kDefaultTimeLimit;  // seconds, > 0; bounds the search
  int64_t alignment = 1;                  // offsets and sizes rounded to it
  std::string sharing = "auto";           // with streams only: auto, shared, per_stream (stream_planner.h)
  std::function<void(const Progress&)> progress;
  const std::atomic<bool>* cancel = nullptr;
};

struct Solution {
  std::vector<Offset> offsets;
  Offset height = 0;
  Offset lower_bound = 0;
  std::string method;  // what produced the placement, e.g. "search" or "portfolio:bottom_up:TLZ"
  bool optimal = false;  // height proven minimal (equals the bound, or search proved it)
  double seconds = 0;
  int64_t nodes = 0;   // search nodes
  std::string sharing;  // with streams: "shared" or "per_stream" (stream_planner.h); else empty
};

Solution solve(const std::vector<Buffer>& buffers, const SolveOptions& options = {});

const std::vector<std::string>& method_names();

}  // namespace torchmem::planner
