// Peak-aware scheduling: a topological order of a dataflow graph that
// lowers the peak of live bytes.
//
// Model: node v runs once and produces out_bytes[v] bytes (0 for views and
// in-place ops), live from v's step through the step of the last node in
// users[v] (the nodes that read v's bytes, directly or through a view); a
// buffer with no users is live at its own step only. The live bytes at a
// step include the outputs being produced and the inputs being read. Edges
// (u, v) say u runs before v; users must be reachable from v through edges
// (the caller's graph guarantees it).
//
// schedule(): least-peak-first list scheduling (among ready nodes, run the
// one whose step peak is lowest, then the one freeing the most, then the
// earliest in the initial order), then passes of swaps of adjacent
// independent nodes kept when the peak drops (up to kMaxSwapNodes nodes).
// The result is never worse than the initial order (which must be
// topological).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace torchmem::planner {

constexpr int64_t kMaxSwapNodes = 4000;

struct Graph {
  int64_t num_nodes = 0;
  std::vector<std::pair<int64_t, int64_t>> edges;
  std::vector<int64_t> out_bytes;
  std::vector<std::vector<int64_t>> users;
};

struct ScheduleResult {
  std::vector<int64_t> order;
  int64_t peak_before = 0;
  int64_t peak_after = 0;
};

// Peak live bytes of a topological order. Throws std::invalid_argument when
// `order` is not a permutation of the nodes.
int64_t schedule_peak(const Graph& graph, const std::vector<int64_t>& order);

// Throws std::invalid_argument for a malformed graph or an initial order
// that is not topological.
ScheduleResult schedule(const Graph& graph, const std::vector<int64_t>& initial_order);

}  // namespace torchmem::planner
