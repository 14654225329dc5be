#include "core/device_memory/private_pools.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace torchmem {

namespace {
std::string name(PoolId id) { return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")"; }
}  // namespace

bool PrivatePools::create_or_incref(PoolId id, std::shared_ptr<DeviceAllocator>& fresh) {
  Pool& pool = pools_[id];
  ++pool.use_count;
  if (pool.allocator) return false;
  pool.allocator = std::move(fresh);
  return true;
}

bool PrivatePools::begin_route(PoolId id, Filter filter, bool capture, std::shared_ptr<DeviceAllocator>& fresh) {
  for (const Route& route : routes_) {
    if (route.id == id) throw std::invalid_argument("already allocating to private pool " + name(id));
  }
  const bool taken = create_or_incref(id, fresh);
  routes_.push_back(Route{id, std::move(filter), capture, pools_[id].allocator.get()});
  return taken;
}

void PrivatePools::end_route(PoolId id) {
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->id == id) {
      routes_.erase(it);
      return;
    }
  }
  throw std::invalid_argument("not allocating to private pool " + name(id));
}

bool PrivatePools::release(PoolId id) {
  auto it = pools_.find(id);
  if (it == pools_.end()) return false;
  if (--it->second.use_count > 0) return true;
  retired_.emplace_back(id, std::move(it->second.allocator));
  pools_.erase(it);
  return true;
}

bool PrivatePools::set_use_on_oom(PoolId id, bool use_on_oom) {
  auto it = pools_.find(id);
  if (it == pools_.end()) return false;
  it->second.use_on_oom = use_on_oom;
  return true;
}

std::shared_ptr<DeviceAllocator> PrivatePools::route_for(Stream stream) const {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->filter(stream)) return pools_.at(it->id).allocator;
  }
  return nullptr;
}

bool PrivatePools::capturing() const {
  return std::any_of(routes_.begin(), routes_.end(), [](const Route& r) { return r.capture; });
}

int PrivatePools::use_count(PoolId id) const {
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second.use_count;
}

std::shared_ptr<DeviceAllocator> PrivatePools::find(PoolId id) const {
  auto it = pools_.find(id);
  if (it != pools_.end()) return it->second.allocator;
  for (const Entry& e : retired_) {
    if (e.first == id) return e.second;
  }
  return nullptr;
}

bool PrivatePools::is_retired(const DeviceAllocator* pool) const {
  return std::any_of(retired_.begin(), retired_.end(), [&](const Entry& e) { return e.second.get() == pool; });
}

std::vector<std::shared_ptr<DeviceAllocator>> PrivatePools::use_on_oom() const {
  std::vector<std::shared_ptr<DeviceAllocator>> out;
  for (const auto& [id, pool] : pools_) {
    if (pool.use_on_oom) out.push_back(pool.allocator);
  }
  return out;
}

std::vector<PrivatePools::Entry> PrivatePools::live() const {
  std::vector<Entry> out;
  for (const auto& [id, pool] : pools_) out.emplace_back(id, pool.allocator);
  return out;
}

std::vector<std::shared_ptr<DeviceAllocator>> PrivatePools::drop_empty_retired() {
  std::vector<std::shared_ptr<DeviceAllocator>> dropped;
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (it->second->has_live_allocations()) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    it = retired_.erase(it);
  }
  return dropped;
}

}  // namespace torchmem
