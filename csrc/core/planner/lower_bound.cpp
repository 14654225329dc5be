#include "core/planner/lower_bound.h"

#include <algorithm>

namespace torchmem::planner {

std::vector<std::pair<Time, Offset>> live_profile(const std::vector<Buffer>& buffers) {
  std::vector<std::pair<Time, Offset>> events;
  events.reserve(buffers.size() * 2);
  for (const Buffer& b : buffers) {
    events.emplace_back(b.lower, b.size);
    events.emplace_back(b.upper, -b.size);
  }
  std::sort(events.begin(), events.end());
  std::vector<std::pair<Time, Offset>> profile;
  Offset live = 0;
  for (size_t i = 0; i < events.size();) {
    const Time t = events[i].first;
    for (; i < events.size() && events[i].first == t; ++i) live += events[i].second;
    profile.emplace_back(t, live);
  }
  return profile;
}

Offset lower_bound(const std::vector<Buffer>& buffers) {
  Offset best = 0;
  for (const auto& [t, live] : live_profile(buffers)) best = std::max(best, live);
  return best;
}

}  // namespace torchmem::planner
