// Planning with streams: two sound reductions of a multi-stream input
// (streams.h) to the one-axis planning of planner.h, or the better of both.
//
//   shared      one slab; a buffer lives until its `shared` end
//               (stream_liveness.h: every allocating stream has synchronised
//               after its last use), so a buffer produced later on any stream
//               may take its bytes. Two streams that run concurrently
//               between syncs cannot reuse each other's bytes, and a buffer
//               waits for the slowest stream to catch up.
//   per_stream  one region per home stream, stacked in stream id order; in
//               its region a buffer lives until its `own` end (the
//               synchronisation after its last read on every stream, back to
//               its home stream). Regions never share bytes; this is the
//               layout of PyTorch's per-stream pools, planned.
//   auto        both; the lower height (shared on ties).
//
// Every method of planner.h runs on the reduced instances (SolveOptions's
// time limit is split between them). lower_bound is the bound of the
// `bound` lifetimes, valid for every placement that respects the streams,
// whichever reduction is used; `optimal` means the height reaches it. The
// placement is checked with validate_streams() (std::logic_error if not:
// a bug). Bad input throws std::invalid_argument (stream_liveness.h, an
// unknown sharing, and what solve() rejects).
#pragma once

#include <string>
#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/planner.h"
#include "core/planner/streams/streams.h"

namespace torchmem::planner {

Solution solve(const std::vector<Buffer>& buffers, const StreamSchedule& schedule, const SolveOptions& options = {});

const std::vector<std::string>& sharing_names();

}  // namespace torchmem::planner
