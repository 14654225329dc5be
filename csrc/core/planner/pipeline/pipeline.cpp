#include "core/planner/pipeline/pipeline.h"

#include <algorithm>
#include <stdexcept>

#include "core/planner/pipeline/pipeline_unroll.h"
#include "core/planner/pipeline/stage_cut.h"
#include "core/planner/search.h"
#include "core/planner/streams/validate_streams.h"

namespace torchmem::planner {

void check_stages(const PipelineGraph& graph, const std::vector<int32_t>& stage_of, int32_t stages) {
  const size_t n = graph.names.size();
  if (stages < 1) throw std::invalid_argument("stages must be >= 1, got " + std::to_string(stages));
  if (stage_of.size() != n) {
    throw std::invalid_argument("expected a stage for each of the " + std::to_string(n) + " nodes, got " +
                                std::to_string(stage_of.size()));
  }
  std::vector<int32_t> count(stages, 0);
  for (size_t v = 0; v < n; ++v) {
    if (stage_of[v] < 0 || stage_of[v] >= stages) {
      throw std::invalid_argument("node " + graph.names[v] + " is given stage " + std::to_string(stage_of[v]) +
                                  ", outside 0.." + std::to_string(stages - 1));
    }
    ++count[stage_of[v]];
  }
  for (int32_t k = 0; k < stages; ++k) {
    if (count[k] == 0) throw std::invalid_argument("stage " + std::to_string(k) + " has no nodes");
  }
  for (const auto& [u, v] : graph.edges) {
    if (stage_of[u] > stage_of[v]) {
      throw std::invalid_argument("the stage cut breaks a dependency: node " + graph.names[v] + " (stage " +
                                  std::to_string(stage_of[v]) + ") depends on node " + graph.names[u] +
                                  ", which is in the later stage " + std::to_string(stage_of[u]));
    }
  }
  for (const GraphBuffer& b : graph.buffers) {
    for (int32_t r : b.readers) {
      if (stage_of[r] < stage_of[b.producer]) {
        throw std::invalid_argument("the stage cut breaks a dependency: node " + graph.names[r] + " (stage " +
                                    std::to_string(stage_of[r]) + ") reads buffer " + b.name + ", produced by node " +
                                    graph.names[b.producer] + " in the later stage " +
                                    std::to_string(stage_of[b.producer]));
      }
    }
  }
}

PipelinePlan plan_pipeline(const PipelineGraph& graph, const PipelineOptions& options) {
  const double start = seconds_now();
  check_graph(graph);
  if (options.in_flight < 1) {
    throw std::invalid_argument("in_flight must be >= 1 (the copies of a tensor crossing one stage boundary), got " +
                                std::to_string(options.in_flight));
  }
  if (options.solve.alignment < 1) throw std::invalid_argument("alignment must be >= 1");
  PipelinePlan plan;
  plan.stages = options.stages;
  plan.in_flight = options.in_flight;
  plan.alignment = options.solve.alignment;
  plan.stage_of = options.stage_of.empty() ? cut_stages(graph, options.stages) : options.stage_of;
  check_stages(graph, plan.stage_of, options.stages);
  const int32_t K = options.stages;
  const int64_t align = options.solve.alignment;
  const size_t n = graph.names.size();
  plan.stage.resize(K);
  std::vector<int32_t> local(n);
  for (size_t v = 0; v < n; ++v) {
    PipelineStage& s = plan.stage[plan.stage_of[v]];
    local[v] = int32_t(s.nodes.size());
    s.nodes.push_back(int32_t(v));
    s.cost += graph.cost[v];
  }
  std::vector<std::vector<Buffer>> stage_buffers(K);
  for (size_t b = 0; b < graph.buffers.size(); ++b) {
    const GraphBuffer& buf = graph.buffers[b];
    const int32_t k = plan.stage_of[buf.producer];
    int32_t far = buf.returned ? K : k;
    for (int32_t r : buf.readers) far = std::max(far, plan.stage_of[r]);
    if (far == k) {
      int32_t last = local[buf.producer];
      for (int32_t r : buf.readers) last = std::max(last, local[r]);
      stage_buffers[k].push_back({int64_t(b), local[buf.producer], last + 1, buf.size});
      plan.stage[k].buffers.push_back(int32_t(b));
      continue;
    }
    PipelineSlot slot;
    slot.buffer = int32_t(b);
    slot.from_stage = k;
    slot.to_stage = far;
    slot.copies = far - k + options.in_flight - 1;
    slot.size = (buf.size + align - 1) / align * align;
    plan.slots.push_back(slot);
  }
  Offset base = 0, stage_bounds = 0;
  for (int32_t k = 0; k < K; ++k) {
    PipelineStage& s = plan.stage[k];
    s.plan = solve(stage_buffers[k], options.solve);
    s.base = base;
    base += s.plan.height;
    stage_bounds += s.plan.lower_bound;
  }
  for (PipelineSlot& slot : plan.slots) {
    slot.base = base;
    base += slot.copies * slot.size;
    plan.slot_bytes += slot.copies * slot.size;
  }
  plan.height = base;
  plan.lower_bound = stage_bounds + plan.slot_bytes;
  std::vector<Buffer> whole;
  for (size_t b = 0; b < graph.buffers.size(); ++b) {
    whole.push_back({int64_t(b), graph.buffers[b].producer, sequential_end(graph, b), graph.buffers[b].size});
  }
  plan.sequential = solve(whole, options.solve);
  double total = 0, largest = 0;
  for (const PipelineStage& s : plan.stage) {
    total += s.cost;
    largest = std::max(largest, s.cost);
  }
  plan.speedup = largest > 0 ? total / largest : 1.0;
  const UnrolledPipeline run = unroll_pipeline(graph, plan, steady_items(plan));
  const Validation v = validate_streams(run.buffers, run.schedule, run.offsets);
  if (!v.ok) throw std::logic_error("pipeline plan is invalid in its steady state: " + v.message);
  plan.seconds = seconds_now() - start;
  return plan;
}

}  // namespace torchmem::planner
