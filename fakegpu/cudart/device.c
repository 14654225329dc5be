/* Devices and their properties, versions, errors, kernel launches (accepted
 * and skipped) and the registration calls every CUDA binary makes at load. */
#include <stdio.h>
#include <string.h>

#include "images.h"
#include "state.h"

#define VALID_DEVICE(d) ((d) >= 0 && (d) < fg_device_count)

int fg_device_attribute(int attr, int device) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: return 1024;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: return 1024;
    case cudaDevAttrMaxBlockDimZ: return 64;
    case cudaDevAttrMaxGridDimX: return 2147483647;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: return 65535;
    case cudaDevAttrMaxSharedMemoryPerBlock: return 48 << 10;
    case cudaDevAttrTotalConstantMemory: return 64 << 10;
    case cudaDevAttrWarpSize: return 32;
    case cudaDevAttrMaxRegistersPerBlock: case cudaDevAttrMaxRegistersPerMultiprocessor: return 65536;
    case cudaDevAttrClockRate: return 1980000;
    case cudaDevAttrMemoryClockRate: return 2619000;
    case cudaDevAttrGlobalMemoryBusWidth: return 5120;
    case cudaDevAttrMultiProcessorCount: return fg_sms;
    case cudaDevAttrIntegrated: return 0;
    case cudaDevAttrCanMapHostMemory: return 1;
    case cudaDevAttrConcurrentKernels: return 1;
    case cudaDevAttrPciBusId: return device + 1;
    case cudaDevAttrPciDeviceId: case cudaDevAttrPciDomainId: return 0;
    case cudaDevAttrAsyncEngineCount: return 3;
    case cudaDevAttrUnifiedAddressing: return 1;
    case cudaDevAttrL2CacheSize: return 50 << 20;
    case cudaDevAttrMaxThreadsPerMultiProcessor: return 2048;
    case cudaDevAttrComputeCapabilityMajor: return fg_cc_major;
    case cudaDevAttrComputeCapabilityMinor: return fg_cc_minor;
    case cudaDevAttrStreamPrioritiesSupported: return 1;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: return 228 << 10;
    case cudaDevAttrManagedMemory: return 1;
    case cudaDevAttrConcurrentManagedAccess: return 1;
    case cudaDevAttrComputePreemptionSupported: return 1;
    case cudaDevAttrCooperativeLaunch: return 1;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: return 227 << 10;
    case cudaDevAttrMaxBlocksPerMultiprocessor: return 32;
    case cudaDevAttrMemoryPoolsSupported: return 1;
    case 102: /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */ return 1;
    case 103: /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */ return 1;
    default: return 0;
  }
}

cudaError_t cudaGetDeviceCount(int *count) {
  fg_init();
  if (count == NULL) return FG_FAIL(cudaErrorInvalidValue, "count=NULL");
  *count = fg_device_count;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (device == NULL) return FG_FAIL(cudaErrorInvalidValue, "device=NULL");
  *device = fg_current_device();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  fg_init();
  if (!VALID_DEVICE(device)) return FG_FAIL(cudaErrorInvalidDevice, "device=%d", device);
  fg_set_current_device(device);
  return cudaSuccess;
}

cudaError_t cudaInitDevice(int device, unsigned int device_flags, unsigned int flags) {
  (void)device_flags;
  (void)flags;
  fg_init();
  return VALID_DEVICE(device) ? cudaSuccess : FG_FAIL(cudaErrorInvalidDevice, "device=%d", device);
}

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  (void)flags;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
  if (flags) *flags = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  fg_init();
  if (value == NULL || !VALID_DEVICE(device))
    return FG_FAIL(value ? cudaErrorInvalidDevice : cudaErrorInvalidValue, "value=%p, attr=%d, device=%d",
                   (void *)value, (int)attr, device);
  *value = fg_device_attribute(attr, device);
  return cudaSuccess;
}

