#include "core/arena.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace torchmem {

// Note [Arena live tracking]
// Every allocation from the region is appended to live_ (addresses only grow
// between resets, so live_ stays sorted without effort). deallocate() finds
// its entry by binary search and marks it dead (size 0); dead entries are
// compacted once they outnumber live ones. The cost is one push_back per
// allocation and one binary search per deallocation, and it buys what a bare
// bump pointer cannot: double frees and foreign pointers are rejected, and
// live_allocations() tells whether anything escaped before a reset.

namespace {

bool is_power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }

std::string bytes_text(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

size_t checked_capacity(size_t capacity) {
  if (capacity == 0) throw std::invalid_argument("Arena: capacity must be positive");
  return capacity;
}

size_t checked_alignment(size_t alignment) {
  if (!is_power_of_two(alignment) || alignment < 64)
    throw std::invalid_argument("Arena: default_alignment must be a power of two >= 64, got " +
                                std::to_string(alignment));
  return alignment;
}

}  // namespace

Arena::Arena(Device& device, ArenaOptions options)
    : device_(device),
      capacity_(checked_capacity(options.capacity)),
      default_alignment_(checked_alignment(options.default_alignment)),
      fallback_(options.fallback) {
  base_ = device_.allocate(capacity_);
  if (base_ == 0) {
    OomInfo info;
    info.requested = capacity_;
    info.device_total = device_.total_bytes();
    info.device_free = device_.free_bytes();
    throw OutOfMemory("Arena: the " + device_.name() + " device could not provide a region of " +
                          bytes_text(capacity_) + " (" + bytes_text(info.device_free) + " free of " +
                          bytes_text(info.device_total) + ")",
                      info);
  }
}

Arena::Arena(std::shared_ptr<Device> device, ArenaOptions options, std::shared_ptr<Allocator> fallback)
    : Arena(*device, options) {
  owned_device_ = std::move(device);
  if (fallback) {
    fallback_ = fallback.get();
    owned_fallback_ = std::move(fallback);
  }
}

Arena::~Arena() {
  release_fallback_locked();
  device_.free(base_, capacity_);
}

// Hands every live fallback allocation back. The fallback accepted them, so
// it should accept them back; if it refuses one, the rest still go back.
void Arena::release_fallback_locked() {
  for (auto& kv : fallback_live_) {
    try {
      fallback_->deallocate(kv.second.first);
    } catch (const std::exception&) {
    }
  }
  fallback_live_.clear();
}

void* Arena::allocate(size_t size, Stream) {
  if (size == 0) return nullptr;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return allocate_locked(size, default_alignment_);
}

void* Arena::allocate_aligned(size_t size, size_t alignment) {
  if (!is_power_of_two(alignment))
    throw std::invalid_argument("Arena: alignment must be a power of two, got " + std::to_string(alignment));
  if (size == 0) return nullptr;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return allocate_locked(size, alignment);
}

void* Arena::allocate_locked(size_t size, size_t alignment) {
  const uintptr_t start = (base_ + offset_ + alignment - 1) & ~(uintptr_t(alignment) - 1);
  const size_t end = start - base_ + size;
  if (start < base_ + offset_ || end < size || end > capacity_) return allocate_fallback_locked(size, alignment);
  offset_ = end;
  peak_ = std::max(peak_, offset_);
  live_.push_back({start, size});
  ++live_count_;
  live_bytes_ += size;
  ++allocations_;
  return reinterpret_cast<void*>(start);
}

void* Arena::allocate_fallback_locked(size_t size, size_t alignment) {
  if (fallback_ == nullptr) {
    OomInfo info;
    info.requested = size;
    info.allocated = live_bytes_;
    info.reserved = capacity_;
    info.largest_free = capacity_ - offset_;
    info.device_total = device_.total_bytes();
    info.device_free = device_.free_bytes();
    throw OutOfMemory("Arena out of memory: tried to allocate " + bytes_text(size) + " (alignment " +
                          std::to_string(alignment) + ") with " + bytes_text(capacity_ - offset_) +
                          " left; the arena holds " + bytes_text(capacity_) + ", " + bytes_text(offset_) +
                          " used by " + std::to_string(live_count_) +
                          " live allocations. Reset the arena, give it a larger capacity, "
                          "or configure a fallback allocator.",
                      info);
  }
  // The fallback guarantees 64-byte alignment; stricter requests over-allocate.
  const size_t extra = alignment > 64 ? alignment : 0;
  void* raw = fallback_->allocate(size + extra);
  void* p = raw;
  if (extra) p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + alignment - 1) & ~(uintptr_t(alignment) - 1));
  fallback_live_.emplace(p, std::make_pair(raw, size));
  ++live_count_;
  live_bytes_ += size;
  ++fallback_allocations_;
  fallback_bytes_ += size;
  return p;
}

