/* A fake libcuda.so.1 for what loads the driver library directly (PyTorch's
 * NVRTC wrapper, libcaffe2_nvrtc.so, and Triton's launcher, which inductor's
 * compiled code calls). Modules and functions are tokens, launches are
 * skipped but counted as the runtime's (stream work, graph nodes), the primary
 * context is active, and a pointer the fake runtime handed out is device
 * memory. A call of anything else here logs "unimplemented libcuda NAME" as
 * the runtime's stubs do.
 *
 * PyTorch's allocator reaches the driver's virtual memory calls through the
 * runtime (cudaGetDriverEntryPoint, src/driver.c) from torch 2.11 on; torch 2.6
 * to 2.10 take them from this library by name (dlsym in c10/cuda/driver_api.cpp),
 * and every name on that list must exist. Those calls are forwarded to the
 * fake runtime's driver table, so both routes reach one state. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "../include/fg_log.h"

static int token;

static CUresult unimplemented(const char *name) {
  fg_log_unimplemented_line(getenv("TORCHMEM_FAKEGPU_LOG"), "libcuda ", name);
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* Every error return of an entry point here: logs "failed NAME(ARGS) = ERROR[: WHY]" (../include/fg_log.h) under
 * entry's name and returns err. A call forwarded to the fake runtime is logged there, not again here. */
__attribute__((format(printf, 4, 5))) static CUresult fail(const char *entry, CUresult err, const char *why,
                                                           const char *fmt, ...) {
  if (err == CUDA_SUCCESS || err == CUDA_ERROR_NOT_READY) return err;
  va_list args;
  va_start(args, fmt);
  fg_log_failed_line(getenv("TORCHMEM_FAKEGPU_LOG"), entry, fg_cu_error_name(err), why, fmt, args);
  va_end(args);
  return err;
}
#define CU_FAIL(err, ...) fail(__func__, (err), NULL, __VA_ARGS__)
#define CU_FAIL_WHY(err, why, ...) fail(__func__, (err), (why), __VA_ARGS__)

static int device_count(void) {
  const char *value = getenv("TORCHMEM_FAKEGPU_DEVICES");
  int n = value ? atoi(value) : 1;
  return n < 1 ? 1 : n > 64 ? 64 : n;
}

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *version) { if (version) *version = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *count) { if (count) *count = device_count(); return CUDA_SUCCESS; }

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (device == NULL || ordinal < 0 || ordinal >= device_count())
    return CU_FAIL(CUDA_ERROR_INVALID_DEVICE, "device=%p, ordinal=%d", (void *)device, ordinal);
  *device = ordinal;
  return CUDA_SUCCESS;
}

/* The fake runtime's function `name` (NULL when it is not loaded in this process). */
static void *runtime_function(const char *name) {
  return dlsym(RTLD_DEFAULT, "fakegpu_version") != NULL ? dlsym(RTLD_DEFAULT, name) : NULL;
}

/* The fake runtime's driver entry point for `name` (a function that logs
 * "unimplemented driver NAME" for a name it does not answer), or NULL when the
 * fake runtime is not loaded in this process. */
static void *runtime_entry(const char *name) {
  typedef int (*entry_fn)(const char *, void **, unsigned long long, int *);
  static entry_fn entry;
  if (entry == NULL) entry = (entry_fn)runtime_function("cudaGetDriverEntryPoint");
  if (entry == NULL) return NULL;
  void *function = NULL;
  int status = 0;
  return entry(name, &function, 0, &status) == 0 ? function : NULL;
}

/* FORWARD(name, (parameters), (arguments)): exports `name` (by its assembler
 * name, so cuda.h's renaming macros such as cuStreamWriteValue32 -> _v2 do not
 * apply) as a call of the runtime's entry point of that name. */
#define FORWARD(name, params, args)                                                  \
  CUresult fg_forward_##name params __asm__(#name);                                  \
  CUresult fg_forward_##name params {                                                \
    CUresult(*function) params = (CUresult(*) params)runtime_entry(#name);           \
    return function != NULL ? function args : unimplemented(#name);                  \
  }

FORWARD(cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                      unsigned long long flags), (handle, size, prop, flags))
FORWARD(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))
FORWARD(cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                              unsigned long long flags), (ptr, size, alignment, addr, flags))
FORWARD(cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size))
FORWARD(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags), (ptr, size, offset, handle, flags))
FORWARD(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))
FORWARD(cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count),
        (ptr, size, desc, count))
FORWARD(cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop,
                                        CUmemAllocationGranularity_flags option), (granularity, prop, option))
/* On torch 2.6-2.10's list, not answered by the runtime's table: they log when called. */
FORWARD(cuMemExportToShareableHandle, (void *shareable, CUmemGenericAllocationHandle handle, int type,
                                       unsigned long long flags), (shareable, handle, type, flags))
