/* The driver entry points PyTorch asks the runtime for
 * (cudaGetDriverEntryPoint[ByVersion]): CUDA's virtual memory calls for
 * expandable segments, with real backing memory, and a few queries.
 *
 * Physical memory (cuMemCreate) is a range of one sparse memfd per process;
 * cuMemMap maps that range at the reserved address (MAP_SHARED|MAP_FIXED), so
 * two mappings of one handle share pages as on a GPU; cuMemRelease punches
 * the range out of the file. Reserved ranges are PROT_NONE anonymous maps.
 * Nothing writes those pages (Note [Device memory holds no data]), so the
 * file stays a hole and costs the host nothing.
 *
 * A name the table does not know gets a function that logs
 * "unimplemented driver NAME" when called and returns CUDA_ERROR_NOT_SUPPORTED
 * (one of FG_DRIVER_SLOTS such functions, each bound to one name). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#include "../include/fg_log.h"
#include "state.h"

#define PHYSICAL_FILE_SIZE (1ULL << 46)

struct physical {
  unsigned long long offset;
  size_t size;
  int device;
};

static int physical_fd = -1;
static unsigned long long physical_next = 0;

/* Each driver entry point here is named fake_ and the driver's name (the table's ENTRY). CU_FAIL is every error
 * return: it counts and logs the call under the driver's name (fg_log_failed) and returns err; CUDA_SUCCESS is
 * returned as it is. The driver's results leave the runtime's last error alone. */
#define CU_FAIL(err, ...) cu_fail(__func__ + sizeof "fake_" - 1, (err), NULL, __VA_ARGS__)
#define CU_FAIL_WHY(err, why, ...) cu_fail(__func__ + sizeof "fake_" - 1, (err), (why), __VA_ARGS__)

__attribute__((format(printf, 4, 5))) static CUresult cu_fail(const char *entry, CUresult err, const char *why,
                                                              const char *fmt, ...) {
  if (err == CUDA_SUCCESS || err == CUDA_ERROR_NOT_READY) return err;
  va_list args;
  va_start(args, fmt);
  fg_log_failed(entry, fg_cu_error_name(err), why, fmt, args);
  va_end(args);
  return err;
}

