#include "torch/cuda_allocator.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace torchmem::glue {

namespace {

using c10::cuda::MempoolId_t;
using c10cca::RecordContext;

constexpr MempoolId_t kDefaultPool = {0, 0};

Stream to_stream(cudaStream_t stream) { return static_cast<Stream>(reinterpret_cast<uintptr_t>(stream)); }
void* to_cuda_stream(Stream stream) { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream)); }

// The context gathered for the allocation this thread is making, read by the
// history's context provider (which runs under the caching allocator's lock,
// where calling into Python could deadlock).
thread_local std::shared_ptr<c10::GatheredContext> t_context;

// This thread's pushed allocators, innermost last, with their devices.
thread_local std::vector<std::pair<int, std::shared_ptr<torchmem::Allocator>>> t_thread_allocators;

std::shared_ptr<torchmem::Allocator> thread_allocator(int device) {
  for (auto it = t_thread_allocators.rbegin(); it != t_thread_allocators.rend(); ++it) {
    if (it->first == device) return it->second;
  }
  return nullptr;
}

// c10's Stat moved between namespaces across releases: take whatever type it is.
template <typename C10Stat>
void add_stat(C10Stat& dst, const Stat& src) {
  dst.current += src.current;
  dst.peak += src.peak;
  dst.allocated += src.allocated;
  dst.freed += src.freed;
}

void add_stats(c10cca::DeviceStats& dst, const DeviceStats& src) {
  auto arrays = [](auto& s) {
    return std::array{&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes};
  };
  auto d = arrays(dst);
  auto s = arrays(const_cast<DeviceStats&>(src));
  for (size_t i = 0; i < d.size(); ++i) {
    for (size_t t = 0; t < kNumStatTypes; ++t) add_stat((*d[i])[t], (*s[i])[t]);
  }
  dst.num_alloc_retries += src.num_alloc_retries;
  dst.num_ooms += src.num_ooms;
  dst.num_sync_all_streams += src.num_sync_all_streams;
  dst.num_device_alloc += src.num_device_alloc;
  dst.num_device_free += src.num_device_free;
  add_stat(dst.oversize_allocations, src.oversize_allocations);
  add_stat(dst.oversize_segments, src.oversize_segments);
  dst.max_split_size = src.max_split_size;
}

c10cca::TraceEntry::Action to_c10(Action action) {
  using A = c10cca::TraceEntry::Action;
  switch (action) {
    case Action::kAlloc: return A::ALLOC;
    case Action::kFreeRequested: return A::FREE_REQUESTED;
    case Action::kFreeCompleted: return A::FREE_COMPLETED;
    case Action::kSegmentAlloc: return A::SEGMENT_ALLOC;
    case Action::kSegmentFree: return A::SEGMENT_FREE;
    case Action::kSegmentMap: return A::SEGMENT_MAP;
    case Action::kSegmentUnmap: return A::SEGMENT_UNMAP;
    case Action::kOom: return A::OOM;
    case Action::kSnapshot: return A::SNAPSHOT;
  }
  return A::SNAPSHOT;
}

// PyTorch's message starts "CUDA out of memory.", which users and tools match.
std::string cuda_oom_message(const std::string& device_name, const std::string& message) {
  const std::string prefix = device_name + " out of memory.";
  if (message.compare(0, prefix.size(), prefix) == 0) return "CUDA out of memory." + message.substr(prefix.size());
  return message;
}

}  // namespace

CudaAllocator::DeviceState::DeviceState(int index, const AllocatorConfig& config)
    : device(index), main(std::make_shared<CachingAllocator>(device, config)) {}

std::shared_ptr<CudaAllocator> CudaAllocator::instance() {
  // Never destroyed: storages and PyTorch keep using it until the process ends.
  static auto* allocator = new std::shared_ptr<CudaAllocator>(new CudaAllocator());
  return *allocator;
}