FORWARD(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *handle, void *shareable, int type),
        (handle, shareable, type))
FORWARD(cuMemsetD32Async, (CUdeviceptr ptr, unsigned int value, size_t count, CUstream stream),
        (ptr, value, count, stream))
FORWARD(cuStreamWriteValue32, (CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned int flags),
        (stream, address, value, flags))
FORWARD(cuMulticastCreate, (void *handle, const void *prop), (handle, prop))
FORWARD(cuMulticastAddDevice, (CUmemGenericAllocationHandle handle, CUdevice device), (handle, device))
FORWARD(cuMulticastBindMem, (CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle mem,
                             size_t mem_offset, size_t size, unsigned long long flags),
        (mc, mc_offset, mem, mem_offset, size, flags))

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice device) {
  CUresult (*answer)(int *, CUdevice_attribute, CUdevice) =
      (CUresult(*)(int *, CUdevice_attribute, CUdevice))runtime_entry("cuDeviceGetAttribute");
  if (answer != NULL) return answer(value, attr, device);
  if (value == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "value=NULL, attr=%d, device=%d", (int)attr, device);
  const char *cc = getenv("TORCHMEM_FAKEGPU_CC");
  int major = 9, minor = 0;
  if (cc) sscanf(cc, "%d.%d", &major, &minor);
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = minor; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 227 << 10; break;
    default: *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active) {
  (void)device;
  if (flags) *flags = 0;
  if (active) *active = 1;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
  (void)device;
  if (context) *context = (CUcontext)&token;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *context) { if (context) *context = (CUcontext)&token; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext context) { (void)context; return CUDA_SUCCESS; }

CUresult cuGetErrorString(CUresult error, const char **text) {
  if (text == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "error=%d, text=NULL", (int)error);
  *text = error == CUDA_SUCCESS ? "no error" : "error (torchmem fake GPU)";
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  (void)image;
  if (module) *module = (CUmodule)&token;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, CUjit_option *options, void **values) {
  (void)n, (void)options, (void)values;
  return cuModuleLoadData(module, image);
}

CUresult cuModuleLoad(CUmodule *module, const char *path) { (void)path; return cuModuleLoadData(module, NULL); }
CUresult cuModuleUnload(CUmodule module) { (void)module; return CUDA_SUCCESS; }

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
  (void)module, (void)name;
  if (function) *function = (CUfunction)&token;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attr, CUfunction function) {
  if (value == NULL)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "value=NULL, attr=%d, function=%p", (int)attr, (void *)function);
  *value = attr == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : attr == CU_FUNC_ATTRIBUTE_NUM_REGS ? 32 : 0;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attr, int value) {
  (void)function, (void)attr, (void)value;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config) { (void)function, (void)config; return CUDA_SUCCESS; }

/* A launch is the runtime's (skipped, yet counted as work on its stream and as
 * a node of the graph a capturing stream builds); without the fake runtime, a no-op. */
static CUresult launch_on(const char *entry, CUstream stream) {
  cudaError_t (*runtime_launch)(const void *, dim3, dim3, void **, size_t, cudaStream_t) =
      (cudaError_t(*)(const void *, dim3, dim3, void **, size_t, cudaStream_t))runtime_function("cudaLaunchKernel");
  if (runtime_launch == NULL) return CUDA_SUCCESS;
  dim3 one = {1, 1, 1};
  if (runtime_launch(NULL, one, one, NULL, 0, (cudaStream_t)stream) == cudaSuccess) return CUDA_SUCCESS;
  return fail(entry, CUDA_ERROR_LAUNCH_FAILED, "the runtime refused the launch", "stream=%p", (void *)stream);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)params, (void)extra;
  return launch_on(__func__, stream);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, CUstream stream, void **params) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)params;
  return launch_on(__func__, stream);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f, int block_size, size_t shared) {
  (void)f, (void)shared;
  if (blocks) *blocks = block_size > 0 && 2048 / block_size > 0 ? 2048 / block_size : 1;
  return CUDA_SUCCESS;
}

CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *options, void **values, CUlinkState *state) {
  (void)n, (void)options, (void)values;
  if (state) *state = (CUlinkState)&token;
  return CUDA_SUCCESS;
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                          unsigned int n, CUjit_option *options, void **values) {
  (void)state, (void)type, (void)data, (void)size, (void)name, (void)n, (void)options, (void)values;
  return CUDA_SUCCESS;
}

CUresult cuLinkComplete(CUlinkState state, void **cubin, size_t *size) {
  (void)state;
  if (cubin) *cubin = &token;
  if (size) *size = sizeof token;
  return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state) { (void)state; return CUDA_SUCCESS; }

