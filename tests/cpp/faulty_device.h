// FaultyDevice: a Device wrapper that injects allocation failures and checks
// the Device contract, for reliability tests (tests/cpp/core_driver.cpp).
//
// It forwards every call to an inner device and:
// - fails chosen allocate()/map() calls the way a real device reports
//   exhaustion (0 / false), without calling the inner device:
//     fail_nth(k)           the k-th allocate-or-map call from now (1-based),
//                           once; fail_nth(k, n) fails n calls in a row
//     fail_randomly(p, s)   each call with probability p, from seed s
//                           (deterministic for one seed and one call order)
//     fail_reserve(true)    every reserve() returns 0
// - counts what is outstanding: live segments (allocate() not yet freed),
//   reserved ranges, mapped bytes; a test checks they are all zero once the
//   allocator has emptied its cache or been destroyed;
// - records contract violations instead of crashing (free() of an address
//   it never returned or with another size, unmap() of bytes never mapped,
//   release() of an unknown range): violations() lists them.
//
// Thread safety: every method takes one internal mutex (the inner device is
// called under it too), as the Device contract asks; a ForkSafeMutex of rank
// kDevice, newer than the inner device's (see fork_safety.h).
// Ownership: the inner device must outlive the wrapper.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class FaultyDevice : public Device {
 public:
  explicit FaultyDevice(Device& inner) : inner_(inner) {}

  // --- fault injection --------------------------------------------------
  // Fails the k-th allocate()/map() call counted from now (k >= 1), and the
  // `count - 1` calls after it. k == 0 disarms.
  void fail_nth(uint64_t k, uint64_t count = 1) {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    fail_at_ = k == 0 ? 0 : calls_ + k;
    fail_count_ = count;
  }
  // Each allocate()/map() fails with probability p (0 disarms).
  void fail_randomly(double p, uint64_t seed) {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    probability_ = p;
    rng_.seed(seed);
  }
  void fail_reserve(bool on) {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    fail_reserve_ = on;
  }
  void disarm() {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    fail_at_ = 0;
    fail_count_ = 0;
    probability_ = 0;
    fail_reserve_ = false;
  }

  // --- accounting -------------------------------------------------------
  uint64_t calls() const { return locked(calls_); }               // allocate() + map() calls
  uint64_t injected_failures() const { return locked(injected_); }
  uint64_t inner_failures() const { return locked(inner_failures_); }  // refused by the inner device
  size_t live_segments() const { return locked(segments_.size()); }
  size_t live_segment_bytes() const {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    size_t n = 0;
    for (const auto& kv : segments_) n += kv.second;
    return n;
  }
  size_t reserved_ranges() const { return locked(ranges_.size()); }
  size_t mapped_bytes() const { return locked(mapped_bytes_); }
  // Nothing outstanding: no segment, no range, no mapped page.
  bool holds_nothing() const {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    return segments_.empty() && ranges_.empty() && mapped_bytes_ == 0;
  }
  std::vector<std::string> violations() const { return locked(violations_); }

  // --- Device -------------------------------------------------------------
  std::string name() const override { return inner_.name(); }

  uintptr_t allocate(size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    if (inject_locked()) return 0;
    const uintptr_t addr = inner_.allocate(size);
    if (addr == 0) {
      ++inner_failures_;
      return 0;
    }
    if (addr % kSegmentAlignment != 0) violation_locked("allocate() returned a misaligned segment", addr, size);
    if (!segments_.emplace(addr, size).second) violation_locked("allocate() returned a live address again", addr, size);
    return addr;
  }

  void free(uintptr_t addr, size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    auto it = segments_.find(addr);
    if (it == segments_.end()) {
      violation_locked("free() of an address allocate() did not return (or freed twice)", addr, size);
      return;  // never pass a bad free on: the inner device would corrupt itself
    }
    if (it->second != size) {
      violation_locked("free() with a size other than the allocation's (" + std::to_string(it->second) + ")", addr, size);
      size = it->second;
    }
    segments_.erase(it);
    inner_.free(addr, size);
  }

  size_t page_size() const override { return inner_.page_size(); }

  uintptr_t reserve(size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    if (fail_reserve_) {
      ++injected_;
      return 0;
    }
    const uintptr_t addr = inner_.reserve(size);
    if (addr != 0) ranges_[addr] = Range{size, {}};
    return addr;
  }

  bool map(uintptr_t addr, size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    Range* range = range_of_locked(addr, size);
    if (!range) {
      violation_locked("map() outside any reserved range", addr, size);
      return false;
    }
    if (inject_locked()) return false;
    for (uintptr_t p = addr; p < addr + size; p += page_size_locked()) {
      if (range->mapped.count(p)) violation_locked("map() of a page already mapped", p, page_size_locked());
    }
    if (!inner_.map(addr, size)) {
      ++inner_failures_;
      return false;
    }
    for (uintptr_t p = addr; p < addr + size; p += page_size_locked()) range->mapped.insert(p);
    mapped_bytes_ += size;
    return true;
  }

  void unmap(uintptr_t addr, size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    Range* range = range_of_locked(addr, size);
    if (!range) {
      violation_locked("unmap() outside any reserved range", addr, size);
      return;
    }
    for (uintptr_t p = addr; p < addr + size; p += page_size_locked()) {
      if (range->mapped.erase(p) == 0) {
        violation_locked("unmap() of a page that is not mapped", p, page_size_locked());
        return;
      }
    }
    mapped_bytes_ -= size;
    inner_.unmap(addr, size);
  }

  void release(uintptr_t addr, size_t size) override {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    auto it = ranges_.find(addr);
    if (it == ranges_.end()) {
      violation_locked("release() of a range reserve() did not return", addr, size);
      return;
    }
    if (!it->second.mapped.empty()) violation_locked("release() of a range with pages still mapped", addr, size);
    if (it->second.size != size) violation_locked("release() with another size than reserve()'s", addr, size);
    ranges_.erase(it);
    inner_.release(addr, size);
  }

  EventId record_event(Stream s) override { return inner_.record_event(s); }
  bool event_complete(EventId e) override { return inner_.event_complete(e); }
  void synchronize_event(EventId e) override { inner_.synchronize_event(e); }
  void destroy_event(EventId e) override { inner_.destroy_event(e); }

  size_t total_bytes() const override { return inner_.total_bytes(); }
  size_t free_bytes() const override { return inner_.free_bytes(); }

 private:
  struct Range {
    size_t size = 0;
    std::set<uintptr_t> mapped;  // page addresses
  };

  template <typename T>
  T locked(const T& value) const {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    return value;
  }

  size_t page_size_locked() const {
    const size_t p = inner_.page_size();
    return p ? p : 1;
  }

  // Counts one allocate/map call; true when this one must fail.
  bool inject_locked() {
    ++calls_;
    bool fail = false;
    if (fail_at_ != 0 && calls_ >= fail_at_ && fail_count_ > 0) {
      fail = true;
      if (--fail_count_ == 0) fail_at_ = 0;
    }
    if (!fail && probability_ > 0) fail = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < probability_;
    if (fail) ++injected_;
    return fail;
  }

  Range* range_of_locked(uintptr_t addr, size_t size) {
    auto it = ranges_.upper_bound(addr);
    if (it == ranges_.begin()) return nullptr;
    --it;
    if (addr + size > it->first + it->second.size) return nullptr;
    return &it->second;
  }

  void violation_locked(const std::string& what, uintptr_t addr, size_t size) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " at 0x%llx, %zu bytes", static_cast<unsigned long long>(addr), size);
    violations_.push_back(what + buf);
  }

  Device& inner_;
  mutable ForkSafeMutex mutex_{LockRank::kDevice};
  uint64_t calls_ = 0;
  uint64_t fail_at_ = 0;
  uint64_t fail_count_ = 0;
  double probability_ = 0;
  bool fail_reserve_ = false;
  std::mt19937_64 rng_{0};
  uint64_t injected_ = 0;
  uint64_t inner_failures_ = 0;
  std::map<uintptr_t, size_t> segments_;
  std::map<uintptr_t, Range> ranges_;
  size_t mapped_bytes_ = 0;
  std::vector<std::string> violations_;
};

// The two injectors the reliability tests name: fail the k-th call, or fail
// at random with a seed. Both are a FaultyDevice armed at construction.
class FailNthDevice final : public FaultyDevice {
 public:
  FailNthDevice(Device& inner, uint64_t k, uint64_t count = 1) : FaultyDevice(inner) { fail_nth(k, count); }
};

class RandomFailDevice final : public FaultyDevice {
 public:
  RandomFailDevice(Device& inner, double probability, uint64_t seed) : FaultyDevice(inner) {
    fail_randomly(probability, seed);
  }
};

}  // namespace torchmem
