// A pipeline plan: a graph (pipeline_graph.h) cut into K stages, each on its
// own stream, running concurrently on successive items (stage k on item t
// while stage k+1 works on item t-1), passing tensors through a fixed number
// of buffers. The plan is for the steady state, with every stage busy:
//
//   - stage-local buffers (produced and read in one stage, not returned) are
//     planned per stage, with solve() over that stage's nodes in order, each
//     stage in a region of its own: stages run concurrently, so two regions
//     can never share bytes;
//   - a buffer read in a later stage, or returned (read by the consumer of
//     the results, after the last stage), crosses d >= 1 stage boundaries
//     and gets copies = d + in_flight - 1 fixed slots for the whole run, used
//     round robin by successive items. With in_flight = 2 (double
//     buffering) a tensor crossing one boundary gets 2 copies: the consumer
//     reads item t while the producer writes item t+1. With in_flight = 1 the
//     producer waits for the consumer, so neighbouring stages take turns.
//
// Layout: the stage regions in stage order, then the slots. height = sum of
// region heights + slot bytes; lower_bound = sum of the stages' lower bounds
// + slot bytes (the bound for this layout: the stages can each be at their
// peak at one instant, and the slots are fixed). `sequential` is the whole
// graph planned on one stream in node order; `speedup` the ideal one, total
// cost / cost of the costliest stage (1 when every cost is 0).
//
// The plan is checked by unrolling the steady state into a multi-stream
// schedule (pipeline_unroll.h) and validate_streams(); std::logic_error if
// that fails (a bug). Bad input throws std::invalid_argument naming the node
// or buffer: stages < 1, in_flight < 1, a stage out of range or without
// nodes, a stage cut that breaks a dependency (an edge or a read from a
// later stage to an earlier one), and what check_graph() rejects.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/pipeline/pipeline_graph.h"
#include "core/planner/planner.h"

namespace torchmem::planner {

struct PipelineOptions {
  int32_t stages = 2;
  int32_t in_flight = 2;
  std::vector<int32_t> stage_of;  // per node; empty: cut_stages(graph, stages)
  SolveOptions solve;             // for every per-stage plan and the sequential one
};

struct PipelineStage {
  std::vector<int32_t> nodes;    // in node order
  std::vector<int32_t> buffers;  // stage-local buffers, indices into graph.buffers
  Solution plan;                 // their placement; offsets relative to `base`
  Offset base = 0;
  double cost = 0;
};

struct PipelineSlot {
  int32_t buffer = 0;      // index into graph.buffers
  int32_t from_stage = 0;
  int32_t to_stage = 0;    // the last stage that reads it; `stages` when returned
  int32_t copies = 0;
  Offset size = 0;         // rounded up to the alignment
  Offset base = 0;         // copy c sits at base + c * size
};

struct PipelinePlan {
  int32_t stages = 0;
  int32_t in_flight = 0;
  int64_t alignment = 1;
  std::vector<int32_t> stage_of;  // per node
  std::vector<PipelineStage> stage;
  std::vector<PipelineSlot> slots;
  Offset height = 0;
  Offset lower_bound = 0;
  Offset slot_bytes = 0;
  Solution sequential;
  double speedup = 1;
  double seconds = 0;
};

PipelinePlan plan_pipeline(const PipelineGraph& graph, const PipelineOptions& options);

// Checks a stage assignment against the graph (the errors listed above).
void check_stages(const PipelineGraph& graph, const std::vector<int32_t>& stage_of, int32_t stages);

}  // namespace torchmem::planner
