// Replayer: runs an allocation trace through the allocator the config asks
// for (make_device_allocator: the native CachingAllocator, or the stitch
// policy) on a SimDevice of any capacity, to reproduce (and try fixes for)
// out-of-memory failures without the GPU. It is the allocator itself, not a
// model of it.
//
// Events arrive in chunks (run() may be called many times), so memory grows
// with the number of live allocations, never with the length of the trace.
// Each event is (op, id, size, stream, addr):
//   kAlloc          allocate `size` on `stream` as `id`; `addr` is where the
//                   recording placed it (0: unknown), compared, never forced
//   kFree           free `id`
//   kEmptyCache     the recorded program's empty_cache()
//   kSegmentAddress the recording's next segment was at `addr` with `size`
//                   bytes (size 0: an expandable range): offered to the
//                   device for the next request (Note [Recorded addresses]);
//                   after a kRequestRelease, even inside a live range, which
//                   the request's own release may give back before it
//                   reserves one there
//   kFailedAlloc    the request the recording's out-of-memory refused: an
//                   OOM here reproduces it; if it succeeds it is freed at once
//   kReleaseSegment the recording released the cached segment (or unmapped
//                   the free pages) at `addr`, of `size` bytes
//   kSurvivedFailedAlloc  a kFailedAlloc after which the program went on
//                   allocating (it caught the OOM): following the recording,
//                   an OOM here is listed and the replay goes on; otherwise
//                   as kFailedAlloc
//   kPool           the allocations that follow go to private pool `id`
//                   (0: the default pool) until the next kPool; `size` and
//                   `addr` are the recording's pool id (PyTorch's MempoolId_t)
//   kFreeRequested  the program freed `id` while its block was still used on
//                   other streams (record_stream; the recording's
//                   free_requested with its free_completed later): the
//                   allocation ends here (DeviceAllocator::request_free:
//                   allocated statistics drop) and the block stays active and
//                   out of the cache until the kFree of `id` (free_completed:
//                   complete_free). A policy without a two-step free frees it
//                   at the kFree (DeviceAllocator's defaults)
//   kRangeOffer     a base an expandable range may be reserved at by the
//                   failed request that follows (Note [Expandable ranges in a
//                   snapshot], torchmem/replay/expandable_ranges.py): offered
//                   as a kSegmentAddress of size 0, but the recording did not
//                   reserve it there, so an offer not taken is not a recorded
//                   segment missed (ReplayFidelity::segments_missed)
//   kRecordedRetry  a run of releases that a new segment followed: the
//                   request that made it missed its search, whether PyTorch
//                   searched before the releases (its own) or after them (the
//                   program's), so the next request skips its search
//                   (RecordedSegments::allocate_after_release). With `size` 0
//                   the recording's allocator retried here, after a failed
//                   device allocation (torchmem/replay/retries.py infers it):
//                   a replay that follows the recording makes those releases
//                   itself and never fails first, so it counts the retry in
//                   num_alloc_retries (unless the next request retried
//                   itself, after kRequestRelease); `size` 1 counts none.
//                   Others ignore it
//   kFreeAtSync     the recording completed the requested free of `id`
//                   (a kFreeRequested before) inside the next request's
//                   full release: PyTorch's synchronize_and_free_events,
//                   after the request's search of the cache missed (Note
//                   [Frees completed at a release], trace_pass.py). The free
//                   completes where the allocator waits for pending frees
//                   (set_pending_free_waiter), or after the next request
//                   where it makes no full release. An id whose free was not
//                   requested is freed at once, as at kFree
//   kRequestRelease the recording released the cached segment (or the free
//                   pages) at `addr` inside the next request, after that
//                   request mapped pages of an expandable range and the
//                   device refused more: the request's own full release
//                   (Note [A failed map's own release], trace_pass.py).
//                   Following the recording, the allocator makes it itself
//                   when its map fails; what it did not make is released
//                   after the request. Others ignore it
// Note [Private pools in the replay]
// As PyTorch's graph_pools: each private pool (a CUDA graph's, a
// torch.cuda.MemPool's) is an allocator of its own under the same config
// on the same device, so it keeps its own free blocks and segments; a
// block is freed to the pool that made it, a recorded release goes to the
// pool that holds the segment, and the statistics are the device's: the
// pools' sums, with peaks of those sums (taken after every event). Under
// the stitch policy, which has no pools, kPool is ignored. A private pool's
// allocator has its releases blocked (device_allocator.h): it allocates
// only under a capture, where PyTorch does not collect or retry. Not following
// the recording, kEmptyCache empties the default pool only (a live graph
// keeps its pool's cache, and the replay does not know which have died).
// A replay that follows the recording (follow_recording) offers segment
// addresses, compares placements and makes each recorded release, and
// ignores kEmptyCache (its releases are in the trace). One that does not
// ignores kSegmentAddress and kReleaseSegment and calls empty_cache() at
// kEmptyCache: the program's calls, under settings of its own.
// Ids are the trace's names for allocations; an id may be reused after it
// is freed. restore() adds the segments and live blocks of a recording's
// start state before the first event (Note [Start state]); under the stitch
// policy, which has no segments to rebuild, it allocates the live blocks
// (their requested sizes, in address order) instead, and follow_recording,
// offers and recorded releases do not apply.
//
// Contract:
// - run() stops at the first out-of-memory and records it; later calls do
//   nothing. Returns the number of events consumed from this chunk.
//   Exception: a replay that follows the recording goes on after an OOM at
//   a kSurvivedFailedAlloc, listing it in recorded_ooms().
// - A free of an unknown id, or an alloc of a live id (one whose free is
//   requested included), or a second kFreeRequested of an id, throws
//   std::invalid_argument naming the event index, unless skip_bad_events is
//   set, in which case the event is skipped and counted.
// - The timeline holds one point per `sample_every` events: the largest
//   allocated and reserved bytes seen in that window, so peaks are exact.
// Not thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/base/device_allocator.h"
#include "core/base/node_pool.h"
#include "core/devices/sim_device.h"
#include "core/replay/recorded_state.h"