CudaAllocator::CudaAllocator()
    : torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator(
          [this](size_t size, int device, cudaStream_t stream) { return malloc_hook(size, device, stream); },
          [this](void* ptr, size_t size, int device, cudaStream_t stream) { free_hook(ptr, size, device, stream); }) {
  set_init_fn([this](int count) { init_hook(count); });
  set_reset_fn([this] { empty_cache_hook(); });
  set_memory_fraction_fn([this](double fraction, int device) { memory_fraction_hook(fraction, device); });
  set_record_stream_fn([this](void* ptr, cudaStream_t stream) { record_stream_hook(ptr, stream); });
  set_begin_allocate_to_pool([this](int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
    begin_allocate_to_pool_hook(device, id, std::move(filter));
  });
  set_end_allocate_to_pool_fn([this](int device, MempoolId_t id) { end_allocate_to_pool_hook(device, id); });
  set_release_pool([this](int device, MempoolId_t id) { release_pool_hook(device, id); });
}

void CudaAllocator::install(const AllocatorConfig& config) {
  static std::mutex install_mutex;
  std::lock_guard<std::mutex> lock(install_mutex);
  std::shared_ptr<CudaAllocator> self = instance();
  c10cca::CUDAAllocator* current = c10cca::get();
  if (current == self.get()) {
    if (self->config_.to_string() == config.to_string()) return;
    if (self->initialized()) {
      throw std::runtime_error("torchmem is already PyTorch's CUDA allocator (conf '" + self->config_.to_string() +
                               "') and CUDA has initialised since, so its config can no longer change to '" +
                               config.to_string() + "'. Pass the config to the first torchmem.install() call.");
    }
    self->config_ = config;
    return;
  }
  if (current != nullptr && current->initialized()) {
    throw std::runtime_error(
        "torchmem cannot replace PyTorch's CUDA allocator: CUDA is already initialised (PyTorch's allocator '" +
        current->name() +
        "' is in use), and PyTorch allows the swap only before. Call torchmem.install() at the start of the "
        "program, before anything touches CUDA (a CUDA tensor, torch.cuda.init(), torch.cuda.memory_allocated(), "
        "a model's .cuda()); in a notebook, restart the kernel first.");
  }
  self->config_ = config;
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(self);
}

bool CudaAllocator::installed() { return c10cca::get() == instance().get(); }

CudaAllocator::DeviceState& CudaAllocator::state(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "torchmem: CUDA device index ", device, " out of range");
  std::call_once(device_once_[device], [&] {
    uint64_t none = kNoState;
    state_generation_.compare_exchange_strong(none, fork_generation());
    auto* s = new DeviceState(device, config_);  // lives as long as the process, like the allocator
    enable_history(*s->main);
    devices_[device].store(s, std::memory_order_release);
  });
  return *devices_[device].load(std::memory_order_acquire);
}

bool CudaAllocator::inherited_through_fork() const {
  const uint64_t generation = state_generation_.load(std::memory_order_relaxed);
  return generation != kNoState && made_before_fork(generation);
}

CudaAllocator::DeviceState* CudaAllocator::existing_state(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return devices_[device].load(std::memory_order_acquire);
}

std::shared_ptr<CachingAllocator> CudaAllocator::make_allocator(DeviceState& s) {
  auto allocator = std::make_shared<CachingAllocator>(s.device, config_);
  if (s.fraction >= 0.0) allocator->set_memory_fraction(s.fraction);
  enable_history(*allocator);
  return allocator;
}

std::shared_ptr<CachingAllocator> CudaAllocator::caching(int device) { return state(device).main; }

size_t CudaAllocator::pending_frees(int device) {
  DeviceState* s = existing_state(device);
  if (!s) return 0;
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->deferred.size();
}

size_t CudaAllocator::pool_count(int device) {
  DeviceState* s = existing_state(device);
  if (!s) return 0;
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->pools.size() + s->retired.size();
}

