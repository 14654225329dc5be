#include "torch/cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>
#include <tuple>
#include <stdexcept>

namespace torchmem::glue {

namespace {

using c10::cuda::MempoolId_t;
using c10cca::RecordContext;

Stream to_stream(cudaStream_t stream) { return static_cast<Stream>(reinterpret_cast<uintptr_t>(stream)); }
void* to_cuda_stream(Stream stream) { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream)); }
PoolId to_pool(MempoolId_t id) { return {id.first, id.second}; }
CudaAllocator* g_self = nullptr;  // the instance, for the deleter (a plain function)
// The context gathered for the allocation this thread is making, read by the
// history's context provider (called with no torchmem lock held).
thread_local std::shared_ptr<c10::GatheredContext> t_context;

// Set in a child forked after the first device state was made (a
// pthread_atfork child handler, registered then): one relaxed load on the
// allocation and free paths.
std::atomic<bool> g_forked_after_state{false};
void mark_forked_child() { g_forked_after_state.store(true, std::memory_order_relaxed); }
// This thread's pushed allocators, innermost last, with their devices.
thread_local std::vector<std::pair<int, std::shared_ptr<torchmem::Allocator>>> t_thread_allocators;
thread_local int t_last_free_device = 0;

std::shared_ptr<torchmem::Allocator> thread_allocator(int device) {
  for (auto it = t_thread_allocators.rbegin(); it != t_thread_allocators.rend(); ++it) {
    if (it->first == device) return it->second;
  }
  return nullptr;
}

// c10's Stat moved between namespaces across releases: take whatever type it is.
template <typename C10Stat>
void copy_stat(C10Stat& dst, const Stat& src) {
  std::tie(dst.current, dst.peak, dst.allocated, dst.freed) = std::tie(src.current, src.peak, src.allocated, src.freed);
}
c10cca::DeviceStats to_c10(const DeviceStats& src) {
  c10cca::DeviceStats dst;
  auto arrays = [](auto& s) {
    return std::array{&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes};
  };
  auto d = arrays(dst);
  auto s = arrays(const_cast<DeviceStats&>(src));
  for (size_t i = 0; i < d.size(); ++i) {
    for (size_t t = 0; t < kNumStatTypes; ++t) copy_stat((*d[i])[t], (*s[i])[t]);
  }
  std::tie(dst.num_alloc_retries, dst.num_ooms, dst.num_sync_all_streams, dst.num_device_alloc, dst.num_device_free,
           dst.max_split_size) = std::tie(src.num_alloc_retries, src.num_ooms, src.num_sync_all_streams,
                                          src.num_device_alloc, src.num_device_free, src.max_split_size);
  // Unset, PyTorch reports its SIZE_MAX as an int64_t: -1 (the core clamps to INT64_MAX).
  if (src.max_split_size == std::numeric_limits<int64_t>::max()) dst.max_split_size = -1;
  copy_stat(dst.oversize_allocations, src.oversize_allocations);
  copy_stat(dst.oversize_segments, src.oversize_segments);
  return dst;
}

c10cca::TraceEntry::Action to_c10(Action action) {
  using A = c10cca::TraceEntry::Action;
  constexpr A actions[] = {A::ALLOC,       A::FREE_REQUESTED, A::FREE_COMPLETED, A::SEGMENT_ALLOC, A::SEGMENT_FREE,
                           A::SEGMENT_MAP, A::SEGMENT_UNMAP,  A::OOM,            A::SNAPSHOT};
  return actions[static_cast<size_t>(action)];
}


}  // namespace

std::shared_ptr<CudaAllocator> CudaAllocator::instance() {
  // Never destroyed: storages and PyTorch keep using it until the process ends.
  static auto* allocator = new std::shared_ptr<CudaAllocator>(new CudaAllocator());
  return *allocator;
}

// The base's hooks are never reached (every method that calls them is
// overridden); they are given for its constructor only.
CudaAllocator::CudaAllocator()
    : torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator(
          [this](size_t size, int device, cudaStream_t stream) { return malloc_on(size, device, stream); },
          [](void* ptr, size_t, int, cudaStream_t) { free_pointer(ptr); }) {
  g_self = this;
}

