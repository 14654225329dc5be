// The checks and the test runner the core's C++ drivers share
// (core_driver.cpp with its component files in tests/cpp/core/,
// stitch_driver.cpp, device_memory_driver.cpp; each driver is one program,
// built by scripts/sanitize.sh).
//
// CHECK* count every check and report a failure without stopping; the
// runner takes --quick (or TORCHMEM_QUICK=1), --seed N, --list and name
// filters, prints one line per test and exits with the failure count
// (at most 125).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace driver {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

inline bool g_quick = false;
inline uint64_t g_seed = 1;
inline std::atomic<int> g_failures{0};
inline std::atomic<int> g_checks{0};
inline std::mutex g_print_mutex;

inline int scaled(int full, int quick) { return g_quick ? quick : full; }

inline void report_failure(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::printf("FAIL %s:%d: %s\n", file, line, what.c_str());
  std::fflush(stdout);
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs f; returns "" when it throws E, else a description of what happened.
template <typename E, typename F>
std::string expect_throw(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const E& e) {
    if (message) *message = e.what();
    return "";
  } catch (const std::exception& e) {
    return std::string("threw another exception: ") + e.what();
  } catch (...) {
    return "threw a non-std exception";
  }
  return "did not throw";
}

// Runs a component's invariant check; a broken invariant is a failure.
template <typename T>
void check_invariants_of(const T& x, const char* file, int line) {
  ++g_checks;
  try {
    x.check_invariants();
  } catch (const std::exception& e) {
    report_failure(file, line, e.what());
  }
}

struct Test {
  const char* name;
  void (*fn)();
};

// The driver's main(): runs the tests the arguments select.
inline int run_tests(int argc, char** argv, const std::vector<Test>& tests) {
  const char* env_quick = std::getenv("TORCHMEM_QUICK");
  g_quick = env_quick && std::strcmp(env_quick, "0") != 0 && *env_quick;
  std::vector<std::string> filters;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      g_quick = true;
    } else if (arg == "--seed" && i + 1 < argc) {
      g_seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--list") {
      list = true;
    } else {
      filters.push_back(arg);
    }
  }
  int ran = 0;
  for (const Test& t : tests) {
    if (!filters.empty() &&
        std::none_of(filters.begin(), filters.end(), [&](const std::string& f) { return contains(t.name, f); }))
      continue;
    if (list) {
      std::printf("%s\n", t.name);
      continue;
    }
    const int before = g_failures.load();
    try {
      t.fn();
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string(t.name) + " threw: " + e.what());
    }
    ++ran;
    std::printf("%-40s %s\n", t.name, g_failures.load() == before ? "ok" : "FAILED");
    std::fflush(stdout);
  }
  if (list) return 0;
  std::printf("%d tests%s, %d checks, %d failures\n", ran, g_quick ? " (quick)" : "", g_checks.load(), g_failures.load());
  return std::min(g_failures.load(), 125);
}

template <size_t N>
int run_tests(int argc, char** argv, const Test (&tests)[N]) {
  return run_tests(argc, argv, std::vector<Test>(tests, tests + N));
}

}  // namespace driver

#define CHECK(cond)                                                            \
  do {                                                                         \
    ++::driver::g_checks;                                                      \
    if (!(cond)) ::driver::report_failure(__FILE__, __LINE__, #cond);          \
  } while (0)

#define CHECK_MSG(cond, msg)                                                                      \
  do {                                                                                            \
    ++::driver::g_checks;                                                                         \
    if (!(cond)) ::driver::report_failure(__FILE__, __LINE__, std::string(#cond) + ": " + (msg)); \
  } while (0)

#define CHECK_THROWS(E, expr)                                                                     \
  do {                                                                                            \
    ++::driver::g_checks;                                                                         \
    std::string why_ = ::driver::expect_throw<E>([&] { (void)(expr); });                          \
    if (!why_.empty()) ::driver::report_failure(__FILE__, __LINE__, #expr " (" #E "): " + why_); \
  } while (0)

#define INVARIANTS(x) ::driver::check_invariants_of((x), __FILE__, __LINE__)
