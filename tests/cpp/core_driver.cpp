// Reliability driver of the core: the caching allocator (host and sim
// devices, fixed and expandable segments), the arena, the paged block pool,
// the planner, the replayer and the planned slab, driven through random operation sequences,
// several threads, fork() while threads allocate, and injected device failures (tests/cpp/faulty_device.h), with
// the invariant checks of each component after every operation. Pure C++17:
// no Python, no torch. Built and run under sanitizers by scripts/sanitize.sh.
//
//   core_driver [--quick] [--seed N] [--list] [NAME_SUBSTRING ...]
//
// --quick (or TORCHMEM_QUICK=1) shrinks every loop for CI. The exit status is
// the number of failed checks (capped at 125); "N checks, 0 failures" is the
// last line of a clean run.
//
// The tests live in tests/cpp/core/, one file per component, sharing
// core_checks.h and driver_checks.h; this file holds main() and their order.
#include <vector>

#include "core/core_checks.h"
#include "driver_checks.h"

int main(int argc, char** argv) {
  using namespace core_driver;
  std::vector<driver::Test> tests;
  for (auto component : {caching_tests, arena_tests, block_pool_tests, planner_tests, planner_streams_tests,
                         replayer_tests, planned_slab_tests, oom_observers_tests, fork_tests}) {
    for (const driver::Test& t : component()) tests.push_back(t);
  }
  return driver::run_tests(argc, argv, tests);
}
