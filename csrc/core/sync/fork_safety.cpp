// See Note [Fork safety] in fork_safety.h.
#include "core/sync/fork_safety.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace torchmem {

// The registered mutexes, one intrusive list per rank, newest at the head.
class ForkRegistry {
 public:
  static ForkRegistry& instance() {
    static ForkRegistry* registry = new ForkRegistry();  // never destroyed: mutexes may outlive static destructors
    return *registry;
  }

  void add(ForkSafeMutex* m) {
    std::lock_guard<std::mutex> lock(mutex_);
    ForkSafeMutex*& head = heads_[static_cast<int>(m->rank_)];
    m->next_ = head;
    if (head) head->prev_ = m;
    head = m;
    ++count_;
  }

  void remove(ForkSafeMutex* m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (m->prev_) m->prev_->next_ = m->next_;
    else heads_[static_cast<int>(m->rank_)] = m->next_;
    if (m->next_) m->next_->prev_ = m->prev_;
    --count_;
  }

  void lock_all() {
    mutex_.lock();
    for (ForkSafeMutex* head : heads_) {
      for (ForkSafeMutex* m = head; m; m = m->next_) m->mutex_.lock();
    }
  }

  void unlock_all() {
    for (ForkSafeMutex* head : heads_) {
      for (ForkSafeMutex* m = head; m; m = m->next_) m->mutex_.unlock();
    }
    mutex_.unlock();
  }

  size_t count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }

  std::atomic<uint64_t> generation{0};

 private:
  ForkRegistry() {
    if (pthread_atfork(&prepare, &parent, &child) != 0) {
      std::fprintf(stderr, "torchmem: pthread_atfork failed; a forked child may hang on torchmem's locks\n");
    }
  }
  static void prepare() { instance().lock_all(); }
  static void parent() { instance().unlock_all(); }
  static void child() {
    ForkRegistry& r = instance();
    r.generation.fetch_add(1, std::memory_order_relaxed);
    r.unlock_all();
  }

  std::mutex mutex_;
  std::array<ForkSafeMutex*, kNumLockRanks> heads_{};
  size_t count_ = 0;
};

ForkSafeMutex::ForkSafeMutex(LockRank rank) : rank_(rank) { ForkRegistry::instance().add(this); }

ForkSafeMutex::~ForkSafeMutex() { ForkRegistry::instance().remove(this); }

uint64_t fork_generation() { return ForkRegistry::instance().generation.load(std::memory_order_relaxed); }

size_t fork_safe_mutex_count() { return ForkRegistry::instance().count(); }

}  // namespace torchmem
