// CudaAllocator: torchmem as PyTorch's CUDA allocator, a thin translation of
// torch's calls and types onto the core.
//
// The policy is in the core, tested on CPU (tests/allocator/test_device_memory.py,
// tests/cpp/core_driver.cpp): one DeviceMemory (core/device_memory/device_memory.h) per
// GPU, over a CudaDevice (csrc/cuda/cuda_device.h), holds the main
// allocator, the private pools of CUDA graphs and torch.cuda.MemPool, stream
// uses with their events and deferred frees, routed thread allocators and the
// capture rules. This class maps torch's calls onto it:
// - allocate()/raw_alloc*(): the DataPtr carries this class's own deleter
//   (raw_deleter(), context == data pointer), so neither allocation nor free
//   passes through the pluggable base's pointer map and mutex. A free asks
//   the devices' DeviceMemory in turn (the thread's last one first).
// - record_stream: recordStream(DataPtr, CUDAStream) -> record_stream, for
//   pointers this allocator made (as PyTorch, others are ignored); the event
//   is recorded on the stream's own device (CudaDevice::record_event).
// - beginAllocateToPool -> a route; it is a capture when the route's filter
//   refuses the current stream at that moment, or the current stream is
//   capturing already (CUDAGraph::capture_begin opens the route before
//   cudaStreamBeginCapture in torch 2.14, after it in 2.11; its filter takes
//   only the capturing stream; use_mem_pool's takes every stream of its
//   thread), and markCaptureBegin/End (torch 2.14+) mark captures too.
//   endAllocateToPool, releasePool, createOrIncrefPool, getPoolUseCount,
//   setUseOnOOM and emptyCache(pool) map one to one; the last four and
//   releasePool never throw (torch.cuda.MemPool's destructor calls them).
// - emptyCache(), setMemoryFraction, getDeviceStats (main allocator and pools
//   added up), resetPeakStats, resetAccumulatedStats, cacheInfo (cudnn's
//   workspace sizing), snapshot()/recordHistory() (the core's history with
//   Python stacks kept in a ContextStore; every call under the allocators'
//   locks), name() "torchmem".
// - Out of memory: torchmem::OutOfMemory becomes c10::OutOfMemoryError
//   ("CUDA out of memory. ..."), after PyTorch's observers (told the device,
//   the size of the segment the allocator tried to get, the limit and the
//   device's free bytes, as PyTorch's malloc) and torchmem's own
//   (oom_observers(), whose notes end the message). Counted once (num_ooms).
//
// Installation: one swap per process, before CUDA initialises (PyTorch's
// rule): install() throws std::runtime_error with what to do otherwise. It
// also registers the allocator as c10::GetAllocator(kCUDA), which
// torch.accelerator's memory functions and c10::getDeviceAllocator use.
// Device state made before install() (torchmem.runtime.cuda.caching_allocator())
// takes the installed config. The allocator lives for the whole process.
//
// Fork: a child forked after this process used CUDA through torchmem (after
// its first device state was made: a pthread_atfork child handler registered
// then marks the child) must not use CUDA, as with PyTorch. In such a child
// allocation throws, and frees of the parent's CUDA tensors are dropped
// before any lock or CUDA call (the memory belongs to the parent's context).
//
// Thread safety: the core's classes lock themselves; the glue's own state is
// written once per device (std::call_once) or under small mutexes never held
// while calling into Python (stack contexts are gathered first).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/allocator.h"
#include "core/base/context_store.h"
#include "core/base/oom_observers.h"
#include "core/device_memory/device_memory.h"
#include "core/policy/native/caching_allocator.h"
#include "cuda/cuda_device.h"

// Version differences are handled without guessing release numbers where
// possible: methods whose signatures changed are declared in each form (see
// below), and c10 types are deduced. The oldest torch this was written for:
static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8),
              "torchmem's CUDA part needs torch 2.8 or newer (CUDAPluggableAllocator with mempool trace entries)");

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
#define TORCHMEM_OVERRIDE_2_11 override
#else
#define TORCHMEM_OVERRIDE_2_11
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
#define TORCHMEM_HAS_MARK_CAPTURE 1
#endif

// Every override of the glue says so: a signature that changes in a torch
// release must fail to compile, not silently stop overriding (torch's own
// headers, included above, are not held to this).
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wsuggest-override"

namespace torchmem::glue {

namespace c10cca = c10::cuda::CUDACachingAllocator;

class CudaAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  static constexpr int kMaxDevices = 64;

  // The process's instance (made on first call, never destroyed).
  static std::shared_ptr<CudaAllocator> instance();

  // Makes torchmem PyTorch's CUDA allocator with this config. Throws
  // std::runtime_error when CUDA is already initialised (PyTorch allows the
  // swap only before), or when torchmem is installed already with another
  // config and CUDA has initialised since.
  static void install(const AllocatorConfig& config);
  static bool installed();

