// Core driver: fork (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

// Fork safety (Note [Fork safety] in core/sync/fork_safety.h): a child forked while
// other threads are inside the allocators must find every lock free and the
// allocators consistent. Each child runs its checks and reports through its
// exit status; the parent kills a child still running after kChildTimeout
// and counts it as hung.

constexpr double kChildTimeout = 30.0;  // seconds: TSan children are slow, a healthy one takes milliseconds

enum class ChildEnd { kExited, kHung };

// Waits for `pid`; a child still running after `timeout` seconds is killed.
ChildEnd wait_child(pid_t pid, double timeout, int* exit_code) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return ChildEnd::kExited;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return ChildEnd::kHung;
}

// fork() without running the pthread_atfork handlers: what a child got
// before torchmem took its locks around fork (the control experiment).
pid_t fork_without_handlers() { return static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0)); }

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// Exit statuses of the children.
constexpr int kChildOk = 0, kChildBroken = 1, kChildThrew = 2;

// In a child: frees the parent's blocks, allocates and frees its own through
// every allocator, and checks invariants and statistics.
int fork_child_checks(CachingAllocator& a, CachingAllocator& b, Arena& arena, RecordingAllocator& recorder,
                      const std::vector<void*>& parents_a, const std::vector<void*>& parents_b) {
  try {
    const auto count = [](const CachingAllocator& x) { return x.stats().allocation[kAggregate].current; };
    const int64_t live_a = count(a), live_b = count(b);
    for (void* p : parents_a) a.deallocate(p);
    for (void* p : parents_b) recorder.deallocate(p);
    if (count(a) != live_a - static_cast<int64_t>(parents_a.size())) return kChildBroken;
    if (count(b) != live_b - static_cast<int64_t>(parents_b.size())) return kChildBroken;
    std::vector<std::pair<Allocator*, void*>> mine;
    for (size_t size : {size_t(4 * KiB), size_t(700 * KiB), size_t(3 * MiB), size_t(24 * MiB)}) {
      for (Allocator* x : std::initializer_list<Allocator*>{&a, &recorder, &arena}) {
        void* p = x->allocate(size);
        std::memset(p, 0x5a, size);
        mine.push_back({x, p});
      }
    }
    for (auto& [x, p] : mine) x->deallocate(p);
    a.check_invariants();
    b.check_invariants();
    arena.check_invariants();
    if (count(a) != live_a - static_cast<int64_t>(parents_a.size())) return kChildBroken;
    return kChildOk;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fork child: %s\n", e.what());
    return kChildThrew;
  }
}

// Threads allocate and free through two caching allocators (one with
// expandable segments, behind a recording allocator), an arena whose
// fallback is the first, with a history context provider on every
// allocation, while another thread forks again and again.
void test_fork_while_threads_allocate() {
  const size_t mutexes_before = fork_safe_mutex_count();
  {
    HostDevice dev_a(1 * GiB), dev_b(1 * GiB), dev_arena(64 * MiB);
    CachingAllocator a(dev_a);
    CachingAllocator b(dev_b, AllocatorConfig::parse("expandable_segments:True"));
    Arena arena(dev_arena, ArenaOptions{4 * MiB, 64, &a});
    auto b_shared = std::shared_ptr<Allocator>(&b, [](Allocator*) {});
    RecordingAllocator recorder(b_shared);
    CHECK(fork_safe_mutex_count() == mutexes_before + 3 + 2 + 2 + 1 + 1);  // devices, allocators + histories, arena, recorder
    std::atomic<uint64_t> contexts{0};
    a.history().enable(1024, [&] { return ++contexts; });

    std::vector<void*> parents_a, parents_b;  // live in the parent; each child frees its copies
    for (size_t size : {size_t(512), size_t(100 * KiB), size_t(2 * MiB), size_t(30 * MiB)}) {
      parents_a.push_back(a.allocate(size));
      parents_b.push_back(recorder.allocate(size));
    }

    std::atomic<bool> stop{false};
    auto worker = [&](int id) {
      std::mt19937_64 rng(g_seed * 131 + id);
      std::vector<std::pair<Allocator*, void*>> mine;
      while (!stop.load(std::memory_order_relaxed)) {
        if (mine.size() < 16 && rng() % 3 != 0) {
          Allocator* x = rng() % 3 == 0 ? static_cast<Allocator*>(&arena)
                                        : rng() % 2 ? static_cast<Allocator*>(&a) : static_cast<Allocator*>(&recorder);
          try {
            mine.push_back({x, x->allocate(1 + rng() % (rng() % 8 == 0 ? 12 * MiB : 256 * KiB))});
          } catch (const OutOfMemory&) {
          }
        } else if (!mine.empty()) {
          const size_t i = rng() % mine.size();
          mine[i].first->deallocate(mine[i].second);
          mine[i] = mine.back();
          mine.pop_back();
        }
        if (rng() % 64 == 0) arena.rewind();
        if (rng() % 512 == 0) a.empty_cache();
      }
      for (auto& [x, p] : mine) x->deallocate(p);
    };

    const int forks = scaled(200, 20);
    int hung = 0, bad = 0;
    std::vector<std::thread> pool;
    for (int i = 0; i < 3; ++i) pool.emplace_back(worker, i);
    std::thread forker([&] {
      for (int i = 0; i < forks && hung < 3; ++i) {  // three hangs are enough to fail: stop waiting
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        const pid_t pid = fork();
        if (pid == 0) _exit(fork_child_checks(a, b, arena, recorder, parents_a, parents_b));
        if (pid < 0) {
          ++bad;
          continue;
        }
        int code = 0;
        if (wait_child(pid, kChildTimeout, &code) == ChildEnd::kHung) {
          ++hung;
        } else if (code != kChildOk) {
          ++bad;
          report_failure(__FILE__, __LINE__, "fork child " + std::to_string(i) + " exited with " + std::to_string(code));
        }
      }
    });
    forker.join();
    stop = true;
    for (auto& t : pool) t.join();
    CHECK_MSG(hung == 0, std::to_string(hung) + " of " + std::to_string(forks) + " children hung");
    CHECK(bad == 0);

    for (void* p : parents_a) a.deallocate(p);
    for (void* p : parents_b) recorder.deallocate(p);
    arena.reset();
    INVARIANTS(a);
    INVARIANTS(b);
    INVARIANTS(arena);
    CHECK(a.stats().allocation[kAggregate].current == 0);
    CHECK(b.stats().allocation[kAggregate].current == 0);
    CHECK(contexts.load() > 0);
    a.empty_cache();
    b.empty_cache();
  }
  CHECK_MSG(fork_safe_mutex_count() == mutexes_before,
            std::to_string(fork_safe_mutex_count()) + " mutexes registered, " + std::to_string(mutexes_before) + " before");
}

