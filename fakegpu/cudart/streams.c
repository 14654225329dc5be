/* Streams, events and synchronisation. Work completes at once unless its
 * stream is held (fakegpu.h); a synchronize call completes what it waits for. */
#include <stdlib.h>
#include <string.h>

#include "../include/fakegpu.h"
#include "state.h"

static struct fg_stream default_streams[FG_MAX_DEVICES];
static unsigned long long next_stream_id = 16;

#define LOCKED(body)                \
  do {                              \
    fg_init();                      \
    pthread_mutex_lock(&fg_lock);   \
    body;                           \
    pthread_mutex_unlock(&fg_lock); \
  } while (0)

struct fg_stream *fg_stream_locked(cudaStream_t handle) {
  uintptr_t value = (uintptr_t)handle;
  if (value == 0 || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    int device = fg_current_device();
    struct fg_stream *s = &default_streams[device];
    if (s->id == 0) {
      s->device = device;
      s->id = (unsigned long long)device + 1;
    }
    return s;
  }
  for (struct fg_stream *s = fg_live_streams; s; s = s->next_live)
    if (s == (struct fg_stream *)handle) return s;
  return NULL;
}

uint64_t fg_stream_add_work_locked(struct fg_stream *s) {
  ++s->recorded;
  if (!s->held && !fg_hold_all) s->done = s->recorded;
  return s->recorded;
}

void fg_stream_complete_locked(struct fg_stream *s) { s->done = s->recorded; }

void fg_device_complete_locked(int device) {
  fg_stream_complete_locked(&default_streams[device]);
  for (struct fg_stream *s = fg_live_streams; s; s = s->next_live)
    if (s->device == device) fg_stream_complete_locked(s);
}

static int thread_mode_is(int mode);

int fg_unsafe_call_refused_locked(void) {
  if (thread_mode_is(cudaStreamCaptureModeRelaxed)) return 0;
  int refused = 0;
  pthread_t self = pthread_self();
  /* Captures run on created streams only (CUDA refuses the legacy stream). */
  for (struct fg_stream *s = fg_live_streams; s; s = s->next_live) {
    if (s->capture_id == 0 || s->capture_mode == cudaStreamCaptureModeRelaxed) continue;
    int own = pthread_equal(s->capture_thread, self);
    int breaks = own || (s->capture_mode == cudaStreamCaptureModeGlobal &&
                         thread_mode_is(cudaStreamCaptureModeGlobal));
    if (breaks) {
      s->capture_invalidated = 1;
      refused = 1;
    }
  }
  if (refused) ++fg_counters[FG_CAPTURE_VIOLATIONS];
  return refused;
}

/* cudaThreadExchangeStreamCaptureMode's per-thread mode. */
static __thread int thread_capture_mode = cudaStreamCaptureModeGlobal;
static int thread_mode_is(int mode) { return thread_capture_mode == mode; }

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (mode == NULL) return FG_FAIL(cudaErrorInvalidValue, "mode=NULL");
  int previous = thread_capture_mode;
  thread_capture_mode = *mode;
  *mode = (enum cudaStreamCaptureMode)previous;
  return cudaSuccess;
}

/* Streams. */

