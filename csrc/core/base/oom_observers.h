// OomObservers: the functions told about an out-of-memory error before it is
// raised to the program, and the notes they add to its message.
//
// An allocator throws OutOfMemory under its own lock; the glue that turns it
// into the framework's error (c10::OutOfMemoryError) calls notify() once the
// exception has left the allocator, then raises the error with the notes
// appended. torchmem.dump_on_oom() is such an observer: it writes a snapshot
// and names the file in the message.
//
// Contract:
// - notify() calls the observers in the order they were added, on the thread
//   that ran out of memory. No lock of this class is held during the calls,
//   so an observer may add or remove observers and may call into the
//   allocator (take snapshots, allocate).
// - notify() never throws. An observer that throws is reported in the notes
//   ("... failed: what()"); the out-of-memory error is raised all the same.
// - An out-of-memory error raised inside an observer (on the same thread) is
//   not reported to the observers again: notify() returns "" for it.
// - add(), remove(), empty() and notify() are thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/base/out_of_memory.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class OomObservers {
 public:
  // Told the device index and the figures of the error; returns a note for
  // the message (one or more lines, without a trailing newline) or "".
  using Observer = std::function<std::string(int device, const OomInfo& info)>;

  // Returns an id for remove(); ids are never reused.
  uint64_t add(Observer observer);
  // False when no observer has this id (removed already).
  bool remove(uint64_t id);
  bool empty() const;

  // Calls every observer; returns their non-empty notes, each preceded by a
  // newline, ready to append to the error message ("" when none has one).
  std::string notify(int device, const OomInfo& info) const noexcept;

 private:
  mutable ForkSafeMutex mutex_{LockRank::kRouting};  // taken alone, never with another torchmem lock
  uint64_t next_id_ = 1;
  // Replaced on add/remove, never changed in place: notify() takes the list
  // with one reference count and calls it without the lock.
  using List = std::vector<std::pair<uint64_t, std::shared_ptr<const Observer>>>;
  std::shared_ptr<const List> observers_ = std::make_shared<const List>();
};

}  // namespace torchmem
