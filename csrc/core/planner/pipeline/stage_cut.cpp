#include "core/planner/pipeline/stage_cut.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace torchmem::planner {

std::vector<int64_t> crossing_bytes(const PipelineGraph& graph) {
  const int32_t n = int32_t(graph.names.size());
  std::vector<int64_t> diff(n + 1, 0);
  for (size_t b = 0; b < graph.buffers.size(); ++b) {
    const GraphBuffer& buf = graph.buffers[b];
    const int32_t last = std::min(sequential_end(graph, b) - 1, n);  // a cut before p crosses when producer < p <= last
    if (last <= buf.producer) continue;
    diff[buf.producer + 1] += buf.size;
    diff[std::min(last, n - 1) + 1] -= buf.size;
  }
  std::vector<int64_t> out(n, 0);
  int64_t run = 0;
  for (int32_t p = 0; p < n; ++p) {
    run += diff[p];
    out[p] = p == 0 ? 0 : run;
  }
  return out;
}

namespace {

// Fewest runs with each run's cost <= limit (a node over it: n + 1).
int32_t runs_needed(const std::vector<double>& cost, double limit) {
  int32_t runs = 1;
  double run = 0;
  for (double c : cost) {
    if (c > limit) return int32_t(cost.size()) + 1;
    if (run + c > limit) {
      ++runs;
      run = 0;
    }
    run += c;
  }
  return runs;
}

}  // namespace

std::vector<int32_t> cut_stages(const PipelineGraph& graph, int32_t stages, double tolerance) {
  check_graph(graph);
  const int32_t n = int32_t(graph.names.size());
  if (stages < 1) throw std::invalid_argument("stages must be >= 1, got " + std::to_string(stages));
  if (stages > n) {
    throw std::invalid_argument("cannot cut " + std::to_string(n) + " nodes into " + std::to_string(stages) + " stages");
  }
  if (!(tolerance >= 0)) throw std::invalid_argument("cut tolerance must be >= 0");
  const std::vector<double>& cost = graph.cost;
  double total = 0, largest = 0;
  for (double c : cost) {
    total += c;
    largest = std::max(largest, c);
  }
  double lo = std::max(largest, total / stages), hi = std::max(total, lo);
  for (int i = 0; i < 200 && hi - lo > 1e-12 * std::max(hi, 1e-300); ++i) {
    const double mid = (lo + hi) / 2;
    if (runs_needed(cost, mid) <= stages) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  // Greedy fill under hi, then split the longest runs until there are `stages`.
  std::vector<int32_t> starts = {0};
  double run = 0;
  for (int32_t v = 0; v < n; ++v) {
    if (v > 0 && run + cost[v] > hi) {
      starts.push_back(v);
      run = 0;
    }
    run += cost[v];
  }
  while (int32_t(starts.size()) < stages) {
    size_t widest = 0;
    int32_t width = 0;
    for (size_t k = 0; k < starts.size(); ++k) {
      const int32_t end = k + 1 < starts.size() ? starts[k + 1] : n;
      if (end - starts[k] > width) {
        width = end - starts[k];
        widest = k;
      }
    }
    starts.insert(starts.begin() + widest + 1, starts[widest] + width / 2);
  }
  std::vector<double> prefix(n + 1, 0);
  for (int32_t v = 0; v < n; ++v) prefix[v + 1] = prefix[v] + cost[v];
  const double limit = hi * (1 + tolerance) + 1e-12 * std::max(hi, 1.0);
  const std::vector<int64_t> crossing = crossing_bytes(graph);
  for (int32_t k = 1; k < stages; ++k) {
    const int32_t left = starts[k - 1], right = k + 1 < stages ? starts[k + 1] : n;
    int32_t best = starts[k];
    for (int32_t p = left + 1; p < right; ++p) {
      if (prefix[p] - prefix[left] > limit || prefix[right] - prefix[p] > limit) continue;
      if (crossing[p] < crossing[best] ||
          (crossing[p] == crossing[best] && std::abs(p - starts[k]) < std::abs(best - starts[k]))) {
        best = p;
      }
    }
    starts[k] = best;
  }
  std::vector<int32_t> stage(n, 0);
  for (int32_t k = 0; k < stages; ++k) {
    const int32_t end = k + 1 < stages ? starts[k + 1] : n;
    for (int32_t v = starts[k]; v < end; ++v) stage[v] = k;
  }
  return stage;
}

}  // namespace torchmem::planner
