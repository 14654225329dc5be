#include "core/planner/streams/stream_liveness.h"

#include <algorithm>
#include <stdexcept>

namespace torchmem::planner {

namespace {

std::vector<StreamId> all_streams(const std::vector<Buffer>& buffers, const StreamSchedule& schedule) {
  if (!schedule.home.empty() && schedule.home.size() != buffers.size()) {
    throw std::invalid_argument("expected one home stream per buffer (" + std::to_string(buffers.size()) +
                                "), got " + std::to_string(schedule.home.size()));
  }
  if (!schedule.names.empty() && schedule.names.size() != buffers.size()) {
    throw std::invalid_argument("expected one name per buffer (" + std::to_string(buffers.size()) + "), got " +
                                std::to_string(schedule.names.size()));
  }
  std::vector<StreamId> out = {0};
  for (size_t b = 0; b < schedule.home.size(); ++b) {
    if (schedule.home[b] < 0) {
      throw std::invalid_argument("buffer " + schedule.name_of(buffers, b) + " has negative stream " +
                                  std::to_string(schedule.home[b]));
    }
    out.push_back(schedule.home[b]);
  }
  for (const StreamRead& r : schedule.reads) {
    if (r.buffer < 0 || size_t(r.buffer) >= buffers.size()) {
      throw std::invalid_argument("a read names buffer #" + std::to_string(r.buffer) + ", but there are " +
                                  std::to_string(buffers.size()) + " buffers");
    }
    if (r.stream < 0) {
      throw std::invalid_argument("buffer " + schedule.name_of(buffers, size_t(r.buffer)) +
                                  " is read on negative stream " + std::to_string(r.stream));
    }
    out.push_back(r.stream);
  }
  return out;
}

}  // namespace

StreamLiveness::StreamLiveness(const std::vector<Buffer>& buffers, const StreamSchedule& schedule)
    : buffers_(buffers), schedule_(schedule), order_(all_streams(buffers, schedule), schedule.syncs) {
  const size_t n = buffers.size();
  last_use_.assign(n, {});
  for (size_t b = 0; b < n; ++b) {
    last_use_[b].emplace_back(schedule.home_of(b), buffers[b].upper - 1);
    horizon_ = std::max(horizon_, buffers[b].upper);
    if (buffers[b].size > 0) allocating_.push_back(schedule.home_of(b));
  }
  for (const Sync& s : schedule.syncs) horizon_ = std::max(horizon_, s.before + 1);
  for (const StreamRead& r : schedule.reads) {
    const size_t b = size_t(r.buffer);
    const StreamId home = schedule.home_of(b);
    const Buffer& buf = buffers[b];
    const std::string where = "buffer " + schedule.name_of(buffers, b) + " is read on stream " +
                              std::to_string(r.stream) + " at step " + std::to_string(r.step);
    if (r.stream == home && r.step < buf.lower) {
      throw std::invalid_argument(where + ", before its producer at step " + std::to_string(buf.lower));
    }
    if (r.stream != home && !order_.before(home, buf.lower, r.stream, r.step)) {
      throw std::invalid_argument(where + ", but no synchronisation from stream " + std::to_string(home) +
                                  " after its producer (step " + std::to_string(buf.lower) +
                                  ") reaches that read: it could run before the buffer is written");
    }
    auto& uses = last_use_[b];
    auto it = std::find_if(uses.begin(), uses.end(), [&](const auto& u) { return u.first == r.stream; });
    if (it == uses.end()) {
      uses.emplace_back(r.stream, r.step);
    } else {
      it->second = std::max(it->second, r.step);
    }
    horizon_ = std::max(horizon_, r.step + 1);
  }
  std::sort(allocating_.begin(), allocating_.end());
  allocating_.erase(std::unique(allocating_.begin(), allocating_.end()), allocating_.end());
  for (size_t b = 0; b < n; ++b) {
    const StreamId home = schedule.home_of(b);
    for (const auto& [s, step] : last_use_[b]) {
      if (s != home && order_.first_after(s, step, home) == kNever) {
        throw std::invalid_argument("buffer " + schedule.name_of(buffers, b) + " is read on stream " +
                                    std::to_string(s) + " at step " + std::to_string(step) +
                                    ", but no synchronisation after that read leads back to stream " +
                                    std::to_string(home) + " (where it is produced): its bytes could never be released");
      }
    }
  }
}

Time StreamLiveness::release(size_t b, StreamId y) const {
  Time out = buffers_[b].upper;
  for (const auto& [s, step] : last_use_[b]) {
    const Time t = order_.first_after(s, step, y);
    if (t == kNever) return kNever;
    out = std::max(out, t);
  }
  return out;
}

StreamLifetimes StreamLiveness::lifetimes() const {
  const size_t n = buffers_.size();
  StreamLifetimes out;
  out.horizon = horizon_;
  out.own.resize(n);
  out.shared.resize(n);
  out.bound.resize(n);
  for (size_t b = 0; b < n; ++b) {
    const StreamId home = schedule_.home_of(b);
    const Time own = release(b, home);
    Time latest = own, earliest = own;
    for (StreamId y : allocating_) {
      if (y == home) continue;
      const Time t = release(b, y);
      latest = std::max(latest, t);
      earliest = std::min(earliest, t);
    }
    out.own[b] = own;
    out.shared[b] = std::min(latest, horizon_);
    out.bound[b] = std::min(earliest, horizon_);
  }
  return out;
}

std::vector<Buffer> with_upper(const std::vector<Buffer>& buffers, const std::vector<Time>& ends) {
  std::vector<Buffer> out = buffers;
  for (size_t b = 0; b < out.size(); ++b) out[b].upper = ends[b];
  return out;
}

}  // namespace torchmem::planner