void CudaAllocator::push_thread_allocator(int device, std::shared_ptr<torchmem::Allocator> allocator) {
  if (!allocator) throw std::invalid_argument("torchmem: cuda_push_thread_allocator needs an allocator");
  if (!installed()) {
    throw std::runtime_error(
        "torchmem is not PyTorch's CUDA allocator, so CUDA allocations cannot be routed: call torchmem.install() first");
  }
  DeviceState& s = instance()->state(device);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (std::find(s.routed.begin(), s.routed.end(), allocator) == s.routed.end()) s.routed.push_back(allocator);
  }
  t_thread_allocators.emplace_back(device, std::move(allocator));
}

void CudaAllocator::pop_thread_allocator(int device) {
  auto it = std::find_if(t_thread_allocators.rbegin(), t_thread_allocators.rend(),
                         [device](const auto& entry) { return entry.first == device; });
  if (it == t_thread_allocators.rend()) {
    throw std::logic_error("torchmem: cuda_pop_thread_allocator(" + std::to_string(device) +
                           ") without a matching push on this thread");
  }
  t_thread_allocators.erase(std::next(it).base());
  DeviceState* s = instance()->existing_state(device);
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  drop_unused_routed_locked(*s);
}

void CudaAllocator::drop_unused_routed_locked(DeviceState& s) {
  auto unused = [](const std::shared_ptr<torchmem::Allocator>& a) {
    return a.use_count() == 1 && !a->has_live_allocations();
  };
  s.routed.erase(std::remove_if(s.routed.begin(), s.routed.end(), unused), s.routed.end());
}

// ---------------------------------------------------------------- hooks

void CudaAllocator::init_hook(int) {}

void* CudaAllocator::malloc_hook(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  TORCH_CHECK(!inherited_through_fork(),
              "torchmem: CUDA cannot be used in a child process forked after its parent used CUDA; use the "
              "'spawn' or 'forkserver' start method for processes that need CUDA");
  DeviceState& s = state(device);

  std::shared_ptr<c10::GatheredContext> context;
  if (history_enabled_) {
    c10cca::CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> lock(history_mutex_);
      if (record_when_ != RecordContext::NEVER) recorder = context_recorder_;
    }
    if (recorder) context = recorder();  // may take the GIL: no lock of ours is held
  }

  std::shared_ptr<CachingAllocator> pool;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.deferred.empty()) process_deferred_locked(s, /*wait=*/false);
    for (auto it = s.routes.rbegin(); it != s.routes.rend(); ++it) {
      if (it->filter(stream)) {
        pool = s.pools.at(it->id).allocator;
        break;
      }
    }
  }
  std::shared_ptr<torchmem::Allocator> target = pool;
  if (!target && !t_thread_allocators.empty()) target = thread_allocator(device);
  if (!target) target = s.main;

  void* ptr = nullptr;
  t_context = context;
  try {
    try {
      ptr = target->allocate(size, to_stream(stream));
    } catch (const OutOfMemory&) {
      // Blocks waiting on other streams' events may free enough: wait for
      // them (outside a capture), give released pools' caches back, retry.
      bool freed = false;
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.deferred.empty() && s.routes.empty()) {
          process_deferred_locked(s, /*wait=*/true);
          freed = true;
        }
        for (auto& [id, retired] : s.retired) retired->empty_cache();
        freed = freed || !s.retired.empty();
      }
      if (!freed) throw;
      ptr = target->allocate(size, to_stream(stream));
    }
  } catch (const OutOfMemory& e) {
    t_context.reset();
    const OomInfo& info = e.info();
    std::vector<c10cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mutex_);
      observers = oom_observers_;
    }
    // As PyTorch's malloc: the size of the failed segment, the limit, the device's free bytes.
    const size_t failed = info.alloc_size ? info.alloc_size : info.requested;  // arenas have no segment size
    for (auto& observer : observers) observer(device, failed, info.allowed, info.device_free);
    const std::string notes = note_observers_.notify(device, info);
    TORCH_CHECK_WITH(OutOfMemoryError, false, cuda_oom_message(s.device.name(), e.what()), notes);
  } catch (...) {
    t_context.reset();
    throw;
  }
  t_context.reset();

  if (pool || context) {
    if (pool) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.pool_blocks[ptr] = pool.get();
    }
    if (context) {
      std::lock_guard<std::mutex> lock(history_mutex_);
      block_contexts_[ptr] = std::move(context);
    }
  }
  return ptr;
}

