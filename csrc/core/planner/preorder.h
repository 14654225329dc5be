// Static preorders: the tie-breaking priority of buffers in the bottom-up
// placements (bottom_up.h, search.h). A preorder is named by letters, each a
// key compared in turn, larger first:
//   T  pressure: the most bytes live at one instant of the buffer's lifetime
//   W  width: the number of sections (distinct endpoints) it spans
//   A  area: size x lifetime length
//   Z  size
//   L  lifetime length
//   H  1 when alive for at least half of the whole horizon, else 0
//   Q  1 when alive for at least a tenth of the whole horizon, else 0
//   P  1 when live at an instant of peak live bytes, else 0
// Ties after all keys go to the lower index.
#pragma once

#include <string>
#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/intervals.h"

namespace torchmem::planner {

// Returns the buffer indices in priority order. Throws std::invalid_argument
// for an unknown letter.
std::vector<int32_t> preorder(const std::vector<Buffer>& buffers, const Sections& sections,
                              const std::string& keys);

// rank[b] = position of b in order.
std::vector<int32_t> ranks_of(const std::vector<int32_t>& order);

}  // namespace torchmem::planner
