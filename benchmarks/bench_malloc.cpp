// Cost of a cached malloc+free pair in torchmem's core next to glibc's
// malloc/free, and tcmalloc's when libtcmalloc_minimal can be opened (its
// tc_malloc/tc_free, called directly: glibc stays the process's malloc), on
// the same size sequence, in one process. torchmem runs the native policy.
//
// Three workloads, each over the same sequence of sizes (the ~20 distinct
// sizes of a BERT-base step, 512 B to 16 MiB):
//   pair:    malloc then free at once (the allocator's fast path);
//   pair2t:  the same pairs split between two threads on one allocator
//            (wall time over all pairs: what contention costs; glibc and
//            tcmalloc keep per-thread caches, torchmem's core one lock);
//   window:  keep 64 blocks live, free the oldest on each malloc, and write
//            one byte per 4 KiB page of each new block (so memory the
//            allocator returned to the OS costs page faults again).
// Prints one JSON object per (workload, allocator, repeat).
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "core/policy/native/caching_allocator.h"
#include "core/devices/host_device.h"

using Clock = std::chrono::steady_clock;

namespace {

std::vector<size_t> size_sequence(size_t n) {
  const size_t sizes[] = {512,     3072,    6144,    12288,   24576,   49152,   98304,
                          196608,  393216,  786432,  1179648, 1572864, 2359296, 3145728,
                          4718592, 6291456, 9437184, 12582912, 14155776, 16777216};
  std::mt19937_64 rng(42);
  std::vector<size_t> out(n);
  for (auto& s : out) s = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
  return out;
}

struct Glibc {
  void* allocate(size_t n) { return std::malloc(n); }
  void deallocate(void* p) { std::free(p); }
};

struct Tcmalloc {
  void* (*malloc_fn)(size_t) = nullptr;
  void (*free_fn)(void*) = nullptr;
  Tcmalloc() {
    void* lib = dlopen("libtcmalloc_minimal.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    malloc_fn = reinterpret_cast<void* (*)(size_t)>(dlsym(lib, "tc_malloc"));
    free_fn = reinterpret_cast<void (*)(void*)>(dlsym(lib, "tc_free"));
  }
  bool available() const { return malloc_fn && free_fn; }
  void* allocate(size_t n) { return malloc_fn(n); }
  void deallocate(void* p) { free_fn(p); }
};

struct Torchmem {
  torchmem::HostDevice device;
  torchmem::CachingAllocator caching{device};
  void* allocate(size_t n) { return caching.allocate(n); }
  void deallocate(void* p) { caching.deallocate(p); }
};

void touch(void* p, size_t n) {
  auto* bytes = static_cast<volatile char*>(p);
  for (size_t i = 0; i < n; i += 4096) bytes[i] = 1;
}

template <typename A>
double pair_ns(A& a, const std::vector<size_t>& sizes) {
  auto start = Clock::now();
  for (size_t s : sizes) {
    void* p = a.allocate(s);
    static_cast<volatile char*>(p)[0] = 1;
    a.deallocate(p);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / sizes.size();
}

template <typename A>
double pair_two_threads_ns(A& a, const std::vector<size_t>& sizes) {
  const size_t half = sizes.size() / 2;
  auto run = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      void* p = a.allocate(sizes[i]);
      static_cast<volatile char*>(p)[0] = 1;
      a.deallocate(p);
    }
  };
  auto start = Clock::now();
  std::thread other(run, half, sizes.size());
  run(0, half);
  other.join();
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / sizes.size();
}

template <typename A>
double window_ns(A& a, const std::vector<size_t>& sizes) {
  std::deque<void*> live;
  auto start = Clock::now();
  for (size_t s : sizes) {
    void* p = a.allocate(s);
    touch(p, s);
    live.push_back(p);
    if (live.size() > 64) {
      a.deallocate(live.front());
      live.pop_front();
    }
  }
  for (void* p : live) a.deallocate(p);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / sizes.size();
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 7;
  const auto pairs = size_sequence(1'000'000);
  const auto windows = size_sequence(4000);
  Glibc glibc;
  Torchmem ours;
  Tcmalloc tc;
  pair_ns(glibc, pairs);  // warm up all
  pair_ns(ours, pairs);
  window_ns(glibc, windows);
  window_ns(ours, windows);
  if (tc.available()) {
    pair_ns(tc, pairs);
    window_ns(tc, windows);
  }
  auto row = [](const char* workload, const char* allocator, double ns) {
    std::printf("{\"workload\": \"%s\", \"allocator\": \"%s\", \"ns\": %.2f}\n", workload, allocator, ns);
  };
  for (int r = 0; r < repeats; ++r) {
    row("pair", "glibc", pair_ns(glibc, pairs));
    row("pair", "torchmem", pair_ns(ours, pairs));
    if (tc.available()) row("pair", "tcmalloc", pair_ns(tc, pairs));
    row("pair2t", "glibc", pair_two_threads_ns(glibc, pairs));
    row("pair2t", "torchmem", pair_two_threads_ns(ours, pairs));
    if (tc.available()) row("pair2t", "tcmalloc", pair_two_threads_ns(tc, pairs));
    row("window", "glibc", window_ns(glibc, windows));
    row("window", "torchmem", window_ns(ours, windows));
    if (tc.available()) row("window", "tcmalloc", window_ns(tc, windows));
  }
  return 0;
}