void CudaAllocator::install(const AllocatorConfig& config) {
  static std::mutex install_mutex;
  std::lock_guard<std::mutex> lock(install_mutex);
  std::shared_ptr<CudaAllocator> self = instance();
  c10cca::CUDAAllocator* current = c10cca::get();
  if (current == self.get()) {
    const std::string now = self->config().to_string();
    if (now == config.to_string()) return;
    if (self->initialized()) {
      throw std::runtime_error("torchmem is already PyTorch's CUDA allocator (conf '" + now +
                               "') and CUDA has initialised since, so its config can no longer change to '" +
                               config.to_string() + "'. Pass the config to the first torchmem.install() call.");
    }
    self->set_config(config);
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
  self->set_config(config);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(self);
  // torch.accelerator's memory functions ask c10::GetAllocator(kCUDA), which
  // changeCurrentAllocator leaves to the native allocator (a registration at
  // priority 0 does not replace it, tests/cuda/test_cuda_build.py): take the highest.
  c10::SetAllocator(c10::kCUDA, self.get(), std::numeric_limits<uint8_t>::max());
}

bool CudaAllocator::installed() { return c10cca::get() == instance().get(); }

void CudaAllocator::set_config(const AllocatorConfig& config) {
  std::lock_guard<std::mutex> lock(config_mutex_);
  config_ = config;
  for (int d = 0; d < device_limit_.load(); ++d) {
    DeviceState* s = existing_state(d);
    if (s && !s->memory.reconfigure(config)) {
      throw std::runtime_error("torchmem: cuda:" + std::to_string(d) +
                               " already holds allocations, so its config can no longer change");
    }
  }
}

CudaAllocator::DeviceState& CudaAllocator::state(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "torchmem: CUDA device index ", device, " out of range");
  if (DeviceState* made = devices_[device].load(std::memory_order_acquire)) return *made;
  std::call_once(device_once_[device], [&] {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, &mark_forked_child); });
    auto* s = new DeviceState(device, config());  // lives as long as the process, like the allocator
    std::lock_guard<std::mutex> lock(history_mutex_);
    enable_history(s->memory, false);
    devices_[device].store(s, std::memory_order_release);
    int limit = device_limit_.load();
    while (limit < device + 1 && !device_limit_.compare_exchange_weak(limit, device + 1)) {
    }
  });
  return *devices_[device].load(std::memory_order_acquire);
}

CudaAllocator::DeviceState* CudaAllocator::existing_state(int device) const {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return devices_[device].load(std::memory_order_acquire);
}
bool CudaAllocator::inherited_through_fork() const { return g_forked_after_state.load(std::memory_order_relaxed); }
DeviceMemory& CudaAllocator::memory(int device) { return state(device).memory; }
std::shared_ptr<CachingAllocator> CudaAllocator::caching(int device) {
  return std::dynamic_pointer_cast<CachingAllocator>(memory(device).main());
}
size_t CudaAllocator::pending_frees(int device) { return existing_state(device) ? memory(device).pending_frees() : 0; }
size_t CudaAllocator::pool_count(int device) { return existing_state(device) ? memory(device).pool_count() : 0; }
void CudaAllocator::push_thread_allocator(int device, std::shared_ptr<torchmem::Allocator> allocator) {
  if (!allocator) throw std::invalid_argument("torchmem: cuda_push_thread_allocator needs an allocator");
  if (!installed()) {
    throw std::runtime_error(
        "torchmem is not PyTorch's CUDA allocator, so CUDA allocations cannot be routed: call torchmem.install() first");
  }
  instance()->memory(device).add_routed(allocator);
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
  if (DeviceState* s = instance()->existing_state(device)) s->memory.drop_unused_routed();
}

// ---------------------------------------------------------------- allocation and free

