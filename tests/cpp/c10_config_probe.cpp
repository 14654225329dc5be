// Runs PyTorch's own allocator-config parser (c10's
// AcceleratorAllocatorConfig, linked from the installed torch's libc10) on
// one config string and prints what it decided, for tests/allocator/test_config.py.
// A CPU-only libc10 has no CUDA parser hook, so only the device-independent
// keys are checked this way. Output, one line:
//   OK <large_segment_size> <max_split_size> <max_non_split_rounding> <gc_threshold> <expandable> <d0> .. <d15>
//   REJECT <first line of PyTorch's message>
// and, with no argument, the keys c10 knows ("KEYS k1 k2 ...").
#include <c10/core/AllocatorConfig.h>

#include <cstdio>
#include <exception>
#include <string>

using c10::CachingAllocator::AcceleratorAllocatorConfig;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("KEYS");
    for (const std::string& key : AcceleratorAllocatorConfig::getKeys()) std::printf(" %s", key.c_str());
    std::printf("\n");
    return 0;
  }
  try {
    AcceleratorAllocatorConfig::instance().parseArgs(argv[1]);
  } catch (const std::exception& e) {
    std::string message = e.what();
    std::printf("REJECT %s\n", message.substr(0, message.find('\n')).c_str());
    return 0;
  }
  std::printf("OK %zu %zu %zu %.17g %d", AcceleratorAllocatorConfig::large_segment_size(),
              AcceleratorAllocatorConfig::max_split_size(), AcceleratorAllocatorConfig::max_non_split_rounding_size(),
              AcceleratorAllocatorConfig::garbage_collection_threshold(),
              AcceleratorAllocatorConfig::use_expandable_segments() ? 1 : 0);
  for (size_t d : AcceleratorAllocatorConfig::roundup_power2_divisions()) std::printf(" %zu", d);
  std::printf("\n");
  return 0;
}