void CudaAllocator::raw_delete(void* ptr) {
  if (inherited_through_fork()) return;
  torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator::raw_delete(ptr);
}

void CudaAllocator::free_hook(void* ptr, size_t, int device, cudaStream_t stream) {
  if (ptr == nullptr || inherited_through_fork()) return;
  DeviceState* s = existing_state(device);
  if (!s) {
    std::fprintf(stderr, "torchmem: ignoring free of %p on cuda:%d, where torchmem allocated nothing\n", ptr, device);
    return;
  }
  // Called from deleters, which must not throw.
  try {
    std::lock_guard<std::mutex> lock(s->mutex);
    Owner owner = owner_locked(*s, ptr);
    auto uses = s->stream_uses.find(ptr);
    if (uses != s->stream_uses.end()) {
      std::vector<Stream> streams = std::move(uses->second);
      s->stream_uses.erase(uses);
      streams.erase(std::remove(streams.begin(), streams.end(), to_stream(stream)), streams.end());
      if (!streams.empty()) {
        s->deferred.push_back(DeferredFree{ptr, owner, std::move(streams), {}});
        process_deferred_locked(*s, /*wait=*/false);  // records its events now, outside a capture
        return;
      }
    }
    deallocate_locked(*s, ptr, owner);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchmem: error freeing %p on cuda:%d: %s\n", ptr, device, e.what());
  }
}

CudaAllocator::Owner CudaAllocator::owner_locked(DeviceState& s, void* ptr) {
  if (!s.pool_blocks.empty()) {
    auto it = s.pool_blocks.find(ptr);
    if (it != s.pool_blocks.end()) return Owner{it->second, nullptr};
  }
  // Newest first: an allocator that wraps another routed one is made, and
  // pushed, after it, and must see its frees.
  for (auto it = s.routed.rbegin(); it != s.routed.rend(); ++it) {
    if ((*it)->owns(ptr)) return Owner{nullptr, it->get()};
  }
  return Owner{s.main.get(), nullptr};
}

void CudaAllocator::deallocate_locked(DeviceState& s, void* ptr, Owner owner) {
  if (history_enabled_) {
    std::lock_guard<std::mutex> lock(history_mutex_);
    block_contexts_.erase(ptr);
  }
  if (owner.routed) {
    try {
      owner.routed->deallocate(ptr);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torchmem: ignoring free of %p on %s: %s\n", ptr, s.device.name().c_str(), e.what());
      return;
    }
    if (!owner.routed->has_live_allocations()) drop_unused_routed_locked(s);
    return;
  }
  CachingAllocator* caching = owner.caching;
  if (!caching->try_deallocate(ptr)) {
    std::fprintf(stderr, "torchmem: ignoring free of %p, which torchmem did not allocate on %s\n", ptr,
                 s.device.name().c_str());
    return;
  }
  if (caching == s.main.get()) return;
  s.pool_blocks.erase(ptr);
  for (auto it = s.retired.begin(); it != s.retired.end(); ++it) {
    if (it->second.get() == caching && !caching->has_live_allocations()) {
      s.retired.erase(it);  // the pool's last block: it gives back its segments
      break;
    }
  }
}

bool CudaAllocator::capturing_locked(const DeviceState& s, cudaStream_t stream) const {
  if (!s.routes.empty()) return true;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (stream != nullptr && cudaStreamIsCapturing(stream, &status) == cudaSuccess) {
    return status != cudaStreamCaptureStatusNone;
  }
  return false;
}

