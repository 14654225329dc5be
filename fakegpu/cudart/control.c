/* The control API (../include/fakegpu.h): what tests and the launcher ask of the fake GPU.
 *
 * Above state.c and streams.c: it reads and changes their state under fg_lock
 * and nothing below calls back into it. */
#include "state.h"

#include <string.h>

#include "../include/fakegpu.h"

int fakegpu_version(void) { return 1; }

void fakegpu_hold_all(int on) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  fg_hold_all = on != 0;
  pthread_mutex_unlock(&fg_lock);
}

int fakegpu_hold_stream(uintptr_t stream, int on) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked((cudaStream_t)stream);
  if (s) s->held = on != 0;
  pthread_mutex_unlock(&fg_lock);
  return s ? 0 : -1;
}

int fakegpu_complete_stream(uintptr_t stream) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked((cudaStream_t)stream);
  if (s) fg_stream_complete_locked(s);
  pthread_mutex_unlock(&fg_lock);
  return s ? 0 : -1;
}

void fakegpu_complete_all(void) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  for (int d = 0; d < fg_device_count; ++d) fg_device_complete_locked(d);
  pthread_mutex_unlock(&fg_lock);
}

long long fakegpu_counter(const char *name) {
  if (name == NULL) return -1;
  if (strcmp(name, "pending_events") == 0) return fakegpu_pending_events();
  for (int i = 0; i < FG_COUNTERS; ++i)
    if (strcmp(name, fg_counter_names[i]) == 0) return __atomic_load_n(&fg_counters[i], __ATOMIC_RELAXED);
  return -1;
}

void fakegpu_reset_counters(void) {
  pthread_mutex_lock(&fg_lock);
  for (int i = 0; i < FG_COUNTERS; ++i) __atomic_store_n(&fg_counters[i], 0, __ATOMIC_RELAXED);
  fg_contents_reset_locked(); /* its epoch is the launch counters */
  pthread_mutex_unlock(&fg_lock);
}

long long fakegpu_device_used(int device) {
  fg_init();
  if (device < 0 || device >= fg_device_count) return -1;
  pthread_mutex_lock(&fg_lock);
  long long used = (long long)fg_devices[device].used;
  pthread_mutex_unlock(&fg_lock);
  return used;
}

long long fakegpu_device_total(int device) {
  fg_init();
  if (device < 0 || device >= fg_device_count) return -1;
  return (long long)fg_devices[device].total;
}

int fakegpu_set_device_held(int device, unsigned long long bytes) {
  fg_init();
  if (device < 0 || device >= fg_device_count) return -1;
  pthread_mutex_lock(&fg_lock);
  struct fg_device *d = &fg_devices[device];
  unsigned long long others = d->used - d->held;
  int ok = bytes <= d->total && others <= d->total - bytes;
  if (ok) {
    d->used = others + bytes;
    d->held = bytes;
  }
  pthread_mutex_unlock(&fg_lock);
  return ok ? 0 : -1;
}

int fakegpu_set_device_total(int device, unsigned long long bytes) {
  fg_init();
  if (device < 0 || device >= fg_device_count) return -1;
  pthread_mutex_lock(&fg_lock);
  int ok = bytes >= fg_devices[device].used;
  if (ok) fg_devices[device].total = bytes;
  pthread_mutex_unlock(&fg_lock);
  return ok ? 0 : -1;
}
