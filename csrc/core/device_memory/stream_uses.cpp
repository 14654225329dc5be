#include "core/device_memory/stream_uses.h"

#include <algorithm>

namespace torchmem {

StreamUses::~StreamUses() {
  for (Deferred& d : deferred_) {
    for (EventId event : d.events) device_.destroy_event(event);
  }
}

void StreamUses::update_counts_locked() {
  busy_.store(uses_.size() + deferred_.size(), std::memory_order_release);
  deferred_count_.store(deferred_.size(), std::memory_order_release);
}

void StreamUses::record(void* ptr, Stream stream) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  std::vector<Stream>& streams = uses_[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  update_counts_locked();
}

bool StreamUses::has_uses(void* ptr) const {
  if (idle()) return false;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return uses_.count(ptr) != 0;
}

void StreamUses::forget(void* ptr) {
  if (idle()) return;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  uses_.erase(ptr);
  update_counts_locked();
}

bool StreamUses::defer_free(void* ptr, Allocator* owner, bool two_step, bool capturing) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = uses_.find(ptr);
  if (it == uses_.end()) return false;
  Deferred d{ptr, owner, two_step, std::move(it->second), {}};
  uses_.erase(it);
  if (!capturing) {
    // Recorded now, as PyTorch's insert_events: the work queued so far.
    for (Stream stream : d.streams) d.events.push_back(device_.record_event(stream));
    d.streams.clear();
  }
  deferred_.push_back(std::move(d));
  update_counts_locked();
  return true;
}

std::vector<StreamUses::Pending> StreamUses::take_completed(bool wait, const Allocator* owner) {
  std::vector<Pending> done;
  if (nothing_pending()) return done;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  for (Deferred& d : deferred_) {
    for (Stream stream : d.streams) d.events.push_back(device_.record_event(stream));
    d.streams.clear();
  }
  auto keep = deferred_.begin();
  for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
    if (owner == nullptr || (it->owner == owner && it->two_step)) {
      auto complete = [&](EventId event) {
        if (wait) device_.synchronize_event(event);
        else if (!device_.event_complete(event)) return false;
        device_.destroy_event(event);
        return true;
      };
      // Events seen complete are dropped one by one, so none is queried twice.
      it->events.erase(std::remove_if(it->events.begin(), it->events.end(), complete), it->events.end());
      if (it->events.empty()) {
        done.push_back(Pending{it->ptr, it->owner, it->two_step});
        continue;
      }
    }
    if (keep != it) *keep = std::move(*it);
    ++keep;
  }
  deferred_.erase(keep, deferred_.end());
  update_counts_locked();
  return done;
}

size_t StreamUses::pending() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return deferred_.size();
}

}  // namespace torchmem
