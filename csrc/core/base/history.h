// History: a ring buffer of allocator events in the vocabulary of
// torch.cuda.memory._snapshot()'s device_traces.
//
// Recording costs one predictable branch when disabled. When enabled, each
// event is one write into a preallocated ring (no heap allocation once the
// ring is full). A context provider, when set, tags allocations with an id
// (for example an interned Python stack); the allocator calls context()
// before taking its lock, so a provider may block (on the GIL) safely.
// record(), enable(), entries() are not thread safe: the owning allocator
// calls them under its lock. context() may be called from any thread; it
// reads the provider under the history's own ForkSafeMutex (rank kContext,
// see fork_safety.h), then calls it with no lock held.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

enum class Action : uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kOom,
  kSnapshot,
};

// The name PyTorch uses for the action ("alloc", "segment_map", ...).
const char* action_name(Action action);

struct TraceEntry {
  Action action;
  uintptr_t addr;      // for kOom: bytes the device had free
  size_t size;         // for kOom: bytes requested
  Stream stream;
  int64_t time_us;     // the system clock's, made strictly increasing across every History of the
                       // process, so entries of several allocators merge in order by time alone
  uint64_t context;    // 0, or the provider's id for this event
};

class History {
 public:
  using ContextProvider = std::function<uint64_t()>;

  // max_entries == 0 disables recording and clears the ring.
  void enable(size_t max_entries, ContextProvider provider = nullptr);
  bool enabled() const { return max_entries_ != 0; }

  void record(Action action, uintptr_t addr, size_t size, Stream stream, uint64_t context = 0) {
    if (max_entries_ == 0) return;
    record_slow(action, addr, size, stream, context);
  }

  // The provider's id for an allocation happening now, or 0 without one.
  uint64_t context() const {
    if (!has_provider_.load(std::memory_order_acquire)) return 0;
    std::shared_ptr<const ContextProvider> provider = current_provider();
    return provider ? (*provider)() : 0;
  }

  // Entries oldest first.
  std::vector<TraceEntry> entries() const;
  void clear();

 private:
  void record_slow(Action action, uintptr_t addr, size_t size, Stream stream, uint64_t context);
  std::shared_ptr<const ContextProvider> current_provider() const;

  size_t max_entries_ = 0;
  size_t next_ = 0;        // ring position of the next write once full
  std::vector<TraceEntry> ring_;
  std::atomic<bool> has_provider_{false};
  // Not std::atomic_load of a shared_ptr: libstdc++ guards that with a hidden
  // mutex pool, which a forked child could inherit held.
  mutable ForkSafeMutex provider_mutex_{LockRank::kContext};
  std::shared_ptr<const ContextProvider> provider_;
};

}  // namespace torchmem
