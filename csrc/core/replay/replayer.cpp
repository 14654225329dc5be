#include "core/replay/replayer.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace torchmem {

Replayer::Replayer(size_t capacity, size_t in_use_by_others, const AllocatorConfig& config, uint64_t sample_every,
                   bool skip_bad_events, bool follow_recording)
    : device_(std::make_unique<SimDevice>(capacity, 2u << 20, in_use_by_others)),
      config_(config),
      allocator_(make_device_allocator(*device_, config)),
      sample_every_(std::max<uint64_t>(1, sample_every)),
      skip_bad_events_(skip_bad_events),
      follow_recording_(follow_recording) {
  stats_ = &allocator_->stats_ref();
  native_ = allocator_->recorded_segments();
  if (!native_) follow_recording_ = false;  // no segments to follow
  pools_.push_back(Pool{ReplayPoolId{0, 0}, allocator_, native_});
  allocator_->set_pending_free_waiter([this] { return take_sync_frees(allocator_.get()); });
}

// ---------------------------------------------------------------- private pools

void Replayer::enter_pool(uint64_t index, ReplayPoolId id) {
  if (!native_) return;  // the stitch policy has no pools
  if (index > pools_.size()) bad_event("pool " + std::to_string(index) + " before pool " + std::to_string(pools_.size()));
  if (index == pools_.size()) {
    if (pools_.size() == 1) pool_peaks_ = allocator_->stats();  // until now the default pool's peaks are the device's
    std::shared_ptr<DeviceAllocator> made = make_device_allocator(*device_, config_);
    made->share_reserved(allocator_->device_reserved());  // a fraction's limit counts every pool
    // A CUDA graph's pool (id (graph, 0)) allocates only while its capture is underway, when PyTorch
    // neither collects garbage nor releases its cache and retries on a failed cudaMalloc. A MemPool's
    // (id (0, n)) allocates under use_mem_pool, where torch 2.14 still releases and retries (seen on the
    // fake GPU: tests/fakegpu/fixed/mempool-oom-retry.json).
    made->set_releases_blocked(id.first != 0 || id.second == 0);
    DeviceAllocator* raw = made.get();
    made->set_pending_free_waiter([this, raw] { return take_sync_frees(raw); });
    if (history_entries_) made->enable_history(history_entries_);
    auto* native = made->recorded_segments();
    pools_.push_back(Pool{id, std::move(made), native});
  }
  current_ = index;
}

DeviceAllocator& Replayer::owner_of(void* ptr) {
  if (!pool_blocks_.empty()) {
    auto it = pool_blocks_.find(ptr);
    if (it != pool_blocks_.end()) return *it->second;
  }
  return *allocator_;
}

void Replayer::free_block(void* ptr, bool requested) {
  DeviceAllocator& owner = owner_of(ptr);
  if (&owner != allocator_.get()) pool_blocks_.erase(ptr);
  if (requested) return owner.complete_free(ptr);
  owner.deallocate(ptr);
}

void Replayer::request_free(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end() || requested_.count(id)) {
    if (!skip_bad_events_) {
      bad_event("free_requested of id " + std::to_string(id) +
                (it == live_.end() ? ", which is not live (never allocated, or freed twice)" : ", whose free is already requested"));
    }
    ++skipped_;
    return;
  }
  owner_of(it->second).request_free(it->second);
  requested_.insert(id);
}

std::vector<void*> Replayer::take_sync_frees(const DeviceAllocator* caller) {
  std::vector<void*> ptrs;  // the caller's own: it completes them under its lock
  for (uint64_t id : sync_frees_) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    DeviceAllocator& owner = owner_of(it->second);
    if (&owner == caller) {
      ptrs.push_back(it->second);
      if (&owner != allocator_.get()) pool_blocks_.erase(it->second);
    } else {
      free_block(it->second, true);  // another pool's block: PyTorch waits for every pool's events
    }
    requested_.erase(id);
    live_.erase(it);
  }
  sync_frees_.clear();
  return ptrs;
}

void Replayer::make_request_releases() {
  for (uintptr_t addr : request_releases_) {
    if (release_segment(addr)) ++fidelity_.releases_made;  // else the request's own release made it
  }
  request_releases_.clear();
}

bool Replayer::release_segment(uintptr_t addr) {
  for (Pool& pool : pools_) {
    if (pool.native && pool.native->release_cached_segment(addr)) return true;
  }
  return false;
}

namespace {

std::vector<StatArray*> stat_arrays(DeviceStats& s) {
  std::vector<StatArray*> out;
  s.for_each_stat_array([&](StatArray& a) { out.push_back(&a); });
  return out;
}

}  // namespace

