// Liveness under streams: from which step may a buffer's bytes go to
// another buffer?
//
// A buffer's uses are its producer (home stream, step `lower`), its uses on
// the home stream through `upper - 1`, and its reads (streams.h). Its bytes
// may go to a buffer produced at step p on stream y once every use happens
// before step p on y; release(b, y) is the first such step. A read still in
// flight on another stream keeps the buffer live.
//
// Each buffer gets three ends of its lifetime on the step axis, from the
// releases on the allocating streams (those home to a buffer of non-zero
// size, and its own home):
//   own     the release on the home stream: the synchronisation after its
//           last use on every stream that reads it, back to the home stream
//           (`upper` when no other stream reads it). Exact between two
//           buffers of the same home stream.
//   shared  the latest release over the allocating streams, capped at the
//           horizon (one past the last step the input names: the run ends
//           there). Past it, a buffer of any stream may take the bytes.
//   bound   the earliest release over the allocating streams. Buffers with
//           lower <= t < bound at one step t are pairwise live at once in
//           some execution, so their total is a lower bound on the height
//           of every placement that respects the streams.
// lower < upper <= bound <= own <= shared <= horizon.
//
// Bad input throws std::invalid_argument naming the buffer: a read before
// its producer on the home stream; a read on another stream that the
// producer does not happen before (no sync from the home stream after
// `lower` reaches it); a read on another stream with no synchronisation
// after it back to the home stream (the bytes could never be released); a
// read of a buffer out of range; a negative stream; `home` or `names` not
// one per buffer; and what HappensBefore rejects (bad syncs).
#pragma once

#include <utility>
#include <vector>

#include "core/planner/buffers.h"
#include "core/planner/streams/streams.h"

namespace torchmem::planner {

struct StreamLifetimes {
  std::vector<Time> own, shared, bound;
  Time horizon = 0;
};

// Keeps references to `buffers` and `schedule`: they must outlive it.
class StreamLiveness {
 public:
  StreamLiveness(const std::vector<Buffer>& buffers, const StreamSchedule& schedule);

  // The first step on stream y after every use of buffer b; kNever when
  // none (not capped at the horizon).
  Time release(size_t b, StreamId y) const;

  // Streams home to a buffer of non-zero size, ascending.
  const std::vector<StreamId>& allocating() const { return allocating_; }
  Time horizon() const { return horizon_; }
  StreamLifetimes lifetimes() const;

 private:
  const std::vector<Buffer>& buffers_;
  const StreamSchedule& schedule_;
  HappensBefore order_;
  std::vector<std::vector<std::pair<StreamId, Time>>> last_use_;  // per buffer: (stream, last step used)
  std::vector<StreamId> allocating_;
  Time horizon_ = 0;
};

// The buffers with their lifetimes ending at `ends` (one per buffer).
std::vector<Buffer> with_upper(const std::vector<Buffer>& buffers, const std::vector<Time>& ends);

}  // namespace torchmem::planner