static CUresult fake_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
  int device = prop ? prop->location.id : fg_current_device();
  if (handle == NULL || size == 0 || size % FG_GRANULE != 0)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "handle=%p, size=%zu, device=%d, flags=0x%llx", (void *)handle, size,
                   device, flags);
  if (device < 0 || device >= fg_device_count)
    return CU_FAIL(CUDA_ERROR_INVALID_DEVICE, "handle=%p, size=%zu, device=%d, flags=0x%llx", (void *)handle, size,
                   device, flags);
  struct physical *p = malloc(sizeof *p);
  if (p == NULL) return CU_FAIL_WHY(CUDA_ERROR_OUT_OF_MEMORY, "host memory", "size=%zu, device=%d", size, device);
  CUresult result = CUDA_SUCCESS;
  const char *why = NULL;
  pthread_mutex_lock(&fg_lock);
  if (physical_fd < 0) {
    physical_fd = memfd_create("torchmem-fakegpu", MFD_CLOEXEC);
    if (physical_fd < 0 || ftruncate(physical_fd, (off_t)PHYSICAL_FILE_SIZE) != 0) {
      result = CUDA_ERROR_OUT_OF_MEMORY;
      why = "no memfd for physical memory";
    }
  }
  if (result == CUDA_SUCCESS && physical_next + size > PHYSICAL_FILE_SIZE) {
    result = CUDA_ERROR_OUT_OF_MEMORY;
    why = "physical memory file full";
  }
  if (result == CUDA_SUCCESS && fg_charge_locked(device, size) != 0) result = CUDA_ERROR_OUT_OF_MEMORY;
  if (result == CUDA_SUCCESS) {
    p->offset = physical_next;
    p->size = size;
    p->device = device;
    physical_next += size;
    ++fg_counters[FG_VMM_CREATES];
  }
  pthread_mutex_unlock(&fg_lock);
  if (result != CUDA_SUCCESS) {
    free(p);
    return CU_FAIL_WHY(result, why, "size=%zu, device=%d", size, device);
  }
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  struct physical *p = (struct physical *)(uintptr_t)handle;
  if (p == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "handle=NULL");
  pthread_mutex_lock(&fg_lock);
  fg_refund_locked(p->device, p->size);
  ++fg_counters[FG_VMM_RELEASES];
  pthread_mutex_unlock(&fg_lock);
  fallocate(physical_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p->offset, (off_t)p->size);
  free(p);
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags) {
  if (ptr == NULL || size == 0)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "ptr=%p, size=%zu, alignment=%zu, addr=%p, flags=0x%llx", (void *)ptr,
                   size, alignment, (void *)(uintptr_t)addr, flags);
  void *p = fg_map_aligned(size, PROT_NONE);
  if (p == NULL)
    return CU_FAIL_WHY(CUDA_ERROR_OUT_OF_MEMORY, "no device addresses left", "size=%zu, alignment=%zu", size,
                       alignment);
  pthread_mutex_lock(&fg_lock);
  fg_memory_add_locked(p, size, fg_current_device(), FG_KIND_RESERVED);
  pthread_mutex_unlock(&fg_lock);
  *ptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  pthread_mutex_lock(&fg_lock);
  int found = fg_memory_remove_locked((void *)(uintptr_t)ptr, NULL, NULL, NULL);
  pthread_mutex_unlock(&fg_lock);
  if (!found)
    return CU_FAIL_WHY(CUDA_ERROR_INVALID_VALUE, "not a reserved address", "ptr=%p, size=%zu", (void *)(uintptr_t)ptr,
                       size);
  fg_unmap_device_range((void *)(uintptr_t)ptr, size);
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
  struct physical *p = (struct physical *)(uintptr_t)handle;
  if (p == NULL || offset + size > p->size)
    return CU_FAIL_WHY(CUDA_ERROR_INVALID_VALUE, p ? "past the handle's end" : NULL,
                       "ptr=%p, size=%zu, offset=%zu, handle=%p, flags=0x%llx", (void *)(uintptr_t)ptr, size, offset,
                       (void *)p, flags);
  void *at = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, physical_fd,
                  (off_t)(p->offset + offset));
  if (at == MAP_FAILED)
    return CU_FAIL_WHY(CUDA_ERROR_OUT_OF_MEMORY, "mmap failed", "ptr=%p, size=%zu, offset=%zu, handle=%p",
                       (void *)(uintptr_t)ptr, size, offset, (void *)p);
  pthread_mutex_lock(&fg_lock);
  ++fg_counters[FG_VMM_MAPS];
  pthread_mutex_unlock(&fg_lock);
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  pthread_mutex_lock(&fg_lock);
  int refused = fg_unsafe_call_refused_locked();
  if (!refused) ++fg_counters[FG_VMM_UNMAPS];
  pthread_mutex_unlock(&fg_lock);
  if (refused)
    return CU_FAIL_WHY(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during a stream capture", "ptr=%p, size=%zu",
                       (void *)(uintptr_t)ptr, size);
  fg_contents_forget((void *)(uintptr_t)ptr, size);
  void *at = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                  -1, 0);
  if (at == MAP_FAILED)
    return CU_FAIL_WHY(CUDA_ERROR_INVALID_VALUE, "mmap failed", "ptr=%p, size=%zu", (void *)(uintptr_t)ptr, size);
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  (void)ptr, (void)size, (void)desc, (void)count;
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags option) {
  if (granularity == NULL)
    return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "granularity=NULL, prop=%p, option=%d", (const void *)prop, (int)option);
  *granularity = FG_GRANULE;
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  void *b = NULL;
  size_t s = 0;
  pthread_mutex_lock(&fg_lock);
  int found = fg_memory_find_locked((void *)(uintptr_t)ptr, &b, &s, NULL, NULL);
  pthread_mutex_unlock(&fg_lock);
  if (!found) return CU_FAIL_WHY(CUDA_ERROR_NOT_FOUND, "not device memory", "ptr=%p", (void *)(uintptr_t)ptr);
  if (base) *base = (CUdeviceptr)(uintptr_t)b;
  if (size) *size = s;
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice device) {
  if (value == NULL || device < 0 || device >= fg_device_count)
    return CU_FAIL(value ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE, "value=%p, attr=%d, device=%d",
                   (void *)value, (int)attr, device);
  *value = fg_device_attribute((int)attr, device);
  return CUDA_SUCCESS;
}

static CUresult fake_cuGetErrorString(CUresult error, const char **text) {
  if (text == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "error=%d, text=NULL", (int)error);
  *text = cudaGetErrorString((cudaError_t)error);
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGet(CUdevice *device, int ordinal) {
  if (device == NULL || ordinal < 0 || ordinal >= fg_device_count)
    return CU_FAIL(device ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE, "device=%p, ordinal=%d",
                   (void *)device, ordinal);
  *device = ordinal;
  return CUDA_SUCCESS;
}

static int context_token;

static CUresult fake_cuCtxGetCurrent(CUcontext *context) {
  if (context == NULL) return CU_FAIL(CUDA_ERROR_INVALID_VALUE, "context=NULL");
  *context = (CUcontext)&context_token;
  return CUDA_SUCCESS;
}

static CUresult fake_cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active) {
  (void)device;
  if (flags) *flags = 0;
  if (active) *active = 1;
  return CUDA_SUCCESS;
}