/* CUDA 12's headers name this cudaGetDeviceProperties_v2 (the unversioned
 * symbol takes CUDA 11's smaller struct, and stays a stub). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  fg_init();
  if (prop == NULL || !VALID_DEVICE(device))
    return FG_FAIL(prop ? cudaErrorInvalidDevice : cudaErrorInvalidValue, "prop=%p, device=%d", (void *)prop, device);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "%s", fg_name);
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = (char)(0x70 + i + device * 16);
  prop->totalGlobalMem = fg_devices[device].total;
  prop->sharedMemPerBlock = (size_t)fg_device_attribute(cudaDevAttrMaxSharedMemoryPerBlock, device);
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->memPitch = 2147483647;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 << 10;
  prop->major = fg_cc_major;
  prop->minor = fg_cc_minor;
  prop->textureAlignment = 512;
  prop->texturePitchAlignment = 32;
  prop->multiProcessorCount = fg_sms;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->pciBusID = device + 1;
  prop->asyncEngineCount = 3;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 << 20;
  prop->persistingL2CacheMaxSize = 30 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->streamPrioritiesSupported = 1;
  prop->globalL1CacheSupported = 1;
  prop->localL1CacheSupported = 1;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerMultiprocessor = 65536;
  prop->managedMemory = 1;
  prop->concurrentManagedAccess = 1;
  prop->computePreemptionSupported = 1;
  prop->cooperativeLaunch = 1;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->accessPolicyMaxWindowSize = 128 << 20;
  prop->reservedSharedMemPerBlock = 1 << 10;
  prop->hostRegisterSupported = 1;
  prop->memoryPoolsSupported = 1;
#if CUDART_VERSION < 13000
  /* Fields CUDA 13 removed (deprecated in CUDA 12), from the attributes' values. */
  prop->clockRate = fg_device_attribute(cudaDevAttrClockRate, device);
  prop->memoryClockRate = fg_device_attribute(cudaDevAttrMemoryClockRate, device);
  prop->deviceOverlap = 1;
  prop->computeMode = cudaComputeModeDefault;
  prop->maxTexture1DLinear = 1 << 27;
  prop->singleToDoublePrecisionPerfRatio = 2;
  prop->cooperativeMultiDeviceLaunch = 1;
#endif
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int length, int device) {
  fg_init();
  if (bus_id == NULL || length <= 0 || !VALID_DEVICE(device))
    return FG_FAIL(bus_id && length > 0 ? cudaErrorInvalidDevice : cudaErrorInvalidValue,
                   "bus_id=%p, length=%d, device=%d", (void *)bus_id, length, device);
  snprintf(bus_id, (size_t)length, "00000000:%02X:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *bus_id) {
  fg_init();
  unsigned domain = 0, bus = 0;
  if (device == NULL || bus_id == NULL || sscanf(bus_id, "%x:%x", &domain, &bus) != 2)
    return FG_FAIL(cudaErrorInvalidValue, "device=%p, bus_id=%s", (void *)device, bus_id ? bus_id : "NULL");
  if (!VALID_DEVICE((int)bus - 1))
    return FG_FAIL(cudaErrorInvalidDevice, "device=%p, bus_id=%s", (void *)device, bus_id);
  *device = (int)bus - 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  fg_init();
  if (can == NULL) return FG_FAIL(cudaErrorInvalidValue, "can=NULL, device=%d, peer=%d", device, peer);
  *can = VALID_DEVICE(device) && VALID_DEVICE(peer) && device != peer;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  fg_init();
  return VALID_DEVICE(peer) ? cudaSuccess : FG_FAIL(cudaErrorInvalidDevice, "peer=%d, flags=0x%x", peer, flags);
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  fg_init();
  return VALID_DEVICE(peer) ? cudaSuccess : FG_FAIL(cudaErrorInvalidDevice, "peer=%d", peer);
}

cudaError_t cudaDeviceGetLimit(size_t *value, enum cudaLimit limit) {
  if (value == NULL) return FG_FAIL(cudaErrorInvalidValue, "value=NULL, limit=%d", (int)limit);
  *value = limit == cudaLimitStackSize ? 1024 : limit == cudaLimitMallocHeapSize ? (8 << 20) : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value) {
  (void)limit;
  (void)value;
  return cudaSuccess;
}

/* The driver is a CUDA 13 one (which runs CUDA 12 programs too, as a real
 * one does); the runtime is the version of the headers the set is built with. */
cudaError_t cudaDriverGetVersion(int *version) {
  if (version == NULL) return FG_FAIL(cudaErrorInvalidValue, "version=NULL");
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
  if (version == NULL) return FG_FAIL(cudaErrorInvalidValue, "version=NULL");
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return fg_take_last_error(); }
cudaError_t cudaPeekAtLastError(void) { return fg_peek_last_error(); }

/* Kernel launches: accepted and skipped; a launch into a capture is counted
 * in its graph. */

static __thread dim3 pushed_grid, pushed_block;
static __thread size_t pushed_shared;
static __thread void *pushed_stream;

/* Every launch entry point's: entry is its name. */
static cudaError_t launch(const char *entry, cudaStream_t stream) {
  fg_init();
  cudaError_t err = cudaSuccess;
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else {
    ++fg_counters[FG_KERNEL_LAUNCHES];
    fg_capture_work_locked(s, 0);
  }
  pthread_mutex_unlock(&fg_lock);
  return fg_fail(entry, err, NULL, "stream=%p", (void *)stream);
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st *stream) {
  pushed_grid = grid;
  pushed_block = block;
  pushed_shared = shared;
  pushed_stream = stream;
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, void *stream) {
  if (grid) *grid = pushed_grid;
  if (block) *block = pushed_block;
  if (shared) *shared = pushed_shared;
  if (stream) *(void **)stream = pushed_stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func) {
  if (kernel) *kernel = (cudaKernel_t)func;
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared,
                               cudaStream_t stream) {
  (void)kernel, (void)grid, (void)block, (void)args, (void)shared;
  return launch(__func__, stream);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared,
                                    cudaStream_t stream) {
  (void)kernel, (void)grid, (void)block, (void)args, (void)shared;
  return launch(__func__, stream);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t stream) {
  (void)func, (void)grid, (void)block, (void)args, (void)shared;
  return launch(__func__, stream);
}

cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                        cudaStream_t stream) {
  (void)func, (void)grid, (void)block, (void)args, (void)shared;
  return launch(__func__, stream);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
  (void)func, (void)args;
  return launch(__func__, config ? config->stream : 0);
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
  if (attr == NULL) return FG_FAIL(cudaErrorInvalidValue, "attr=NULL, func=%p", func);
  fg_init();
  memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = fg_image_version(func, fg_cc_major, fg_cc_minor);
  attr->binaryVersion = attr->ptxVersion;
  attr->maxDynamicSharedSizeBytes = 48 << 10;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  (void)func, (void)attr, (void)value;
  return cudaSuccess;
}

cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache config) {
  (void)func, (void)config;
  return cudaSuccess;
}

/* Both occupancy entry points': entry is the caller's name. */
static cudaError_t occupancy(const char *entry, int *blocks, const void *func, int block_size) {
  if (blocks == NULL) return fg_fail(entry, cudaErrorInvalidValue, NULL, "blocks=NULL, func=%p", func);
  int per_sm = block_size > 0 ? 2048 / block_size : 1;
  *blocks = per_sm < 1 ? 1 : per_sm > 32 ? 32 : per_sm;
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, const void *func, int block_size,
                                                                   size_t shared, unsigned int flags) {
  (void)shared, (void)flags;
  return occupancy(__func__, blocks, func, block_size);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func, int block_size,
                                                          size_t shared) {
  (void)shared;
  return occupancy(__func__, blocks, func, block_size);
}

cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

/* Registration at load time: each binary's architectures, and which binary each kernel is in
 * (images.c, Note [Kernel images and the card's compute capability]). */

void **__cudaRegisterFatBinary(void *fatbin) { return fg_images_register(fatbin); }

void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }
void __cudaUnregisterFatBinary(void **handle) { (void)handle; }

void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, void *tid, void *bid, void *block, void *grid, int *wsize) {
  (void)device_fun, (void)device_name, (void)thread_limit;
  (void)tid, (void)bid, (void)block, (void)grid, (void)wsize;
  fg_images_add_kernel(handle, host_fun);
}

void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name, int ext,
                       size_t size, int constant, int global) {
  (void)handle, (void)host_var, (void)device_address, (void)device_name, (void)ext, (void)size;
  (void)constant, (void)global;
}

void __cudaRegisterManagedVar(void **handle, void **host_var_ptr, char *device_address, const char *device_name,
                              int ext, size_t size, int constant, int global) {
  (void)handle, (void)host_var_ptr, (void)device_address, (void)device_name, (void)ext, (void)size;
  (void)constant, (void)global;
}

void __cudaRegisterHostVar(void **handle, const char *name, char *var, size_t size) {
  (void)handle, (void)name, (void)var, (void)size;
}

char __cudaInitModule(void **handle) {
  (void)handle;
  return 1;
}

void __cudaRegisterUnifiedTable(void *table) { (void)table; }
