#include "core/planner/validate.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <tuple>

namespace torchmem::planner {

namespace {

std::string describe(const Buffer& a, Offset oa, const Buffer& b, Offset ob) {
  auto one = [](const Buffer& x, Offset o) {
    return "buffer " + std::to_string(x.id) + " [t " + std::to_string(x.lower) + ", " +
           std::to_string(x.upper) + ") at [" + std::to_string(o) + ", " + std::to_string(o + x.size) +
           ")";
  };
  return one(a, oa) + " overlaps " + one(b, ob);
}

}  // namespace

Validation validate(const std::vector<Buffer>& buffers, const std::vector<Offset>& offsets) {
  Validation result;
  if (offsets.size() != buffers.size()) {
    result.ok = false;
    result.message = "expected " + std::to_string(buffers.size()) + " offsets, got " +
                     std::to_string(offsets.size());
    return result;
  }
  // Events: (time, kind, index); kind 0 = end before kind 1 = start (half-open).
  std::vector<std::tuple<Time, int, int64_t>> events;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (offsets[i] < 0) {
      result = {false, int64_t(i), -1, "buffer " + std::to_string(buffers[i].id) + " has negative offset"};
      return result;
    }
    if (buffers[i].size == 0) continue;
    events.emplace_back(buffers[i].lower, 1, int64_t(i));
    events.emplace_back(buffers[i].upper, 0, int64_t(i));
  }
  std::sort(events.begin(), events.end());
  std::set<std::pair<Offset, int64_t>> live;  // (offset, index)
  for (const auto& [t, kind, i] : events) {
    if (kind == 0) {
      live.erase({offsets[i], i});
      continue;
    }
    auto it = live.insert({offsets[i], i}).first;
    const Offset end = offsets[i] + buffers[i].size;
    if (std::next(it) != live.end() && std::next(it)->first < end) {
      const int64_t j = std::next(it)->second;
      return {false, i, j, describe(buffers[i], offsets[i], buffers[j], offsets[j])};
    }
    if (it != live.begin()) {
      const int64_t j = std::prev(it)->second;
      if (offsets[j] + buffers[j].size > offsets[i]) {
        return {false, j, i, describe(buffers[j], offsets[j], buffers[i], offsets[i])};
      }
    }
  }
  return result;
}

}  // namespace torchmem::planner
