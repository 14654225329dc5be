// AllocatorConfig: the caching allocator's settings, parsed from
// PYTORCH_CUDA_ALLOC_CONF's grammar: "key:value,key:value", lists in
// brackets ("roundup_power2_divisions:[256:1,512:2,>:8]").
//
// What PyTorch accepts, parse() accepts; what PyTorch rejects, parse()
// rejects (c10::CachingAllocator::AcceleratorAllocatorConfig::parseArgs and
// c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::parseArgs), with a
// message naming the key and what it takes. Two knowing differences:
// - numbers must be whole: PyTorch reads a prefix (std::stoull, std::stod),
//   so it takes "64MB" as 64, "-5" as 2^64 - 5 and "0.6x" as 0.6; torchmem
//   rejects them;
// - backend takes "native" only (torchmem is the native policy).
//
// Keys that decide placements: large_segment_size_mb, max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions,
// garbage_collection_threshold, expandable_segments,
// per_process_memory_fraction. PyTorch keys checked and then ignored
// (torchmem has no pinned host allocator, and holds its lock on device
// calls): release_lock_on_cudamalloc, release_lock_on_hipmalloc,
// pinned_use_background_threads, pinned_max_round_threshold_mb,
// pinned_max_cached_size_mb, pinned_use_cuda_host_register,
// pinned_use_hip_host_register, pinned_num_register_threads,
// pinned_reserve_segment_size_mb, pinned_free_catch_all,
// graph_capture_record_stream_reuse, throw_on_cudamalloc_oom.
// torchmem's own: capacity (device capacity, e.g. "8GiB", "512MB" or
// bytes; host and sim devices), and policy: "native" (the default, PyTorch's
// caching policy, CachingAllocator) or "stitch" (StitchAllocator: blocks in
// a large reserved virtual range per stream, physical pages mapped where
// blocks touch them and unmapped when the device runs short; see
// docs/stitch.md). Under policy:stitch the keys that shape the native
// policy's segments and splits (large_segment_size_mb, max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions, expandable_segments)
// are accepted and have no effect; capacity, per_process_memory_fraction
// and garbage_collection_threshold apply.
// Two CPU settings depart from the native policy (Note [CPU settings]):
// reuse_order and min_block_size.
// parse() throws std::invalid_argument naming the key and what it accepts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace torchmem {

constexpr size_t kMinBlockSize = 512;          // all sizes round up to 512 B (native policy)
constexpr size_t kMinCpuBlockSize = 64;        // the least min_block_size: c10's CPU alignment
constexpr size_t kSmallSize = 1048576;         // largest "small" request: 1 MiB
constexpr size_t kSmallBuffer = 2097152;       // small-pool segments: 2 MiB
constexpr size_t kLargeBuffer = 20971520;      // default large_segment_size: 20 MiB
constexpr size_t kMinLargeAlloc = 10485760;    // from 10 MiB, segments fit the request
constexpr size_t kRoundLarge = 2097152;        // ... rounded up to 2 MiB
constexpr size_t kRoundUpPowerOfTwoIntervals = 16;  // 1 MiB .. 64 GiB, one per power of two

// The name of the policy make_device_allocator() builds by default:
// PyTorch's caching policy. The names a config may give are those
// registered in policy/policies.cpp (base/policy_registry.h).
inline constexpr const char* kNativePolicy = "native";

// Note [CPU settings]
// Two settings change decisions, so the native policy (and the simulated
// and CUDA devices) keeps their defaults; torchmem.install() turns them on
// for the CPU only (torchmem/runtime/_install.py, CPU_DEFAULTS):
// - reuse_order: among the free blocks of the best-fitting size, the one with
//   the lowest address (address, native) or the one most recently put back
//   in its pool (recent): its cache lines are the likeliest to be warm.
//   A third order is PyTorch's own from torch 2.14 on (segment): the block of
//   the oldest segment, then the lowest address (its comparator,
//   BlockComparatorSizeCounterAddress, orders by a counter each cudaMalloc'ed
//   segment takes and its blocks inherit; torch 2.11 orders by address).
//   torchmem.runtime.cuda picks it on CUDA for a torch that has it.
// - min_block_size: the rounding granule and the least block, 512 B in the
//   native policy (PyTorch's GPU rule); a power of two from 64 B (c10's CPU
//   alignment) lets tiny tensors cost about what glibc charges.
enum class ReuseOrder : uint8_t { kAddress, kRecent, kSegment };

struct AllocatorConfig {
  // Segments for requests of 1 to 10 MiB, and the large pool's expandable
  // page size; also the least max_split_size and max_non_split_rounding.
  size_t large_segment_size = kLargeBuffer;
  size_t max_split_size = std::numeric_limits<size_t>::max();
  size_t max_non_split_rounding = kLargeBuffer;  // default: large_segment_size
  std::array<size_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  // 1: no limit, and so no garbage collection (PyTorch sets a limit only
  // below 1; DeviceCachingAllocator::setMemoryFraction).
  double per_process_memory_fraction = 1.0;
  size_t capacity = 0;  // 0: the device's own
  std::string policy = kNativePolicy;  // a registered policy's name
  ReuseOrder reuse_order = ReuseOrder::kAddress;
  size_t min_block_size = kMinBlockSize;  // a power of two, kMinCpuBlockSize .. kMinBlockSize

  static AllocatorConfig parse(const std::string& text);
  // Divisions that apply to a request of `size` bytes (0 or 1: none).
  size_t divisions_for(size_t size) const;
  // The config in parse()'s grammar, only the keys that differ from defaults.
  std::string to_string() const;
};

// "80GiB", "512MB", "1.5 GB", "4096" -> bytes. Throws std::invalid_argument.
size_t parse_size(const std::string& text);

// The top-level "key:value" items of a settings string, trimmed; a list
// value ("[256:1,>:4]") stays whole. One trailing comma is allowed, as in
// PyTorch. Throws std::invalid_argument for an empty item or unbalanced
// brackets. Keys and values are not checked (AllocatorConfig::parse does).
std::vector<std::string> config_items(const std::string& text);

// PyTorch's get_allocation_size: what the device is asked for to serve a
// request of `size` bytes (already rounded): a small-pool segment up to
// kSmallSize, a large segment below kMinLargeAlloc, else the size rounded up
// to kRoundLarge.
size_t allocation_size(size_t size, size_t large_segment_size);

// PyTorch's round_size: the block a request of `size` bytes takes under `c`:
// at least min_block_size, rounded up to it, or to the next power-of-two
// division where roundup_power2_divisions gives its interval more than one.
size_t round_request(size_t size, const AllocatorConfig& c);

// The pages of one expandable segment on a device of `device_bytes`: PyTorch
// reserves 9/8 of the device's memory per segment (find_expandable_space),
// rounded up to whole pages of `page` bytes.
size_t expandable_pages(size_t device_bytes, size_t page);

}  // namespace torchmem
