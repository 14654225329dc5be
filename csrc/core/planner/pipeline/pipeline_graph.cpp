#include "core/planner/pipeline/pipeline_graph.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace torchmem::planner {

void check_graph(const PipelineGraph& graph) {
  const int32_t n = int32_t(graph.names.size());
  if (graph.cost.size() != graph.names.size()) {
    throw std::invalid_argument("expected one cost per node (" + std::to_string(n) + "), got " +
                                std::to_string(graph.cost.size()));
  }
  for (int32_t v = 0; v < n; ++v) {
    if (!(graph.cost[v] >= 0) || std::isinf(graph.cost[v])) {
      throw std::invalid_argument("node " + graph.names[v] + " has cost " + std::to_string(graph.cost[v]) +
                                  " (must be a finite number >= 0)");
    }
  }
  auto node = [&](int32_t v, const std::string& what) {
    if (v < 0 || v >= n) throw std::invalid_argument(what + " names node #" + std::to_string(v) + " of " + std::to_string(n));
  };
  for (const GraphBuffer& b : graph.buffers) {
    node(b.producer, "buffer " + b.name);
    if (b.size < 0) throw std::invalid_argument("buffer " + b.name + " has negative size " + std::to_string(b.size));
    for (int32_t r : b.readers) {
      node(r, "buffer " + b.name);
      if (r < b.producer) {
        throw std::invalid_argument("buffer " + b.name + " is read by node " + graph.names[r] +
                                    ", which runs before its producer " + graph.names[b.producer]);
      }
    }
  }
  for (const auto& [u, v] : graph.edges) {
    node(u, "an edge");
    node(v, "an edge");
    if (u >= v) {
      throw std::invalid_argument("edge " + graph.names[u] + " -> " + graph.names[v] +
                                  " points backwards in the node order");
    }
  }
}

int32_t sequential_end(const PipelineGraph& graph, size_t b) {
  const GraphBuffer& buf = graph.buffers[b];
  if (buf.returned) return int32_t(graph.names.size()) + 1;
  int32_t last = buf.producer;
  for (int32_t r : buf.readers) last = std::max(last, r);
  return last + 1;
}

}  // namespace torchmem::planner
