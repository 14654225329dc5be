// Cost of a cached malloc+free pair in torchmem's core next to glibc's
// malloc/free, and tcmalloc's when libtcmalloc_minimal can be opened (its
// tc_malloc/tc_free, called directly: glibc stays the process's malloc), on
// the same size sequences, in one process. torchmem runs the native policy.
//
// Size mixes (1,000,000 requests each, bench_malloc.py names them):
//   bert:    the ~20 distinct sizes of a BERT-base step, 512 B to 16 MiB,
//            drawn at random;
//   gpt2:    the requested sizes of GPT-2-shaped training steps with varying
//            sequence lengths, as recorded (benchmarks/gpt2_step_sizes.json,
//            record_gpt2_sizes.py), in their order, over and over;
//   eleven:  eleven kinds from 512 B to 9 MiB (a factor of ~2.67 apart),
//            each with 0-3 extra 512-byte steps, drawn at random;
//   uniform: a pool drawn at random (small: up to 1 MiB; large: 1-10 MiB;
//            oversize-segment: 10-32 MiB), then a size in it, uniform in
//            512-byte steps;
//   hot:     four hot sizes (4 KiB, 96 KiB, 3 MiB, 12 MiB) for 90% of the
//            requests, and a long tail: 10% log-uniform from 512 B to
//            64 MiB in 512-byte steps.
// Workloads:
//   pair:    malloc then free at once (the allocator's fast path), on every mix;
//   pair2t:  the bert pairs split between two threads on one allocator
//            (wall time over all pairs: what contention costs; glibc and
//            tcmalloc keep per-thread caches, torchmem's core one lock);
//   window:  bert sizes, keep 64 blocks live, free the oldest on each
//            malloc, and write one byte per 4 KiB page of each new block (so
//            memory the allocator returned to the OS costs page faults again).
// Each mix has its own torchmem allocator, warmed up on that mix. pair and
// window are timed in the thread's CPU time (CLOCK_THREAD_CPUTIME_ID, page
// faults included), pair2t in wall time.
//
//   bench_malloc GPT2_SIZES.json [REPEATS]      one JSON object per (workload, mix, allocator, repeat)
//   bench_malloc GPT2_SIZES.json count MIX ALLOCATOR PAIRS
//                                               PAIRS pairs to warm up, then the same in count_pairs() (for
//                                               valgrind --tool=callgrind --toggle-collect=*count_pairs*)
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/devices/host_device.h"
#include "core/policy/native/caching_allocator.h"

using Clock = std::chrono::steady_clock;

