// A portfolio of fast placements; keeps the lowest. Members, in order:
// bottom-up placements under preorders AZ, TLZ, QZ (the best on real
// traces), size-first best fit, bottom-up under six more preorders, best
// fit by pressure, the sweep line. Stops early when one reaches the lower
// bound or the deadline passes (after at least one member).
#pragma once

#include <string>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

struct PortfolioResult {
  std::vector<Offset> offsets;
  Offset height = 0;
  std::string member;  // which member produced the placement
};

// deadline: seconds_now() value (search.h), 0 = none.
PortfolioResult place_portfolio(const std::vector<Buffer>& buffers, Offset lower_bound, double deadline = 0);

}  // namespace torchmem::planner
