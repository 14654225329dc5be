// PrivatePools: a device's private memory pools (CUDA graphs,
// torch.cuda.MemPool, torch.cuda.use_mem_pool), each an allocator of its own
// on the device, with the routes that send allocations to them.
//
// Note [Private pools]
// As PyTorch's graph_pools (c10/cuda/CUDACachingAllocator.cpp):
// - A pool is made by create_or_incref() (MemPool) or by the first route to
//   it (a graph capture) and counts its uses: each create_or_incref() and
//   each begin_route() adds one, each release() drops one.
// - begin_route(id, filter, capture) sends the allocations whose stream
//   passes `filter` to the pool until end_route(id); the innermost open
//   route whose filter takes the stream wins. A route is a capture when a
//   CUDA graph is captured through it (the capture rules then hold, see
//   device_memory.h); torch.cuda.use_mem_pool's routes are not.
// - At zero uses the pool retires (PyTorch's graph_pools_freeable): it
//   serves no allocation, its cache may be emptied, and it is forgotten
//   once its last block is freed (drop_empty_retired()).
// - use_on_oom pools lend their cached blocks when the device's main
//   allocator is out of memory (torch.cuda.MemPool(use_on_oom=True)).
// Unknown ids: release(), set_use_on_oom() and find() return false / null
// (a MemPool's destructor calls them and must not throw); a second route to
// a routed pool and end_route() of a pool not routed throw
// std::invalid_argument, as PyTorch's checks do.
//
// Not thread safe: DeviceMemory calls it under its lock. Allocators are made
// by the factory and handed back for destruction outside that lock
// (ForkSafeMutex's rule: none is made or destroyed under another).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/base/device_allocator.h"

namespace torchmem {

using PoolId = std::pair<uint64_t, uint64_t>;

class PrivatePools {
 public:
  using Filter = std::function<bool(Stream)>;
  using Entry = std::pair<PoolId, std::shared_ptr<DeviceAllocator>>;

  // `fresh` is the allocator a new pool takes (made by the caller outside its
  // lock); returns true when it was taken.
  bool create_or_incref(PoolId id, std::shared_ptr<DeviceAllocator>& fresh);
  bool begin_route(PoolId id, Filter filter, bool capture, std::shared_ptr<DeviceAllocator>& fresh);
  void end_route(PoolId id);
  bool release(PoolId id);
  bool set_use_on_oom(PoolId id, bool use_on_oom);

  // The pool whose route takes `stream` (innermost first), else null.
  std::shared_ptr<DeviceAllocator> route_for(Stream stream) const;
  bool has_routes() const { return !routes_.empty(); }
  bool capturing() const;
  int use_count(PoolId id) const;
  std::shared_ptr<DeviceAllocator> find(PoolId id) const;  // live or retired
  bool is_retired(const DeviceAllocator* pool) const;
  std::vector<std::shared_ptr<DeviceAllocator>> use_on_oom() const;
  std::vector<Entry> live() const;
  std::vector<Entry> retired() const { return retired_; }
  size_t count() const { return pools_.size() + retired_.size(); }
  // Forgets retired pools with no live allocation; returns them (to destroy
  // outside the caller's lock).
  std::vector<std::shared_ptr<DeviceAllocator>> drop_empty_retired();

 private:
  struct Pool {
    std::shared_ptr<DeviceAllocator> allocator;
    int use_count = 0;
    bool use_on_oom = false;
  };
  struct Route {
    PoolId id;
    Filter filter;
    bool capture;
    DeviceAllocator* allocator;
  };
  std::map<PoolId, Pool> pools_;
  std::vector<Route> routes_;   // innermost last
  std::vector<Entry> retired_;
};

}  // namespace torchmem
