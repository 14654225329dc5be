// FastMutex: the lock of the core's allocators (inside ForkSafeMutex).
//
// An uncontended lock() and unlock() are one atomic instruction each,
// inlined: std::mutex makes the same two atomic operations but through
// out-of-line pthread calls, which cost a cached malloc+free pair about 9 ns
// of its ~69 (BENCHMARKS.md, "A cached malloc+free in the core", commits
// c1772ee and fc60b00). A thread that finds the lock taken spins briefly, then
// sleeps in the kernel (a futex on Linux; elsewhere it yields), so a thread
// that waits while the holder calls the device (mmap, cudaMalloc) does not
// burn a core.
//
// States: 0 free; 1 held; 2 held, and a thread may be asleep waiting for it
// (so unlock() must wake one). This is the three-state futex mutex of
// Drepper's "Futexes Are Tricky".
//
// Satisfies Lockable (std::lock_guard, std::unique_lock). Not recursive; no
// fairness; not movable.
#pragma once

#include <atomic>
#include <cstdint>

namespace torchmem {

class FastMutex {
 public:
  FastMutex() = default;
  FastMutex(const FastMutex&) = delete;
  FastMutex& operator=(const FastMutex&) = delete;

  void lock() {
    if (!try_lock()) lock_contended();
  }
  bool try_lock() {
    uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) wake_one();
  }

 private:
  void lock_contended();
  void wake_one();

  std::atomic<uint32_t> state_{0};
};

}  // namespace torchmem