namespace torchmem {

enum class ReplayOp : uint8_t {
  kAlloc = 0,
  kFree = 1,
  kEmptyCache = 2,
  kSegmentAddress = 3,
  kFailedAlloc = 4,
  kReleaseSegment = 5,
  kSurvivedFailedAlloc = 6,
  kPool = 7,
  kFreeRequested = 8,
  kRangeOffer = 9,
  kRecordedRetry = 10,
  kFreeAtSync = 11,
  kRequestRelease = 12,
};

using ReplayPoolId = std::pair<uint64_t, uint64_t>;

struct ReplayOom {
  uint64_t index = 0;  // event index in the whole trace
  OomInfo info;
  std::string message;
  bool recorded = false;  // at a kFailedAlloc: the recording's own OOM, reproduced
};

struct TimelinePoint {
  uint64_t index;       // last event of the window
  int64_t allocated;    // largest in the window
  int64_t reserved;
};

// How closely the replay followed the recording's addresses.
struct ReplayFidelity {
  uint64_t placements_matched = 0;    // allocs at their recorded address
  uint64_t placements_differed = 0;   // allocs elsewhere (recorded address known)
  int64_t first_difference = -1;      // event index of the first, or -1
  uint64_t segments_followed = 0;     // recorded segment addresses taken
  uint64_t segments_missed = 0;       // recorded segment addresses not taken
  uint64_t empty_cache_calls = 0;
  uint64_t releases_made = 0;          // recorded releases of cached memory made
  uint64_t releases_missed = 0;        // recorded releases with no such cached memory here
  int64_t failed_alloc_succeeded = -1;  // event index of a kFailedAlloc that did not fail, or -1
};

class Replayer {
 public:
  Replayer(size_t capacity, size_t in_use_by_others, const AllocatorConfig& config, uint64_t sample_every,
           bool skip_bad_events, bool follow_recording = false);

  // Before the first event: takes the segment from the device at its
  // address and rebuilds it; ids[i] names live_blocks[i]. Throws
  // std::invalid_argument when the device cannot hold it there (overlap, or
  // more than the capacity), when its blocks are inconsistent, or an id is live.
  // `pool`: the index of the private pool that holds it (0: the default
  // pool); make the pools first with enter_pool().
  void restore(const RecordedSegment& segment, const std::vector<uint64_t>& ids, size_t pool = 0);
  // Allocations go to pool `index` (made now when it is the next one); a
  // kPool event does the same. Before the first event it makes the pools
  // that held segments when recording began (Note [Private pools in the replay]).
  void enter_pool(uint64_t index, ReplayPoolId id);
  // The same for the range of an expandable segment (reserved at its base).
  void restore_expandable(const RecordedRange& range, const std::vector<uint64_t>& ids, size_t pool = 0);
  // Fresh segment addresses start above `floor` (the highest recorded one).
  void set_address_floor(uintptr_t floor) { device_->set_address_floor(floor); }

  size_t run(const uint8_t* ops, const uint64_t* ids, const uint64_t* sizes, const uint64_t* streams,
             const uint64_t* addrs, size_t n);

  bool stopped() const { return oom_ != nullptr; }
  const ReplayOom* oom() const { return oom_.get(); }
  // Following the recording: the OOMs met at kSurvivedFailedAlloc and gone past, in order.
  const std::vector<ReplayOom>& recorded_ooms() const { return recorded_ooms_; }
  uint64_t events() const { return events_; }
  uint64_t skipped() const { return skipped_; }
  const ReplayFidelity& fidelity() const { return fidelity_; }
  const std::vector<TimelinePoint>& timeline() const { return timeline_; }
  DeviceAllocator& allocator() { return *allocator_; }
  // The policy's replay support (DeviceAllocator::recorded_segments(): the
  // native policy's), or null under a policy without it.
  RecordedSegments* native() { return native_; }
  SimDevice& device() { return *device_; }

