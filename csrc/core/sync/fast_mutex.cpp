#include "core/sync/fast_mutex.h"

#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace torchmem {

namespace {

constexpr int kSpins = 100;  // about a microsecond: longer than a hot-path critical section

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void FastMutex::lock_contended() {
  for (int i = 0; i < kSpins; ++i) {
    cpu_relax();
    if (state_.load(std::memory_order_relaxed) == 0 && try_lock()) return;
  }
  // Mark the lock "held, with a sleeper" before each sleep, so that the
  // holder's unlock() wakes a thread.
  while (state_.exchange(2, std::memory_order_acquire) != 0) {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
#else
    std::this_thread::yield();
#endif
  }
}

void FastMutex::wake_one() {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#endif
}

}  // namespace torchmem
