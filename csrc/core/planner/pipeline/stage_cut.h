// Cutting a graph into pipeline stages: contiguous runs of the node order.
//
// cut_stages() first finds the least possible cost of the costliest stage
// over all cuts into `stages` non-empty runs (T*, by bisection on the
// threshold with a greedy fill, exact to 1e-12 relative), then moves each cut,
// left to right, to the position where the fewest bytes cross it (buffers
// produced before the cut and read, or returned, after it) among those that
// keep both neighbouring stages within (1 + tolerance) * T*; ties go to the
// position nearest the balanced one. A contiguous cut of the node order never
// breaks a dependency, since edges point forward.
//
// Throws std::invalid_argument when stages < 1, stages > nodes, tolerance < 0,
// or the graph is malformed (check_graph).
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/pipeline/pipeline_graph.h"

namespace torchmem::planner {

constexpr double kDefaultCutTolerance = 0.05;

// The stage of every node, 0 .. stages-1, non-decreasing in node order.
std::vector<int32_t> cut_stages(const PipelineGraph& graph, int32_t stages, double tolerance = kDefaultCutTolerance);

// crossing[p] (0 < p < nodes): bytes of the buffers live across a cut placed
// just before node p. crossing[0] = 0.
std::vector<int64_t> crossing_bytes(const PipelineGraph& graph);

}  // namespace torchmem::planner
