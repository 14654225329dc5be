// Streams in the planner's input, and the order they impose.
//
// Time is one axis of steps: the order in which the program issues its
// operations. On one stream, operations run in step order. Operations on
// different streams run concurrently unless synchronised:
//
//   Sync{from, after, to, before}   an event recorded on stream `from` after
//                                   its operation at step `after`, waited on
//                                   by stream `to` before its operation at
//                                   step `before` (after < before).
//
// Happens-before: step u on stream s happens before step t on stream x when
// s == x and u < t, or when a chain of syncs leads from s (recorded at or
// after u) to x (waited at or before t). Since every sync points forward in
// steps, happens-before implies u < t: the step order is one valid
// execution, and a program may run any other that respects the syncs.
//
// A buffer (buffers.h) is produced on its home stream at step `lower` and
// used there through step `upper - 1`. A StreamRead adds a use of the buffer
// on any stream (another one, or its home stream later). Stream ids are any
// non-negative int32; they need not be dense.
//
// Thread safety: HappensBefore is immutable after construction; const
// methods may run concurrently.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

using StreamId = int32_t;

// A step that never comes: a release that no synchronisation reaches.
constexpr Time kNever = std::numeric_limits<Time>::max();

struct Sync {
  StreamId from = 0;
  Time after = 0;
  StreamId to = 0;
  Time before = 0;
};

struct StreamRead {
  int32_t buffer = 0;  // index into the buffers vector
  StreamId stream = 0;
  Time step = 0;
};

struct StreamSchedule {
  std::vector<StreamId> home;      // per buffer, the producer's stream; empty: all on stream 0
  std::vector<StreamRead> reads;
  std::vector<Sync> syncs;
  std::vector<std::string> names;  // per buffer, for error messages only; empty: the buffer ids

  // True when it says nothing beyond one stream: every buffer on stream 0,
  // no reads, no syncs.
  bool single_stream() const;
  StreamId home_of(size_t b) const { return home.empty() ? 0 : home[b]; }
  std::string name_of(const std::vector<Buffer>& buffers, size_t b) const;
};

// Vector clocks over the syncs: for each stream, the steps where it waits,
// and what it knows from then on about every other stream.
// O(syncs x streams) memory; a query is a binary search.
class HappensBefore {
 public:
  // Throws std::invalid_argument for a negative stream id, a sync from a
  // stream to itself, or after >= before. `streams` lists every stream the
  // caller will query (the syncs' streams are added).
  HappensBefore(const std::vector<StreamId>& streams, const std::vector<Sync>& syncs);

  // Whether step u on stream s happens before step t on stream x.
  bool before(StreamId s, Time u, StreamId x, Time t) const;

  // The first step t on stream x such that step u on stream s happens
  // before it; kNever when no sync leads there.
  Time first_after(StreamId s, Time u, StreamId x) const;

  const std::vector<StreamId>& streams() const { return ids_; }

 private:
  static constexpr Time kUnknown = std::numeric_limits<Time>::min();
  int32_t index(StreamId s) const;               // -1 when unknown
  // The latest step of stream column `s` known on stream `x` at step t.
  Time known(int32_t x, Time t, int32_t s) const;

  std::vector<StreamId> ids_;                    // dense index -> stream id, ascending
  std::unordered_map<StreamId, int32_t> dense_;  // stream id -> dense index
  // Per stream: the steps where it waits (ascending) and, for each, a row of
  // ids_.size() clocks (the latest step of each stream known from then on).
  std::vector<std::vector<Time>> wait_steps_;
  std::vector<std::vector<Time>> clocks_;
};

}  // namespace torchmem::planner
