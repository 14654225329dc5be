#include "core/allocators/arena.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace torchmem {

// Note [Arena passes]
// A plain arena resets when nothing is live, so one tensor kept across steps
// (the loop variable of a training loop) stops every reset, and the arena
// bumps on after it step after step until it overflows. Here a kept tensor
// only pins its own bytes: at rewind() every live allocation moves to
// holes_, sorted, and the cursor restarts at 0, stepping over holes as it
// meets them (next_hole_ only moves forward while it bumps, so each hole
// costs one comparison per pass). This pass's allocations go to pass_,
// appended in address order, since the cursor only grows between its
// pull-backs, and a pull-back drops every entry above it.
//
// Bytes freed behind the cursor cannot be reached by bumping; they are
// reused at the next rewind, or, when the cursor reaches the region's end
// and the pass has freed at least the request's size behind it, by a wrap:
// a rewind within the pass, after which bumping from 0 over the holes is a
// first-fit search. The size test keeps a too-small arena (with a fallback)
// from paying an O(n) rewind per request.

// Note [Arena streams]
// The arena reuses bytes as soon as they are freed, without events: safe on
// one stream (its kernels run in order), unsafe across streams. So the
// region serves one stream and others are forwarded to options.other_streams
// (the CUDA glue's device caching allocator, which records events). A block
// freed after record_stream() reaches deallocate() only once those streams'
// work is done (the glue defers it), so until then it is live, and skipped.

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

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

Device& checked_device(const std::shared_ptr<Device>& device) {
  if (!device) throw std::invalid_argument("Arena: a device is required");
  return *device;
}

ArenaOptions with_owners(ArenaOptions options, const ArenaOwners& owners) {
  if (owners.source) options.source = owners.source.get();
  if (owners.fallback) options.fallback = owners.fallback.get();
  if (owners.other_streams) options.other_streams = owners.other_streams.get();
  return options;
}

// Index of the live entry starting at p in an address-ordered list, or kNone.
template <typename Entries>
size_t find_live(const Entries& entries, uintptr_t p) {
  auto it = std::lower_bound(entries.begin(), entries.end(), p, [](const auto& e, uintptr_t a) { return e.addr < a; });
  if (it == entries.end() || it->addr != p || !it->live()) return kNone;
  return static_cast<size_t>(it - entries.begin());
}

}  // namespace

Arena::Arena(Device& device, ArenaOptions options)
    : device_(device),
      capacity_(checked_capacity(options.capacity)),
      default_alignment_(checked_alignment(options.default_alignment)),
      fallback_(options.fallback),
      other_streams_(options.other_streams),
      source_(options.source),
      stream_(options.stream) {
  if (source_) {
    base_ = reinterpret_cast<uintptr_t>(source_->allocate(capacity_, region_stream()));
    return;
  }
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

Arena::Arena(ArenaOwners owners, ArenaOptions options)
    : Arena(checked_device(owners.device), with_owners(options, owners)) {
  owned_device_ = std::move(owners.device);
  owned_source_ = std::move(owners.source);
  owned_fallback_ = std::move(owners.fallback);
  owned_other_streams_ = std::move(owners.other_streams);
}

Arena::~Arena() {
  release_forwarded_locked();
  if (!source_) {
    device_.free(base_, capacity_);
    return;
  }
  try {
    source_->deallocate(reinterpret_cast<void*>(base_));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchmem: Arena could not return its region: %s\n", e.what());
  }
}

// Hands every live forwarded allocation back. Whoever accepted them should
// accept them back; if one refuses, the rest still go back.
void Arena::release_forwarded_locked() {
  for (auto& kv : forwarded_) {
    try {
      kv.second.allocator->deallocate(kv.second.raw);
    } catch (const std::exception&) {
    }
  }
  forwarded_.clear();
  forwarded_bytes_ = 0;
}

void* Arena::allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (stream_ == kAnyStream || stream == stream_) return allocate_locked(size, default_alignment_, stream);
  return allocate_other_stream_locked(size, stream);
}

void* Arena::allocate_other_stream_locked(size_t size, Stream stream) {
  if (other_streams_ == nullptr)
    throw std::invalid_argument("Arena: a request on stream " + std::to_string(stream) + ", but this arena serves stream " +
                                std::to_string(stream_) + " only and has no allocator for other streams");
  void* p = forward_locked(other_streams_, size, default_alignment_, stream);
  ++counters_.other_stream_allocations;
  return p;
}

