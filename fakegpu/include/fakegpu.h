/* The fake GPU's control API: what a test uses to drive the fake CUDA runtime.
 *
 * The fake runtime (libtorchmem_fakecudart.so, preloaded in front of the real
 * libcudart.so.13) gives PyTorch devices whose memory is host memory and whose
 * kernels are accepted and skipped. These functions are exported (version node
 * FAKEGPU_1) so that Python reaches them with ctypes (torchmem.fakegpu.Control).
 *
 * Work and events. Each stream counts the work recorded on it (event records,
 * kernel launches, copies) and the work completed. Normally work completes at
 * once. A held stream keeps its work pending: an event recorded on it is "not
 * ready" (cudaEventQuery returns cudaErrorNotReady) until the test completes
 * the stream's work or a synchronize call waits for it (the fake completes the
 * work then, as the GPU would finish it).
 *
 * Stream handles are the values of torch.cuda.Stream.cuda_stream; 0 is the
 * current device's default stream.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef TORCHMEM_FAKEGPU_H
#define TORCHMEM_FAKEGPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The control API's version: bumped when a function changes meaning. */
int fakegpu_version(void);

/* While on, work recorded on every stream (present and future) stays pending. */
void fakegpu_hold_all(int on);

/* Holds (on != 0) or stops holding one stream. Returns 0, or -1 for an
 * unknown handle. Stopping a hold does not complete pending work. */
int fakegpu_hold_stream(uintptr_t stream, int on);

/* Completes the work recorded on one stream so far. Returns 0, or -1. */
int fakegpu_complete_stream(uintptr_t stream);

/* Completes the work recorded on every stream so far. */
void fakegpu_complete_all(void);

/* Work recorded and not yet complete, over every stream: event records and
 * host functions (cudaLaunchHostFunc) on held streams. */
long long fakegpu_pending_events(void);

/* A named counter, or -1 for an unknown name. Names: malloc_calls,
 * free_calls, failed_mallocs, event_records, event_queries, syncs,
 * kernel_launches, memcpy_calls, captures_begun, captures_ended,
 * graph_launches, capture_violations, unimplemented_calls, vmm_creates,
 * vmm_releases, vmm_maps, vmm_unmaps, failed_calls (calls of an entry point
 * the fake implements that returned an error other than "not ready"). */
long long fakegpu_counter(const char *name);

/* Sets every counter to zero. */
void fakegpu_reset_counters(void);

/* Bytes of device memory in use on a device (cudaMalloc and cuMemCreate, in
 * 2 MiB units, and what fakegpu_set_device_held holds), or -1 for an unknown
 * device. */
long long fakegpu_device_used(int device);

/* The card's memory in bytes, or -1 for an unknown device. */
long long fakegpu_device_total(int device);

/* Sets a card's memory (bytes). Returns 0, or -1 for an unknown device or a
 * size below what is in use. */
int fakegpu_set_device_total(int device, unsigned long long bytes);

/* Holds `bytes` of a card's memory outside every allocator, as a CUDA
 * context or another process does on a real GPU: in use (cudaMemGetInfo's
 * free drops by it), never allocated. Replaces what was held before.
 * Returns 0, or -1 for an unknown device or more than the card has free. */
int fakegpu_set_device_held(int device, unsigned long long bytes);

/* Captures under way (cudaStreamBeginCapture without its end). */
int fakegpu_captures_underway(void);

#ifdef __cplusplus
}
#endif

#endif
