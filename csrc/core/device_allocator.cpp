#include "core/device_allocator.h"

#include "core/caching_allocator.h"

namespace torchmem {

std::shared_ptr<DeviceAllocator> make_device_allocator(Device& device, const AllocatorConfig& config) {
  return std::make_shared<CachingAllocator>(device, config);
}

}  // namespace torchmem