/* The runtime's current device is the context's (one primary context per device). */
CUresult cuCtxGetDevice(CUdevice *device) {
  if (device == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "device=NULL");
  cudaError_t (*get)(int *) = (cudaError_t(*)(int *))runtime_function("cudaGetDevice");
  int current = 0;
  if (get != NULL && get(&current) != cudaSuccess)
    return CU_FAIL_WHY(CUDA_ERROR_INVALID_CONTEXT, "cudaGetDevice failed", "device=%p", (void *)device);
  *device = current;
  return CUDA_SUCCESS;
}

static size_t printf_fifo = 1 << 20, malloc_heap = 8 << 20, stack_size = 1024;

static size_t *limit_of(CUlimit limit) {
  switch (limit) {
    case CU_LIMIT_PRINTF_FIFO_SIZE: return &printf_fifo;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return &malloc_heap;
    case CU_LIMIT_STACK_SIZE: return &stack_size;
    default: return NULL;
  }
}

CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
  size_t *held = limit_of(limit);
  if (value == NULL || held == NULL)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "value=%p, limit=%d", (void *)value, (int)limit);
  *value = *held;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  size_t *held = limit_of(limit);
  if (held == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "limit=%d, value=%zu", (int)limit, value);
  *held = value;
  return CUDA_SUCCESS;
}

/* Answered from the runtime's cudaPointerGetAttributes: a pointer the fake GPU
 * handed out is device memory of its device (Triton's launcher asks this of
 * every tensor argument); anything else is refused as the driver refuses a
 * host pointer it does not know. */
/* Both pointer queries', under the caller's name. */
static CUresult pointer_attribute(const char *entry, void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (data == NULL)
    return fail(entry, CUDA_ERROR_INVALID_VALUE, NULL, "data=NULL, attr=%d, ptr=%p", (int)attr, (void *)(uintptr_t)ptr);
  cudaError_t (*get)(struct cudaPointerAttributes *, const void *) =
      (cudaError_t(*)(struct cudaPointerAttributes *, const void *))runtime_function("cudaPointerGetAttributes");
  if (get == NULL) return unimplemented(entry);
  struct cudaPointerAttributes found;
  if (get(&found, (const void *)(uintptr_t)ptr) != cudaSuccess || found.type == cudaMemoryTypeUnregistered)
    return fail(entry, CUDA_ERROR_INVALID_VALUE, "not memory the fake GPU gave", "data=%p, attr=%d, ptr=%p", data,
                (int)attr, (void *)(uintptr_t)ptr);
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(CUmemorytype *)data = found.type == cudaMemoryTypeHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = found.device; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)&token; return CUDA_SUCCESS;
    default: return unimplemented("cuPointerGetAttribute (that attribute)");
  }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  return pointer_attribute(__func__, data, attr, ptr);
}

CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr) {
  if (attrs == NULL || data == NULL)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "count=%u, attrs=%p, data=%p, ptr=%p", count, (void *)attrs,
                   (void *)data, (void *)(uintptr_t)ptr);
  for (unsigned int i = 0; i < count; i++) {
    CUresult status = pointer_attribute(__func__, data[i], attrs[i], ptr);
    if (status != CUDA_SUCCESS) return status; /* logged */
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  (void)f, (void)params, (void)extra;
  return config == NULL ? CU_FAIL(CUDA_ERROR_INVALID_VALUE, "config=NULL, f=%p", (void *)f)
                        : launch_on(__func__, config->hStream);
}

/* One cluster per multiprocessor: what the card can hold at once, for Triton's occupancy query. */
CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f, const CUlaunchConfig *config) {
  if (clusters == NULL)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "clusters=NULL, f=%p, config=%p", (void *)f, (const void *)config);
  int sms = 0;
  if (cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) != CUDA_SUCCESS || sms < 1) sms = 1;
  *clusters = sms;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeIm2col(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                                 const cuuint64_t *dims, const cuuint64_t *strides, const int *lower,
                                 const int *upper, cuuint32_t channels, cuuint32_t pixels,
                                 const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                                 CUtensorMapFloatOOBfill fill) {
  (void)type, (void)rank, (void)address, (void)dims, (void)strides, (void)lower, (void)upper, (void)channels;
  (void)pixels, (void)element_strides, (void)interleave, (void)swizzle, (void)promotion, (void)fill;
  if (map) memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                                CUtensorMapFloatOOBfill fill) {
  (void)type, (void)rank, (void)address, (void)dims, (void)strides, (void)box, (void)element_strides;
  (void)interleave, (void)swizzle, (void)promotion, (void)fill;
  if (map) memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}
