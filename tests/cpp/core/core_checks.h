// What the core driver's component files share (tests/cpp/core/*.cpp,
// linked with tests/cpp/core_driver.cpp, which holds main() and the order
// of the tests): the core's headers, a reference model of live blocks,
// random sizes, the devices the tests run on, and each component's list of
// tests.
#pragma once

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/allocators/arena.h"
#include "core/allocators/memory_resource.h"
#include "core/allocators/paged_block_pool.h"
#include "core/allocators/planned_slab.h"
#include "core/allocators/recording_allocator.h"
#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/oom_observers.h"
#include "core/devices/host_device.h"
#include "core/devices/sim_device.h"
#include "core/planner/buffers.h"
#include "core/planner/lower_bound.h"
#include "core/planner/pipeline/pipeline.h"
#include "core/planner/pipeline/pipeline_unroll.h"
#include "core/planner/pipeline/stage_cut.h"
#include "core/planner/planner.h"
#include "core/planner/scheduling.h"
#include "core/planner/streams/stream_liveness.h"
#include "core/planner/streams/stream_planner.h"
#include "core/planner/streams/streams.h"
#include "core/planner/streams/validate_streams.h"
#include "core/planner/validate.h"
#include "core/policy/native/caching_allocator.h"
#include "core/replay/replayer.h"
#include "core/sync/fast_mutex.h"
#include "core/sync/fork_safety.h"

#include "../device_checks.h"
#include "../driver_checks.h"

namespace core_driver {

using namespace torchmem;
using namespace driver;

struct LiveBlock {
  size_t size;
  uint8_t tag;
};

// Live blocks by address: the reference model. Insert checks overlap.
struct LiveSet {
  std::map<uintptr_t, LiveBlock> blocks;
  size_t requested = 0;

  bool insert(uintptr_t p, size_t size, uint8_t tag) {
    auto next = blocks.lower_bound(p);
    if (next != blocks.end() && next->first < p + size) return false;
    if (next != blocks.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > p) return false;
    }
    blocks.emplace(p, LiveBlock{size, tag});
    requested += size;
    return true;
  }
  std::pair<uintptr_t, LiveBlock> take(size_t index) {
    auto it = blocks.begin();
    std::advance(it, index % blocks.size());
    auto out = *it;
    requested -= it->second.size;
    blocks.erase(it);
    return out;
  }
};

inline size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 1 + rng() % 4096;             // small pool, sub-page
    case 1: return 1 + rng() % (2 * MiB);        // around the small/large boundary
    case 2: return MiB + rng() % (9 * MiB);      // 20 MiB segments
    default: return 10 * MiB + rng() % (30 * MiB);  // rounded-to-2 MiB segments
  }
}


enum class Kind { kSim, kHost };

inline std::unique_ptr<Device> make_device(Kind kind, size_t capacity) {
  if (kind == Kind::kHost) return std::make_unique<HostDevice>(capacity);
  return std::make_unique<SimDevice>(capacity);
}

inline void check_stats_match(const DeviceAllocator& a, const LiveSet& live) {
  const DeviceStats s = a.stats();
  CHECK(s.allocation[kAggregate].current == static_cast<int64_t>(live.blocks.size()));
  CHECK(s.requested_bytes[kAggregate].current == static_cast<int64_t>(live.requested));
  CHECK(s.reserved_bytes[kAggregate].current >= s.allocated_bytes[kAggregate].current);
  CHECK(s.allocated_bytes[kAggregate].current >= s.requested_bytes[kAggregate].current);
  CHECK(s.allocation[kAggregate].current == s.allocation[kSmallPool].current + s.allocation[kLargePool].current);
  CHECK(s.reserved_bytes[kAggregate].peak >= s.reserved_bytes[kAggregate].current);
}

// Each component's tests, in the order the driver runs them.
std::vector<Test> caching_tests();
std::vector<Test> arena_tests();
std::vector<Test> block_pool_tests();
std::vector<Test> planner_tests();
std::vector<Test> planner_streams_tests();
std::vector<Test> replayer_tests();
std::vector<Test> planned_slab_tests();
std::vector<Test> oom_observers_tests();
std::vector<Test> fork_tests();

}  // namespace core_driver
