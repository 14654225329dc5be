#include "core/devices/sim_device.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace torchmem {

// Note [Recorded addresses]
// Best fit breaks ties between equal free blocks by address, so a replay
// makes the GPU's decisions only if its segments sit where the GPU's did.
// The replayer offers each recorded segment address just before the request
// that made it; when the replay asks for the same size at that moment, the
// segment lands at the recorded address and every later tie breaks the same
// way. A refused offer means the replay has left the recording.

namespace {
constexpr uintptr_t kSimBase = uintptr_t(1) << 40;  // well away from 0
constexpr uintptr_t kSimAlign = 2u << 20;

uintptr_t align_up(uintptr_t n) { return (n + kSimAlign - 1) / kSimAlign * kSimAlign; }
}  // namespace

SimDevice::SimDevice(size_t capacity_bytes, size_t page_size, size_t in_use_by_others)
    : capacity_(capacity_bytes), page_size_(page_size), used_(in_use_by_others), next_address_(kSimBase) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    throw std::invalid_argument("SimDevice: page_size must be a power of two");
  }
  if (in_use_by_others > capacity_bytes) {
    throw std::invalid_argument("SimDevice: memory in use by others exceeds the capacity");
  }
}

bool SimDevice::overlaps_live(uintptr_t addr, size_t size) const {
  auto it = ranges_.upper_bound(addr);
  if (it != ranges_.end() && it->first < addr + size) return true;
  if (it == ranges_.begin()) return false;
  --it;
  return it->first + it->second > addr;
}

uintptr_t SimDevice::take_addresses(size_t size, bool reserving) {
  const size_t want = reserving ? 0 : size;
  auto offer = std::find_if(offers_.begin(), offers_.end(), [&](const Offer& o) { return (o.size == 0) == reserving; });
  if (reserving) {  // a range takes the first base offered that is free for it
    auto free_base = std::find_if(offer, offers_.end(), [&](const Offer& o) {
      return o.size == 0 && !overlaps_live(o.addr, size);
    });
    if (free_base != offers_.end()) offer = free_base;
  }
  if (offer != offers_.end()) {
    if (offer->size == want && !overlaps_live(offer->addr, size)) {
      const uintptr_t addr = offer->addr;
      offers_.erase(offer);
      ++offers_taken_;
      ranges_.emplace(addr, size);
      return addr;
    }
    ++offers_refused_;
  }
  uintptr_t addr = next_address_;
  while (overlaps_live(addr, size + kSimAlign)) addr = align_up(addr + size + kSimAlign);
  next_address_ = align_up(addr + size) + kSimAlign;
  ranges_.emplace(addr, size);
  return addr;
}

uintptr_t SimDevice::allocate(size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (size == 0 || size > capacity_ - used_) return 0;
  used_ += size;
  ++live_;
  return take_addresses(size, false);
}

void SimDevice::check_not_capturing(const char* call) const {
  if (capturing_) {
    throw std::logic_error(std::string("SimDevice: ") + call +
                           " while a CUDA graph is captured (it would invalidate the capture)");
  }
}

void SimDevice::free(uintptr_t addr, size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("free");
  used_ -= size;
  --live_;
  ranges_.erase(addr);
}

uintptr_t SimDevice::reserve(size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return take_addresses(size, true);
}

bool SimDevice::map(uintptr_t, size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  ++map_calls_;
  if (size > capacity_ - used_) return false;
  used_ += size;
  return true;
}

void SimDevice::unmap(uintptr_t, size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("unmap");
  ++unmap_calls_;
  used_ -= size;
}

void SimDevice::release(uintptr_t addr, size_t) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("release");
  ranges_.erase(addr);
}

size_t SimDevice::free_bytes() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return capacity_ - used_;
}

size_t SimDevice::live_segments() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return live_;
}

void SimDevice::offer(uintptr_t addr, size_t size, bool while_live) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (size == 0 && !while_live && overlaps_live(addr, 1)) return;  // a map inside a range already reserved
  offers_.push_back({addr, size});
}

size_t SimDevice::take_unused_offers() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const size_t n = offers_.size();
  offers_.clear();
  return n;
}

bool SimDevice::adopt(uintptr_t addr, size_t size) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (addr == 0 || size == 0 || size > capacity_ - used_ || overlaps_live(addr, size)) return false;
  used_ += size;
  ++live_;
  ranges_.emplace(addr, size);
  return true;
}

void SimDevice::set_address_floor(uintptr_t floor) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  next_address_ = std::max(next_address_, align_up(floor) + kSimAlign);
}

size_t SimDevice::offers_taken() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return offers_taken_;
}

size_t SimDevice::offers_refused() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return offers_refused_;
}

EventId SimDevice::record_event(Stream stream) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("record_event");
  const EventId id = ++next_event_;
  events_.emplace(id, Event{stream, !manual_events_});
  ++events_recorded_;
  return id;
}

bool SimDevice::event_complete(EventId id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("event_complete");
  auto it = events_.find(id);
  if (it == events_.end()) throw std::logic_error("SimDevice: unknown event " + std::to_string(id));
  return it->second.complete;
}

void SimDevice::synchronize_event(EventId id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  check_not_capturing("synchronize_event");
  auto it = events_.find(id);
  if (it == events_.end()) throw std::logic_error("SimDevice: unknown event " + std::to_string(id));
  it->second.complete = true;
  ++synchronizations_;
}

void SimDevice::destroy_event(EventId id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  events_.erase(id);
}

void SimDevice::set_manual_events(bool manual) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  manual_events_ = manual;
}

size_t SimDevice::complete_events(Stream stream) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  size_t n = 0;
  for (auto& [id, event] : events_) {
    if (event.stream == stream && !event.complete) {
      event.complete = true;
      ++n;
    }
  }
  return n;
}

size_t SimDevice::complete_all_events() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  size_t n = 0;
  for (auto& [id, event] : events_) {
    n += !event.complete;
    event.complete = true;
  }
  return n;
}

size_t SimDevice::live_events() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return events_.size();
}

size_t SimDevice::events_recorded() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return events_recorded_;
}

size_t SimDevice::synchronizations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return synchronizations_;
}

size_t SimDevice::map_calls() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return map_calls_;
}

size_t SimDevice::unmap_calls() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return unmap_calls_;
}

void SimDevice::set_capturing(bool capturing) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  capturing_ = capturing;
}

}  // namespace torchmem