void Replayer::track_pool_peaks() {
  DeviceStats sum;
  for (const Pool& pool : pools_) add_stats(sum, pool.allocator->stats_ref());
  auto keep = [](Stat& peak, const Stat& now) { peak.peak = std::max(peak.peak, now.current); };
  const std::vector<StatArray*> peaks = stat_arrays(pool_peaks_), nows = stat_arrays(sum);
  for (size_t a = 0; a < peaks.size(); ++a) {
    StatArray& peak = *peaks[a];
    const StatArray& now = *nows[a];
    peak[kAggregate].peak = std::max(peak[kAggregate].peak, now[kSmallPool].current + now[kLargePool].current);
    keep(peak[kSmallPool], now[kSmallPool]);
    keep(peak[kLargePool], now[kLargePool]);
  }
  keep(pool_peaks_.oversize_allocations, sum.oversize_allocations);
  keep(pool_peaks_.oversize_segments, sum.oversize_segments);
}

DeviceStats Replayer::stats() const {
  DeviceStats out = pools_.size() == 1 ? allocator_->stats() : pool_sums();
  out.num_alloc_retries += recorded_retries_;
  return out;
}

DeviceStats Replayer::pool_sums() const {
  DeviceStats sum;
  for (const Pool& pool : pools_) add_stats(sum, pool.allocator->stats());
  DeviceStats peaks = pool_peaks_;
  const std::vector<StatArray*> from = stat_arrays(peaks), into = stat_arrays(sum);
  for (size_t a = 0; a < into.size(); ++a) {
    for (size_t t = 0; t < kNumStatTypes; ++t) (*into[a])[t].peak = (*from[a])[t].peak;
  }
  sum.oversize_allocations.peak = peaks.oversize_allocations.peak;
  sum.oversize_segments.peak = peaks.oversize_segments.peak;
  return sum;
}

void Replayer::enable_history(size_t max_entries) {
  history_entries_ = max_entries;
  for (Pool& pool : pools_) pool.allocator->enable_history(max_entries);
}

std::vector<TraceEntry> Replayer::history() const {
  if (pools_.size() == 1) return allocator_->history_entries();
  std::vector<TraceEntry> all;
  for (const Pool& pool : pools_) {
    std::vector<TraceEntry> part = pool.allocator->history_entries();
    all.insert(all.end(), part.begin(), part.end());
  }
  // History's clock never repeats a time (history.h), so time orders the pools' entries.
  std::stable_sort(all.begin(), all.end(), [](const TraceEntry& a, const TraceEntry& b) { return a.time_us < b.time_us; });
  if (history_entries_ && all.size() > history_entries_) all.erase(all.begin(), all.end() - history_entries_);
  return all;
}

size_t Replayer::largest_free_block() const {
  size_t largest = 0;
  for (const Pool& pool : pools_) largest = std::max(largest, pool.allocator->largest_free_block());
  return largest;
}

void Replayer::check_invariants() const {
  for (const Pool& pool : pools_) pool.allocator->check_invariants();
}

// ---------------------------------------------------------------- start state and events

// A policy without segments to rebuild gets the live blocks of the start
// state as allocations, in address order, before the first event.
void Replayer::restore_by_allocating(const std::vector<RecordedBlock>& blocks, Stream stream,
                                     const std::vector<uint64_t>& ids) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return blocks[a].addr < blocks[b].addr; });
  std::vector<std::pair<uint64_t, void*>> made;
  try {
    for (size_t i : order) {
      const size_t size = blocks[i].requested_size ? blocks[i].requested_size : blocks[i].size;
      made.emplace_back(ids[i], allocator_->allocate(std::max<size_t>(size, 1), stream));
    }
  } catch (const OutOfMemory&) {
    for (auto& [id, ptr] : made) allocator_->deallocate(ptr);
    throw std::invalid_argument("a live block that existed when recording began does not fit in the capacity");
  }
  for (auto& [id, ptr] : made) live_.emplace(id, ptr);
}

void Replayer::bad_event(const std::string& what) const {
  throw std::invalid_argument("event " + std::to_string(events_) + ": " + what);
}

