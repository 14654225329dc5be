#include "cuda/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>

namespace torchmem::cuda {

namespace {

[[noreturn]] void fail(const char* what, cudaError_t err) {
  throw std::runtime_error(std::string("torchmem: ") + what + " failed: " + cudaGetErrorString(err));
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(what, err);
}

// Selects `index` for the scope, restoring the caller's device when it was
// another (as c10's CUDAGuard: one cudaGetDevice when it already is). The
// calls inside a scope never change the current device.
class DeviceScope {
 public:
  explicit DeviceScope(int index) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) {
      check(cudaSetDevice(index), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// cudaStreamLegacy and cudaStreamPerThread name a stream of the current
// device, as 0 does.
bool names_current_devices_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

// Relaxed capture mode for the scope: device memory calls are then allowed
// while this or another thread captures a CUDA graph (as PyTorch does).
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The driver's virtual memory API, looked up once through the runtime.
struct DriverApi {
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;

  static const DriverApi& get() {
    static const DriverApi api = load();
    return api;
  }

 private:
  template <typename F>
  static void lookup(const char* symbol, F& fn) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, 12000, cudaEnableDefault, &status);
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      throw std::runtime_error(std::string("torchmem: the CUDA driver has no ") + symbol +
                               " (expandable segments need the CUDA virtual memory API)");
    }
    fn = reinterpret_cast<F>(ptr);
  }
  static DriverApi load() {
    DriverApi api;
    lookup("cuMemAddressReserve", api.cuMemAddressReserve);
    lookup("cuMemAddressFree", api.cuMemAddressFree);
    lookup("cuMemCreate", api.cuMemCreate);
    lookup("cuMemRelease", api.cuMemRelease);
    lookup("cuMemMap", api.cuMemMap);
    lookup("cuMemUnmap", api.cuMemUnmap);
    lookup("cuMemSetAccess", api.cuMemSetAccess);
    lookup("cuMemGetAllocationGranularity", api.cuMemGetAllocationGranularity);
    return api;
  }
};

void check_driver(CUresult res, const char* what) {
  if (res != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("torchmem: ") + what + " failed with CUresult " + std::to_string(res));
  }
}

CUmemAllocationProp page_properties(int index) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = index;
  return prop;
}

}  // namespace

CudaDevice::CudaDevice(int index) : index_(index) {
  DeviceScope scope(index_);
  size_t free = 0;
  check(cudaMemGetInfo(&free, &total_), "cudaMemGetInfo");
  // Pages are the larger of 2 MiB and the device's granularity; without the
  // virtual memory API, reserve() fails later with a message saying so.
  try {
    const DriverApi& api = DriverApi::get();
    CUmemAllocationProp prop = page_properties(index_);
    size_t granularity = 0;
    if (api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS) {
      page_size_ = std::max(page_size_, granularity);
    }
  } catch (const std::runtime_error&) {
  }
}

CudaDevice::~CudaDevice() {
  // Destroyed at process exit at the earliest (the glue keeps devices alive);
  // the driver may already be gone, so errors are ignored.
  for (auto& [id, event] : events_) cudaEventDestroy(static_cast<cudaEvent_t>(event.event));
  for (auto& [device, spares] : spare_events_) {
    for (void* event : spares) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
}

uintptr_t CudaDevice::allocate(size_t size) {
  DeviceScope scope(index_);
  RelaxedCapture relaxed;
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, size);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls do not see it
    return 0;
  }
  check(err, "cudaMalloc");
  return reinterpret_cast<uintptr_t>(ptr);
}

void CudaDevice::free(uintptr_t addr, size_t) {
  DeviceScope scope(index_);
  RelaxedCapture relaxed;
  check(cudaFree(reinterpret_cast<void*>(addr)), "cudaFree");
}

uintptr_t CudaDevice::reserve(size_t size) {
  const DriverApi& api = DriverApi::get();
  CUdeviceptr ptr = 0;
  if (api.cuMemAddressReserve(&ptr, size, page_size_, 0, 0) != CUDA_SUCCESS) return 0;
  return static_cast<uintptr_t>(ptr);
}