/* Every stream creation's, under the caller's name. */
static cudaError_t create_stream(const char *entry, cudaStream_t *stream, unsigned int flags, int priority) {
  if (stream == NULL)
    return fg_fail(entry, cudaErrorInvalidValue, NULL, "stream=NULL, flags=0x%x, priority=%d", flags, priority);
  struct fg_stream *s = calloc(1, sizeof *s);
  if (s == NULL)
    return fg_fail(entry, cudaErrorMemoryAllocation, "host memory", "stream=%p, flags=0x%x, priority=%d",
                   (void *)stream, flags, priority);
  LOCKED({
    s->device = fg_current_device();
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    s->id = next_stream_id++;
    s->next_live = fg_live_streams;
    fg_live_streams = s;
  });
  *stream = (cudaStream_t)s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
  return create_stream(__func__, stream, flags, priority);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  return create_stream(__func__, stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return create_stream(__func__, stream, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  int found = 0;
  LOCKED({
    for (struct fg_stream **p = &fg_live_streams; *p; p = &(*p)->next_live) {
      if (*p == (struct fg_stream *)stream) {
        struct fg_stream *s = *p;
        *p = s->next_live;
        free(s);
        found = 1;
        break;
      }
    }
  });
  return found ? cudaSuccess : FG_FAIL(cudaErrorInvalidResourceHandle, "stream=%p", (void *)stream);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

/* Runs body with s the stream of handle, then returns err_ (logged under the entry point's name with the
 * stream's handle; an unknown one fails). */
#define WITH_STREAM(handle, body)                                \
  cudaError_t err_ = cudaSuccess;                                \
  LOCKED({                                                       \
    struct fg_stream *s = fg_stream_locked(handle);              \
    if (s == NULL) err_ = cudaErrorInvalidResourceHandle;        \
    else { body; }                                               \
  });                                                            \
  return FG_FAIL(err_, "stream=%p", (void *)(handle))

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
  WITH_STREAM(stream, if (priority) *priority = s->priority);
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags) {
  WITH_STREAM(stream, if (flags) *flags = s->flags);
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device) {
  WITH_STREAM(stream, if (device) *device = s->device);
}

cudaError_t cudaStreamGetId(cudaStream_t stream, unsigned long long *id) {
  WITH_STREAM(stream, if (id) *id = s->id);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  WITH_STREAM(stream, {
    if (fg_unsafe_call_refused_locked()) err_ = cudaErrorStreamCaptureUnsupported;
    else if (s->done < s->recorded) err_ = cudaErrorNotReady;
  });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  WITH_STREAM(stream, {
    if (fg_unsafe_call_refused_locked() || s->capture_id != 0) {
      err_ = cudaErrorStreamCaptureUnsupported;
      s->capture_invalidated = s->capture_id != 0;
    } else {
      ++fg_counters[FG_SYNCS];
      fg_stream_complete_locked(s);
    }
  });
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)event;
  (void)flags;
  WITH_STREAM(stream, (void)s);
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t err = cudaSuccess;
  LOCKED({
    if (fg_unsafe_call_refused_locked()) err = cudaErrorStreamCaptureUnsupported;
    else {
      ++fg_counters[FG_SYNCS];
      fg_device_complete_locked(fg_current_device());
    }
  });
  return FG_FAIL_WHY(err, "during a stream capture", "");
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data) {
  cudaError_t err = cudaSuccess;
  LOCKED({
    struct fg_stream *s = fg_stream_locked(stream);
    if (s == NULL) err = cudaErrorInvalidResourceHandle;
    else fg_stream_add_work_locked(s);
  });
  if (err == cudaSuccess && fn != NULL) fn(data);
  return FG_FAIL(err, "stream=%p", (void *)stream);
}

/* Events.
 *
 * Note [Elapsed time on the fake GPU]
 * Nothing runs, so there is no time to measure. Timing code divides by what
 * cudaEventElapsedTime gives (Triton's do_bench sizes its repeats by it, and
 * inductor's autotuning divides by it), so 0 ms would crash it and a tiny
 * figure would make it repeat a launch a hundred thousand times. Each interval
 * reads FG_EVENT_INTERVAL_MS for every event recorded after its start, up to
 * and including its end: deterministic, positive, and cheap for
 * do_bench. Every candidate of an autotuning takes the same time, so it keeps
 * its first; what that choice allocates may differ from a real card's. */

#define FG_EVENT_INTERVAL_MS 10.0
static uint64_t recorded_events;

/* Both event creations', under the caller's name. */
static cudaError_t create_event(const char *entry, cudaEvent_t *event, unsigned int flags) {
  if (event == NULL) return fg_fail(entry, cudaErrorInvalidValue, NULL, "event=NULL, flags=0x%x", flags);
  struct fg_event *e = calloc(1, sizeof *e);
  if (e == NULL)
    return fg_fail(entry, cudaErrorMemoryAllocation, "host memory", "event=%p, flags=0x%x", (void *)event, flags);
  e->flags = flags;
  *event = (cudaEvent_t)e;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  return create_event(__func__, event, flags);
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return create_event(__func__, event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == NULL) return FG_FAIL(cudaErrorInvalidResourceHandle, "event=NULL");
  LOCKED({
    struct fg_event *e = (struct fg_event *)event;
    e->stream = NULL;
  });
  free(event);
  return cudaSuccess;
}

/* Both event records', under the caller's name. */
static cudaError_t record_event(const char *entry, cudaEvent_t event, cudaStream_t stream) {
  if (event == NULL)
    return fg_fail(entry, cudaErrorInvalidResourceHandle, NULL, "event=NULL, stream=%p", (void *)stream);
  cudaError_t err = cudaSuccess;
  LOCKED({
    struct fg_stream *s = fg_stream_locked(stream);
    struct fg_event *e = (struct fg_event *)event;
    if (s == NULL) err = cudaErrorInvalidResourceHandle;
    else {
      ++fg_counters[FG_EVENT_RECORDS];
      e->stream = s;
      e->seq = s->capture_id != 0 ? 0 : fg_stream_add_work_locked(s);
      e->stamp = ++recorded_events;
    }
  });
  return fg_fail(entry, err, NULL, "event=%p, stream=%p", (void *)event, (void *)stream);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  (void)flags;
  return record_event(__func__, event, stream);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) { return record_event(__func__, event, stream); }

static int event_pending_locked(const struct fg_event *e) {
  if (e->stream == NULL) return 0;
  int known = e->stream >= &default_streams[0] && e->stream < &default_streams[FG_MAX_DEVICES];
  for (struct fg_stream *s = fg_live_streams; s && !known; s = s->next_live) known = s == e->stream;
  return known && e->stream->done < e->seq; /* a destroyed stream's work is done */
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == NULL) return FG_FAIL(cudaErrorInvalidResourceHandle, "event=NULL");
  cudaError_t err = cudaSuccess;
  LOCKED({
    ++fg_counters[FG_EVENT_QUERIES];
    if (fg_unsafe_call_refused_locked()) err = cudaErrorStreamCaptureUnsupported;
    else if (event_pending_locked((struct fg_event *)event)) err = cudaErrorNotReady;
  });
  /* Not ready is an answer, not an error: CUDA does not record it as the last error (nor does FG_FAIL). */
  return FG_FAIL(err, "event=%p", (void *)event);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == NULL) return FG_FAIL(cudaErrorInvalidResourceHandle, "event=NULL");
  cudaError_t err = cudaSuccess;
  LOCKED({
    struct fg_event *e = (struct fg_event *)event;
    if (fg_unsafe_call_refused_locked()) err = cudaErrorStreamCaptureUnsupported;
    else {
      ++fg_counters[FG_SYNCS];
      if (e->stream && e->stream->done < e->seq) e->stream->done = e->seq;
    }
  });
  return FG_FAIL(err, "event=%p", (void *)event);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == NULL || start == NULL || end == NULL)
    return FG_FAIL(cudaErrorInvalidValue, "ms=%p, start=%p, end=%p", (void *)ms, (void *)start, (void *)end);
  const struct fg_event *a = (const struct fg_event *)start, *b = (const struct fg_event *)end;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return FG_FAIL_WHY(cudaErrorInvalidResourceHandle, "an event without timing", "ms=%p, start=%p, end=%p",
                       (void *)ms, (void *)start, (void *)end);
  cudaError_t err = cudaSuccess;
  LOCKED({
    if (a->stream == NULL || b->stream == NULL) err = cudaErrorInvalidResourceHandle;
    else *ms = (float)((double)b->stamp - (double)a->stamp) * FG_EVENT_INTERVAL_MS;
  });
  return FG_FAIL_WHY(err, "an event not recorded", "ms=%p, start=%p, end=%p", (void *)ms, (void *)start,
                     (void *)end);
}

long long fakegpu_pending_events(void) {
  /* Events are not tracked in a list: count streams' pending work instead. */
  long long pending = 0;
  LOCKED({
    for (int d = 0; d < fg_device_count; ++d)
      pending += (long long)(default_streams[d].recorded - default_streams[d].done);
    for (struct fg_stream *s = fg_live_streams; s; s = s->next_live)
      pending += (long long)(s->recorded - s->done);
  });
  return pending;
}