  // Private pools (Note [Private pools in the replay]): pool 0 is the
  // default pool, allocator(); the others in the order the trace made them.
  size_t pool_count() const { return pools_.size(); }
  ReplayPoolId pool_id(size_t i) const { return pools_.at(i).id; }
  DeviceAllocator& pool_allocator(size_t i) { return *pools_.at(i).allocator; }
  // The device's statistics: every pool's summed, peaks of the sums; following
  // the recording, num_alloc_retries counts its counted kRecordedRetry events too.
  DeviceStats stats() const;
  // Allocations that a tie between segments of the start state decided, and
  // the event index of the first (-1: none): the snapshot does not hold those
  // segments' ages (Note [Start segments' ages], caching_replay.cpp).
  uint64_t start_age_guesses() const { return age_guesses_; }
  int64_t first_start_age_guess() const { return first_age_guess_; }
  // History for every pool (now and made later), and its entries in the
  // order they happened across pools.
  void enable_history(size_t max_entries);
  std::vector<TraceEntry> history() const;
  size_t largest_free_block() const;
  void check_invariants() const;

 private:
  void sample(int64_t allocated, int64_t reserved);
  void allocate(uint64_t id, size_t size, Stream stream, uintptr_t recorded, ReplayOp op);
  void settle_offers();
  [[noreturn]] void bad_event(const std::string& what) const;

  void restore_by_allocating(const std::vector<RecordedBlock>& blocks, Stream stream, const std::vector<uint64_t>& ids);
  DeviceAllocator& owner_of(void* ptr);  // the pool allocator that made the live block at ptr
  void free_block(void* ptr, bool requested);
  void request_free(uint64_t id);
  // The kFreeAtSync blocks, forgotten here, at `caller`'s full release: those of other pools freed now, the
  // caller's returned for it to complete (caller null: every one freed now).
  std::vector<void*> take_sync_frees(const DeviceAllocator* caller);
  void make_request_releases();          // the kRequestRelease releases the last request did not make
  bool release_segment(uintptr_t addr);
  void track_pool_peaks();
  DeviceStats pool_sums() const;  // stats() of more than one pool

  struct Pool {
    ReplayPoolId id;
    std::shared_ptr<DeviceAllocator> allocator;
    RecordedSegments* native;  // the pool allocator's replay support
    uint64_t age_guesses_seen = 0;  // native->start_age_guesses() when last read
  };
  void note_age_guesses(Pool& pool);  // after an allocation in `pool`: counts its new start-age guesses

  std::unique_ptr<SimDevice> device_;
  AllocatorConfig config_;
  std::shared_ptr<DeviceAllocator> allocator_;
  RecordedSegments* native_ = nullptr;
  const DeviceStats* stats_ = nullptr;  // the allocator's live statistics
  std::vector<Pool> pools_;             // [0]: the default pool
  size_t current_ = 0;                  // the pool allocations go to now
  std::unordered_map<void*, DeviceAllocator*> pool_blocks_;  // live blocks of private pools
  std::unordered_set<uint64_t> requested_;  // live ids whose free is requested (kFreeRequested)
  std::vector<uint64_t> sync_frees_;        // of those, ids that complete at the next request's release
  std::vector<uintptr_t> request_releases_;  // kRequestRelease addresses, made by or after the next request
  DeviceStats pool_peaks_;              // with private pools: peaks of the pools' sums
  size_t history_entries_ = 0;
  NodePool nodes_;  // the live map's nodes: no heap allocation per event once warm
  using LiveMap = std::unordered_map<uint64_t, void*, std::hash<uint64_t>, std::equal_to<uint64_t>,
                                     PoolAllocator<std::pair<const uint64_t, void*>>>;
  LiveMap live_{1024, std::hash<uint64_t>{}, std::equal_to<uint64_t>{}, PoolAllocator<std::pair<const uint64_t, void*>>(&nodes_)};
  std::unique_ptr<ReplayOom> oom_;
  std::vector<ReplayOom> recorded_ooms_;
  std::vector<TimelinePoint> timeline_;
  ReplayFidelity fidelity_;
  uint64_t sample_every_;
  bool skip_bad_events_;
  bool follow_recording_;
  bool offers_pending_ = false;        // recorded addresses offered (kSegmentAddress), not yet settled
  bool range_offers_pending_ = false;  // kRangeOffer bases offered, not yet settled
  int64_t recorded_retries_ = 0;       // counted kRecordedRetry events whose request made no retry of its own
  bool search_missed_ = false;         // a kRecordedRetry met: the next request skips its search
  bool retry_counted_ = false;         // ... and the recording counted it in num_alloc_retries (size 0)
  bool segments_restored_ = false;     // restore() made a start segment: only then can a start-age tie arise
  uint64_t age_guesses_ = 0;           // every pool's start-age guesses (note_age_guesses)
  int64_t first_age_guess_ = -1;       // event index of the first, or -1
  uint64_t events_ = 0;
  uint64_t skipped_ = 0;
  int64_t window_allocated_ = 0;
  int64_t window_reserved_ = 0;
};

}  // namespace torchmem