c10::DataPtr CudaAllocator::allocate(size_t size) {
  const c10::DeviceIndex device = c10::cuda::current_device();
  void* ptr = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {ptr, ptr, &free_pointer, c10::Device(c10::DeviceType::CUDA, device)};
}
void* CudaAllocator::raw_alloc(size_t size) { return allocate(size).release_context(); }
void* CudaAllocator::raw_alloc_with_stream(size_t size, cudaStream_t stream) {
  return malloc_on(size, c10::cuda::current_device(), stream);
}
void* CudaAllocator::malloc_on(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  TORCH_CHECK(!inherited_through_fork(),
              "torchmem: CUDA cannot be used in a child process forked after its parent used CUDA; use the "
              "'spawn' or 'forkserver' start method for processes that need CUDA");
  DeviceState& s = state(device);
  // May take the GIL: no lock of ours is held.
  const c10cca::CreateContextFn recorder = context_recorder_.load(std::memory_order_acquire);
  std::shared_ptr<c10::GatheredContext> context = recorder ? recorder() : nullptr;
  if (context) t_context = context;  // t_context is null whenever no context is gathered
  void* ptr = nullptr;
  try {
    ptr = s.memory.allocate(size, to_stream(stream), t_thread_allocators.empty() ? nullptr : thread_allocator(device));
  } catch (const OutOfMemory& e) {
    if (context) t_context.reset();
    raise_out_of_memory(device, e);
  } catch (...) {
    if (context) t_context.reset();
    throw;
  }
  if (context) t_context.reset();
  if (context) contexts_.set_block(reinterpret_cast<uintptr_t>(ptr), std::move(context));
  return ptr;
}

void CudaAllocator::raise_out_of_memory(int device, const OutOfMemory& e) {
  const OomInfo& info = e.info();
  std::vector<c10cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    observers = oom_observers_;
  }
  // As PyTorch's malloc: the segment it tried to get (alloc_size; the
  // request where an allocator has no segment), the limit, the free bytes.
  const size_t tried = info.alloc_size ? info.alloc_size : info.requested;
  for (auto& observer : observers) observer(device, tried, info.allowed, info.device_free);
  const std::string notes = note_observers_.notify(device, info);
  // PyTorch's message starts "CUDA out of memory.", which users and tools match.
  std::string message = e.what();
  const std::string prefix = state(device).device.name() + " out of memory.";
  if (message.rfind(prefix, 0) == 0) message = "CUDA out of memory." + message.substr(prefix.size());
  TORCH_CHECK_WITH(OutOfMemoryError, false, message, notes);
}

// Called by deleters: never throws.
void CudaAllocator::free_pointer(void* ptr) {
  CudaAllocator* self = g_self;
  if (ptr == nullptr || self->inherited_through_fork()) return;
  if (self->history_enabled_.load(std::memory_order_relaxed)) self->contexts_.erase_block(reinterpret_cast<uintptr_t>(ptr));
  const int limit = self->device_limit_.load(std::memory_order_acquire);
  const int first = t_last_free_device < limit ? t_last_free_device : 0;
  for (int i = 0; i < limit; ++i) {
    const int d = (first + i) % limit;
    DeviceState* s = self->existing_state(d);
    try {
      if (s && s->memory.free(ptr)) {
        t_last_free_device = d;
        return;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torchmem: error freeing %p on cuda:%d: %s\n", ptr, d, e.what());
      return;
    }
  }
  std::fprintf(stderr, "torchmem: ignoring free of %p, which torchmem did not allocate\n", ptr);
}

// ---------------------------------------------------------------- caches, streams, pools

void CudaAllocator::emptyCache(MempoolId_t mempool_id) {
  for (int d = 0; d < device_limit_.load(); ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    if (to_pool(mempool_id) == kDefaultPool) {
      s->memory.empty_cache();
      continue;
    }
    try {  // MemPool's destructor: must not throw
      s->memory.empty_pool_cache(to_pool(mempool_id));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torchmem: emptying a private pool's cache on cuda:%d: %s\n", d, e.what());
    }
  }
}

void CudaAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  memory(device).set_memory_fraction(fraction);
}
double CudaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  DeviceState* s = existing_state(device);
  return s ? s->memory.memory_fraction() : config().per_process_memory_fraction;
}
void CudaAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  // As PyTorch: nothing to do for empty tensors and pointers from elsewhere.
  if (!ptr.get() || ptr.get_deleter() != &free_pointer) return;
  if (DeviceState* s = existing_state(ptr.device().index())) s->memory.record_stream(ptr.get(), to_stream(stream.stream()));
}
void CudaAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                        std::function<bool(cudaStream_t)> filter) {
  // A graph capture's filter takes only its capturing stream. Where torch
  // opens the route before cudaStreamBeginCapture (2.14), that stream is not
  // capturing yet and the filter refuses it; where it opens it after (2.11),
  // the current stream is capturing already. use_mem_pool's filter takes
  // every stream of its thread, and its stream is not capturing.
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(current, &status));
  const bool capture = !filter(current) || status != cudaStreamCaptureStatusNone;
  auto core_filter = [filter = std::move(filter)](Stream s) { return filter(static_cast<cudaStream_t>(to_cuda_stream(s))); };
  memory(device).begin_allocate_to_pool(to_pool(mempool_id), std::move(core_filter), capture);
}

void CudaAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  memory(device).end_allocate_to_pool(to_pool(mempool_id));
}
void CudaAllocator::releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  if (DeviceState* s = existing_state(device)) s->memory.release_pool(to_pool(mempool_id));
}
void CudaAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                       std::shared_ptr<c10cca::CUDAAllocator> allocator) {
  TORCH_CHECK(allocator == nullptr || allocator.get() == this,
              "torchmem: a torch.cuda.MemPool with its own allocator is not supported while torchmem is installed");
  memory(device).create_or_incref_pool(to_pool(mempool_id));
}

int CudaAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return existing_state(device) ? memory(device).pool_use_count(to_pool(mempool_id)) : 0;
}
void CudaAllocator::setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) {
  if (DeviceState* s = existing_state(device)) s->memory.set_use_on_oom(to_pool(mempool_id), use_on_oom);
}

#ifdef TORCHMEM_HAS_MARK_CAPTURE
void CudaAllocator::markCaptureBegin(c10::DeviceIndex device) { memory(device).mark_capture(true); }
void CudaAllocator::markCaptureEnd(c10::DeviceIndex device) { memory(device).mark_capture(false); }
#endif

// ---------------------------------------------------------------- statistics

// A device torchmem has not allocated on has zero statistics (and gets no
// CUDA context from being asked).
c10cca::DeviceStats CudaAllocator::getDeviceStats(c10::DeviceIndex device) {
  DeviceState* s = existing_state(device);
  return s ? to_c10(s->memory.stats()) : c10cca::DeviceStats{};
}
void CudaAllocator::resetPeakStats(c10::DeviceIndex device) {
  if (DeviceState* s = existing_state(device)) s->memory.reset_peak_stats();
}
void CudaAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  if (DeviceState* s = existing_state(device)) s->memory.reset_accumulated_stats();
}
void CudaAllocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  DeviceState& s = state(device);
  if (*largest_block == 0) *largest_block = s.device.free_bytes();
  *largest_block = std::max(*largest_block, s.memory.largest_free_block());
}
void CudaAllocator::attachOutOfMemoryObserver(c10cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

// ---------------------------------------------------------------- history and snapshots

// Under history_mutex_, so devices made meanwhile get the same settings.
void CudaAllocator::enable_history(DeviceMemory& memory, bool clear) {
  History::ContextProvider provider;
  if (history_max_entries_) {
    provider = [this]() -> uint64_t { return t_context && alloc_contexts_ ? contexts_.add(t_context) : 0; };
  }
  memory.enable_history(history_max_entries_, std::move(provider), clear);
}

void CudaAllocator::recordHistory(bool enabled, c10cca::CreateContextFn context_recorder,
                                  size_t alloc_trace_max_entries, c10cca::RecordContext when, bool clear_history,
                                  const std::vector<std::string>&) {
  recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clear_history);
}
void CudaAllocator::recordHistory(bool enabled, c10cca::CreateContextFn context_recorder,
                                  size_t alloc_trace_max_entries, c10cca::RecordContext when, bool clear_history) {
  std::lock_guard<std::mutex> lock(history_mutex_);
  history_enabled_ = enabled;
  history_max_entries_ = enabled ? std::max<size_t>(alloc_trace_max_entries, 1) : 0;
  context_recorder_ = enabled && when != RecordContext::NEVER ? context_recorder : nullptr;
  alloc_contexts_ = enabled && (when == RecordContext::ALLOC || when == RecordContext::ALL);
  contexts_.configure(history_max_entries_, clear_history);
  for (int d = 0; d < device_limit_.load(); ++d) {
    if (DeviceState* s = existing_state(d)) enable_history(s->memory, clear_history);
  }
}