void CudaAllocator::process_deferred_locked(DeviceState& s, bool wait) {
  // Events may be neither recorded nor queried while a graph is captured.
  if (capturing_locked(s, nullptr)) return;
  for (auto& d : s.deferred) {
    for (Stream stream : d.streams) d.events.push_back(s.device.record_event(stream));
    d.streams.clear();
  }
  for (auto it = s.deferred.begin(); it != s.deferred.end();) {
    bool done = true;
    for (EventId event : it->events) {
      if (wait) {
        s.device.synchronize_event(event);
      } else if (!s.device.event_complete(event)) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    for (EventId event : it->events) s.device.destroy_event(event);
    deallocate_locked(s, it->ptr, it->owner);
    it = s.deferred.erase(it);
  }
}

void CudaAllocator::empty_cache_hook() {
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    std::lock_guard<std::mutex> lock(s->mutex);
    TORCH_CHECK(s->routes.empty(), "torchmem: torch.cuda.empty_cache() is not allowed while ", s->device.name(),
                " allocates to a private pool (a CUDA graph capture or torch.cuda.use_mem_pool)");
    process_deferred_locked(*s, /*wait=*/true);
    s->main->empty_cache();
    for (auto& [id, retired] : s->retired) retired->empty_cache();
  }
}

void CudaAllocator::memory_fraction_hook(double fraction, int device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.fraction = fraction;
  s.main->set_memory_fraction(fraction);
  for (auto& [id, pool] : s.pools) pool.allocator->set_memory_fraction(fraction);
}

void CudaAllocator::record_stream_hook(void* ptr, cudaStream_t stream) {
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    std::lock_guard<std::mutex> lock(s->mutex);
    if (!owner_locked(*s, ptr).allocator().owns(ptr)) continue;
    auto& uses = s->stream_uses[ptr];
    if (std::find(uses.begin(), uses.end(), to_stream(stream)) == uses.end()) uses.push_back(to_stream(stream));
    return;
  }
}

void CudaAllocator::begin_allocate_to_pool_hook(int device, MempoolId_t id,
                                                std::function<bool(cudaStream_t)> filter) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const Route& route : s.routes) {
    TORCH_CHECK(route.id != id, "torchmem: already allocating to pool (", id.first, ", ", id.second, ")");
  }
  Pool& pool = s.pools[id];
  if (!pool.allocator) pool.allocator = make_allocator(s);
  ++pool.use_count;
  s.routes.push_back(Route{id, std::move(filter)});
}

void CudaAllocator::end_allocate_to_pool_hook(int device, MempoolId_t id) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto it = s.routes.begin(); it != s.routes.end(); ++it) {
    if (it->id == id) {
      s.routes.erase(it);
      return;
    }
  }
  TORCH_CHECK(false, "torchmem: endAllocateToPool for pool (", id.first, ", ", id.second,
              ") that is not being allocated to");
}

void CudaAllocator::release_pool_hook(int device, MempoolId_t id) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.pools.find(id);
  if (it == s.pools.end()) return;
  if (--it->second.use_count > 0) return;
  std::shared_ptr<CachingAllocator> allocator = std::move(it->second.allocator);
  s.pools.erase(it);
  allocator->empty_cache();
  if (allocator->has_live_allocations()) s.retired.emplace_back(id, std::move(allocator));
}

void CudaAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                       std::shared_ptr<c10cca::CUDAAllocator> allocator) {
  TORCH_CHECK(allocator == nullptr || allocator.get() == this,
              "torchmem: a torch.cuda.MemPool with its own allocator is not supported while torchmem is installed");
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  Pool& pool = s.pools[mempool_id];
  if (!pool.allocator) pool.allocator = make_allocator(s);
  ++pool.use_count;
}

int CudaAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  DeviceState* s = existing_state(device);
  if (!s) return 0;
  std::lock_guard<std::mutex> lock(s->mutex);
  auto it = s->pools.find(mempool_id);
  return it == s->pools.end() ? 0 : it->second.use_count;
}

// ---------------------------------------------------------------- statistics

// A device torchmem has not allocated on has zero statistics (and gets no
// CUDA context from being asked).
c10cca::DeviceStats CudaAllocator::getDeviceStats(c10::DeviceIndex device) {
  c10cca::DeviceStats result;
  DeviceState* s = existing_state(device);
  if (!s) return result;
  std::lock_guard<std::mutex> lock(s->mutex);
  add_stats(result, s->main->stats());
  for (auto& [id, pool] : s->pools) add_stats(result, pool.allocator->stats());
  for (auto& [id, retired] : s->retired) add_stats(result, retired->stats());
  return result;
}

