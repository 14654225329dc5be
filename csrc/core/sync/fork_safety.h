// Fork safety: the core's locks are held across fork(), so a forked child
// never waits on a lock that a thread of its parent held at that moment.
//
// Note [Fork safety]
// fork() copies only the calling thread. A lock that another thread held at
// the moment of the fork stays held in the child, by a thread that does not
// exist there, and the child's first call that needs it hangs forever
// (DataLoader workers and multiprocessing fork by default on Linux). glibc's
// malloc takes its own locks around fork() for this reason; torchmem does
// the same for its own:
//
// - Every lock of the core is a ForkSafeMutex. While it exists it is in one
//   process-wide registry (registration is in the constructor and the
//   destructor; lock() and unlock() are a plain FastMutex's).
// - Before fork() (a pthread_atfork prepare handler, installed with the
//   registry), the forking thread takes the registry's lock, then every
//   registered mutex in lock order (below). Once it holds them all no other
//   thread is inside a critical section, so the child copies consistent
//   state: its allocators can free what the parent allocated, and their
//   statistics and invariants hold.
// - After fork(), the parent releases them all. The child releases them too
//   (its one thread is the thread that took them) and adds one to
//   fork_generation(). Nothing else is reset: the child keeps its parent's
//   allocators, cached blocks, live allocations and settings.
//
// Lock order. The forking thread takes the locks rank by rank, and within a
// rank newest first. The ranks follow how the code nests locks: a thread
// that holds a lock may take another only of a higher rank, or of the same
// rank and older:
//   kRouting    the CPU install's routing table (glue): held while it asks a
//               routed allocator whether it is still in use, or empties a cache;
//               a DeviceMemory's lock (pools, routes), held while it calls
//               its allocators.
//   kWrapper    allocators that call another allocator under their own lock:
//               arena (its fallback), planned slab (its fallback), recording
//               allocator (its target). A wrapper is made after the allocator
//               it wraps, so newest first is outermost first.
//   kAllocator  caching allocators; their history ring is under this lock.
//   kContext    a history's context provider slot (set under kAllocator);
//               StreamUses (taken under kAllocator by the out-of-memory
//               waiter) and ContextStore.
//   kDevice     a device's own bookkeeping (called under kAllocator); a device
//               that wraps another is newer than it.
//
// Contract for code that uses ForkSafeMutex:
// - Follow the lock order above.
// - Never call fork() while holding one (the prepare handler would wait for
//   the calling thread itself), for example from a free-memory callback.
// - Never construct or destroy one while holding another: the registry's lock
//   is taken then, and the prepare handler takes it before the others.
// - A lock held across a wait on something the forking thread may hold (the
//   Python GIL) deadlocks the fork: call such things outside the lock (as the
//   history's context provider is called before the allocator's lock).
// - pthread_atfork handlers of other libraries registered before torchmem's
//   (the first ForkSafeMutex, or the first fork_generation() call) run while
//   torchmem's locks are held: their prepare handlers after torchmem's, their
//   child handlers before it. They must not allocate through torchmem.
//
// What a child may do: everything, on the CPU. State that belongs to a
// device context the child does not have (CUDA) is not reset here: code
// that owns such state records fork_generation() when it makes it and, in
// a child (made_before_fork() true), must not use it, nor take its locks
// (see docs/reliability.md, "Fork safety", for the CUDA rule).
#pragma once

#include <cstdint>
#include <mutex>  // std::lock_guard, for users

#include "core/sync/fast_mutex.h"

namespace torchmem {

enum class LockRank : uint8_t { kRouting, kWrapper, kAllocator, kContext, kDevice };
constexpr int kNumLockRanks = 5;

// A lock (a FastMutex) that the fork handlers take before fork() and release
// after it, in parent and child. Satisfies Lockable (use std::lock_guard).
// Neither copyable nor movable: the registry holds its address.
class ForkSafeMutex {
 public:
  explicit ForkSafeMutex(LockRank rank);
  ~ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  void lock() { mutex_.lock(); }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() { mutex_.unlock(); }

  LockRank rank() const { return rank_; }

 private:
  friend class ForkRegistry;
  FastMutex mutex_;
  const LockRank rank_;
  ForkSafeMutex* prev_ = nullptr;  // registry links, within the rank's list
  ForkSafeMutex* next_ = nullptr;
};

// How many forks separate this process from the one that first used
// torchmem: 0 there, n in a child forked n levels down (counted by the
// child handler, so from the first ForkSafeMutex or the first call to this
// function, whichever came first).
uint64_t fork_generation();

// Whether state made when fork_generation() was `generation` was inherited
// from a parent process through fork().
inline bool made_before_fork(uint64_t generation) { return generation != fork_generation(); }

// Mutexes registered now (for tests).
size_t fork_safe_mutex_count();

}  // namespace torchmem