// One thread holds the allocator's lock (a free-memory callback runs under
// it, sleeping) when another forks. fork() waits for the lock, so the child
// sees the callback finished and allocates at once; the control, a fork that
// skips the handlers, leaves the lock held in the child, which hangs.
void fork_with_lock_held(bool run_handlers) {
  HostDevice dev(256 * MiB);
  CachingAllocator a(dev);
  std::atomic<bool> in_callback{false}, callback_done{false};
  a.add_free_memory_callback([&] {
    in_callback = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    callback_done = true;
    return false;
  });
  std::thread holder([&] { a.deallocate(a.allocate(1 * MiB)); });  // a miss: the callback runs under the lock
  while (!in_callback.load()) std::this_thread::yield();
  const pid_t pid = run_handlers ? fork() : fork_without_handlers();
  if (pid == 0) {
    const bool waited = callback_done.load();
    void* p = a.allocate(4 * KiB);
    a.deallocate(p);
    _exit(waited ? kChildOk : kChildBroken);
  }
  holder.join();
  CHECK(pid > 0);
  if (pid <= 0) return;
  int code = -1;
  const ChildEnd end = wait_child(pid, run_handlers ? kChildTimeout : 2.0, &code);
  if (run_handlers) {
    CHECK_MSG(end == ChildEnd::kExited, "the child hung on the allocator's lock");
    CHECK_MSG(code == kChildOk, "child exit " + std::to_string(code) + " (1: fork did not wait for the lock)");
  } else {
    CHECK_MSG(end == ChildEnd::kHung, "the control did not reproduce the hang (child exit " + std::to_string(code) + ")");
  }
  INVARIANTS(a);
  a.empty_cache();
}

// FastMutex: mutual exclusion through its spinning and its sleeping paths.
// Holders that sometimes sleep make waiters give up spinning and sleep on
// the futex, so a lost wake-up hangs this test (the driver's timeout).
void test_fast_mutex() {
  torchmem::FastMutex mutex;
  const int threads = 4;
  const int rounds = scaled(20000, 4000);
  long counter = 0;  // plain: a broken lock loses increments (and ThreadSanitizer reports the race)
  std::atomic<int> inside{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<torchmem::FastMutex> lock(mutex);
        if (inside.fetch_add(1) != 0) CHECK(false);
        ++counter;
        if ((i + t) % 997 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(counter == static_cast<long>(threads) * rounds);
  CHECK(mutex.try_lock());
  CHECK(!mutex.try_lock());
  mutex.unlock();
}

void test_fork_waits_for_a_held_lock() {
  // Only without ThreadSanitizer: the control forks behind its back, and under it the child of the
  // real fork has been seen not to observe the holder's write (it passes in the plain and ASan builds;
  // the 200-fork test runs under TSan).
  if (kThreadSanitizer) return;
  fork_with_lock_held(true);
  fork_with_lock_held(false);
}

}  // namespace

std::vector<Test> fork_tests() {
  return {
      {"fast_mutex", test_fast_mutex},
      {"fork_while_threads_allocate", test_fork_while_threads_allocate},
      {"fork_waits_for_a_held_lock", test_fork_waits_for_a_held_lock},
  };
}

}  // namespace core_driver
