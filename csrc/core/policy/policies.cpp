// The registered policies (base/policy_registry.h): one line each. A new
// policy lives in its own folder under policy/, derives from PolicyBase
// (policy_base.h) and is added here; see "adding a policy" in docs/design.md.
#include "core/base/policy_registry.h"

#include <stdexcept>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/policy/native/caching_allocator.h"
#include "core/policy/stitch/stitch_allocator.h"

namespace torchmem {

namespace {

template <typename P>
std::shared_ptr<DeviceAllocator> make(Device& device, const AllocatorConfig& config) {
  return std::make_shared<P>(device, config);
}

}  // namespace

const std::vector<PolicyRegistration>& registered_policies() {
  static const std::vector<PolicyRegistration> policies = {
      {kNativePolicy, "PyTorch's caching policy, the default", make<CachingAllocator>},
      {"stitch", "least memory: docs/stitch.md", make<StitchAllocator>},
  };
  return policies;
}

const PolicyRegistration* find_policy(const std::string& name) {
  for (const PolicyRegistration& p : registered_policies()) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

std::string policy_choices() {
  const auto& all = registered_policies();
  std::string out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += i + 1 == all.size() ? " or " : ", ";
    out += std::string(all[i].name) + " (" + all[i].description + ")";
  }
  return out;
}

std::shared_ptr<DeviceAllocator> make_device_allocator(Device& device, const AllocatorConfig& config) {
  const PolicyRegistration* policy = find_policy(config.policy);
  if (policy == nullptr) throw std::invalid_argument("unknown policy '" + config.policy + "': " + policy_choices());
  return policy->make(device, config);
}

}  // namespace torchmem