// One batch per call: every page's handle is created, then every page is
// mapped, then access is granted once for the whole range.
bool CudaDevice::map(uintptr_t addr, size_t size) {
  const DriverApi& api = DriverApi::get();
  DeviceScope scope(index_);
  RelaxedCapture relaxed;
  const CUmemAllocationProp prop = page_properties(index_);
  const size_t pages = (size + page_size_ - 1) / page_size_;
  std::vector<CUmemGenericAllocationHandle> handles;
  handles.reserve(pages);
  size_t mapped = 0;
  auto undo = [&] {
    for (size_t i = 0; i < mapped; ++i) api.cuMemUnmap(static_cast<CUdeviceptr>(addr + i * page_size_), page_size_);
    for (CUmemGenericAllocationHandle handle : handles) api.cuMemRelease(handle);
  };
  CUresult res = CUDA_SUCCESS;
  while (handles.size() < pages) {
    CUmemGenericAllocationHandle handle = 0;
    res = api.cuMemCreate(&handle, page_size_, &prop, 0);
    if (res != CUDA_SUCCESS) break;
    handles.push_back(handle);
  }
  for (; res == CUDA_SUCCESS && mapped < pages; ++mapped) {
    res = api.cuMemMap(static_cast<CUdeviceptr>(addr + mapped * page_size_), page_size_, 0, handles[mapped], 0);
    if (res != CUDA_SUCCESS) break;
  }
  if (res == CUDA_SUCCESS) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = index_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    res = api.cuMemSetAccess(static_cast<CUdeviceptr>(addr), pages * page_size_, &access, 1);
  }
  if (res != CUDA_SUCCESS) {
    undo();
    if (res == CUDA_ERROR_OUT_OF_MEMORY) return false;
    check_driver(res, "cuMemCreate/cuMemMap/cuMemSetAccess");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < pages; ++i) page_handles_[addr + i * page_size_] = handles[i];
  return true;
}

// One wait for the device per call, however many pages it unmaps.
void CudaDevice::unmap(uintptr_t addr, size_t size) {
  const DriverApi& api = DriverApi::get();
  DeviceScope scope(index_);
  // Unlike cudaFree, cuMemUnmap does not wait for work still using the pages.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t page = addr; page < addr + size; page += page_size_) {
    auto it = page_handles_.find(page);
    if (it == page_handles_.end()) throw std::logic_error("torchmem: unmap of a page that is not mapped");
    check_driver(api.cuMemUnmap(static_cast<CUdeviceptr>(page), page_size_), "cuMemUnmap");
    check_driver(api.cuMemRelease(it->second), "cuMemRelease");
    page_handles_.erase(it);
  }
}

void CudaDevice::release(uintptr_t addr, size_t size) {
  check_driver(DriverApi::get().cuMemAddressFree(static_cast<CUdeviceptr>(addr), size), "cuMemAddressFree");
}

// The event is made and recorded on the stream's own device (a stream of
// another GPU, as PyTorch's record_stream allows): recording it with another
// device current would fail, and fail again at every later attempt.
EventId CudaDevice::record_event(Stream stream) {
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
  int device = index_;  // 0, cudaStreamLegacy, cudaStreamPerThread: this device's own, made current below
#if CUDART_VERSION >= 12080
  if (!names_current_devices_stream(cuda_stream)) check(cudaStreamGetDevice(cuda_stream, &device), "cudaStreamGetDevice");
#endif
  DeviceScope scope(device);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& spares = spare_events_[device];
    if (!spares.empty()) {
      event = static_cast<cudaEvent_t>(spares.back());
      spares.pop_back();
    }
  }
  if (!event) check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  const cudaError_t err = cudaEventRecord(event, cuda_stream);
  std::lock_guard<std::mutex> lock(mutex_);
  if (err != cudaSuccess) {
    spare_events_[device].push_back(event);
    fail("cudaEventRecord", err);
  }
  const EventId id = ++next_event_;
  events_.emplace(id, Event{event, device});
  return id;
}

void* CudaDevice::event_for(EventId id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(id);
  if (it == events_.end()) throw std::logic_error("torchmem: unknown CUDA event " + std::to_string(id));
  return it->second.event;
}

bool CudaDevice::event_complete(EventId id) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_for(id)));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  check(err, "cudaEventQuery");
  return true;
}

void CudaDevice::synchronize_event(EventId id) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_for(id))), "cudaEventSynchronize");
}

void CudaDevice::destroy_event(EventId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(id);
  if (it == events_.end()) return;
  spare_events_[it->second.device].push_back(it->second.event);
  events_.erase(it);
}

size_t CudaDevice::free_bytes() const {
  DeviceScope scope(index_);
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

size_t CudaDevice::live_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

}  // namespace torchmem::cuda
