/* The fake GPU's state, shared by the runtime's files.
 *
 * Settings (read once, at the first call):
 *   TORCHMEM_FAKEGPU_DEVICES   number of devices (default 1, at most 64)
 *   TORCHMEM_FAKEGPU_MEMORY    each card's memory in bytes (default 80 GiB)
 *   TORCHMEM_FAKEGPU_CC        compute capability "major.minor" (default 9.0)
 *   TORCHMEM_FAKEGPU_NAME      device name (default "torchmem fake GPU")
 *   TORCHMEM_FAKEGPU_SMS       multiprocessors (default 132)
 *   TORCHMEM_FAKEGPU_HOLD      "1": hold every stream from the start
 *   TORCHMEM_FAKEGPU_LOG       a file that gets one line per call of an
 *                              entry point the fake does not implement, and
 *                              one per failed call of one it does:
 *                              "torchmem fake GPU: failed NAME(ARGS) =
 *                              ERROR[: WHY] (pid N)" (../include/fg_log.h)
 *
 * One locking style: each entry point calls fg_init(), then takes fg_lock with
 * pthread_mutex_lock around what it reads or changes here; functions named
 * *_locked expect it held. Two files keep a lock of their own in the same style
 * (address_space.c, images.c). The failure counters alone change lock-free,
 * with atomics, since a failure is logged inside locked code. The control API
 * (control.c) sits above this state and the streams; nothing here calls it. Device memory is host address space that is never touched:
 * cudaMalloc maps anonymous memory that costs nothing until touched;
 * cuMemCreate takes a range of one sparse memfd. What reads back from it is
 * contents.c's (Note [Device memory holds no data]).
 */
#ifndef TORCHMEM_FAKEGPU_STATE_H
#define TORCHMEM_FAKEGPU_STATE_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#define FG_MAX_DEVICES 64
#define FG_GRANULE ((size_t)2 << 20) /* cudaMalloc and cuMem accounting unit */

struct fg_device {
  unsigned long long total;
  unsigned long long used;  /* allocations, in granules, plus held */
  unsigned long long held;  /* outside every allocator (fakegpu_set_device_held) */
};

struct fg_stream {
  int device;
  int priority;
  unsigned flags;
  unsigned long long id;
  uint64_t recorded; /* work items recorded on the stream */
  uint64_t done;     /* work items completed: done <= recorded */
  int held;
  /* Capture: capture_id != 0 while a capture is under way on this stream. */
  unsigned long long capture_id;
  int capture_mode;
  pthread_t capture_thread;
  int capture_invalidated;
  struct fg_graph *capture_graph;
  struct fg_stream *next_live;
};

struct fg_event {
  unsigned flags;
  struct fg_stream *stream; /* NULL until recorded */
  uint64_t seq;             /* complete when stream->done >= seq */
  uint64_t stamp;           /* how many events were recorded before it, process-wide (cudaEventElapsedTime) */
};

struct fg_graph {
  long long kernels;
  long long copies;
};

struct fg_graph_exec {
  struct fg_graph *graph;
};

enum fg_counter {
  FG_MALLOC_CALLS,
  FG_FREE_CALLS,
  FG_FAILED_MALLOCS,
  FG_EVENT_RECORDS,
  FG_EVENT_QUERIES,
  FG_SYNCS,
  FG_KERNEL_LAUNCHES,
  FG_MEMCPY_CALLS,
  FG_CAPTURES_BEGUN,
  FG_CAPTURES_ENDED,
  FG_GRAPH_LAUNCHES,
  FG_CAPTURE_VIOLATIONS,
  FG_UNIMPLEMENTED_CALLS,
  FG_VMM_CREATES,
  FG_VMM_RELEASES,
  FG_VMM_MAPS,
  FG_VMM_UNMAPS,
  FG_FAILED_CALLS,
  FG_COUNTERS
};

extern pthread_mutex_t fg_lock;
extern int fg_device_count;
extern struct fg_device fg_devices[FG_MAX_DEVICES];
extern int fg_cc_major, fg_cc_minor, fg_sms;
extern char fg_name[256];
extern int fg_hold_all;
/* TORCHMEM_FAKEGPU_DATA=1: device memory keeps what is copied to it (contents.c). */
extern int fg_keep_data;
extern long long fg_counters[FG_COUNTERS];
extern const char *const fg_counter_names[FG_COUNTERS];
extern struct fg_stream *fg_live_streams;

/* Reads the settings once; every entry point calls it first. */
void fg_init(void);

/* The calling thread's current device. */
int fg_current_device(void);
void fg_set_current_device(int device);

