#include "core/base/device_allocator.h"

#include "core/policy/native/caching_allocator.h"
#include "core/policy/stitch/stitch_allocator.h"

namespace torchmem {

std::shared_ptr<DeviceAllocator> make_device_allocator(Device& device, const AllocatorConfig& config) {
  if (config.policy == Policy::kStitch) return std::make_shared<StitchAllocator>(device, config);
  return std::make_shared<CachingAllocator>(device, config);
}

}  // namespace torchmem