void Replayer::restore(const RecordedSegment& segment, const std::vector<uint64_t>& ids, size_t pool) {
  if (ids.size() != segment.live_blocks.size()) throw std::invalid_argument("restore: one id per live block");
  for (uint64_t id : ids) {
    if (live_.count(id)) throw std::invalid_argument("restore: id " + std::to_string(id) + " is already live");
  }
  if (!native_) return restore_by_allocating(segment.live_blocks, segment.stream, ids);
  if (pool >= pools_.size()) throw std::invalid_argument("restore: pool " + std::to_string(pool) + " not made yet");
  if (!device_->adopt(segment.addr, segment.size)) {
    const bool too_big = segment.size > device_->free_bytes();
    char buf[200];
    std::snprintf(buf, sizeof buf, "the segment at 0x%llx (%zu bytes) that existed when recording began %s",
                  static_cast<unsigned long long>(segment.addr), segment.size,
                  too_big ? "does not fit in the capacity" : "is at address 0 or overlaps another segment");
    throw std::invalid_argument(buf);
  }
  try {
    pools_[pool].native->restore_segment(segment);
  } catch (...) {
    device_->free(segment.addr, segment.size);
    throw;
  }
  segments_restored_ = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    void* ptr = reinterpret_cast<void*>(segment.live_blocks[i].addr);
    live_.emplace(ids[i], ptr);
    if (pool != 0) pool_blocks_.emplace(ptr, pools_[pool].allocator.get());
  }
}

void Replayer::restore_expandable(const RecordedRange& range, const std::vector<uint64_t>& ids, size_t pool) {
  if (ids.size() != range.live_blocks.size()) throw std::invalid_argument("restore: one id per live block");
  for (uint64_t id : ids) {
    if (live_.count(id)) throw std::invalid_argument("restore: id " + std::to_string(id) + " is already live");
  }
  if (!native_) return restore_by_allocating(range.live_blocks, range.stream, ids);
  if (pool >= pools_.size()) throw std::invalid_argument("restore: pool " + std::to_string(pool) + " not made yet");
  device_->offer(range.base, 0);
  try {
    pools_[pool].native->restore_expandable(range);
  } catch (...) {
    device_->take_unused_offers();
    throw;
  }
  device_->take_unused_offers();
  for (size_t i = 0; i < ids.size(); ++i) {
    void* ptr = reinterpret_cast<void*>(range.live_blocks[i].addr);
    live_.emplace(ids[i], ptr);
    if (pool != 0) pool_blocks_.emplace(ptr, pools_[pool].allocator.get());
  }
}

void Replayer::sample(int64_t allocated, int64_t reserved) {
  window_allocated_ = std::max(window_allocated_, allocated);
  window_reserved_ = std::max(window_reserved_, reserved);
  if ((events_ + 1) % sample_every_ == 0) {
    timeline_.push_back({events_, window_allocated_, window_reserved_});
    window_allocated_ = window_reserved_ = 0;
  }
}

void Replayer::settle_offers() {
  if (!offers_pending_ && !range_offers_pending_) return;
  const size_t unused = device_->take_unused_offers();
  if (offers_pending_) fidelity_.segments_missed += unused;  // a kRangeOffer's base was a guess
  offers_pending_ = range_offers_pending_ = false;
}

void Replayer::note_age_guesses(Pool& pool) {
  if (!pool.native) return;
  const uint64_t guesses = pool.native->start_age_guesses();
  if (guesses == pool.age_guesses_seen) return;
  age_guesses_ += guesses - pool.age_guesses_seen;
  pool.age_guesses_seen = guesses;
  if (first_age_guess_ < 0) first_age_guess_ = static_cast<int64_t>(events_);
}

void Replayer::allocate(uint64_t id, size_t size, Stream stream, uintptr_t recorded, ReplayOp op) {
  const bool failed_on_gpu = op != ReplayOp::kAlloc;
  const size_t taken_before = device_->offers_taken();
  void* ptr = nullptr;
  DeviceAllocator& into = *pools_[current_].allocator;
  RecordedSegments* native = pools_[current_].native;
  const bool retried = search_missed_;
  const bool counted = retried && retry_counted_;
  search_missed_ = retry_counted_ = false;
  const int64_t retries_before = into.stats_ref().num_alloc_retries;
  auto count_recorded_retry = [&] {  // unless the request retried itself (its own full release)
    if (counted && into.stats_ref().num_alloc_retries == retries_before) ++recorded_retries_;
  };
  try {
    ptr = retried && native ? native->allocate_after_release(size, stream) : into.allocate(size, stream);
    count_recorded_retry();
  } catch (const OutOfMemory& e) {
    count_recorded_retry();
    fidelity_.segments_followed += device_->offers_taken() - taken_before;
    settle_offers();
    ReplayOom oom{events_, e.info(), e.what(), failed_on_gpu};
    if (op == ReplayOp::kSurvivedFailedAlloc && follow_recording_) {
      recorded_ooms_.push_back(std::move(oom));
    } else {
      oom_ = std::make_unique<ReplayOom>(std::move(oom));
    }
    return;
  }
  fidelity_.segments_followed += device_->offers_taken() - taken_before;
  settle_offers();
  if (pools_.size() > 1) track_pool_peaks();
  if (segments_restored_) note_age_guesses(pools_[current_]);
  if (failed_on_gpu) {
    into.deallocate(ptr);
    if (fidelity_.failed_alloc_succeeded < 0) fidelity_.failed_alloc_succeeded = static_cast<int64_t>(events_);
    return;
  }
  live_.emplace(id, ptr);
  if (current_ != 0) pool_blocks_.emplace(ptr, &into);
  if (recorded == 0 || !follow_recording_) return;
  if (reinterpret_cast<uintptr_t>(ptr) == recorded) {
    ++fidelity_.placements_matched;
  } else {
    ++fidelity_.placements_differed;
    if (fidelity_.first_difference < 0) fidelity_.first_difference = static_cast<int64_t>(events_);
  }
}