/* Every error return of an entry point: records err as the thread's last
 * error, counts it (failed_calls), logs "failed NAME(ARGS) = ERROR[: WHY]" to
 * TORCHMEM_FAKEGPU_LOG and returns err. ARGS are fmt's: name=value, sizes in
 * decimal, pointers and handles %p, flags in hex. cudaSuccess is returned as
 * it is, and cudaErrorNotReady (an answer, not an error) is neither recorded
 * nor logged. FG_FAIL names the calling function; a helper shared by entry
 * points calls fg_fail with its caller's name. */
cudaError_t fg_fail(const char *entry, cudaError_t err, const char *why, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define FG_FAIL(err, ...) fg_fail(__func__, (err), NULL, __VA_ARGS__)
#define FG_FAIL_WHY(err, why, ...) fg_fail(__func__, (err), (why), __VA_ARGS__)
/* Counts and logs a failed call whose result is not the runtime's (the driver
 * entry points, driver.c), without touching the last error. */
void fg_log_failed(const char *entry, const char *error, const char *why, const char *fmt, va_list args);
cudaError_t fg_take_last_error(void);
cudaError_t fg_peek_last_error(void);

/* Logs a call of an entry point the fake does not implement; returns
 * cudaErrorNotSupported. */
int fg_unimplemented(const char *name);
/* Logs and counts such a call without touching the last error (driver calls). */
void fg_log_unimplemented(const char *name);

/* Charges or refunds device memory (rounded up to FG_GRANULE). Charge returns
 * 0, or -1 when the card is full. */
int fg_charge_locked(int device, size_t bytes);
void fg_refund_locked(int device, size_t bytes);

/* Streams: handle 0, cudaStreamLegacy and cudaStreamPerThread name the
 * current device's default stream. NULL for an unknown handle. */
struct fg_stream *fg_stream_locked(cudaStream_t handle);
/* Adds one work item to a stream; completes it at once unless held. */
uint64_t fg_stream_add_work_locked(struct fg_stream *s);
void fg_stream_complete_locked(struct fg_stream *s);
void fg_device_complete_locked(int device);

/* Capture rules: whether the calling thread may make a call that would
 * synchronise (CUDA's "potentially unsafe" calls) now. A refused call marks
 * the captures it breaks as invalidated and counts a violation. */
int fg_unsafe_call_refused_locked(void);

/* Counts a launch or copy into its stream's capture; 1 when the stream is
 * capturing (the work is captured, not run). */
int fg_capture_work_locked(struct fg_stream *s, int is_copy);

/* The device address space (address_space.c): takes size bytes (rounded up to
 * FG_GRANULE) at the lowest free address, mapped with `prot` (PROT_NONE for a
 * reservation), or NULL; returns a range taken so. Thread-safe, own lock.
 * fg_map_device (cudaMalloc) takes the top of the highest free range instead
 * when TORCHMEM_FAKEGPU_ADDRESSES=falling (Note [Falling device addresses]). */
void *fg_map_aligned(size_t size, int prot);
void *fg_map_device(size_t size, int prot);
void fg_unmap_aligned(void *ptr, size_t size);
/* 1 when ptr lies in the device address space (cudaMalloc, reservations). */
int fg_in_device_space(const void *ptr);

/* Device memory's contents (contents.c, Note [Device memory holds no data]).
 * fg_contents_copy is every copy: by address, host-to-host is memmove, a read
 * from the device writes zeros plus kept bytes, a write to it keeps small
 * copies only. fg_contents_fill is every memset. Neither touches device pages.
 * Thread-safe; they take fg_lock (call them without it). */
#define FG_KEPT_COPY ((size_t)1 << 20)  /* largest copy whose bytes are kept */
#define FG_KEPT_TOTAL ((size_t)64 << 20) /* most bytes kept at once */
void fg_contents_copy(void *dst, const void *src, size_t size);
void fg_contents_fill(void *dst, int value, size_t size);
/* Drops what is kept in [ptr, ptr + size) (freed or unmapped memory). */
void fg_contents_forget(const void *ptr, size_t size);
/* Frees a device range: drops what reads back from it, then fg_unmap_aligned. */
void fg_unmap_device_range(void *ptr, size_t size);
/* Drops everything kept (the counters were reset); expects fg_lock held. */
void fg_contents_reset_locked(void);

/* Registers device memory (cudaMalloc, reserved ranges) for lookups by address. */
void fg_memory_add_locked(void *ptr, size_t size, int device, int kind);
int fg_memory_remove_locked(void *ptr, size_t *size, int *device, int *kind);
/* The registered range holding ptr; 0 when none. */
int fg_memory_find_locked(const void *ptr, void **base, size_t *size, int *device, int *kind);

enum { FG_KIND_DEVICE = 1, FG_KIND_HOST = 2, FG_KIND_RESERVED = 3 };

/* Device attributes (cudaDeviceAttr values; the driver's CUdevice_attribute
 * numbers agree for every attribute answered here). 0 for unknown ones. */
int fg_device_attribute(int attr, int device);

#endif
