// The graph a pipeline plan is made for (pipeline.h, stage_cut.h).
//
// Nodes are numbered in execution order (node v runs at step v of one item).
// A buffer is produced by one node, read by others (directly or through a
// view; in-place writers count as readers), and may be returned by the graph
// (then it is read once more after the last node). Edges u -> v say that u
// runs before v (data and ordering dependencies); every edge and every read
// must point forward in the node order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torchmem::planner {

struct GraphBuffer {
  std::string name;
  int32_t producer = 0;
  std::vector<int32_t> readers;
  bool returned = false;
  int64_t size = 0;
};

struct PipelineGraph {
  std::vector<std::string> names;  // per node
  std::vector<double> cost;        // per node, >= 0 (seconds, or any unit)
  std::vector<GraphBuffer> buffers;
  std::vector<std::pair<int32_t, int32_t>> edges;
};

// Throws std::invalid_argument naming the node or buffer: cost not one per
// node, a negative or NaN cost, a node index out of range, a read or an edge
// that points backwards, a negative size.
void check_graph(const PipelineGraph& graph);

// Step just past the last use of buffer b when the graph runs alone in node
// order (one past the last node when it is returned): its sequential lifetime
// is [producer, sequential_end).
int32_t sequential_end(const PipelineGraph& graph, size_t b);

}  // namespace torchmem::planner
