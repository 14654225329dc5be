// StreamUses: allocations used on streams other than their own, and the
// frees that wait for those streams' work (PyTorch's Tensor.record_stream).
//
// Note [Stream uses]
// A block belongs to the stream it was allocated on: a free makes it
// reusable at once on that stream, since later work there runs after the
// work that used it. A use on another stream (record(ptr, stream)) breaks
// that: the free must wait until the work queued on each such stream by
// then is done. So a free of a block with uses is deferred: an event is
// recorded on each of its streams, and the memory is reused once they have
// all completed (PyTorch's insert_events / process_events). The caller
// polls (take_completed(false)) at each allocation and waits
// (take_completed(true)) before it empties the cache or retries an
// allocation that ran out of memory.
// While a CUDA graph is captured no event may be recorded or queried
// (recording puts it in the graph; querying invalidates the capture): a
// free deferred then records its events only at the first take_completed()
// after the capture, which callers make only when no capture is underway.
//
// Contract:
// - record(ptr, stream) adds a use; the caller skips the allocation's own
//   stream (PyTorch ignores it). Uses of a pointer are forgotten when its
//   free is deferred or forgotten (forget()).
// - defer_free(ptr, owner, two_step, capturing) returns false, keeping nothing, when
//   ptr has no uses (the caller frees it now). Otherwise it keeps (ptr,
//   owner) until take_completed() returns it.
// - take_completed(wait, owner) records the events of frees deferred during
//   a capture, then returns, and forgets, the frees whose events have all
//   completed (wait: after synchronizing every event), of every owner or of
//   one. Destroyed events go back to the device. Never call it while a
//   capture is underway.
// - Thread safe: one internal ForkSafeMutex of rank kContext (under an
//   allocator's lock, as the out-of-memory retry's waiter takes it), held
//   while calling the device's event functions and never while calling an
//   allocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "core/base/allocator.h"
#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class StreamUses {
 public:
  struct Pending {
    void* ptr;
    Allocator* owner;   // frees ptr once complete
    bool two_step;      // owner is a DeviceAllocator whose request_free(ptr) was made
  };

  explicit StreamUses(Device& device) : device_(device) {}
  ~StreamUses();
  StreamUses(const StreamUses&) = delete;
  StreamUses& operator=(const StreamUses&) = delete;

  void record(void* ptr, Stream stream);
  bool has_uses(void* ptr) const;
  void forget(void* ptr);
  bool defer_free(void* ptr, Allocator* owner, bool two_step, bool capturing);
  // owner: only that owner's two-step frees (the out-of-memory waiter's).
  std::vector<Pending> take_completed(bool wait, const Allocator* owner = nullptr);

  size_t pending() const;
  // No use recorded and no free pending: callers skip the lock.
  bool idle() const { return busy_.load(std::memory_order_acquire) == 0; }
  bool nothing_pending() const { return deferred_count_.load(std::memory_order_acquire) == 0; }

 private:
  struct Deferred {
    void* ptr;
    Allocator* owner;
    bool two_step;
    std::vector<Stream> streams;   // events still to record (a capture was underway)
    std::vector<EventId> events;   // recorded, not yet seen complete
  };
  void update_counts_locked();

  Device& device_;
  mutable ForkSafeMutex mutex_{LockRank::kContext};
  std::unordered_map<void*, std::vector<Stream>> uses_;
  std::vector<Deferred> deferred_;
  std::atomic<size_t> busy_{0};            // uses_.size() + deferred_.size()
  std::atomic<size_t> deferred_count_{0};  // deferred_.size()
};

}  // namespace torchmem