void CudaAllocator::resetPeakStats(c10::DeviceIndex device) {
  DeviceState* s = existing_state(device);
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  s->main->reset_peak_stats();
  for (auto& [id, pool] : s->pools) pool.allocator->reset_peak_stats();
  for (auto& [id, retired] : s->retired) retired->reset_peak_stats();
}

void CudaAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  DeviceState* s = existing_state(device);
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  s->main->reset_accumulated_stats();
  for (auto& [id, pool] : s->pools) pool.allocator->reset_accumulated_stats();
  for (auto& [id, retired] : s->retired) retired->reset_accumulated_stats();
}

void CudaAllocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  DeviceState& s = state(device);
  if (*largest_block == 0) *largest_block = s.device.free_bytes();
  *largest_block = std::max(*largest_block, s.main->largest_free_block());
}

double CudaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  DeviceState* s = existing_state(device);
  if (!s) return 1.0;
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->fraction >= 0.0 ? s->fraction : config_.per_process_memory_fraction;
}

void CudaAllocator::attachOutOfMemoryObserver(c10cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

// ---------------------------------------------------------------- history and snapshots

void CudaAllocator::enable_history(CachingAllocator& allocator) {
  size_t max_entries = 0;
  {
    std::lock_guard<std::mutex> lock(history_mutex_);
    if (history_enabled_) max_entries = history_max_entries_;
  }
  if (max_entries == 0) {
    allocator.history().enable(0);
    return;
  }
  allocator.history().enable(max_entries, [this]() -> uint64_t {
    if (!t_context) return 0;
    std::lock_guard<std::mutex> lock(history_mutex_);
    if (record_when_ != RecordContext::ALLOC && record_when_ != RecordContext::ALL) return 0;
    const uint64_t id = ++next_context_id_;
    trace_contexts_.emplace(id, t_context);
    trace_context_order_.push_back(id);
    while (trace_context_order_.size() > history_max_entries_) {
      trace_contexts_.erase(trace_context_order_.front());
      trace_context_order_.pop_front();
    }
    return id;
  });
}

void CudaAllocator::recordHistory(bool enabled, c10cca::CreateContextFn context_recorder,
                                  size_t alloc_trace_max_entries, c10cca::RecordContext when, bool clear_history,
                                  const std::vector<std::string>&) {
  recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clear_history);
}

void CudaAllocator::recordHistory(bool enabled, c10cca::CreateContextFn context_recorder,
                                  size_t alloc_trace_max_entries, c10cca::RecordContext when, bool clear_history) {
  {
    std::lock_guard<std::mutex> lock(history_mutex_);
    history_enabled_ = enabled;
    history_max_entries_ = enabled ? std::max<size_t>(alloc_trace_max_entries, 1) : 0;
    context_recorder_ = enabled ? context_recorder : nullptr;
    record_when_ = enabled ? when : RecordContext::NEVER;
    if (clear_history || !enabled) {
      trace_contexts_.clear();
      trace_context_order_.clear();
    }
    if (!enabled) block_contexts_.clear();
  }
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    std::lock_guard<std::mutex> lock(s->mutex);
    std::vector<CachingAllocator*> all{s->main.get()};
    for (auto& [id, pool] : s->pools) all.push_back(pool.allocator.get());
    for (auto& [id, retired] : s->retired) all.push_back(retired.get());
    for (CachingAllocator* a : all) {
      // History::enable keeps the ring when the size is unchanged; clear it
      // when asked to.
      if (clear_history) a->history().clear();
      enable_history(*a);
    }
  }
}

bool CudaAllocator::isHistoryEnabled() {
  std::lock_guard<std::mutex> lock(history_mutex_);
  return history_enabled_;
}

c10cca::SnapshotInfo CudaAllocator::snapshot(MempoolId_t mempool_id, bool include_traces) {
  return make_snapshot(mempool_id, include_traces);
}