bool CudaAllocator::isHistoryEnabled() { return history_enabled_; }
c10cca::SnapshotInfo CudaAllocator::snapshot(MempoolId_t id, bool include_traces) { return make_snapshot(id, include_traces); }
c10cca::SnapshotInfo CudaAllocator::snapshot(MempoolId_t mempool_id) { return make_snapshot(mempool_id, true); }
c10cca::SnapshotInfo CudaAllocator::make_snapshot(MempoolId_t mempool_id, bool include_traces) {
  c10cca::SnapshotInfo result{};
  const int device_count = std::max<int>(c10::cuda::device_count(), 1);
  result.device_traces.resize(device_count);
  for (int d = 0; d < device_limit_.load(); ++d) {
    DeviceState* s = existing_state(d);
    if (!s) continue;
    std::vector<c10cca::TraceEntry> traces;
    for (auto& [id, allocator] : s->memory.allocators()) {
      if (to_pool(mempool_id) != kDefaultPool && id != to_pool(mempool_id)) continue;
      for (const SegmentInfo& seg : allocator->segments()) {  // one per run of mapped pages, as PyTorch
        c10cca::SegmentInfo& out = result.segments.emplace_back();
        out.device = static_cast<c10::DeviceIndex>(d);
        out.address = seg.addr;
        out.stream = to_cuda_stream(seg.stream);
        out.is_large = !seg.is_small;
        out.is_expandable = seg.is_expandable;
        out.owner_private_pool_id = {id.first, id.second};
        for (const BlockInfo& b : seg.blocks) {
          c10cca::BlockInfo& block = out.blocks.emplace_back();
          block.size = b.size;
          block.requested_size = b.requested_size;
          block.allocated = b.allocated;
          block.active = b.active;
          if (b.allocated) block.context_when_allocated = std::static_pointer_cast<c10::GatheredContext>(contexts_.block(b.addr));
          out.total_size += b.size;
          out.allocated_size += b.allocated ? b.size : 0;
          out.active_size += b.active ? b.size : 0;
          out.requested_size += b.active ? b.requested_size : 0;
        }
      }
      if (!include_traces || d >= device_count) continue;
      for (const TraceEntry& e : allocator->history_entries()) {
        auto context = e.context ? std::static_pointer_cast<c10::GatheredContext>(contexts_.get(e.context)) : nullptr;
        traces.emplace_back(to_c10(e.action), static_cast<c10::DeviceIndex>(d), e.addr, e.size,
                            to_cuda_stream(e.stream), MempoolId_t{id.first, id.second}, c10::approx_time_t{0},
                            std::move(context));
        // The snapshot's times are microseconds since the epoch (PyTorch
        // converts its clock to these before returning a snapshot).
        traces.back().time_.t_ = static_cast<time_t>(e.time_us);
      }
    }
    if (include_traces && d < device_count) {
      std::stable_sort(traces.begin(), traces.end(), [](const auto& a, const auto& b) { return a.time_.t_ < b.time_.t_; });
      result.device_traces[d] = std::move(traces);
    }
  }
  const AllocatorConfig c = config();
  result.config_metadata.garbage_collection_threshold = c.garbage_collection_threshold;
  // Unset is SIZE_MAX, as native's (the snapshot's Python dict reads -1 for it).
  result.config_metadata.max_split_size = c.max_split_size;
  result.config_metadata.expandable_segments = c.expandable_segments;
  result.config_metadata.last_allocator_settings = c.to_string();
  result.config_metadata.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(),
                                                         c.roundup_power2_divisions.end());
  return result;
}

}  // namespace torchmem::glue
