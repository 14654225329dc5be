// The input and output of static memory planning.
//
// A Buffer lives over the half-open time interval [lower, upper) and needs
// `size` contiguous bytes. A placement gives every buffer an offset; it is
// valid when any two buffers that overlap in time occupy disjoint byte
// ranges [offset, offset + size). Two buffers where one ends at t and the
// other starts at t do not overlap and may share bytes. The height of a
// placement is max(offset + size); the planner minimises it.
//
// Invariants checked by check_buffers(): size >= 0, lower < upper.
// Zero-size buffers are legal; they sit at offset 0 and never conflict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchmem::planner {

using Offset = int64_t;
using Time = int64_t;

struct Buffer {
  int64_t id = 0;
  Time lower = 0;
  Time upper = 0;
  int64_t size = 0;
};

// Throws std::invalid_argument naming the first bad buffer.
void check_buffers(const std::vector<Buffer>& buffers);

// max(offset + size) over buffers, 0 when empty.
Offset height_of(const std::vector<Buffer>& buffers, const std::vector<Offset>& offsets);

// Sizes rounded up to a multiple of `alignment` (>= 1). Placements of the
// padded buffers made by this planner use offsets that are sums of padded
// sizes, hence multiples of the alignment.
std::vector<Buffer> pad_sizes(const std::vector<Buffer>& buffers, int64_t alignment);

// Greatest common divisor of the non-zero sizes (1 when none): every height
// of a canonical placement is a multiple of it.
int64_t size_granularity(const std::vector<Buffer>& buffers);

}  // namespace torchmem::planner
