#include "core/planner/streams/validate_streams.h"

#include <algorithm>
#include <tuple>

#include "core/planner/range_max_tree.h"
#include "core/planner/streams/stream_liveness.h"

namespace torchmem::planner {

namespace {

// Counts per cell: how many placed blocks cover it.
using CoverTree = RangeMaxTree<int32_t>;

std::string place(const std::string& name, const Buffer& b, Offset o) {
  return "buffer " + name + " (produced at step " + std::to_string(b.lower) + ") at [" + std::to_string(o) + ", " +
         std::to_string(o + b.size) + ")";
}

}  // namespace

Validation validate_streams(const std::vector<Buffer>& buffers, const StreamSchedule& schedule,
                            const std::vector<Offset>& offsets) {
  if (schedule.single_stream() && schedule.names.empty()) return validate(buffers, offsets);
  Validation result;
  if (offsets.size() != buffers.size()) {
    result.ok = false;
    result.message = "expected " + std::to_string(buffers.size()) + " offsets, got " + std::to_string(offsets.size());
    return result;
  }
  const StreamLiveness live(buffers, schedule);
  std::vector<Offset> coords;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (offsets[i] < 0) return {false, int64_t(i), -1, "buffer " + schedule.name_of(buffers, i) + " has negative offset"};
    if (buffers[i].size == 0) continue;
    coords.push_back(offsets[i]);
    coords.push_back(offsets[i] + buffers[i].size);
  }
  std::sort(coords.begin(), coords.end());
  coords.erase(std::unique(coords.begin(), coords.end()), coords.end());
  auto cell = [&](Offset o) { return int32_t(std::lower_bound(coords.begin(), coords.end(), o) - coords.begin()); };
  // (step, kind: 0 release, 1 produce, 2 check, index)
  std::vector<std::tuple<Time, int, int64_t>> events;
  for (StreamId y : live.allocating()) {
    events.clear();
    std::vector<Time> release(buffers.size(), kNever);
    for (size_t a = 0; a < buffers.size(); ++a) {
      if (buffers[a].size == 0) continue;
      release[a] = live.release(a, y);
      events.emplace_back(buffers[a].lower, 1, int64_t(a));
      if (release[a] != kNever) events.emplace_back(release[a], 0, int64_t(a));
      if (schedule.home_of(a) == y) events.emplace_back(buffers[a].lower, 2, int64_t(a));
    }
    std::sort(events.begin(), events.end());
    CoverTree cover(int32_t(coords.size()));
    for (const auto& [t, kind, i] : events) {
      const int32_t l = cell(offsets[i]), r = cell(offsets[i] + buffers[i].size);
      if (kind != 2) {
        cover.add(l, r, kind == 1 ? 1 : -1);
        continue;
      }
      if (cover.max(l, r) < 2) continue;
      const Buffer& b = buffers[i];
      for (size_t a = 0; a < buffers.size(); ++a) {
        const Buffer& o = buffers[a];
        if (int64_t(a) == i || o.size == 0 || o.lower > b.lower || release[a] <= b.lower) continue;
        if (offsets[a] < offsets[i] + b.size && offsets[i] < offsets[a] + o.size) {
          const std::string why = release[a] == kNever ? "no synchronisation ever orders them"
                                                       : "it is released for stream " + std::to_string(y) +
                                                             " only at step " + std::to_string(release[a]);
          return {false, int64_t(a), i,
                  place(schedule.name_of(buffers, a), o, offsets[a]) + " overlaps " +
                      place(schedule.name_of(buffers, i), b, offsets[i]) + ", produced on stream " +
                      std::to_string(y) + " while the first can still be in use (" + why + ")"};
        }
      }
    }
  }
  return result;
}

}  // namespace torchmem::planner
