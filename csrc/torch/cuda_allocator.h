// CudaAllocator: torchmem's caching allocator as PyTorch's CUDA allocator.
//
// A C++ subclass of torch::cuda::CUDAPluggableAllocator: the pluggable base
// routes malloc/free, empty_cache, the memory fraction, record_stream and the
// CUDA graph pool calls to our hooks, and the overrides below make PyTorch's
// own APIs report this allocator (a bare pluggable allocator breaks them):
// torch.cuda.memory_stats() and friends (getDeviceStats, resetPeakStats,
// resetAccumulatedStats), memory_snapshot() / _dump_snapshot() (snapshot),
// _record_memory_history() (recordHistory), cudnn's workspace sizing
// (cacheInfo) and torch.cuda.OutOfMemoryError (the malloc hook rethrows
// torchmem::OutOfMemory as c10::OutOfMemoryError, after telling PyTorch's
// out-of-memory observers and then torchmem's, oom_observers(), whose notes
// end the message).
//
// State is per device (one CudaDevice and one CachingAllocator each, made on
// first use, so no CUDA context is created on a device that is never used):
// - Streams: a block freed after record_stream() on other streams is kept
//   (still allocated in the caching allocator) until an event recorded on
//   each of those streams completes. Events are polled at each allocation on
//   the device, waited for in empty_cache() and before an out of memory error
//   is raised (after which the allocation is retried once). While a CUDA
//   graph is captured, such frees wait, without events, until the capture ends.
// - CUDA graphs and torch.cuda.MemPool: each private pool is its own
//   CachingAllocator on the same CudaDevice; beginAllocateToPool routes the
//   allocations whose stream passes the filter to it until endAllocateToPool;
//   releasePool drops a use and, at zero, empties the pool's cache and
//   forgets it once its last block is freed. Device statistics add up the
//   main allocator and the pools (peaks are summed, an upper bound).
// - Thread allocators (torchmem.planned()): a thread may route its
//   allocations on a device to another torchmem Allocator (a planned slab, a
//   recorder) with push_thread_allocator(); a private pool route that takes
//   the stream comes first. Frees ask the device's routed allocators
//   owns(ptr) before its caching allocator, on any thread, with the same
//   stream handling; a routed allocator stays registered until it is popped
//   everywhere, held by nobody else and has no live allocation. Device
//   statistics and snapshots see what routed allocators take from the
//   caching allocator (a planned slab's region is one block of it).
//
// Installation: one swap per process, before CUDA initialises (PyTorch's
// rule); install() throws std::runtime_error with what to do otherwise.
// The allocator object lives for the whole process.
//
// Fork: a child forked after this process used CUDA through torchmem (its
// first device state was made in an earlier fork_generation(), see
// core/fork_safety.h) must not use CUDA, as with PyTorch. In such a child
// malloc throws, and frees of the parent's CUDA tensors are dropped before
// any lock or CUDA call (the memory belongs to the parent's CUDA context):
// the child never waits on a lock a parent thread held (the glue's mutexes
// and the pluggable base's are plain std::mutex, not held across fork). A
// child forked before CUDA was used may use it as any process.
//
// Thread safety: the caching allocators lock themselves; per-device glue
// state (pools, routes, routed allocators, deferred frees) is under the
// device's mutex, which is never held while calling into Python (stack
// contexts are gathered first). Lock order: the device's mutex, then an
// allocator's own lock (a routed allocator's, then its fallback's).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/alloc_config.h"
#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/oom_observers.h"
#include "core/fork_safety.h"
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

  // The caching allocator of a device's default pool (made on first use).
  std::shared_ptr<CachingAllocator> caching(int device);
  // Told of every out-of-memory error raised to PyTorch (with the device
  // index), after PyTorch's own observers; their notes end the message.
  OomObservers& oom_observers() { return note_observers_; }
  // Frees waiting on stream events, and private pools alive, on a device.
  size_t pending_frees(int device);
  size_t pool_count(int device);

  // Until the matching pop, the calling thread's allocations on `device` go
  // to `allocator` (the innermost one pushed for that device, with the
  // allocation's stream), unless a private pool route takes the stream. The
  // allocator is called without the device's mutex when allocating and under
  // it when freeing (and may be destroyed there, once unused): it may use the
  // device's caching allocator as its fallback but must not call back into
  // this class. Out of memory from it is reported as from the caching
  // allocator (observers, torch.cuda.OutOfMemoryError).
  // push: std::invalid_argument for a null allocator, std::runtime_error when
  // torchmem is not PyTorch's CUDA allocator. pop: std::logic_error when this
  // thread has nothing pushed for `device`.
  static void push_thread_allocator(int device, std::shared_ptr<torchmem::Allocator> allocator);
  static void pop_thread_allocator(int device);

  // Overrides: PyTorch's statistics, snapshot and history APIs.
  c10cca::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  std::string name() override { return "torchmem"; }

  // Signatures that differ between torch releases. TORCHMEM_OVERRIDE_2_11
  // marks those that match torch 2.11 to 2.14 (checked by
  // scripts/check_cuda_build.sh against both with -Werror=suggest-override);
  // the other overloads are for releases before 2.11, where they override
  // instead.
  c10cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool_id, bool include_traces) TORCHMEM_OVERRIDE_2_11;
  c10cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool_id);
  void recordHistory(bool enabled, c10cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     c10cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) TORCHMEM_OVERRIDE_2_11;
  void recordHistory(bool enabled, c10cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     c10cca::RecordContext when, bool clear_history);
  bool isHistoryEnabled() TORCHMEM_OVERRIDE_2_11;
  double getMemoryFraction(c10::DeviceIndex device) TORCHMEM_OVERRIDE_2_11;
  void attachOutOfMemoryObserver(c10cca::OutOfMemoryObserver observer) TORCHMEM_OVERRIDE_2_11;
  // Drops the free in a forked child that inherited CUDA state (see Fork above).
  void raw_delete(void* ptr) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                          std::shared_ptr<c10cca::CUDAAllocator> allocator) TORCHMEM_OVERRIDE_2_11;
  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) TORCHMEM_OVERRIDE_2_11;

 private:
  struct Pool {
    std::shared_ptr<CachingAllocator> allocator;
    int use_count = 0;
  };
  struct Route {
    c10::cuda::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };
  // Who frees a pointer: a caching allocator (the main one or a pool's), or
  // a routed thread allocator. Exactly one is set.
  struct Owner {
    CachingAllocator* caching = nullptr;
    torchmem::Allocator* routed = nullptr;
    torchmem::Allocator& allocator() const { return routed ? *routed : *caching; }
  };
  struct DeferredFree {
    void* ptr;
    Owner owner;
    std::vector<Stream> streams;   // streams still to wait for
    std::vector<EventId> events;   // recorded on them (empty until recorded)
  };
  struct DeviceState {
    explicit DeviceState(int index, const AllocatorConfig& config);
    cuda::CudaDevice device;
    std::shared_ptr<CachingAllocator> main;
    std::mutex mutex;
    std::map<c10::cuda::MempoolId_t, Pool> pools;
    // Released pools whose blocks are not all freed yet.
    std::vector<std::pair<c10::cuda::MempoolId_t, std::shared_ptr<CachingAllocator>>> retired;
    std::unordered_map<void*, CachingAllocator*> pool_blocks; // live blocks of pools
    // Thread allocators pushed for this device, oldest first; kept while
    // pushed, held elsewhere or owning live allocations.
    std::vector<std::shared_ptr<torchmem::Allocator>> routed;
    std::vector<Route> routes;                                // innermost last
    std::unordered_map<void*, std::vector<Stream>> stream_uses;
    std::deque<DeferredFree> deferred;
    double fraction = -1.0;                                   // < 0: not set (the config's applies)
  };

  CudaAllocator();

  // Hooks installed on the pluggable base.
  void* malloc_hook(size_t size, int device, cudaStream_t stream);
  void free_hook(void* ptr, size_t size, int device, cudaStream_t stream);
  void init_hook(int device_count);
  void empty_cache_hook();
  void memory_fraction_hook(double fraction, int device);
  void record_stream_hook(void* ptr, cudaStream_t stream);
  void begin_allocate_to_pool_hook(int device, c10::cuda::MempoolId_t id, std::function<bool(cudaStream_t)> filter);
  void end_allocate_to_pool_hook(int device, c10::cuda::MempoolId_t id);
  void release_pool_hook(int device, c10::cuda::MempoolId_t id);

  // Whether this process inherited CUDA state through fork() (see Fork above).
  bool inherited_through_fork() const;

  DeviceState& state(int device);
  DeviceState* existing_state(int device);
  CachingAllocator& target_for(DeviceState& s, cudaStream_t stream, bool* is_pool);
  std::shared_ptr<CachingAllocator> make_allocator(DeviceState& s);
  // Never throws for a routed owner's refusal (printed instead).
  void deallocate_locked(DeviceState& s, void* ptr, Owner owner);
  // A pool's block, else the newest routed allocator that owns ptr, else main.
  Owner owner_locked(DeviceState& s, void* ptr);
  // Forgets routed allocators nobody else holds and with nothing live.
  static void drop_unused_routed_locked(DeviceState& s);
  // Deferred frees: record events once no capture is under way, free blocks
  // whose events completed (all of them, waiting, when `wait`).
  void process_deferred_locked(DeviceState& s, bool wait);
  bool capturing_locked(const DeviceState& s, cudaStream_t stream) const;
  void enable_history(CachingAllocator& allocator);
  c10cca::SnapshotInfo make_snapshot(c10::cuda::MempoolId_t mempool_id, bool include_traces);

  AllocatorConfig config_;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices_{};  // written once each, never freed
  std::array<std::once_flag, kMaxDevices> device_once_;
  static constexpr uint64_t kNoState = ~uint64_t(0);
  std::atomic<uint64_t> state_generation_{kNoState};  // fork_generation() when the first device state was made
  std::mutex observers_mutex_;
  std::vector<c10cca::OutOfMemoryObserver> oom_observers_;   // PyTorch's (attachOutOfMemoryObserver)
  OomObservers note_observers_;                              // torchmem's (oom_observers())

  // History: settings for allocators made later, and the stack contexts the
  // recorder gathered, by the id the core's history stores.
  std::mutex history_mutex_;
  std::atomic<bool> history_enabled_{false};
  size_t history_max_entries_ = 0;
  c10cca::CreateContextFn context_recorder_ = nullptr;
  c10cca::RecordContext record_when_ = c10cca::RecordContext::NEVER;
  uint64_t next_context_id_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> trace_contexts_;
  std::deque<uint64_t> trace_context_order_;
  std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> block_contexts_;
};

}  // namespace torchmem::glue