void* Arena::allocate_aligned(size_t size, size_t alignment) {
  if (!is_power_of_two(alignment))
    throw std::invalid_argument("Arena: alignment must be a power of two, got " + std::to_string(alignment));
  if (size == 0) return nullptr;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return allocate_locked(size, alignment, region_stream());
}

inline void* Arena::place_locked(uintptr_t start, size_t size, size_t next_hole, size_t skipped) {
  pass_.push_back({start, size});  // first: it alone may throw
  offset_ = start + size - base_;
  next_hole_ = next_hole;
  peak_ = std::max(peak_, offset_);
  block_peak_ = std::max(block_peak_, offset_);
  pass_live_bytes_ += size;
  ++counters_.allocations;
  if (skipped) {
    counters_.holes_skipped += skipped;
    counters_.block_holes_skipped += skipped;
  }
  return reinterpret_cast<void*>(start);
}

void* Arena::allocate_locked(size_t size, size_t alignment, Stream stream) {
  const uintptr_t at = base_ + offset_;
  const uintptr_t start = (at + alignment - 1) & ~(uintptr_t(alignment) - 1);
  if (next_hole_ == holes_.size() && start >= at && start - base_ <= capacity_ && size <= capacity_ - (start - base_))
    return place_locked(start, size, next_hole_, 0);  // no hole ahead: the common case
  return allocate_slow_locked(size, alignment, stream);
}

void* Arena::allocate_slow_locked(size_t size, size_t alignment, Stream stream) {
  if (void* p = bump_locked(size, alignment)) return p;
  if (freed_behind_ >= size) {
    rewind_locked(/*new_block=*/false);
    ++counters_.wraps;
    if (void* p = bump_locked(size, alignment)) return p;
  }
  if (fallback_ == nullptr) throw_out_of_memory_locked(size, alignment);
  void* p = forward_locked(fallback_, size, alignment, stream);
  ++counters_.fallback_allocations;
  ++counters_.block_fallback_allocations;
  counters_.fallback_bytes += size;
  counters_.block_fallback_bytes += size;
  return p;
}

// From the cursor on, the first place that fits between live holes; nullptr
// (and nothing changed) when none does before the region's end.
void* Arena::bump_locked(size_t size, size_t alignment) {
  size_t cursor = offset_;
  size_t h = next_hole_;
  size_t skipped = 0;
  for (;;) {
    const uintptr_t at = base_ + cursor;
    const uintptr_t start = (at + alignment - 1) & ~(uintptr_t(alignment) - 1);
    if (start < at || start - base_ > capacity_ || size > capacity_ - (start - base_)) return nullptr;
    const uintptr_t end = start + size;
    while (h < holes_.size() && (!holes_[h].live() || holes_[h].end() <= start)) ++h;
    if (h == holes_.size() || holes_[h].addr >= end) return place_locked(start, size, h, skipped);
    cursor = holes_[h].end() - base_;
    ++h;
    ++skipped;
  }
}

void* Arena::forward_locked(Allocator* to, size_t size, size_t alignment, Stream stream) {
  // Allocators guarantee 64-byte alignment; stricter requests over-allocate.
  const size_t extra = alignment > 64 ? alignment : 0;
  if (size + extra < size) throw_out_of_memory_locked(size, alignment);
  void* raw = to->allocate(size + extra, stream);
  void* p = raw;
  if (extra) p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + alignment - 1) & ~(uintptr_t(alignment) - 1));
  try {
    forwarded_.emplace(p, Forwarded{raw, size, to});
  } catch (...) {
    to->deallocate(raw);
    throw;
  }
  forwarded_bytes_ += size;
  return p;
}

void Arena::throw_out_of_memory_locked(size_t size, size_t alignment) const {
  OomInfo info;
  info.requested = size;
  info.allocated = hole_bytes_ + pass_live_bytes_;
  info.reserved = capacity_;
  info.largest_free = largest_gap_ahead_locked();
  info.device_total = device_.total_bytes();
  info.device_free = device_.free_bytes();
  const size_t live = hole_count_ + pass_.size() - pass_dead_;
  throw OutOfMemory(
      "Arena out of memory: tried to allocate " + bytes_text(size) + " (alignment " + std::to_string(alignment) +
          "). The arena holds " + bytes_text(capacity_) + "; its cursor is at " + bytes_text(offset_) +
          " and the largest free run ahead of it is " + bytes_text(info.largest_free) + ". " + std::to_string(live) +
          " allocations are live (" + bytes_text(info.allocated) + "); the cursor skips " + std::to_string(hole_count_) +
          " of them (" + bytes_text(hole_bytes_) + "), kept from earlier blocks or made before a wrap; " +
          std::to_string(counters_.block_holes) + " allocations (" + bytes_text(counters_.block_hole_bytes) +
          ") were kept from earlier blocks when this one began; its peak is " + bytes_text(block_peak_) +
          ". Give the arena a larger capacity, free tensors kept from earlier blocks, or configure a fallback "
          "allocator (fallback=\"caching\").",
      info);
}

