// What a policy reports of its segments and blocks, for snapshots
// (torch.cuda.memory._snapshot()'s segments): plain data, every policy's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/devices/device.h"

namespace torchmem {

// A run of addresses: what an expandable segment maps or unmaps at once.
struct SegmentRange {
  uintptr_t addr;
  size_t size;
};

// Plain data for snapshots (torch.cuda.memory._snapshot()'s segments).
struct BlockInfo {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested_size = 0;
  bool allocated = false;      // live: handed out and not freed
  bool mapped = true;
  bool active = false;         // allocated, or freed and waiting for other streams
};

struct SegmentInfo {
  uintptr_t addr = 0;
  size_t total_size = 0;
  Stream stream = 0;
  bool is_small = false;
  bool is_expandable = false;
  size_t allocated_size = 0;
  size_t requested_size = 0;
  std::vector<BlockInfo> blocks;
};

}  // namespace torchmem
