/* Device memory as host address space: cudaMalloc takes a range of the device
 * address space (address_space.c; never backed), copies and memsets follow
 * Note [Device memory holds no data] (contents.c), pinned host memory is
 * real, malloc'ed memory. A card's capacity is charged in 2 MiB units. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "state.h"

cudaError_t cudaMalloc(void **ptr, size_t size) {
  if (ptr == NULL) return FG_FAIL(cudaErrorInvalidValue, "ptr=NULL, size=%zu", size);
  *ptr = NULL;
  if (size == 0) return cudaSuccess;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  int device = fg_current_device();
  ++fg_counters[FG_MALLOC_CALLS];
  /* Unsafe during a capture unless the thread is relaxed (PyTorch switches). */
  if (fg_unsafe_call_refused_locked()) {
    pthread_mutex_unlock(&fg_lock);
    return FG_FAIL_WHY(cudaErrorStreamCaptureUnsupported, "during a stream capture", "size=%zu", size);
  }
  int charged = fg_charge_locked(device, size) == 0;
  pthread_mutex_unlock(&fg_lock);
  void *p = charged ? fg_map_device(size, PROT_READ | PROT_WRITE) : NULL;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  if (p != NULL) fg_memory_add_locked(p, size, device, FG_KIND_DEVICE);
  else {
    if (charged) fg_refund_locked(device, size);
    ++fg_counters[FG_FAILED_MALLOCS];
  }
  pthread_mutex_unlock(&fg_lock);
  if (p == NULL)
    return FG_FAIL_WHY(cudaErrorMemoryAllocation, charged ? "no device addresses left" : NULL, "size=%zu", size);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  if (ptr == NULL) return cudaSuccess;
  size_t size = 0;
  int device = 0, kind = 0;
  cudaError_t err = cudaSuccess;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  if (fg_unsafe_call_refused_locked()) err = cudaErrorStreamCaptureUnsupported;
  else if (!fg_memory_find_locked(ptr, NULL, NULL, NULL, &kind) || kind != FG_KIND_DEVICE ||
           !fg_memory_remove_locked(ptr, &size, &device, &kind))
    err = cudaErrorInvalidValue;
  else {
    ++fg_counters[FG_FREE_CALLS];
    fg_refund_locked(device, size);
  }
  pthread_mutex_unlock(&fg_lock);
  if (err == cudaSuccess) fg_unmap_device_range(ptr, size);
  return FG_FAIL_WHY(err, err == cudaErrorInvalidValue ? "not an address cudaMalloc gave" : "during a stream capture",
                     "ptr=%p", ptr);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  const struct fg_device *d = &fg_devices[fg_current_device()];
  if (free_bytes) *free_bytes = d->total - d->used;
  if (total_bytes) *total_bytes = d->total;
  pthread_mutex_unlock(&fg_lock);
  return cudaSuccess;
}

/* A copy or memset runs at once unless its stream is capturing: *run says whether it runs now. An unknown
 * stream fails the call, logged under entry, the caller's name. */
static cudaError_t on_stream(const char *entry, cudaStream_t stream, int *run) {
  cudaError_t err = cudaSuccess;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else {
    ++fg_counters[FG_MEMCPY_CALLS];
    *run = !fg_capture_work_locked(s, 1);
  }
  pthread_mutex_unlock(&fg_lock);
  return fg_fail(entry, err, NULL, "stream=%p", (void *)stream);
}

/* Every copy entry point's: count bytes from src to dst on stream, under the caller's name. */
static cudaError_t copy(const char *entry, void *dst, const void *src, size_t count, cudaStream_t stream) {
  int run = 0;
  cudaError_t err = on_stream(entry, stream, &run);
  if (err == cudaSuccess && run) fg_contents_copy(dst, src, count);
  return err;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  return copy(__func__, dst, src, count, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  return copy(__func__, dst, src, count, 0);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t count,
                                cudaStream_t stream) {
  (void)dst_device, (void)src_device;
  return copy(__func__, dst, src, count, stream);
}

cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t count) {
  (void)dst_device, (void)src_device;
  return copy(__func__, dst, src, count, 0);
}

