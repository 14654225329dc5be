// Bottom-up placement (one dive of the search without backtracking).
//
// Every unplaced buffer has a floor: the highest top among placed buffers
// that overlap it in time. Repeatedly place the unplaced buffer with the
// lowest floor (ties: earliest in `order`) at its floor. Offsets are placed
// in non-decreasing order, so the result is canonical: no buffer can drop.
// The floor of a buffer is a range max over its sections of a skyline, kept
// in a segment tree: O(n log n) plus one heap reinsertion per stale floor.
#pragma once

#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/intervals.h"

namespace torchmem::planner {

std::vector<Offset> place_bottom_up(const std::vector<Buffer>& buffers, const Sections& sections,
                                    const std::vector<int32_t>& order);

}  // namespace torchmem::planner