  // A device's policy, and its main caching allocator (made on first use).
  DeviceMemory& memory(int device);
  std::shared_ptr<CachingAllocator> caching(int device);
  // Told of every out-of-memory error raised to PyTorch (with the device
  // index), after PyTorch's own observers; their notes end the message.
  OomObservers& oom_observers() { return note_observers_; }
  size_t pending_frees(int device);
  size_t pool_count(int device);

  // Until the matching pop, the calling thread's allocations on `device` go
  // to `allocator` (the innermost one pushed for that device, with the
  // allocation's stream), unless a private pool route takes the stream. Frees
  // find it on any thread (DeviceMemory::add_routed). It may use the device's
  // caching allocator as its fallback but must not call back into this
  // class. push: std::invalid_argument for a null allocator,
  // std::runtime_error when torchmem is not PyTorch's CUDA allocator. pop:
  // std::logic_error when this thread has nothing pushed for `device`.
  static void push_thread_allocator(int device, std::shared_ptr<torchmem::Allocator> allocator);
  static void pop_thread_allocator(int device);

  // The hot path, bypassing the pluggable base.
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override { return &free_pointer; }
  void* raw_alloc(size_t size) override;
  void* raw_alloc_with_stream(size_t size, cudaStream_t stream) override;
  void raw_delete(void* ptr) override { free_pointer(ptr); }

  // Caches, streams and private pools.
  void emptyCache(c10::cuda::MempoolId_t mempool_id) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  double getMemoryFraction(c10::DeviceIndex device) TORCHMEM_OVERRIDE_2_11;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                          std::shared_ptr<c10cca::CUDAAllocator> allocator) TORCHMEM_OVERRIDE_2_11;
  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) TORCHMEM_OVERRIDE_2_11;
  void setUseOnOOM(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id, bool use_on_oom) TORCHMEM_OVERRIDE_2_11;
#ifdef TORCHMEM_HAS_MARK_CAPTURE
  void markCaptureBegin(c10::DeviceIndex device) override;
  void markCaptureEnd(c10::DeviceIndex device) override;
#endif

  // PyTorch's statistics, snapshot and history APIs.
  c10cca::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  std::string name() override { return "torchmem"; }
  // Signatures that differ between torch releases. TORCHMEM_OVERRIDE_2_11
  // marks those that match torch 2.11 to 2.14 (checked by
  // scripts/check_cuda_build.sh with -Werror=suggest-override); the other
  // overloads are for releases before 2.11, where they override instead.
  c10cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool_id, bool include_traces) TORCHMEM_OVERRIDE_2_11;
  c10cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool_id);
  void recordHistory(bool enabled, c10cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     c10cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) TORCHMEM_OVERRIDE_2_11;
  void recordHistory(bool enabled, c10cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     c10cca::RecordContext when, bool clear_history);
  bool isHistoryEnabled() TORCHMEM_OVERRIDE_2_11;
  void attachOutOfMemoryObserver(c10cca::OutOfMemoryObserver observer) TORCHMEM_OVERRIDE_2_11;

 private:
  struct DeviceState {
    DeviceState(int index, const AllocatorConfig& config) : device(index), memory(device, config) {}
    cuda::CudaDevice device;
    DeviceMemory memory;
  };

  CudaAllocator();
  static void free_pointer(void* ptr);
  void* malloc_on(size_t size, int device, cudaStream_t stream);
  [[noreturn]] void raise_out_of_memory(int device, const OutOfMemory& e);
  // Whether this process inherited CUDA state through fork() (see Fork above).
  bool inherited_through_fork() const;
  DeviceState& state(int device);
  DeviceState* existing_state(int device) const;
  void set_config(const AllocatorConfig& config);
  AllocatorConfig config() {
    std::lock_guard<std::mutex> lock(config_mutex_);
    return config_;
  }
  void enable_history(DeviceMemory& memory, bool clear);
  c10cca::SnapshotInfo make_snapshot(c10::cuda::MempoolId_t mempool_id, bool include_traces);

  std::mutex config_mutex_;
  AllocatorConfig config_;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices_{};  // written once each, never freed
  std::array<std::once_flag, kMaxDevices> device_once_;
  std::atomic<int> device_limit_{0};  // 1 + the highest index with a state
  std::mutex observers_mutex_;
  std::vector<c10cca::OutOfMemoryObserver> oom_observers_;   // PyTorch's (attachOutOfMemoryObserver)
  OomObservers note_observers_;                              // torchmem's (oom_observers())

  // History: the settings (for allocators made later) and the Python stacks.
  std::mutex history_mutex_;
  std::atomic<bool> history_enabled_{false};
  size_t history_max_entries_ = 0;
  std::atomic<c10cca::CreateContextFn> context_recorder_{nullptr};  // null: no stacks gathered
  std::atomic<bool> alloc_contexts_{false};                          // allocations keep their stacks
  ContextStore contexts_;
};

}  // namespace torchmem::glue

#pragma GCC diagnostic pop