/* CUDA's log callbacks: registered, never called (the fake has nothing to log). */
static int log_token;

static CUresult fake_cuLogsRegisterCallback(void *callback, void *data, void **handle) {
  (void)callback, (void)data;
  if (handle) *handle = &log_token;
  return CUDA_SUCCESS;
}

static CUresult fake_cuLogsUnregisterCallback(void *handle) {
  (void)handle;
  return CUDA_SUCCESS;
}

struct entry {
  const char *name;
  void *function;
};

#define ENTRY(name) {#name, (void *)fake_##name}
static const struct entry table[] = {
    ENTRY(cuMemCreate),          ENTRY(cuMemRelease),          ENTRY(cuMemAddressReserve),
    ENTRY(cuMemAddressFree),     ENTRY(cuMemMap),              ENTRY(cuMemUnmap),
    ENTRY(cuMemSetAccess),       ENTRY(cuMemGetAllocationGranularity), ENTRY(cuMemGetAddressRange),
    ENTRY(cuDeviceGetAttribute), ENTRY(cuGetErrorString),      ENTRY(cuDeviceGet),
    ENTRY(cuCtxGetCurrent),      ENTRY(cuDevicePrimaryCtxGetState), ENTRY(cuLogsRegisterCallback),
    ENTRY(cuLogsUnregisterCallback),
};

/* Functions for names the table does not know: each slot logs its name. */
#define FG_DRIVER_SLOTS 64
static const char *slot_names[FG_DRIVER_SLOTS];
static int slots_used = 0;

static CUresult slot_call(int slot) {
  char name[160];
  snprintf(name, sizeof name, "driver %s", slot_names[slot]);
  fg_log_unimplemented(name);
  return CUDA_ERROR_NOT_SUPPORTED;
}

#define SLOT(a, b) static CUresult slot_##a##b(void) { return slot_call((a) * 8 + (b)); }
#define SLOTS8(a) SLOT(a, 0) SLOT(a, 1) SLOT(a, 2) SLOT(a, 3) SLOT(a, 4) SLOT(a, 5) SLOT(a, 6) SLOT(a, 7)
SLOTS8(0) SLOTS8(1) SLOTS8(2) SLOTS8(3) SLOTS8(4) SLOTS8(5) SLOTS8(6) SLOTS8(7)
#define REF8(a) (void *)slot_##a##0, (void *)slot_##a##1, (void *)slot_##a##2, (void *)slot_##a##3, \
                (void *)slot_##a##4, (void *)slot_##a##5, (void *)slot_##a##6, (void *)slot_##a##7
static void *const slot_functions[FG_DRIVER_SLOTS] = {REF8(0), REF8(1), REF8(2), REF8(3),
                                                      REF8(4), REF8(5), REF8(6), REF8(7)};

static void *lookup(const char *symbol) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (strcmp(table[i].name, symbol) == 0) return table[i].function;
  void *found = NULL;
  pthread_mutex_lock(&fg_lock);
  for (int i = 0; i < slots_used && !found; ++i)
    if (strcmp(slot_names[i], symbol) == 0) found = slot_functions[i];
  if (!found && slots_used < FG_DRIVER_SLOTS) {
    slot_names[slots_used] = strdup(symbol);
    found = slot_functions[slots_used++];
  }
  pthread_mutex_unlock(&fg_lock);
  return found;
}

/* Every cudaGetDriverEntryPoint variant's, under the caller's name. */
static cudaError_t entry_point(const char *entry, const char *symbol, void **function,
                               enum cudaDriverEntryPointQueryResult *status) {
  fg_init();
  if (symbol == NULL || function == NULL)
    return fg_fail(entry, cudaErrorInvalidValue, NULL, "symbol=%s, function=%p", symbol ? symbol : "NULL",
                   (void *)function);
  *function = lookup(symbol);
  if (status) *status = *function ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  return entry_point(__func__, symbol, function, status);
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **function, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *status) {
  (void)flags;
  return entry_point(__func__, symbol, function, status);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **function, unsigned int version,
                                                  unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  return entry_point(__func__, symbol, function, status);
}

cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **function, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *status) {
  (void)flags;
  return entry_point(__func__, symbol, function, status);
}
