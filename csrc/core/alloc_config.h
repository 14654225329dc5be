// AllocatorConfig: the caching allocator's settings, parsed from
// PYTORCH_CUDA_ALLOC_CONF's grammar: "key:value,key:value", lists in
// brackets ("roundup_power2_divisions:[256:1,512:2,>:8]").
//
// Keys (PyTorch's): max_split_size_mb, max_non_split_rounding_mb,
// roundup_power2_divisions, garbage_collection_threshold,
// expandable_segments, backend (native only), release_lock_on_cudamalloc.
// torchmem's own: per_process_memory_fraction (0 < f <= 1, as
// torch.cuda.set_per_process_memory_fraction) and capacity (device
// capacity, e.g. "8GiB", "512MB" or bytes; host and sim devices).
// parse() throws std::invalid_argument naming the key and what it accepts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace torchmem {

constexpr size_t kMinBlockSize = 512;          // all sizes round up to 512 B
constexpr size_t kSmallSize = 1048576;         // largest "small" request: 1 MiB
constexpr size_t kSmallBuffer = 2097152;       // small-pool segments: 2 MiB
constexpr size_t kLargeBuffer = 20971520;      // segments for 1-10 MiB requests: 20 MiB
constexpr size_t kMinLargeAlloc = 10485760;    // from 10 MiB, segments fit the request
constexpr size_t kRoundLarge = 2097152;        // ... rounded up to 2 MiB
constexpr size_t kRoundUpPowerOfTwoIntervals = 16;  // 1 MiB .. 64 GiB, one per power of two

struct AllocatorConfig {
  size_t max_split_size = std::numeric_limits<size_t>::max();
  size_t max_non_split_rounding = kLargeBuffer;
  std::array<size_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  double per_process_memory_fraction = 0.0;  // 0: not set (no limit, no garbage collection)
  size_t capacity = 0;  // 0: the device's own

  static AllocatorConfig parse(const std::string& text);
  // Divisions that apply to a request of `size` bytes (0 or 1: none).
  size_t divisions_for(size_t size) const;
  // The config in parse()'s grammar, only the keys that differ from defaults.
  std::string to_string() const;
};

// "80GiB", "512MB", "1.5 GB", "4096" -> bytes. Throws std::invalid_argument.
size_t parse_size(const std::string& text);

}  // namespace torchmem
