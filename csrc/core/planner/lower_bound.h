// The lower bound on any placement's height: the most bytes live at one
// instant. With half-open lifetimes a buffer ending at t is not live at t.
#pragma once

#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

// O(n log n). 0 for no buffers.
Offset lower_bound(const std::vector<Buffer>& buffers);

// Live bytes over time: (time, bytes live from this time until the next
// entry's time), one entry per distinct endpoint, in time order.
std::vector<std::pair<Time, Offset>> live_profile(const std::vector<Buffer>& buffers);

}  // namespace torchmem::planner