void Arena::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (in_region(p)) {
    auto it = std::lower_bound(live_.begin(), live_.end(), p,
                               [](const Live& e, uintptr_t a) { return e.addr < a; });
    if (it == live_.end() || it->addr != p || it->size == 0)
      throw std::invalid_argument("Arena: deallocate of a pointer that is not a live allocation of this arena "
                                  "(double free, interior pointer, or freed by a reset)");
    live_bytes_ -= it->size;
    it->size = 0;
    --live_count_;
    ++dead_entries_;
    if (dead_entries_ > 64 && dead_entries_ * 2 > live_.size()) {
      live_.erase(std::remove_if(live_.begin(), live_.end(), [](const Live& e) { return e.size == 0; }),
                  live_.end());
      dead_entries_ = 0;
    }
  } else {
    auto it = fallback_live_.find(ptr);
    if (it == fallback_live_.end())
      throw std::invalid_argument("Arena: deallocate of a pointer that is not a live allocation of this arena");
    void* raw = it->second.first;
    const size_t size = it->second.second;
    fallback_->deallocate(raw);  // may throw: then the arena is unchanged
    fallback_live_.erase(it);
    live_bytes_ -= size;
    --live_count_;
  }
  if (live_count_ == 0) {
    live_.clear();
    dead_entries_ = 0;
    if (reset_pending_) reset_locked();
  }
}

bool Arena::owns(const void* ptr) const {
  if (ptr == nullptr) return false;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (!in_region(p)) return fallback_live_.count(const_cast<void*>(ptr)) != 0;
  auto it = std::lower_bound(live_.begin(), live_.end(), p, [](const Live& e, uintptr_t a) { return e.addr < a; });
  return it != live_.end() && it->addr == p && it->size != 0;
}

void Arena::reset() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  reset_locked();
}

bool Arena::reset_when_unused() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (live_count_ == 0) {
    reset_locked();
    return true;
  }
  reset_pending_ = true;
  return false;
}

void Arena::reset_locked() {
  release_fallback_locked();
  live_.clear();
  dead_entries_ = 0;
  live_count_ = 0;
  live_bytes_ = 0;
  offset_ = 0;
  reset_pending_ = false;
  ++resets_;
}

void Arena::reset_peak() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  peak_ = offset_;
}

size_t Arena::used() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return offset_;
}

size_t Arena::peak() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return peak_;
}

size_t Arena::live_allocations() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return live_count_;
}

ArenaStats Arena::stats() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  ArenaStats s;
  s.capacity = capacity_;
  s.used = offset_;
  s.peak = peak_;
  s.live_allocations = live_count_;
  s.live_bytes = live_bytes_;
  s.allocations = allocations_;
  s.resets = resets_;
  s.fallback_allocations = fallback_allocations_;
  s.fallback_bytes = fallback_bytes_;
  s.fallback_live = fallback_live_.size();
  s.reset_pending = reset_pending_;
  return s;
}

void Arena::check_invariants() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error("Arena invariant broken: " + what); };
  if (offset_ > capacity_) fail("offset beyond capacity");
  if (peak_ < offset_ || peak_ > capacity_) fail("peak outside [used, capacity]");
  size_t count = 0, bytes = 0, dead = 0;
  uintptr_t prev_end = base_;
  for (const Live& e : live_) {
    if (e.addr < prev_end) fail("live entries overlap or are out of order");
    if (e.size == 0) {
      ++dead;
      prev_end = e.addr + 1;
      continue;
    }
    if (e.addr + e.size > base_ + offset_) fail("live entry beyond the offset");
    prev_end = e.addr + e.size;
    ++count;
    bytes += e.size;
  }
  if (dead != dead_entries_) fail("dead entry count");
  for (const auto& kv : fallback_live_) {
    ++count;
    bytes += kv.second.second;
  }
  if (count != live_count_) fail("live count");
  if (bytes != live_bytes_) fail("live bytes");
  if (!fallback_live_.empty() && fallback_ == nullptr) fail("fallback allocations without a fallback");
  if (reset_pending_ && live_count_ == 0) fail("reset pending with nothing live");
}

}  // namespace torchmem
