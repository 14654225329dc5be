// The registry of policies: which DeviceAllocator each name in a config's
// "policy:NAME" makes. The list itself is policy/policies.cpp, one line per
// policy (its folder under policy/ holds everything else): the config's
// parser, make_device_allocator(), the bindings (torchmem._C.policies()) and
// the tests read it from there, so a new policy is one folder plus one line
// ("adding a policy" in docs/design.md).
//
// Thread safety: the list is built once, on first use, and never changes.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace torchmem {

class Device;
class DeviceAllocator;
struct AllocatorConfig;

struct PolicyRegistration {
  const char* name;         // the config's policy:NAME
  const char* description;  // for the config's error message: "PyTorch's caching policy, the default"
  std::shared_ptr<DeviceAllocator> (*make)(Device& device, const AllocatorConfig& config);
};

// Every registered policy, the default (native) first.
const std::vector<PolicyRegistration>& registered_policies();
// The registration of `name`, or nullptr.
const PolicyRegistration* find_policy(const std::string& name);
// "native (PyTorch's caching policy, the default) or stitch (least memory:
// docs/stitch.md)": the names a config may give, for error messages.
std::string policy_choices();

}  // namespace torchmem
