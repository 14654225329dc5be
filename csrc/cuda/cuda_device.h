// CudaDevice: the torchmem::Device of one CUDA GPU (see core/devices/device.h for the
// contract every device keeps).
//
// - allocate()/free(): cudaMalloc / cudaFree on this device. allocate()
//   returns 0 for cudaErrorMemoryAllocation (and clears that error); any
//   other CUDA error throws std::runtime_error.
// - Expandable segments (Note [Expandable segments] in PyTorch's allocator):
//   reserve() takes an address range with cuMemAddressReserve; map() backs
//   a range of pages (page_size(), 2 MiB or the device's granularity if
//   larger) in one batch: cuMemCreate for each page, cuMemMap for each, then
//   one cuMemSetAccess granting this device read/write access to the range;
//   unmap() waits for the device once per call, then cuMemUnmap +
//   cuMemRelease each page; release() frees the range. The driver entry
//   points are looked up through the runtime (cudaGetDriverEntryPointByVersion),
//   so nothing links libcuda directly.
// - Events: record_event(stream) records a cudaEvent (created with
//   cudaEventDisableTiming, recycled per device) on that stream, made on the
//   stream's own device (which may be another GPU); a Stream is the
//   cudaStream_t's value (0 = the legacy default stream).
// - total_bytes() is read once (cudaMemGetInfo); free_bytes() asks each time.
// - Every call selects this device for its duration and restores the
//   caller's current device. Device memory calls run in relaxed stream
//   capture mode, so a segment can be taken while a CUDA graph is captured.
//
// Thread safety: internally synchronised (events and page handles under a
// mutex); the CUDA calls themselves are thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/devices/device.h"

namespace torchmem::cuda {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  uintptr_t allocate(size_t size) override;
  void free(uintptr_t addr, size_t size) override;

  size_t page_size() const override { return page_size_; }
  uintptr_t reserve(size_t size) override;
  bool map(uintptr_t addr, size_t size) override;
  void unmap(uintptr_t addr, size_t size) override;
  void release(uintptr_t addr, size_t size) override;

  EventId record_event(Stream stream) override;
  bool event_complete(EventId id) override;
  void synchronize_event(EventId id) override;
  void destroy_event(EventId id) override;

  size_t total_bytes() const override { return total_; }
  size_t free_bytes() const override;

  // Events alive (recorded and not yet destroyed); for tests.
  size_t live_events() const;

 private:
  void* event_for(EventId id) const;

  const int index_;
  size_t total_ = 0;
  size_t page_size_ = 2u << 20;

  mutable std::mutex mutex_;
  std::map<uintptr_t, unsigned long long> page_handles_;  // page address -> CUmemGenericAllocationHandle
  struct Event {
    void* event;  // cudaEvent_t
    int device;   // the device of the stream it was recorded on
  };
  std::unordered_map<EventId, Event> events_;
  std::unordered_map<int, std::vector<void*>> spare_events_;  // by device
  EventId next_event_ = 0;
};

}  // namespace torchmem::cuda
