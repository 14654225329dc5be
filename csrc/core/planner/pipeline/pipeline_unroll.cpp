#include "core/planner/pipeline/pipeline_unroll.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <tuple>

namespace torchmem::planner {

int32_t steady_items(const PipelinePlan& plan) {
  int32_t copies = 1;
  for (const PipelineSlot& s : plan.slots) copies = std::max(copies, s.copies);
  return plan.stages + copies + 1;
}

UnrolledPipeline unroll_pipeline(const PipelineGraph& graph, const PipelinePlan& plan, int32_t items) {
  if (items < 1) throw std::invalid_argument("items must be >= 1, got " + std::to_string(items));
  const int32_t K = plan.stages;
  const size_t n = graph.names.size(), nb = graph.buffers.size();
  UnrolledPipeline out;
  out.node_step.assign(size_t(items) * n, 0);
  out.output_step.assign(items, 0);
  Time step = 0;
  for (int32_t slot = 0; slot < items + K; ++slot) {
    for (int32_t k = K; k >= 0; --k) {
      const int32_t t = slot - k;
      if (t < 0 || t >= items) continue;
      if (k == K) {
        out.output_step[t] = step++;
        continue;
      }
      for (int32_t v : plan.stage[k].nodes) out.node_step[size_t(t) * n + v] = step++;
    }
  }
  const Time end = step;
  auto first = [&](int32_t k, int32_t t) {
    return k == K ? out.output_step[t] : out.node_step[size_t(t) * n + plan.stage[k].nodes.front()];
  };
  auto last = [&](int32_t k, int32_t t) {
    return k == K ? out.output_step[t] : out.node_step[size_t(t) * n + plan.stage[k].nodes.back()];
  };
  // Stage pairs (k, j), k < j, that exchange data or order.
  std::set<std::pair<int32_t, int32_t>> pairs;
  for (const auto& [u, v] : graph.edges) {
    if (plan.stage_of[u] < plan.stage_of[v]) pairs.emplace(plan.stage_of[u], plan.stage_of[v]);
  }
  std::vector<int32_t> slot_of(nb, -1);
  for (size_t s = 0; s < plan.slots.size(); ++s) slot_of[plan.slots[s].buffer] = int32_t(s);
  std::set<std::tuple<int32_t, int32_t, int32_t>> frees;  // (reader stage, producer stage, copies)
  for (size_t b = 0; b < nb; ++b) {
    const GraphBuffer& buf = graph.buffers[b];
    const int32_t k = plan.stage_of[buf.producer];
    std::vector<int32_t> readers;
    for (int32_t r : buf.readers) readers.push_back(plan.stage_of[r]);
    if (buf.returned) readers.push_back(K);
    for (int32_t j : readers) {
      if (j == k) continue;
      pairs.emplace(k, j);
      if (slot_of[b] >= 0) frees.emplace(j, k, plan.slots[slot_of[b]].copies);
    }
  }
  std::vector<Sync>& syncs = out.schedule.syncs;
  for (const auto& [k, j] : pairs) {
    for (int32_t t = 0; t < items; ++t) syncs.push_back({k, last(k, t), j, first(j, t)});
  }
  std::set<std::pair<int32_t, int32_t>> drained;
  for (const auto& [j, k, copies] : frees) {
    for (int32_t t = copies; t < items; ++t) syncs.push_back({j, last(j, t - copies), k, first(k, t)});
    if (drained.emplace(j, k).second) syncs.push_back({j, last(j, items - 1), k, end});
  }
  std::sort(syncs.begin(), syncs.end(), [](const Sync& a, const Sync& b) {
    return std::tie(a.before, a.to, a.from, a.after) < std::tie(b.before, b.to, b.from, b.after);
  });
  syncs.erase(std::unique(syncs.begin(), syncs.end(),
                          [](const Sync& a, const Sync& b) {
                            return a.from == b.from && a.after == b.after && a.to == b.to && a.before == b.before;
                          }),
              syncs.end());
  std::vector<size_t> position(nb, 0);  // of a stage-local buffer in its stage's plan
  for (const PipelineStage& s : plan.stage) {
    for (size_t k = 0; k < s.buffers.size(); ++k) position[s.buffers[k]] = k;
  }
  const int64_t align = plan.alignment;
  for (int32_t t = 0; t < items; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const GraphBuffer& buf = graph.buffers[b];
      const int32_t k = plan.stage_of[buf.producer];
      const Time at = out.node_step[size_t(t) * n + buf.producer];
      Time home_last = at;
      const int32_t index = int32_t(out.buffers.size());
      for (int32_t r : buf.readers) {
        const Time rs = out.node_step[size_t(t) * n + r];
        if (plan.stage_of[r] == k) {
          home_last = std::max(home_last, rs);
        } else {
          out.schedule.reads.push_back({index, plan.stage_of[r], rs});
        }
      }
      if (buf.returned) out.schedule.reads.push_back({index, K, out.output_step[t]});
      Offset offset = 0;
      if (slot_of[b] >= 0) {
        const PipelineSlot& slot = plan.slots[slot_of[b]];
        offset = slot.base + (t % slot.copies) * slot.size;
      } else {
        offset = plan.stage[k].base + plan.stage[k].plan.offsets[position[b]];
      }
      out.buffers.push_back({int64_t(index), at, home_last + 1, (buf.size + align - 1) / align * align});
      out.schedule.home.push_back(k);
      out.schedule.names.push_back(buf.name + "[item " + std::to_string(t) + "]");
      out.offsets.push_back(offset);
    }
  }
  return out;
}

}  // namespace torchmem::planner
