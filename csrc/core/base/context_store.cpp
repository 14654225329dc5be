#include "core/base/context_store.h"

#include <utility>
#include <vector>

namespace torchmem {

void ContextStore::configure(size_t max_entries, bool clear) {
  std::unordered_map<uint64_t, Context> dropped;
  std::unordered_map<uintptr_t, Context> dropped_blocks;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  max_entries_ = max_entries;
  if (clear || max_entries == 0) {
    dropped.swap(by_id_);
    order_.clear();
  }
  if (max_entries == 0) dropped_blocks.swap(blocks_);
}

uint64_t ContextStore::add(Context context) {
  std::vector<Context> dropped;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const uint64_t id = ++next_id_;
  by_id_.emplace(id, std::move(context));
  order_.push_back(id);
  while (order_.size() > max_entries_) {
    auto it = by_id_.find(order_.front());
    if (it != by_id_.end()) {
      dropped.push_back(std::move(it->second));
      by_id_.erase(it);
    }
    order_.pop_front();
  }
  return id;
}

ContextStore::Context ContextStore::get(uint64_t id) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

void ContextStore::set_block(uintptr_t addr, Context context) {
  Context old;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  old = std::exchange(blocks_[addr], std::move(context));
}

void ContextStore::erase_block(uintptr_t addr) {
  Context old;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) return;
  old = std::move(it->second);
  blocks_.erase(it);
}

ContextStore::Context ContextStore::block(uintptr_t addr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = blocks_.find(addr);
  return it == blocks_.end() ? nullptr : it->second;
}

}  // namespace torchmem
