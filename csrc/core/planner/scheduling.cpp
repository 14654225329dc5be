#include "core/planner/scheduling.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace torchmem::planner {

namespace {

void check_graph(const Graph& g) {
  if (g.num_nodes < 0 || int64_t(g.out_bytes.size()) != g.num_nodes || int64_t(g.users.size()) != g.num_nodes) {
    throw std::invalid_argument("graph: out_bytes and users need one entry per node");
  }
  for (const auto& [u, v] : g.edges) {
    if (u < 0 || v < 0 || u >= g.num_nodes || v >= g.num_nodes || u == v) {
      throw std::invalid_argument("graph: bad edge (" + std::to_string(u) + ", " + std::to_string(v) + ")");
    }
  }
  for (const auto& us : g.users) {
    for (int64_t u : us) {
      if (u < 0 || u >= g.num_nodes) throw std::invalid_argument("graph: bad user " + std::to_string(u));
    }
  }
}

std::vector<int64_t> positions(const Graph& g, const std::vector<int64_t>& order) {
  if (int64_t(order.size()) != g.num_nodes) throw std::invalid_argument("order must list every node once");
  std::vector<int64_t> pos(g.num_nodes, -1);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t v = order[i];
    if (v < 0 || v >= g.num_nodes || pos[v] >= 0) throw std::invalid_argument("order must list every node once");
    pos[v] = int64_t(i);
  }
  return pos;
}

}  // namespace

int64_t schedule_peak(const Graph& g, const std::vector<int64_t>& order) {
  const std::vector<int64_t> pos = positions(g, order);
  const int64_t n = g.num_nodes;
  std::vector<int64_t> delta(n + 1, 0);
  for (int64_t v = 0; v < n; ++v) {
    int64_t last = pos[v];
    for (int64_t u : g.users[v]) last = std::max(last, pos[u]);
    delta[pos[v]] += g.out_bytes[v];
    delta[last + 1] -= g.out_bytes[v];
  }
  int64_t live = 0, peak = 0;
  for (int64_t i = 0; i < n; ++i) peak = std::max(peak, live += delta[i]);
  return peak;
}

ScheduleResult schedule(const Graph& g, const std::vector<int64_t>& initial) {
  check_graph(g);
  const int64_t n = g.num_nodes;
  const std::vector<int64_t> init_pos = positions(g, initial);
  std::vector<std::vector<int64_t>> succ(n);
  std::vector<int64_t> indeg(n, 0);
  for (const auto& [u, v] : g.edges) {
    if (init_pos[u] > init_pos[v]) throw std::invalid_argument("initial order is not topological");
    succ[u].push_back(v);
    ++indeg[v];
  }
  // readers[u] = buffers that u reads (u in users[v]); pending[v] = unrun users.
  std::vector<std::vector<int64_t>> reads(n);
  std::vector<int64_t> pending(n, 0);
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t u : g.users[v]) {
      if (u != v) {
        reads[u].push_back(v);
        ++pending[v];
      }
    }
  }
  // Least-peak-first list scheduling.
  std::vector<int64_t> order, ready;
  std::vector<char> done(n, 0);
  for (int64_t v = 0; v < n; ++v) {
    if (indeg[v] == 0) ready.push_back(v);
  }
  int64_t live = 0;
  while (!ready.empty()) {
    size_t pick = 0;
    std::tuple<int64_t, int64_t, int64_t> best{INT64_MAX, INT64_MAX, INT64_MAX};
    for (size_t i = 0; i < ready.size(); ++i) {
      const int64_t v = ready[i];
      int64_t freed = pending[v] == 0 ? g.out_bytes[v] : 0;
      for (int64_t b : reads[v]) {
        if (pending[b] == 1) freed += g.out_bytes[b];
      }
      const std::tuple<int64_t, int64_t, int64_t> key{live + g.out_bytes[v], g.out_bytes[v] - freed, init_pos[v]};
      if (key < best) {
        best = key;
        pick = i;
      }
    }
    const int64_t v = ready[pick];
    ready[pick] = ready.back();
    ready.pop_back();
    order.push_back(v);
    done[v] = 1;
    live += g.out_bytes[v];
    if (pending[v] == 0) live -= g.out_bytes[v];
    for (int64_t b : reads[v]) {
      if (--pending[b] == 0) live -= g.out_bytes[b];
    }
    for (int64_t w : succ[v]) {
      if (--indeg[w] == 0) ready.push_back(w);
    }
  }
  if (int64_t(order.size()) != n) throw std::invalid_argument("graph has a cycle");
  // Adjacent swaps of independent nodes, kept when the peak drops.
  std::vector<std::vector<int64_t>> adj(n);
  for (const auto& [u, v] : g.edges) adj[u].push_back(v);
  auto depends = [&](int64_t a, int64_t b) { return std::find(adj[a].begin(), adj[a].end(), b) != adj[a].end(); };
  auto improve = [&](std::vector<int64_t> ord) {
    int64_t peak = schedule_peak(g, ord);
    // Each pass costs O(n * (n + users)): skipped on large graphs.
    for (int pass = 0; pass < 3 && n <= kMaxSwapNodes; ++pass) {
      bool changed = false;
      for (int64_t i = 0; i + 1 < n; ++i) {
        if (depends(ord[i], ord[i + 1])) continue;
        std::swap(ord[i], ord[i + 1]);
        const int64_t p = schedule_peak(g, ord);
        if (p < peak) {
          peak = p;
          changed = true;
        } else {
          std::swap(ord[i], ord[i + 1]);
        }
      }
      if (!changed) break;
    }
    return std::make_pair(peak, ord);
  };
  ScheduleResult r;
  r.peak_before = schedule_peak(g, initial);
  auto a = improve(order);
  auto b = improve(initial);
  const auto& best = a.first <= b.first ? a : b;
  r.order = best.second;
  r.peak_after = std::min(best.first, r.peak_before);
  if (r.peak_after == r.peak_before && best.first > r.peak_before) r.order = initial;
  return r;
}

}  // namespace torchmem::planner
