#include "core/planner/streams/streams.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace torchmem::planner {

bool StreamSchedule::single_stream() const {
  return reads.empty() && syncs.empty() && std::all_of(home.begin(), home.end(), [](StreamId s) { return s == 0; });
}

std::string StreamSchedule::name_of(const std::vector<Buffer>& buffers, size_t b) const {
  return b < names.size() ? names[b] : std::to_string(buffers[b].id);
}

namespace {

std::string describe(const Sync& s) {
  return "sync from stream " + std::to_string(s.from) + " after step " + std::to_string(s.after) + " to stream " +
         std::to_string(s.to) + " before step " + std::to_string(s.before);
}

}  // namespace

HappensBefore::HappensBefore(const std::vector<StreamId>& streams, const std::vector<Sync>& syncs) {
  ids_ = streams;
  for (const Sync& s : syncs) {
    if (s.from < 0 || s.to < 0) throw std::invalid_argument(describe(s) + ": stream ids must be >= 0");
    if (s.from == s.to) throw std::invalid_argument(describe(s) + ": a stream cannot wait for itself");
    if (s.after >= s.before) {
      throw std::invalid_argument(describe(s) + ": the event must be recorded before it is waited on (after < before)");
    }
    ids_.push_back(s.from);
    ids_.push_back(s.to);
  }
  for (StreamId s : ids_) {
    if (s < 0) throw std::invalid_argument("stream " + std::to_string(s) + ": stream ids must be >= 0");
  }
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  for (size_t i = 0; i < ids_.size(); ++i) dense_[ids_[i]] = int32_t(i);
  const size_t n = ids_.size();
  wait_steps_.assign(n, {});
  clocks_.assign(n, {});
  std::vector<Sync> order = syncs;
  std::sort(order.begin(), order.end(), [](const Sync& a, const Sync& b) {
    return std::tie(a.before, a.to, a.from, a.after) < std::tie(b.before, b.to, b.from, b.after);
  });
  // In order of `before`: what `from` knows after `after` is final (its
  // waits up to `after` < `before` are already in).
  std::vector<Time> carried(n);
  for (const Sync& s : order) {
    const int32_t a = dense_.at(s.from), b = dense_.at(s.to);
    for (size_t k = 0; k < n; ++k) carried[k] = known(a, s.after, int32_t(k));
    carried[a] = std::max(carried[a], s.after);
    std::vector<Time>& steps = wait_steps_[b];
    std::vector<Time>& rows = clocks_[b];
    if (steps.empty() || steps.back() != s.before) {
      const size_t prev = rows.size();
      steps.push_back(s.before);
      rows.resize(prev + n, kUnknown);
      if (prev > 0) std::copy(rows.begin() + prev - n, rows.begin() + prev, rows.begin() + prev);
    }
    Time* row = rows.data() + rows.size() - n;
    for (size_t k = 0; k < n; ++k) row[k] = std::max(row[k], carried[k]);
  }
}

int32_t HappensBefore::index(StreamId s) const {
  const auto it = dense_.find(s);
  return it == dense_.end() ? -1 : it->second;
}

Time HappensBefore::known(int32_t x, Time t, int32_t s) const {
  const std::vector<Time>& steps = wait_steps_[x];
  const size_t k = size_t(std::upper_bound(steps.begin(), steps.end(), t) - steps.begin());
  if (k == 0) return kUnknown;
  return clocks_[x][(k - 1) * ids_.size() + size_t(s)];
}

bool HappensBefore::before(StreamId s, Time u, StreamId x, Time t) const {
  if (s == x) return u < t;
  const int32_t si = index(s), xi = index(x);
  if (si < 0 || xi < 0) return false;
  return known(xi, t, si) >= u;
}

Time HappensBefore::first_after(StreamId s, Time u, StreamId x) const {
  if (s == x) return u + 1;
  const int32_t si = index(s), xi = index(x);
  if (si < 0 || xi < 0) return kNever;
  const std::vector<Time>& steps = wait_steps_[xi];
  const size_t n = ids_.size();
  // Clocks only grow along a stream's waits: binary search the first row
  // that knows step u of s.
  size_t lo = 0, hi = steps.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (clocks_[xi][mid * n + size_t(si)] >= u) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo == steps.size() ? kNever : steps[lo];
}

}  // namespace torchmem::planner
