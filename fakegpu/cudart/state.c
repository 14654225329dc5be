/* Settings, counters and the memory table: the state every other file of the runtime reads. */
#define _GNU_SOURCE
#include "state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/fg_log.h"

pthread_mutex_t fg_lock = PTHREAD_MUTEX_INITIALIZER;
int fg_device_count = 1;
struct fg_device fg_devices[FG_MAX_DEVICES];
int fg_cc_major = 9, fg_cc_minor = 0, fg_sms = 132;
char fg_name[256] = "torchmem fake GPU";
int fg_hold_all = 0;
int fg_keep_data = 0;
long long fg_counters[FG_COUNTERS];
struct fg_stream *fg_live_streams = NULL;

const char *const fg_counter_names[FG_COUNTERS] = {
    "malloc_calls",       "free_calls",          "failed_mallocs",  "event_records",
    "event_queries",      "syncs",               "kernel_launches", "memcpy_calls",
    "captures_begun",     "captures_ended",      "graph_launches",  "capture_violations",
    "unimplemented_calls", "vmm_creates",        "vmm_releases",    "vmm_maps",
    "vmm_unmaps",         "failed_calls",
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static __thread int current_device = 0;
static __thread cudaError_t last_error = cudaSuccess;
static char log_path[4096];

static unsigned long long env_ull(const char *name, unsigned long long fallback) {
  const char *value = getenv(name);
  if (value == NULL || *value == '\0') return fallback;
  char *end = NULL;
  unsigned long long parsed = strtoull(value, &end, 10);
  return (end != NULL && *end == '\0') ? parsed : fallback;
}

static void read_settings(void) {
  unsigned long long devices = env_ull("TORCHMEM_FAKEGPU_DEVICES", 1);
  fg_device_count = devices < 1 ? 1 : devices > FG_MAX_DEVICES ? FG_MAX_DEVICES : (int)devices;
  unsigned long long memory = env_ull("TORCHMEM_FAKEGPU_MEMORY", 80ULL << 30);
  for (int d = 0; d < FG_MAX_DEVICES; ++d) fg_devices[d].total = memory;
  const char *cc = getenv("TORCHMEM_FAKEGPU_CC");
  if (cc != NULL && sscanf(cc, "%d.%d", &fg_cc_major, &fg_cc_minor) != 2) {
    fg_cc_major = 9;
    fg_cc_minor = 0;
  }
  const char *name = getenv("TORCHMEM_FAKEGPU_NAME");
  if (name != NULL && *name != '\0') snprintf(fg_name, sizeof fg_name, "%s", name);
  fg_sms = (int)env_ull("TORCHMEM_FAKEGPU_SMS", 132);
  fg_hold_all = env_ull("TORCHMEM_FAKEGPU_HOLD", 0) != 0;
  fg_keep_data = env_ull("TORCHMEM_FAKEGPU_DATA", 0) != 0;
  const char *log = getenv("TORCHMEM_FAKEGPU_LOG");
  if (log != NULL) snprintf(log_path, sizeof log_path, "%s", log);
}

void fg_init(void) { pthread_once(&init_once, read_settings); }

int fg_current_device(void) { return current_device; }
void fg_set_current_device(int device) { current_device = device; }

cudaError_t fg_fail(const char *entry, cudaError_t err, const char *why, const char *fmt, ...) {
  if (err == cudaSuccess || err == cudaErrorNotReady) return err;
  last_error = err;
  va_list args;
  va_start(args, fmt);
  fg_log_failed(entry, cudaGetErrorName(err), why, fmt, args);
  va_end(args);
  return err;
}

void fg_log_failed(const char *entry, const char *error, const char *why, const char *fmt, va_list args) {
  fg_init();
  __atomic_fetch_add(&fg_counters[FG_FAILED_CALLS], 1, __ATOMIC_RELAXED);
  fg_log_failed_line(log_path, entry, error, why, fmt, args);
}

cudaError_t fg_take_last_error(void) {
  cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}

cudaError_t fg_peek_last_error(void) { return last_error; }

int fg_unimplemented(const char *name) {
  fg_log_unimplemented(name);
  last_error = cudaErrorNotSupported;
  return cudaErrorNotSupported;
}

void fg_log_unimplemented(const char *name) {
  fg_init();
  __atomic_fetch_add(&fg_counters[FG_UNIMPLEMENTED_CALLS], 1, __ATOMIC_RELAXED);
  fg_log_unimplemented_line(log_path, "", name);
}

static size_t granules(size_t bytes) { return (bytes + FG_GRANULE - 1) / FG_GRANULE * FG_GRANULE; }

int fg_charge_locked(int device, size_t bytes) {
  struct fg_device *d = &fg_devices[device];
  size_t charged = granules(bytes);
  if (charged > d->total || d->used > d->total - charged) return -1;
  d->used += charged;
  return 0;
}

void fg_refund_locked(int device, size_t bytes) {
  struct fg_device *d = &fg_devices[device];
  size_t charged = granules(bytes);
  d->used = charged > d->used ? 0 : d->used - charged;
}

/* The memory table: ranges sorted by address (hundreds to thousands of them). */
struct range {
  uintptr_t base;
  size_t size;
  int device;
  int kind;
};
static struct range *ranges = NULL;
static size_t range_count = 0, range_capacity = 0;

static size_t first_above(uintptr_t address) {
  size_t lo = 0, hi = range_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ranges[mid].base <= address) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

void fg_memory_add_locked(void *ptr, size_t size, int device, int kind) {
  if (range_count == range_capacity) {
    size_t capacity = range_capacity ? range_capacity * 2 : 256;
    struct range *grown = realloc(ranges, capacity * sizeof *grown);
    if (grown == NULL) abort();
    ranges = grown;
    range_capacity = capacity;
  }
  size_t at = first_above((uintptr_t)ptr);
  memmove(&ranges[at + 1], &ranges[at], (range_count - at) * sizeof *ranges);
  ranges[at] = (struct range){(uintptr_t)ptr, size, device, kind};
  ++range_count;
}

int fg_memory_find_locked(const void *ptr, void **base, size_t *size, int *device, int *kind) {
  size_t at = first_above((uintptr_t)ptr);
  if (at == 0) return 0;
  struct range *r = &ranges[at - 1];
  if ((uintptr_t)ptr >= r->base + (r->size ? r->size : 1)) return 0;
  if (base) *base = (void *)r->base;
  if (size) *size = r->size;
  if (device) *device = r->device;
  if (kind) *kind = r->kind;
  return 1;
}

int fg_memory_remove_locked(void *ptr, size_t *size, int *device, int *kind) {
  size_t at = first_above((uintptr_t)ptr);
  if (at == 0 || ranges[at - 1].base != (uintptr_t)ptr) return 0;
  struct range *r = &ranges[at - 1];
  if (size) *size = r->size;
  if (device) *device = r->device;
  if (kind) *kind = r->kind;
  memmove(r, r + 1, (range_count - at) * sizeof *ranges);
  --range_count;
  return 1;
}