size_t Replayer::run(const uint8_t* ops, const uint64_t* ids, const uint64_t* sizes, const uint64_t* streams,
                     const uint64_t* addrs, size_t n) {
  size_t i = 0;
  for (; i < n && !oom_; ++i, ++events_) {
    const uint64_t id = ids[i];
    switch (static_cast<ReplayOp>(ops[i])) {
      case ReplayOp::kAlloc:
      case ReplayOp::kFailedAlloc:
      case ReplayOp::kSurvivedFailedAlloc: {
        const auto op = static_cast<ReplayOp>(ops[i]);
        if (op == ReplayOp::kAlloc && live_.count(id)) {
          if (!skip_bad_events_) bad_event("alloc of id " + std::to_string(id) + ", which is already live");
          ++skipped_;
          continue;
        }
        allocate(id, sizes[i], streams[i], addrs ? addrs[i] : 0, op);
        if (!sync_frees_.empty()) take_sync_frees(nullptr);  // no full release made them: after the request
        if (!request_releases_.empty()) make_request_releases();
        if (oom_) return i;
        break;
      }
      case ReplayOp::kFreeAtSync:
        if (requested_.count(id) && live_.count(id)) {
          sync_frees_.push_back(id);
          break;
        }
        [[fallthrough]];
      case ReplayOp::kFree: {
        auto it = live_.find(id);
        if (it == live_.end()) {
          if (!skip_bad_events_) bad_event("free of id " + std::to_string(id) + ", which is not live (never allocated, or freed twice)");
          ++skipped_;
          continue;
        }
        free_block(it->second, !requested_.empty() && requested_.erase(id));
        live_.erase(it);
        break;
      }
      case ReplayOp::kFreeRequested:
        request_free(id);
        break;
      case ReplayOp::kEmptyCache:
        if (follow_recording_) break;
        allocator_->empty_cache();
        ++fidelity_.empty_cache_calls;
        break;
      case ReplayOp::kRequestRelease:
        if (follow_recording_ && addrs && native_) request_releases_.push_back(addrs[i]);
        break;
      case ReplayOp::kReleaseSegment:
        if (!follow_recording_ || !addrs || !native_) break;
        ++(release_segment(addrs[i]) ? fidelity_.releases_made : fidelity_.releases_missed);
        break;
      case ReplayOp::kSegmentAddress:
        if (follow_recording_ && addrs && addrs[i]) {
          // After the request's own releases, a range there may be given back before the request reserves.
          device_->offer(addrs[i], sizes[i], !request_releases_.empty());
          offers_pending_ = true;
        }
        break;
      case ReplayOp::kRecordedRetry:
        if (follow_recording_) {
          search_missed_ = true;
          retry_counted_ = sizes[i] == 0;
        }
        break;
      case ReplayOp::kRangeOffer:
        if (follow_recording_ && addrs && addrs[i]) {
          device_->offer(addrs[i], 0, true);  // the request's own release may give back the range there
          range_offers_pending_ = true;
        }
        break;
      case ReplayOp::kPool:
        enter_pool(id, ReplayPoolId{sizes[i], addrs ? addrs[i] : 0});
        break;
      default:
        bad_event("unknown operation code " + std::to_string(ops[i]));
    }
    if (pools_.size() == 1) {
      const DeviceStats& s = *stats_;  // kept pool by pool (increase_pool): the aggregate is their sum
      sample(s.allocated_bytes[kSmallPool].current + s.allocated_bytes[kLargePool].current,
             s.reserved_bytes[kSmallPool].current + s.reserved_bytes[kLargePool].current);
    } else {
      track_pool_peaks();
      int64_t allocated = 0, reserved = 0;
      for (const Pool& pool : pools_) {
        const DeviceStats& s = pool.allocator->stats_ref();
        allocated += s.allocated_bytes[kSmallPool].current + s.allocated_bytes[kLargePool].current;
        reserved += s.reserved_bytes[kSmallPool].current + s.reserved_bytes[kLargePool].current;
      }
      sample(allocated, reserved);
    }
  }
  return i;
}

}  // namespace torchmem
