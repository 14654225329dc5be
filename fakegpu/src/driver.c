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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#include "state.h"

#define PHYSICAL_FILE_SIZE (1ULL << 46)

struct physical {
  unsigned long long offset;
  size_t size;
  int device;
};

static int physical_fd = -1;
static unsigned long long physical_next = 0;

static CUresult vmm_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                           unsigned long long flags) {
  (void)flags;
  if (handle == NULL || size == 0 || size % FG_GRANULE != 0) return CUDA_ERROR_INVALID_VALUE;
  int device = prop ? prop->location.id : fg_current_device();
  if (device < 0 || device >= fg_device_count) return CUDA_ERROR_INVALID_DEVICE;
  struct physical *p = malloc(sizeof *p);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult result = CUDA_SUCCESS;
  pthread_mutex_lock(&fg_lock);
  if (physical_fd < 0) {
    physical_fd = memfd_create("torchmem-fakegpu", MFD_CLOEXEC);
    if (physical_fd < 0 || ftruncate(physical_fd, (off_t)PHYSICAL_FILE_SIZE) != 0) result = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (result == CUDA_SUCCESS && (physical_next + size > PHYSICAL_FILE_SIZE || fg_charge_locked(device, size) != 0))
    result = CUDA_ERROR_OUT_OF_MEMORY;
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
    return result;
  }
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult vmm_release(CUmemGenericAllocationHandle handle) {
  struct physical *p = (struct physical *)(uintptr_t)handle;
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fg_lock);
  fg_refund_locked(p->device, p->size);
  ++fg_counters[FG_VMM_RELEASES];
  pthread_mutex_unlock(&fg_lock);
  fallocate(physical_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p->offset, (off_t)p->size);
  free(p);
  return CUDA_SUCCESS;
}

static CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                            unsigned long long flags) {
  (void)alignment, (void)addr, (void)flags;
  if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = fg_map_aligned(size, PROT_NONE);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fg_lock);
  fg_memory_add_locked(p, size, fg_current_device(), FG_KIND_RESERVED);
  pthread_mutex_unlock(&fg_lock);
  *ptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult vmm_address_free(CUdeviceptr ptr, size_t size) {
  pthread_mutex_lock(&fg_lock);
  int found = fg_memory_remove_locked((void *)(uintptr_t)ptr, NULL, NULL, NULL);
  pthread_mutex_unlock(&fg_lock);
  if (!found) return CUDA_ERROR_INVALID_VALUE;
  fg_unmap_aligned((void *)(uintptr_t)ptr, size);
  return CUDA_SUCCESS;
}

static CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                        unsigned long long flags) {
  (void)flags;
  struct physical *p = (struct physical *)(uintptr_t)handle;
  if (p == NULL || offset + size > p->size) return CUDA_ERROR_INVALID_VALUE;
  void *at = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, physical_fd,
                  (off_t)(p->offset + offset));
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fg_lock);
  ++fg_counters[FG_VMM_MAPS];
  pthread_mutex_unlock(&fg_lock);
  return CUDA_SUCCESS;
}

static CUresult vmm_unmap(CUdeviceptr ptr, size_t size) {
  pthread_mutex_lock(&fg_lock);
  int refused = fg_unsafe_call_refused_locked();
  if (!refused) ++fg_counters[FG_VMM_UNMAPS];
  pthread_mutex_unlock(&fg_lock);
  if (refused) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  fg_contents_forget((void *)(uintptr_t)ptr, size);
  void *at = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                  -1, 0);
  return at == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  (void)ptr, (void)size, (void)desc, (void)count;
  return CUDA_SUCCESS;
}

static CUresult vmm_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option) {
  (void)prop, (void)option;
  if (granularity == NULL) return CUDA_ERROR_INVALID_VALUE;
  *granularity = FG_GRANULE;
  return CUDA_SUCCESS;
}

static CUresult address_range(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  void *b = NULL;
  size_t s = 0;
  pthread_mutex_lock(&fg_lock);
  int found = fg_memory_find_locked((void *)(uintptr_t)ptr, &b, &s, NULL, NULL);
  pthread_mutex_unlock(&fg_lock);
  if (!found) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = (CUdeviceptr)(uintptr_t)b;
  if (size) *size = s;
  return CUDA_SUCCESS;
}

static CUresult device_attribute(int *value, CUdevice_attribute attr, CUdevice device) {
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= fg_device_count) return CUDA_ERROR_INVALID_DEVICE;
  *value = fg_device_attribute((int)attr, device);
  return CUDA_SUCCESS;
}

static CUresult error_string(CUresult error, const char **text) {
  if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
  *text = cudaGetErrorString((cudaError_t)error);
  return CUDA_SUCCESS;
}

static CUresult device_get(CUdevice *device, int ordinal) {
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= fg_device_count) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

static int context_token;

static CUresult context_current(CUcontext *context) {
  if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
  *context = (CUcontext)&context_token;
  return CUDA_SUCCESS;
}

static CUresult primary_context_state(CUdevice device, unsigned int *flags, int *active) {
  (void)device;
  if (flags) *flags = 0;
  if (active) *active = 1;
  return CUDA_SUCCESS;
}

/* CUDA's log callbacks: registered, never called (the fake has nothing to log). */
static int log_token;

static CUresult logs_register(void *callback, void *data, void **handle) {
  (void)callback, (void)data;
  if (handle) *handle = &log_token;
  return CUDA_SUCCESS;
}

static CUresult logs_unregister(void *handle) {
  (void)handle;
  return CUDA_SUCCESS;
}

struct entry {
  const char *name;
  void *function;
};

static const struct entry table[] = {
    {"cuMemCreate", (void *)vmm_create},
    {"cuMemRelease", (void *)vmm_release},
    {"cuMemAddressReserve", (void *)vmm_reserve},
    {"cuMemAddressFree", (void *)vmm_address_free},
    {"cuMemMap", (void *)vmm_map},
    {"cuMemUnmap", (void *)vmm_unmap},
    {"cuMemSetAccess", (void *)vmm_set_access},
    {"cuMemGetAllocationGranularity", (void *)vmm_granularity},
    {"cuMemGetAddressRange", (void *)address_range},
    {"cuDeviceGetAttribute", (void *)device_attribute},
    {"cuGetErrorString", (void *)error_string},
    {"cuDeviceGet", (void *)device_get},
    {"cuCtxGetCurrent", (void *)context_current},
    {"cuDevicePrimaryCtxGetState", (void *)primary_context_state},
    {"cuLogsRegisterCallback", (void *)logs_register},
    {"cuLogsUnregisterCallback", (void *)logs_unregister},
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

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  fg_init();
  if (symbol == NULL || function == NULL) return fg_ret(cudaErrorInvalidValue);
  *function = lookup(symbol);
  if (status) *status = *function ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **function, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *status) {
  return cudaGetDriverEntryPointByVersion(symbol, function, 13000, flags, status);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **function, unsigned int version,
                                                  unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult *status) {
  return cudaGetDriverEntryPointByVersion(symbol, function, version, flags, status);
}

cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **function, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *status) {
  return cudaGetDriverEntryPointByVersion(symbol, function, 13000, flags, status);
}