namespace {

// The calling thread's CPU time in ns: on a shared machine, time spent
// descheduled does not count (the pair and window workloads run on one thread).
double thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr size_t kRequests = 1'000'000;

size_t steps_512(size_t n) { return (n + 511) / 512 * 512; }

std::vector<size_t> bert_mix(size_t n) {
  const size_t sizes[] = {512,     3072,    6144,    12288,   24576,   49152,   98304,
                          196608,  393216,  786432,  1179648, 1572864, 2359296, 3145728,
                          4718592, 6291456, 9437184, 12582912, 14155776, 16777216};
  std::mt19937_64 rng(42);
  std::vector<size_t> out(n);
  for (auto& s : out) s = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
  return out;
}

std::vector<size_t> gpt2_mix(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const size_t key = s.find("\"sizes\"");
  const size_t open = key == std::string::npos ? key : s.find('[', key);
  std::vector<size_t> recorded;
  if (open != std::string::npos) {
    const char* p = s.c_str() + open + 1;
    for (;;) {
      while (*p == ' ' || *p == ',' || *p == '\n') ++p;
      if (*p < '0' || *p > '9') break;
      char* end = nullptr;
      recorded.push_back(std::strtoull(p, &end, 10));
      p = end;
    }
  }
  if (recorded.empty()) {
    std::fprintf(stderr, "bench_malloc: no \"sizes\" list in %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<size_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = recorded[i % recorded.size()];
  return out;
}

std::vector<size_t> eleven_mix(size_t n) {
  std::vector<size_t> kinds;
  for (int k = 0; k < 11; ++k) kinds.push_back(steps_512(static_cast<size_t>(512.0 * std::pow(18432.0, k / 10.0))));
  std::mt19937_64 rng(7);
  std::vector<size_t> out(n);
  for (auto& s : out) s = kinds[rng() % kinds.size()] + 512 * (rng() % 4);
  return out;
}

std::vector<size_t> uniform_mix(size_t n) {
  const size_t lo[] = {512, kMiB + 512, 10 * kMiB};
  const size_t hi[] = {kMiB, 10 * kMiB - 512, 32 * kMiB};
  std::mt19937_64 rng(11);
  std::vector<size_t> out(n);
  for (auto& s : out) {
    const size_t pool = rng() % 3;
    s = lo[pool] + 512 * (rng() % ((hi[pool] - lo[pool]) / 512 + 1));
  }
  return out;
}

std::vector<size_t> hot_mix(size_t n) {
  const size_t hot[] = {4 * kKiB, 96 * kKiB, 3 * kMiB, 12 * kMiB};
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(64.0 * kMiB));
  std::vector<size_t> out(n);
  for (auto& s : out) s = rng() % 10 ? hot[rng() % 4] : steps_512(static_cast<size_t>(std::exp(log_size(rng))));
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
  const double start = thread_cpu_ns();
  for (size_t s : sizes) {
    void* p = a.allocate(s);
    static_cast<volatile char*>(p)[0] = 1;
    a.deallocate(p);
  }
  return (thread_cpu_ns() - start) / sizes.size();
}

// The pairs callgrind counts (its --toggle-collect names this function).
template <typename A>
__attribute__((noinline)) void count_pairs(A& a, const std::vector<size_t>& sizes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    void* p = a.allocate(sizes[i % sizes.size()]);
    static_cast<volatile char*>(p)[0] = 1;
    a.deallocate(p);
  }
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
  const double start = thread_cpu_ns();
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
  return (thread_cpu_ns() - start) / sizes.size();
}

struct Mix {
  const char* name;
  std::vector<size_t> sizes;
};

std::vector<Mix> mixes(const std::string& gpt2_path) {
  return {{"bert", bert_mix(kRequests)},
          {"gpt2", gpt2_mix(gpt2_path, kRequests)},
          {"eleven", eleven_mix(kRequests)},
          {"uniform", uniform_mix(kRequests)},
          {"hot", hot_mix(kRequests)}};
}

template <typename A>
int count(A& a, const std::vector<size_t>& sizes, size_t n) {
  const std::vector<size_t> first(sizes.begin(), sizes.begin() + std::min(n, sizes.size()));
  pair_ns(a, first);  // warm up on the same pairs
  count_pairs(a, first, n);
  return 0;
}

int count_main(const std::vector<Mix>& all, const std::string& mix, const std::string& allocator, size_t n) {
  for (const Mix& m : all) {
    if (mix != m.name) continue;
    if (allocator == "glibc") {
      Glibc g;
      return count(g, m.sizes, n);
    }
    if (allocator == "torchmem") {
      Torchmem t;
      return count(t, m.sizes, n);
    }
    Tcmalloc tc;
    if (allocator == "tcmalloc" && tc.available()) return count(tc, m.sizes, n);
    std::fprintf(stderr, "bench_malloc: unknown or unavailable allocator %s\n", allocator.c_str());
    return 2;
  }
  std::fprintf(stderr, "bench_malloc: unknown mix %s\n", mix.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_malloc GPT2_SIZES.json [REPEATS | count MIX ALLOCATOR PAIRS]\n");
    return 2;
  }
  const std::vector<Mix> all = mixes(argv[1]);
  if (argc > 2 && std::strcmp(argv[2], "count") == 0) {
    if (argc != 6) {
      std::fprintf(stderr, "usage: bench_malloc GPT2_SIZES.json count MIX ALLOCATOR PAIRS\n");
      return 2;
    }
    return count_main(all, argv[3], argv[4], std::strtoull(argv[5], nullptr, 10));
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  const std::vector<size_t>& bert = all[0].sizes;
  const auto windows = bert_mix(4000);
  Glibc glibc;
  Tcmalloc tc;
  std::vector<std::unique_ptr<Torchmem>> ours;
  for (const Mix& m : all) {  // warm up all
    ours.push_back(std::make_unique<Torchmem>());
    pair_ns(glibc, m.sizes);
    pair_ns(*ours.back(), m.sizes);
    if (tc.available()) pair_ns(tc, m.sizes);
  }
  Torchmem window_ours;
  window_ns(glibc, windows);
  window_ns(window_ours, windows);
  if (tc.available()) window_ns(tc, windows);
  auto row = [](const char* workload, const char* mix, const char* allocator, double ns) {
    std::printf("{\"workload\": \"%s\", \"mix\": \"%s\", \"allocator\": \"%s\", \"ns\": %.2f}\n", workload, mix,
                allocator, ns);
  };
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < all.size(); ++i) {
      row("pair", all[i].name, "glibc", pair_ns(glibc, all[i].sizes));
      row("pair", all[i].name, "torchmem", pair_ns(*ours[i], all[i].sizes));
      if (tc.available()) row("pair", all[i].name, "tcmalloc", pair_ns(tc, all[i].sizes));
    }
    row("pair2t", "bert", "glibc", pair_two_threads_ns(glibc, bert));
    row("pair2t", "bert", "torchmem", pair_two_threads_ns(*ours[0], bert));
    if (tc.available()) row("pair2t", "bert", "tcmalloc", pair_two_threads_ns(tc, bert));
    row("window", "bert", "glibc", window_ns(glibc, windows));
    row("window", "bert", "torchmem", window_ns(window_ours, windows));
    if (tc.available()) row("window", "bert", "tcmalloc", window_ns(tc, windows));
  }
  return 0;
}