static cudaError_t copy_2d(const char *entry, void *dst, size_t dpitch, const void *src, size_t spitch,
                           size_t width, size_t height, cudaStream_t stream) {
  int run = 0;
  cudaError_t err = on_stream(entry, stream, &run);
  if (err == cudaSuccess && run)
    for (size_t row = 0; row < height; ++row)
      fg_contents_copy((char *)dst + row * dpitch, (const char *)src + row * spitch, width);
  return err;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  return copy_2d(__func__, dst, dpitch, src, spitch, width, height, stream);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind) {
  (void)kind;
  return copy_2d(__func__, dst, dpitch, src, spitch, width, height, 0);
}

static cudaError_t fill(const char *entry, void *ptr, int value, size_t count, cudaStream_t stream) {
  int run = 0;
  cudaError_t err = on_stream(entry, stream, &run);
  if (err == cudaSuccess && run) fg_contents_fill(ptr, value, count);
  return err;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  return fill(__func__, ptr, value, count, stream);
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) { return fill(__func__, ptr, value, count, 0); }

cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count, size_t offset,
                                    enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  return copy(__func__, (char *)symbol + offset, src, count, stream);
}

cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               enum cudaMemcpyKind kind) {
  (void)kind;
  return copy(__func__, (char *)symbol + offset, src, count, 0);
}

cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset,
                                      enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  return copy(__func__, dst, (const char *)symbol + offset, count, stream);
}

cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                 enum cudaMemcpyKind kind) {
  (void)kind;
  return copy(__func__, dst, (const char *)symbol + offset, count, 0);
}

cudaError_t cudaGetSymbolAddress(void **ptr, const void *symbol) {
  if (ptr == NULL) return FG_FAIL(cudaErrorInvalidValue, "ptr=NULL, symbol=%p", symbol);
  *ptr = (void *)symbol; /* a registered variable lives at its host shadow */
  return cudaSuccess;
}

cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol) {
  (void)symbol;
  if (size == NULL) return FG_FAIL(cudaErrorInvalidValue, "size=NULL, symbol=%p", symbol);
  *size = 0;
  return cudaSuccess;
}

/* Pinned host memory. */

/* Both pinned allocations': under the caller's name. */
static cudaError_t host_alloc(const char *entry, void **ptr, size_t size, unsigned int flags) {
  if (ptr == NULL) return fg_fail(entry, cudaErrorInvalidValue, NULL, "ptr=NULL, size=%zu, flags=0x%x", size, flags);
  void *p = NULL;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0)
    return fg_fail(entry, cudaErrorMemoryAllocation, "host memory", "size=%zu, flags=0x%x", size, flags);
  fg_init();
  pthread_mutex_lock(&fg_lock);
  fg_memory_add_locked(p, size, fg_current_device(), FG_KIND_HOST);
  pthread_mutex_unlock(&fg_lock);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  return host_alloc(__func__, ptr, size, flags);
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return host_alloc(__func__, ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr) {
  if (ptr == NULL) return cudaSuccess;
  int kind = 0, found;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  found = fg_memory_find_locked(ptr, NULL, NULL, NULL, &kind) && kind == FG_KIND_HOST &&
          fg_memory_remove_locked(ptr, NULL, NULL, NULL);
  pthread_mutex_unlock(&fg_lock);
  if (!found) return FG_FAIL_WHY(cudaErrorInvalidValue, "not an address cudaHostAlloc gave", "ptr=%p", ptr);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  (void)ptr;
  (void)size;
  (void)flags;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
  (void)ptr;
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned int flags) {
  (void)flags;
  if (device_ptr == NULL) return FG_FAIL(cudaErrorInvalidValue, "device_ptr=NULL, host_ptr=%p", host_ptr);
  *device_ptr = host_ptr;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  if (attributes == NULL) return FG_FAIL(cudaErrorInvalidValue, "attributes=NULL, ptr=%p", ptr);
  memset(attributes, 0, sizeof *attributes);
  void *base = NULL;
  int device = 0, kind = 0;
  fg_init();
  pthread_mutex_lock(&fg_lock);
  int found = fg_memory_find_locked(ptr, &base, NULL, &device, &kind);
  pthread_mutex_unlock(&fg_lock);
  attributes->device = found ? device : -2;
  if (found && kind == FG_KIND_HOST) {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = (void *)ptr;
    attributes->devicePointer = (void *)ptr;
  } else if (found) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = (void *)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}
