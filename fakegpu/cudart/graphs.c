/* Graph capture as bookkeeping: a capture counts what is launched into it; a
 * graph can be instantiated, launched (nothing runs) and destroyed. While a
 * capture is under way the capture rules of fg_unsafe_call_refused_locked()
 * apply, as CUDA's do. */
#include <stdlib.h>

#include "state.h"

static unsigned long long next_capture_id = 1;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  fg_init();
  cudaError_t err = cudaSuccess;
  struct fg_graph *graph = calloc(1, sizeof *graph);
  if (graph == NULL)
    return FG_FAIL_WHY(cudaErrorMemoryAllocation, "host memory", "stream=%p, mode=%d", (void *)stream, (int)mode);
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else if ((uintptr_t)stream == 0 || stream == cudaStreamLegacy) err = cudaErrorStreamCaptureUnsupported;
  else if (s->capture_id != 0) err = cudaErrorIllegalState;
  else {
    s->capture_id = next_capture_id++;
    s->capture_mode = mode;
    s->capture_thread = pthread_self();
    s->capture_invalidated = 0;
    s->capture_graph = graph;
    graph = NULL;
    ++fg_counters[FG_CAPTURES_BEGUN];
  }
  pthread_mutex_unlock(&fg_lock);
  free(graph);
  return FG_FAIL(err, "stream=%p, mode=%d", (void *)stream, (int)mode);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph_out) {
  fg_init();
  cudaError_t err = cudaSuccess;
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else if (s->capture_id == 0) err = cudaErrorIllegalState;
  else {
    struct fg_graph *graph = s->capture_graph;
    int invalidated = s->capture_invalidated;
    s->capture_id = 0;
    s->capture_graph = NULL;
    s->capture_invalidated = 0;
    ++fg_counters[FG_CAPTURES_ENDED];
    if (invalidated) {
      free(graph);
      graph = NULL;
      err = cudaErrorStreamCaptureInvalidated;
    }
    if (graph_out) *graph_out = (cudaGraph_t)graph;
    else free(graph);
  }
  pthread_mutex_unlock(&fg_lock);
  return FG_FAIL(err, "stream=%p", (void *)stream);
}

/* Every capture query's, under the caller's name. */
static cudaError_t capture_info(const char *entry, cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                unsigned long long *id, cudaGraph_t *graph) {
  fg_init();
  cudaError_t err = cudaSuccess;
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (s->capture_id != 0)
      st = s->capture_invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    if (status) *status = st;
    if (id && s->capture_id != 0) *id = s->capture_id;
    if (graph) *graph = (cudaGraph_t)s->capture_graph;
  }
  pthread_mutex_unlock(&fg_lock);
  return fg_fail(entry, err, NULL, "stream=%p", (void *)stream);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  return capture_info(__func__, stream, status, NULL, NULL);
}

static cudaError_t capture_info_edges(const char *entry, cudaStream_t stream,
                                      enum cudaStreamCaptureStatus *status, unsigned long long *id, cudaGraph_t *graph,
                                      const cudaGraphNode_t **dependencies, const cudaGraphEdgeData **edges,
                                      size_t *count) {
  if (dependencies) *dependencies = NULL;
  if (edges) *edges = NULL;
  if (count) *count = 0;
  return capture_info(entry, stream, status, id, graph);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **dependencies, const cudaGraphEdgeData **edges,
                                     size_t *count) {
  return capture_info_edges(__func__, stream, status, id, graph, dependencies, edges, count);
}
#else
/* CUDA 12: the headers name cudaStreamGetCaptureInfo _v2 (no edge data); _v3
 * has CUDA 13's signature; the unversioned symbol is CUDA 11's and stays a stub. */
cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                        unsigned long long *id, cudaGraph_t *graph,
                                        const cudaGraphNode_t **dependencies, size_t *count) {
  return capture_info_edges(__func__, stream, status, id, graph, dependencies, NULL, count);
}

cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                        unsigned long long *id, cudaGraph_t *graph,
                                        const cudaGraphNode_t **dependencies, const cudaGraphEdgeData **edges,
                                        size_t *count) {
  return capture_info_edges(__func__, stream, status, id, graph, dependencies, edges, count);
}
#endif

/* Counts a launch or copy into the capture of its stream; returns 1 when the
 * stream is capturing (the work is captured, not run). */
int fg_capture_work_locked(struct fg_stream *s, int is_copy) {
  if (s == NULL || s->capture_id == 0) return 0;
  if (s->capture_graph) {
    if (is_copy) ++s->capture_graph->copies;
    else ++s->capture_graph->kernels;
  }
  return 1;
}

int fakegpu_captures_underway(void) {
  fg_init();
  int count = 0;
  pthread_mutex_lock(&fg_lock);
  for (struct fg_stream *s = fg_live_streams; s; s = s->next_live) count += s->capture_id != 0;
  pthread_mutex_unlock(&fg_lock);
  return count;
}

cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned int flags) {
  if (graph == NULL) return FG_FAIL(cudaErrorInvalidValue, "graph=NULL, flags=0x%x", flags);
  *graph = (cudaGraph_t)calloc(1, sizeof(struct fg_graph));
  return *graph ? cudaSuccess : FG_FAIL_WHY(cudaErrorMemoryAllocation, "host memory", "graph=%p, flags=0x%x",
                                            (void *)graph, flags);
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
  if (graph == NULL || count == NULL)
    return FG_FAIL(cudaErrorInvalidValue, "graph=%p, nodes=%p, count=%p", (void *)graph, (void *)nodes, (void *)count);
  const struct fg_graph *g = (const struct fg_graph *)graph;
  size_t total = (size_t)(g->kernels + g->copies);
  if (nodes) {
    size_t n = *count < total ? *count : total;
    for (size_t i = 0; i < n; ++i) nodes[i] = (cudaGraphNode_t)(uintptr_t)(i + 1);
  }
  *count = total;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  free(graph);
  return cudaSuccess;
}

/* Every instantiation's, under the caller's name. */
static cudaError_t instantiate(const char *entry, cudaGraphExec_t *exec, cudaGraph_t graph) {
  if (exec == NULL || graph == NULL)
    return fg_fail(entry, cudaErrorInvalidValue, NULL, "exec=%p, graph=%p", (void *)exec, (void *)graph);
  struct fg_graph_exec *e = calloc(1, sizeof *e);
  if (e == NULL)
    return fg_fail(entry, cudaErrorMemoryAllocation, "host memory", "exec=%p, graph=%p", (void *)exec, (void *)graph);
  e->graph = (struct fg_graph *)graph;
  *exec = (cudaGraphExec_t)e;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  return instantiate(__func__, exec, graph);
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  return instantiate(__func__, exec, graph);
}

cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *exec, cudaGraph_t graph,
                                           cudaGraphInstantiateParams *params) {
  cudaError_t err = instantiate(__func__, exec, graph);
  if (params) params->result_out = err == cudaSuccess ? cudaGraphInstantiateSuccess : cudaGraphInstantiateError;
  return err;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  free(exec);
  return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream) {
  (void)stream;
  return exec ? cudaSuccess : FG_FAIL(cudaErrorInvalidValue, "exec=NULL, stream=%p", (void *)stream);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == NULL) return FG_FAIL(cudaErrorInvalidValue, "exec=NULL, stream=%p", (void *)stream);
  fg_init();
  cudaError_t err = cudaSuccess;
  pthread_mutex_lock(&fg_lock);
  struct fg_stream *s = fg_stream_locked(stream);
  if (s == NULL) err = cudaErrorInvalidResourceHandle;
  else ++fg_counters[FG_GRAPH_LAUNCHES];
  pthread_mutex_unlock(&fg_lock);
  return FG_FAIL(err, "exec=%p, stream=%p", (void *)exec, (void *)stream);
}
