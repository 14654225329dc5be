// Conversions between the planner's core types and Python, shared by the
// planner bindings (planner_bindings.cpp, planner_stream_bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "core/planner/planner.h"

namespace torchmem::bindings {

// Buffers from three columns of equal length (ids 0..n-1); throws
// std::invalid_argument when the lengths differ.
std::vector<planner::Buffer> to_buffers(const std::vector<int64_t>& lower, const std::vector<int64_t>& upper,
                                        const std::vector<int64_t>& size);
// {"offsets", "height", "lower_bound", "method", "optimal", "seconds", "nodes", "sharing"}.
pybind11::dict solution_to_dict(const planner::Solution& s);

}  // namespace torchmem::bindings