void Arena::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (in_region(p)) {
    const size_t i = find_live(pass_, p);
    const size_t j = i == kNone ? find_live(holes_, p) : kNone;
    if (i == kNone && j == kNone)
      throw std::invalid_argument("Arena: deallocate of a pointer that is not a live allocation of this arena "
                                  "(double free, interior pointer, or freed by a reset)");
    if (i != kNone) release_pass_entry_locked(i);
    if (j != kNone) release_hole_locked(j);
    after_region_free_locked();
    return;
  }
  auto it = forwarded_.find(ptr);
  if (it == forwarded_.end())
    throw std::invalid_argument("Arena: deallocate of a pointer that is not a live allocation of this arena");
  it->second.allocator->deallocate(it->second.raw);  // may throw: then the arena is unchanged
  forwarded_bytes_ -= it->second.size;
  forwarded_.erase(it);
}

void Arena::release_pass_entry_locked(size_t index) {
  pass_live_bytes_ -= pass_[index].size;
  if (index + 1 < pass_.size()) {
    freed_behind_ += pass_[index].size;
    pass_[index].size = 0;
    ++pass_dead_;
    if (pass_dead_ > 64 && pass_dead_ * 2 > pass_.size()) {
      pass_.erase(std::remove_if(pass_.begin(), pass_.end(), [](const Entry& e) { return !e.live(); }), pass_.end());
      pass_dead_ = 0;
    }
    return;
  }
  pass_.pop_back();
  while (!pass_.empty() && !pass_.back().live()) {
    pass_.pop_back();
    --pass_dead_;
  }
  offset_ = pass_.empty() ? 0 : pass_.back().end() - base_;
  const uintptr_t cursor = base_ + offset_;
  next_hole_ = static_cast<size_t>(
      std::partition_point(holes_.begin(), holes_.end(), [cursor](const Entry& e) { return e.end() <= cursor; }) -
      holes_.begin());
}

void Arena::release_hole_locked(size_t index) {
  Entry& e = holes_[index];
  if (e.end() <= base_ + offset_) freed_behind_ += e.size;
  hole_bytes_ -= e.size;
  --hole_count_;
  e.size = 0;
}

void Arena::after_region_free_locked() {
  if (hole_count_ != 0 || !pass_.empty()) return;
  holes_.clear();
  next_hole_ = 0;
  offset_ = 0;
  freed_behind_ = 0;
}

bool Arena::owns(const void* ptr) const {
  if (ptr == nullptr) return false;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (!in_region(p)) return forwarded_.count(const_cast<void*>(ptr)) != 0;
  return find_live(pass_, p) != kNone || find_live(holes_, p) != kNone;
}

size_t Arena::rewind() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  rewind_locked(/*new_block=*/true);
  return hole_count_;
}

void Arena::rewind_locked(bool new_block) {
  scratch_.clear();
  auto h = holes_.begin();
  auto p = pass_.begin();
  while (h != holes_.end() || p != pass_.end()) {
    const bool take_hole = p == pass_.end() || (h != holes_.end() && h->addr < p->addr);
    const Entry& e = take_hole ? *h++ : *p++;
    if (e.live()) scratch_.push_back(e);
  }
  holes_.swap(scratch_);
  hole_count_ = holes_.size();
  hole_bytes_ += pass_live_bytes_;
  pass_.clear();
  pass_dead_ = 0;
  pass_live_bytes_ = 0;
  offset_ = 0;
  next_hole_ = 0;
  freed_behind_ = 0;
  if (!new_block) return;
  ++counters_.rewinds;
  block_peak_ = extent_locked();
  block_start_allocations_ = counters_.allocations;
  counters_.block_holes = hole_count_;
  counters_.block_hole_bytes = hole_bytes_;
  counters_.block_holes_skipped = 0;
  counters_.block_fallback_allocations = 0;
  counters_.block_fallback_bytes = 0;
}

void Arena::reset() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  reset_locked();
}

