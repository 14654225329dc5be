#include "core/planner/planner.h"

#include <algorithm>
#include <stdexcept>

#include "core/planner/bottom_up.h"
#include "core/planner/greedy.h"
#include "core/planner/intervals.h"
#include "core/planner/lower_bound.h"
#include "core/planner/portfolio.h"
#include "core/planner/preorder.h"
#include "core/planner/search.h"
#include "core/planner/sweep_line.h"
#include "core/planner/validate.h"

namespace torchmem::planner {

const std::vector<std::string>& method_names() {
  static const std::vector<std::string> names = {"auto",      "naive",     "greedy", "sweep",
                                                 "bottom_up", "portfolio", "search"};
  return names;
}

Solution solve(const std::vector<Buffer>& input, const SolveOptions& options) {
  const double start = seconds_now();
  const auto& names = method_names();
  if (std::find(names.begin(), names.end(), options.method) == names.end()) {
    throw std::invalid_argument("unknown method '" + options.method + "'");
  }
  if (!(options.time_limit > 0)) throw std::invalid_argument("time limit must be > 0");
  check_buffers(input);
  const std::vector<Buffer> buffers = pad_sizes(input, options.alignment);
  Solution out;
  out.lower_bound = lower_bound(buffers);
  const double deadline = start + options.time_limit;
  auto report = [&](const std::string& phase, Offset height) {
    if (options.progress) options.progress({seconds_now() - start, height, out.lower_bound, phase});
  };
  const std::string& m = options.method;
  if (m == "naive") {
    out.offsets = place_naive(buffers);
  } else if (m == "greedy") {
    out.offsets = place_greedy(buffers);
  } else if (m == "sweep") {
    out.offsets = place_sweep_line(buffers);
  } else if (m == "bottom_up") {
    const Sections s = make_sections(buffers);
    out.offsets = place_bottom_up(buffers, s, preorder(buffers, s, "TLZ"));
  } else {
    // When the search follows, the portfolio gets a third of the time.
    const bool small = count_overlapping_pairs(buffers) <= kSearchMaxPairs;
    const bool searching = (m == "search" || m == "auto") && small;
    PortfolioResult p = place_portfolio(buffers, out.lower_bound,
                                        searching ? start + options.time_limit / 3 : deadline);
    out.offsets = std::move(p.offsets);
    out.method = "portfolio:" + p.member;
    report(out.method, p.height);
    if (searching && p.height > out.lower_bound) {
      SearchLimits limits;
      limits.deadline = deadline;
      limits.cancel = options.cancel;
      const Offset before = p.height;
      MinimizeResult r = search_minimize(buffers, std::move(out.offsets), out.lower_bound, limits,
                                         [&](Offset h) { report("search", h); });
      out.offsets = std::move(r.offsets);
      out.optimal = r.optimal;
      out.nodes = r.nodes;
      if (r.height < before) out.method = "search";
    }
  }
  if (out.method.empty()) out.method = m;
  out.height = height_of(buffers, out.offsets);
  out.optimal = out.optimal || out.height <= out.lower_bound;
  const Validation v = validate(buffers, out.offsets);
  if (!v.ok) throw std::logic_error("planner produced an invalid placement: " + v.message);
  out.seconds = seconds_now() - start;
  return out;
}

}  // namespace torchmem::planner
