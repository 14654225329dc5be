// The sweep line: an online allocator replayed over the buffers' events in
// time order (frees before allocations at equal times, since lifetimes are
// half-open; larger allocations first among equal times). Free space is an
// address-ordered list of holes below the current top; a request takes the
// best-fitting hole (smallest that holds it, lowest address on ties), else
// grows the top (reusing a hole that touches the top); a free merges with
// its free neighbours. It sees no future, so it is the baseline a dynamic
// allocator with perfect reuse would reach. O(n log n).
#pragma once

#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

std::vector<Offset> place_sweep_line(const std::vector<Buffer>& buffers);

}  // namespace torchmem::planner
