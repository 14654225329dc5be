// Checks a placement under streams: no two buffers that can be live at once
// overlap in memory, reads still in flight on another stream included.
//
// Buffers A and B (A produced first, or both at one step) can be live at
// once unless every use of A happens before B's producer, that is unless
// B.lower >= release(A, home stream of B) (stream_liveness.h). Zero-size
// buffers never conflict. Without streams (schedule.single_stream()) this is
// validate() of validate.h.
//
// O(streams x n log n): for each allocating stream y, a sweep over steps
// keeps the byte ranges of the buffers not yet released for y (a count per
// byte cell: range add, range max) and, at the producer of each buffer
// whose home is y, asks whether another one covers any of its bytes.
// Throws std::invalid_argument for bad input (stream_liveness.h).
#pragma once

#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/streams/streams.h"
#include "core/planner/validate.h"

namespace torchmem::planner {

Validation validate_streams(const std::vector<Buffer>& buffers, const StreamSchedule& schedule,
                            const std::vector<Offset>& offsets);

}  // namespace torchmem::planner
