// ContextStore: the stack contexts a history refers to (PyTorch's
// GatheredContext, held as shared_ptr<void>), by the id History's context
// provider returned, and the context of each live block for snapshots.
//
// Contract:
// - configure(max_entries, clear): keep the newest max_entries trace
//   contexts (older ones are dropped as new ones come); clear, or
//   max_entries 0, drops them all (and the blocks' with 0).
// - add(context) returns a fresh id (never 0); get(id) is null once dropped.
// - Thread safe: one ForkSafeMutex of rank kContext, never held while
//   calling out (a context's destructor may take the Python GIL: contexts
//   dropped here are released after the lock).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>

#include "core/sync/fork_safety.h"

namespace torchmem {

class ContextStore {
 public:
  using Context = std::shared_ptr<void>;

  void configure(size_t max_entries, bool clear);
  uint64_t add(Context context);
  Context get(uint64_t id) const;
  void set_block(uintptr_t addr, Context context);
  void erase_block(uintptr_t addr);
  Context block(uintptr_t addr) const;

 private:
  mutable ForkSafeMutex mutex_{LockRank::kContext};
  size_t max_entries_ = 0;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, Context> by_id_;
  std::deque<uint64_t> order_;
  std::unordered_map<uintptr_t, Context> blocks_;
};

}  // namespace torchmem