c10cca::SnapshotInfo CudaAllocator::snapshot(MempoolId_t mempool_id) { return make_snapshot(mempool_id, true); }

c10cca::SnapshotInfo CudaAllocator::make_snapshot(MempoolId_t mempool_id, bool include_traces) {
  c10cca::SnapshotInfo result{};
  const int device_count = std::max<int>(c10::cuda::device_count(), 1);
  result.device_traces.resize(device_count);

  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    std::vector<std::pair<MempoolId_t, std::shared_ptr<CachingAllocator>>> owners;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      owners.emplace_back(kDefaultPool, s->main);
      for (auto& [id, pool] : s->pools) owners.emplace_back(id, pool.allocator);
      for (auto& entry : s->retired) owners.push_back(entry);
    }
    std::vector<c10cca::TraceEntry> traces;
    for (auto& [id, allocator] : owners) {
      if (mempool_id != kDefaultPool && id != mempool_id) continue;
      for (const SegmentInfo& seg : allocator->segments()) {
        // An expandable segment is reported as one segment per run of mapped
        // pages, as PyTorch does.
        size_t offset = 0;
        c10cca::SegmentInfo* out = nullptr;
        for (const BlockInfo& b : seg.blocks) {
          if (!b.mapped) {
            out = nullptr;
            offset += b.size;
            continue;
          }
          if (out == nullptr) {
            result.segments.emplace_back();
            out = &result.segments.back();
            out->device = static_cast<c10::DeviceIndex>(d);
            out->address = seg.addr + offset;
            out->stream = to_cuda_stream(seg.stream);
            out->is_large = !seg.is_small;
            out->is_expandable = seg.is_expandable;
            out->owner_private_pool_id = id;
          }
          c10cca::BlockInfo block;
          block.size = b.size;
          block.requested_size = b.requested_size;
          block.allocated = b.allocated;
          block.active = b.allocated;
          if (b.allocated) {
            std::lock_guard<std::mutex> lock(history_mutex_);
            auto ctx = block_contexts_.find(reinterpret_cast<void*>(b.addr));
            if (ctx != block_contexts_.end()) block.context_when_allocated = ctx->second;
          }
          out->total_size += b.size;
          if (b.allocated) {
            out->allocated_size += b.size;
            out->active_size += b.size;
            out->requested_size += b.requested_size;
          }
          out->blocks.push_back(std::move(block));
          offset += b.size;
        }
      }
      if (!include_traces || d >= device_count) continue;
      for (const TraceEntry& e : allocator->history().entries()) {
        std::shared_ptr<c10::GatheredContext> context;
        if (e.context != 0) {
          std::lock_guard<std::mutex> lock(history_mutex_);
          auto it = trace_contexts_.find(e.context);
          if (it != trace_contexts_.end()) context = it->second;
        }
        traces.emplace_back(to_c10(e.action), static_cast<c10::DeviceIndex>(d), e.addr, e.size,
                            to_cuda_stream(e.stream), id, c10::approx_time_t{0}, std::move(context));
        // The snapshot's times are microseconds since the epoch (PyTorch
        // converts its clock to these before returning a snapshot).
        traces.back().time_.t_ = static_cast<time_t>(e.time_us);
      }
    }
    if (include_traces && d < device_count) {
      std::stable_sort(traces.begin(), traces.end(),
                       [](const auto& a, const auto& b) { return a.time_.t_ < b.time_.t_; });
      result.device_traces[d] = std::move(traces);
    }
  }

  const AllocatorConfig& c = config_;
  result.config_metadata.garbage_collection_threshold = c.garbage_collection_threshold;
  result.config_metadata.max_split_size = c.max_split_size == std::numeric_limits<size_t>::max() ? 0 : c.max_split_size;
  result.config_metadata.expandable_segments = c.expandable_segments;
  result.config_metadata.last_allocator_settings = c.to_string();
  result.config_metadata.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(),
                                                         c.roundup_power2_divisions.end());
  return result;
}

}  // namespace torchmem::glue