void Arena::reset_locked() {
  release_forwarded_locked();
  pass_.clear();
  pass_dead_ = 0;
  pass_live_bytes_ = 0;
  holes_.clear();
  hole_count_ = 0;
  hole_bytes_ = 0;
  next_hole_ = 0;
  offset_ = 0;
  freed_behind_ = 0;
  ++counters_.resets;
}

void Arena::reset_peak() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  peak_ = extent_locked();
}

size_t Arena::extent_locked() const {
  auto last = std::find_if(holes_.rbegin(), holes_.rend(), [](const Entry& e) { return e.live(); });
  return last == holes_.rend() ? offset_ : std::max(offset_, static_cast<size_t>(last->end() - base_));
}

size_t Arena::largest_gap_ahead_locked() const {
  size_t largest = 0;
  size_t cursor = offset_;
  for (size_t h = next_hole_; h < holes_.size(); ++h) {
    const Entry& e = holes_[h];
    if (!e.live() || e.end() <= base_ + cursor) continue;
    if (e.addr > base_ + cursor) largest = std::max(largest, static_cast<size_t>(e.addr - base_ - cursor));
    cursor = e.end() - base_;
  }
  return std::max(largest, capacity_ - cursor);
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
  return hole_count_ + pass_.size() - pass_dead_ + forwarded_.size();
}

ArenaStats Arena::stats() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  ArenaStats s = counters_;
  s.capacity = capacity_;
  s.used = offset_;
  s.peak = peak_;
  s.block_peak = block_peak_;
  s.block_allocations = counters_.allocations - block_start_allocations_;
  s.live_allocations = hole_count_ + pass_.size() - pass_dead_ + forwarded_.size();
  s.live_bytes = hole_bytes_ + pass_live_bytes_ + forwarded_bytes_;
  s.holes = hole_count_;
  s.hole_bytes = hole_bytes_;
  s.fallback_live = forwarded_.size();
  s.fallback_live_bytes = forwarded_bytes_;
  return s;
}

void Arena::check_invariants() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto fail = [](const std::string& what) { throw std::logic_error("Arena invariant broken: " + what); };
  const uintptr_t cursor = base_ + offset_;
  if (offset_ > capacity_) fail("cursor beyond capacity");
  size_t dead = 0, bytes = 0;
  uintptr_t prev_end = base_;
  for (const Entry& e : pass_) {
    if (e.addr < prev_end) fail("pass entries overlap or are out of order");
    if (e.end() > cursor) fail("pass entry beyond the cursor");
    prev_end = e.live() ? e.end() : e.addr + 1;
    dead += !e.live();
    bytes += e.size;
  }
  if (!pass_.empty() && !pass_.back().live()) fail("the newest pass entry is freed");
  if (dead != pass_dead_) fail("pass dead count");
  if (bytes != pass_live_bytes_) fail("pass live bytes");
  size_t holes = 0;
  bytes = 0;
  prev_end = base_;
  for (size_t i = 0; i < holes_.size(); ++i) {
    const Entry& e = holes_[i];
    if (e.addr < prev_end) fail("holes overlap or are out of order");
    if (e.end() > base_ + capacity_) fail("hole beyond the region");
    prev_end = e.live() ? e.end() : e.addr + 1;
    if (i < next_hole_ && e.live() && e.end() > cursor) fail("a live hole ahead of the cursor below next_hole");
    if (!e.live()) continue;
    ++holes;
    bytes += e.size;
    auto p = std::lower_bound(pass_.begin(), pass_.end(), e.addr, [](const Entry& x, uintptr_t a) { return x.addr < a; });
    if (p != pass_.end() && p->live() && p->addr < e.end()) fail("a pass entry overlaps a live hole");
    if (p != pass_.begin() && std::prev(p)->live() && std::prev(p)->end() > e.addr) fail("a pass entry overlaps a live hole");
  }
  if (next_hole_ > holes_.size()) fail("next_hole beyond the holes");
  if (holes != hole_count_) fail("hole count");
  if (bytes != hole_bytes_) fail("hole bytes");
  bytes = 0;
  for (const auto& kv : forwarded_) bytes += kv.second.size;
  if (bytes != forwarded_bytes_) fail("forwarded bytes");
  const size_t extent = extent_locked();
  if (extent > peak_ || extent > block_peak_) fail("extent above a peak");
  if (peak_ > capacity_ || block_peak_ > capacity_) fail("peak beyond capacity");
}

}  // namespace torchmem
