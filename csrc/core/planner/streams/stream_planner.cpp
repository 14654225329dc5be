#include "core/planner/streams/stream_planner.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "core/planner/lower_bound.h"
#include "core/planner/search.h"
#include "core/planner/streams/stream_liveness.h"
#include "core/planner/streams/validate_streams.h"

namespace torchmem::planner {

const std::vector<std::string>& sharing_names() {
  static const std::vector<std::string> names = {"auto", "shared", "per_stream"};
  return names;
}

namespace {

struct Candidate {
  std::vector<Offset> offsets;
  Offset height = 0;
  std::string method;
  int64_t nodes = 0;
};

SolveOptions share_of(const SolveOptions& options, double deadline, int parts) {
  SolveOptions sub = options;
  sub.progress = nullptr;
  sub.time_limit = std::max(1e-3, (deadline - seconds_now()) / std::max(parts, 1));
  return sub;
}

Candidate plan_shared(const std::vector<Buffer>& buffers, const StreamLifetimes& life, const SolveOptions& options,
                      double deadline, int parts) {
  const Solution s = solve(with_upper(buffers, life.shared), share_of(options, deadline, parts));
  return {s.offsets, s.height, s.method, s.nodes};
}

Candidate plan_per_stream(const std::vector<Buffer>& buffers, const StreamSchedule& schedule,
                          const StreamLifetimes& life, const SolveOptions& options, double deadline) {
  std::map<StreamId, std::vector<size_t>> regions;
  for (size_t b = 0; b < buffers.size(); ++b) regions[schedule.home_of(b)].push_back(b);
  Candidate out;
  out.offsets.assign(buffers.size(), 0);
  std::vector<std::string> methods;
  int left = int(regions.size());
  for (const auto& [stream, members] : regions) {
    std::vector<Buffer> sub;
    for (size_t b : members) sub.push_back({buffers[b].id, buffers[b].lower, life.own[b], buffers[b].size});
    const Solution s = solve(sub, share_of(options, deadline, left--));
    for (size_t k = 0; k < members.size(); ++k) out.offsets[members[k]] = out.height + s.offsets[k];
    out.height += s.height;
    out.nodes += s.nodes;
    if (std::find(methods.begin(), methods.end(), s.method) == methods.end()) methods.push_back(s.method);
  }
  for (size_t k = 0; k < methods.size(); ++k) out.method += (k ? "+" : "") + methods[k];
  return out;
}

}  // namespace

Solution solve(const std::vector<Buffer>& buffers, const StreamSchedule& schedule, const SolveOptions& options) {
  const auto& kinds = sharing_names();
  if (std::find(kinds.begin(), kinds.end(), options.sharing) == kinds.end()) {
    throw std::invalid_argument("unknown sharing '" + options.sharing + "' (auto, shared, per_stream)");
  }
  if (schedule.single_stream()) return solve(buffers, options);
  const double start = seconds_now();
  if (!(options.time_limit > 0)) throw std::invalid_argument("time limit must be > 0");
  check_buffers(buffers);
  const std::vector<Buffer> padded = pad_sizes(buffers, options.alignment);
  const StreamLifetimes life = StreamLiveness(buffers, schedule).lifetimes();
  const double deadline = start + options.time_limit;
  Solution out;
  out.lower_bound = lower_bound(with_upper(padded, life.bound));
  auto report = [&](const std::string& phase, Offset height) {
    if (options.progress) options.progress({seconds_now() - start, height, out.lower_bound, phase});
  };
  std::vector<std::pair<std::string, Candidate>> tried;
  const bool both = options.sharing == "auto";
  if (options.sharing != "per_stream") {
    tried.emplace_back("shared", plan_shared(buffers, life, options, deadline, both ? 2 : 1));
    report("shared:" + tried.back().second.method, tried.back().second.height);
  }
  if (options.sharing != "shared") {
    tried.emplace_back("per_stream", plan_per_stream(buffers, schedule, life, options, deadline));
    report("per_stream:" + tried.back().second.method, tried.back().second.height);
  }
  size_t best = 0;
  for (size_t k = 1; k < tried.size(); ++k) {
    if (tried[k].second.height < tried[best].second.height) best = k;
  }
  Candidate& c = tried[best].second;
  out.sharing = tried[best].first;
  out.offsets = std::move(c.offsets);
  out.method = c.method;
  for (const auto& t : tried) out.nodes += t.second.nodes;
  out.height = height_of(padded, out.offsets);
  out.optimal = out.height <= out.lower_bound;
  const Validation v = validate_streams(padded, schedule, out.offsets);
  if (!v.ok) throw std::logic_error("planner produced an invalid placement under streams: " + v.message);
  out.seconds = seconds_now() - start;
  return out;
}

}  // namespace torchmem::planner
