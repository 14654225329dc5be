// The steady state of a pipeline plan (pipeline.h) written out as a
// multi-stream schedule (streams.h) over `items` successive items, with the
// plan's offsets, so that validate_streams() can check the plan.
//
// Stream k runs stage k; stream `stages` is the consumer of returned values
// (one operation per item). Steps are issued slot by slot: in slot s, stage
// k works on item s - k, stages in descending order (a consumer before its
// producer). Syncs:
//   data ready  stage j waits for stage k (k < j) to finish item t before it
//               starts item t, for each pair joined by an edge or a read;
//   slot free   before stage k starts item t, it waits for every stage that
//               reads a slot of k to finish item t - copies;
//   drain       after the last item, every reader stage syncs back to the
//               stages whose slots it read, at a final step.
// With in_flight >= 2 every sync crosses slots, so within a slot the stages
// are unordered: all busy at once.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/pipeline/pipeline.h"
#include "core/planner/streams/streams.h"

namespace torchmem::planner {

struct UnrolledPipeline {
  std::vector<Buffer> buffers;     // item-major: buffer b of item t at t * graph.buffers.size() + b
  StreamSchedule schedule;
  std::vector<Offset> offsets;     // the plan's, for every unrolled buffer
  std::vector<Time> node_step;     // item-major: node v of item t runs at node_step[t * nodes + v]
  std::vector<Time> output_step;   // per item, the consumer's step
};

// Throws std::invalid_argument when items < 1.
UnrolledPipeline unroll_pipeline(const PipelineGraph& graph, const PipelinePlan& plan, int32_t items);

// Enough items for every slot to be reused: stages + the most copies + 1.
int32_t steady_items(const PipelinePlan& plan);

}  // namespace torchmem::planner
