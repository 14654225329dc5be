/* A stand-in for NCCL (libnccl.so.2) on the fake GPU (docs/fakegpu.md).
 *
 * PyTorch's ProcessGroupNCCL runs unchanged on it: communicators are made
 * without talking to any other process, and collectives and point-to-point
 * calls return at once, as if every other rank held what this one holds
 * (Note [Collectives without peers]). What NCCL itself takes from the device is taken from the
 * fake runtime with cudaMalloc, so PyTorch's allocator finds that much less
 * free memory, as on a real card (Note [NCCL's own device memory]).
 *
 * NCCL's library has no symbol versions: preloaded under its soname, this one
 * is the libnccl.so.2 that libtorch_cuda.so binds to. Entry points PyTorch
 * references but this file does not serve (device communicators, signals,
 * growing and shrinking communicators) log "unimplemented NAME" to
 * $TORCHMEM_FAKEGPU_LOG and fail with ncclInvalidUsage.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../include/fg_log.h"

/* The ABI of nccl.h, which the CUDA toolkit does not ship. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_NUM_OPS 5 /* ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg */

typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef struct { size_t size; unsigned int magic; unsigned int version; float estimatedTime; } ncclSimInfo_t;

struct fg_comm {
  int nranks;
  int rank;
  int device;
  void *buffers;      /* NCCL's own device memory, taken at the first collective */
  size_t buffer_bytes;
};
typedef struct fg_comm *ncclComm_t;

struct fg_window { void *user; };
typedef struct fg_window *ncclWindow_t;

/* Note [NCCL's own device memory]
 * Since NCCL 2.22 a communicator connects its peers at its first collective
 * (NCCL_RUNTIME_CONNECT), and each connection's receive side holds one buffer
 * per protocol. The sizes are NCCL's defaults (src/init.cc): Simple 4 MiB
 * (NCCL_BUFFSIZE), LL 8*512*8*16 B = 512 KiB (NCCL_LL_BUFFSIZE), LL128
 * 120*640*8*8 B = 4,800 KiB (NCCL_LL128_BUFFSIZE); the environment variables
 * override them as in NCCL. Each channel of a ring has two connections (to
 * the previous and the next rank). The channel count depends on the topology
 * NCCL detects, which the fake GPU does not have: 16 is assumed, or
 * NCCL_MIN_NCHANNELS when set. So a communicator of two or more ranks takes
 * 16 * 2 * 9,633,792 B = 294 MiB at its first collective, once, and gives it
 * back when destroyed. This is an estimate from NCCL's source, not a figure
 * measured on a card; trees, NVLS and point-to-point buffers are not counted.
 */
enum { ASSUMED_CHANNELS = 16, CONNECTIONS_PER_CHANNEL = 2 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t device_bytes[64], device_peak[64];
static int next_op = NCCL_NUM_OPS;

static long long setting(const char *name, long long fallback) {
  const char *given = getenv(name);
  if (given == NULL || given[0] == '\0') return fallback;
  char *end = NULL;
  long long value = strtoll(given, &end, 0);
  return end != given && value > 0 ? value : fallback;
}

static size_t buffer_bytes_per_comm(void) {
  long long per_connection = setting("NCCL_BUFFSIZE", 1LL << 22) + setting("NCCL_LL_BUFFSIZE", 8 * 512 * 8 * 16) +
                             setting("NCCL_LL128_BUFFSIZE", 120 * 640 * 8 * 8);
  return (size_t)(setting("NCCL_MIN_NCHANNELS", ASSUMED_CHANNELS) * CONNECTIONS_PER_CHANNEL * per_connection);
}

static ncclResult_t unimplemented(const char *name) {
  fg_log_unimplemented_line(getenv("TORCHMEM_FAKEGPU_LOG"), "", name);
  return ncclInvalidUsage;
}

static const char *result_name(ncclResult_t result) {
  static const char *const names[] = {"ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError",
                                      "ncclInternalError",   "ncclInvalidArgument",    "ncclInvalidUsage",
                                      "ncclRemoteError",     "ncclInProgress"};
  return result >= 0 && result < (int)(sizeof names / sizeof names[0]) ? names[result] : "ncclUnknownResult";
}

/* Every error return of an entry point here: logs "failed NAME(ARGS) = ERROR[: WHY]" (../include/fg_log.h) under
 * entry's name and returns result; ncclSuccess is returned as it is. NCCL_FAIL names the calling function; a
 * helper shared by entry points is given its caller's name. */
__attribute__((format(printf, 4, 5))) static ncclResult_t fail(const char *entry, ncclResult_t result,
                                                               const char *why, const char *fmt, ...) {
  if (result == ncclSuccess) return result;
  va_list args;
  va_start(args, fmt);
  fg_log_failed_line(getenv("TORCHMEM_FAKEGPU_LOG"), entry, result_name(result), why, fmt, args);
  va_end(args);
  return result;
}
#define NCCL_FAIL(result, ...) fail(__func__, (result), NULL, __VA_ARGS__)

/* The fake runtime's calls, found at run time: it is preloaded before this library. */
typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*device_fn)(int *);
typedef cudaError_t (*set_device_fn)(int);

static void *runtime(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static int current_device(void) {
  device_fn get = (device_fn)runtime("cudaGetDevice");
  int device = 0;
  if (get == NULL || get(&device) != cudaSuccess) device = 0;
  return device;
}

/* Takes the communicator's buffers on its device, once (Note [NCCL's own device memory]); every collective's
 * and point-to-point call's first step, under the caller's name. */
static ncclResult_t connect_comm(const char *entry, ncclComm_t comm) {
  if (comm == NULL) return fail(entry, ncclInvalidArgument, NULL, "comm=NULL");
  if (comm->nranks < 2 || comm->buffers != NULL) return ncclSuccess;
  malloc_fn take = (malloc_fn)runtime("cudaMalloc");
  set_device_fn set = (set_device_fn)runtime("cudaSetDevice");
  if (take == NULL || set == NULL) return fail(entry, ncclSystemError, "no fake CUDA runtime", "comm=%p", (void *)comm);
  int before = current_device();
  size_t bytes = buffer_bytes_per_comm();
  set(comm->device);
  cudaError_t got = take(&comm->buffers, bytes);
  set(before);
  if (got != cudaSuccess) {
    comm->buffers = NULL;
    return fail(entry, ncclUnhandledCudaError, "cudaMalloc of NCCL's buffers failed", "comm=%p, device=%d, bytes=%zu",
                (void *)comm, comm->device, bytes);
  }
  comm->buffer_bytes = bytes;
  pthread_mutex_lock(&lock);
  if (comm->device >= 0 && comm->device < 64) {
    device_bytes[comm->device] += bytes;
    if (device_bytes[comm->device] > device_peak[comm->device]) device_peak[comm->device] = device_bytes[comm->device];
  }
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static void release_comm(ncclComm_t comm) {
  if (comm == NULL) return;
  if (comm->buffers != NULL) {
    free_fn give = (free_fn)runtime("cudaFree");
    if (give != NULL) give(comm->buffers);
    pthread_mutex_lock(&lock);
    if (comm->device >= 0 && comm->device < 64) device_bytes[comm->device] -= comm->buffer_bytes;
    pthread_mutex_unlock(&lock);
  }
  free(comm);
}

/* Every communicator creation's, under the caller's name. */
static ncclResult_t new_comm(const char *entry, ncclComm_t *out, int nranks, int rank, int device) {
  if (out == NULL || nranks < 1 || rank < 0 || rank >= nranks)
    return fail(entry, ncclInvalidArgument, NULL, "comm=%p, nranks=%d, rank=%d", (void *)out, nranks, rank);
  ncclComm_t comm = calloc(1, sizeof *comm);
  if (comm == NULL) return fail(entry, ncclSystemError, "host memory", "nranks=%d, rank=%d", nranks, rank);
  comm->nranks = nranks;
  comm->rank = rank;
  comm->device = device;
  *out = comm;
  return ncclSuccess;
}

/* What preflight reads (torchmem/preflight/hook.py): the most device bytes NCCL held at once on one device. */
size_t torchmem_nccl_device_peak(int device) {
  pthread_mutex_lock(&lock);
  size_t bytes = device >= 0 && device < 64 ? device_peak[device] : 0;
  pthread_mutex_unlock(&lock);
  return bytes;
}

/* The real library's version: the nvidia NCCL wheel beside torch, passed by the launcher as MAJOR.MINOR.PATCH;
 * without it, the NCCL of the torch release the stand-in set was first checked with. */
ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL) return NCCL_FAIL(ncclInvalidArgument, "version=NULL");
  const char *given = getenv("TORCHMEM_FAKEGPU_NCCL_VERSION");
  int major = 0, minor = 0, patch = 0;
  if (given != NULL && sscanf(given, "%d.%d.%d", &major, &minor, &patch) >= 2) {
    *version = major * 10000 + minor * 100 + patch;
  } else {
    *version = CUDART_VERSION >= 13000 ? 23007 : 22105;
  }
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == NULL) return NCCL_FAIL(ncclInvalidArgument, "id=NULL");
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "torchmem-fake-nccl-%d", (int)getpid());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  return new_comm(__func__, comm, nranks, rank, current_device());
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
  (void)id, (void)config;
  return new_comm(__func__, comm, nranks, rank, current_device());
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nids, ncclUniqueId *ids,
                                      void *config) {
  (void)nids, (void)ids, (void)config;
  return new_comm(__func__, comm, nranks, rank, current_device());
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devices) {
  if (comms == NULL || ndev < 1) return NCCL_FAIL(ncclInvalidArgument, "comms=%p, ndev=%d", (void *)comms, ndev);
  for (int i = 0; i < ndev; i++) {
    ncclResult_t made = new_comm(__func__, &comms[i], ndev, i, devices != NULL ? devices[i] : i);
    if (made != ncclSuccess) return made; /* logged */
  }
  return ncclSuccess;
}

/* The new communicator's size is known only to the other ranks; it keeps its parent's (PyTorch keeps its own). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
  (void)config;
  if (comm == NULL || newcomm == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, color=%d, key=%d, newcomm=%p", (void *)comm, color, key,
                     (void *)newcomm);
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = NULL;
    return ncclSuccess;
  }
  return new_comm(__func__, newcomm, comm->nranks, key >= 0 && key < comm->nranks ? key : 0, comm->device);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm != NULL ? ncclSuccess : NCCL_FAIL(ncclInvalidArgument, "comm=NULL");
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { release_comm(comm); return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { release_comm(comm); return ncclSuccess; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  if (comm == NULL || error == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, error=%p", (void *)comm, (void *)error);
  *error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (comm == NULL || count == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, count=%p", (void *)comm, (void *)count);
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (comm == NULL || device == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, device=%p", (void *)comm, (void *)device);
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (comm == NULL || rank == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, rank=%p", (void *)comm, (void *)rank);
  *rank = comm->rank;
  return ncclSuccess;
}

/* ncclStatGpuMemSuspend 0, ncclStatGpuMemSuspended 1, ncclStatGpuMemPersist 2, ncclStatGpuMemTotal 3. */
ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t *value) {
  if (comm == NULL || value == NULL || stat < 0 || stat > 3)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, stat=%d, value=%p", (void *)comm, stat, (void *)value);
  *value = stat >= 2 ? comm->buffer_bytes : 0;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "";
}

/* Registration: buffers are used where they lie. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  if (comm == NULL || handle == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, buff=%p, size=%zu, handle=%p", (void *)comm, buff, size,
                     (void *)handle);
  *handle = buff;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  return comm != NULL ? ncclSuccess : NCCL_FAIL(ncclInvalidArgument, "comm=NULL, handle=%p", handle);
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int flags) {
  if (comm == NULL || win == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, buff=%p, size=%zu, win=%p, flags=0x%x", (void *)comm, buff, size,
                     (void *)win, (unsigned)flags);
  *win = malloc(sizeof **win);
  if (*win == NULL) return NCCL_FAIL(ncclSystemError, "buff=%p, size=%zu", buff, size);
  (*win)->user = buff;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm;
  free(win);
  return ncclSuccess;
}

ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **user) {
  (void)comm;
  if (win == NULL || user == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "comm=%p, win=%p, user=%p", (void *)comm, (void *)win, (void *)user);
  *user = win->user;
  return ncclSuccess;
}

/* Memory for NCCL's memory pool: device memory from the fake runtime, in the user's hands (not NCCL's own). */
ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  malloc_fn take = (malloc_fn)runtime("cudaMalloc");
  if (ptr == NULL || take == NULL)
    return NCCL_FAIL(ncclInvalidArgument, "ptr=%p, size=%zu", (void *)ptr, size);
  if (take(ptr, size) != cudaSuccess)
    return NCCL_FAIL(ncclUnhandledCudaError, "ptr=%p, size=%zu", (void *)ptr, size);
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr) {
  free_fn give = (free_fn)runtime("cudaFree");
  if (give == NULL) return NCCL_FAIL(ncclInvalidArgument, "ptr=%p", ptr);
  return give(ptr) == cudaSuccess ? ncclSuccess : NCCL_FAIL(ncclUnhandledCudaError, "ptr=%p", ptr);
}

ncclResult_t ncclRedOpCreatePreMulSum(int *op, void *scalar, int datatype, int residence, ncclComm_t comm) {
  (void)scalar, (void)datatype, (void)residence, (void)comm;
  if (op == NULL) return NCCL_FAIL(ncclInvalidArgument, "op=NULL");
  pthread_mutex_lock(&lock);
  *op = next_op++;
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(int op, ncclComm_t comm) {
  (void)op, (void)comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *info) {
  if (info != NULL) info->estimatedTime = 0.0f;
  return ncclSuccess;
}

/* Note [Collectives without peers]
 * No other rank exists to send anything, so a collective's result is what it
 * would be if every rank held this rank's input: an all-gather repeats this
 * rank's part, an all-reduce leaves the input (a sum would be the world size
 * times it; values are garbage on the fake GPU anyway), a reduce-scatter
 * takes this rank's slice, a broadcast keeps the root's data. This keeps the
 * checks that read results back on the CPU consistent: DDP all-gathers each
 * rank's parameter shapes and fails when they differ. These are the fake
 * runtime's copies (fakegpu_copy), done at the call. Only payloads up to
 * SMALL_PAYLOAD bytes per rank are copied: those are the metadata a CPU
 * reads back. Larger ones (gathered parameters, gradients) are not touched,
 * so their pages never take host memory. Send and receive move nothing.
 */
enum { SMALL_PAYLOAD = 1 << 20 };

/* ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16, fp8 e4m3, e5m2. */
static size_t type_size(int type) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return type >= 0 && type < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[type] : 0;
}

/* The bytes of `count` elements when they are small enough to copy (Note [Collectives without peers]), else 0. */
static size_t small(size_t count, int type) {
  size_t bytes = count * type_size(type);
  return bytes <= SMALL_PAYLOAD ? bytes : 0;
}

/* Through the fake runtime's copy (Note [Device memory holds no data] in its contents.c): device pages are never
 * touched, and only what the runtime keeps of small copies moves. */
static void copy(void *to, const void *from, size_t bytes) {
  typedef void (*copy_fn)(void *, const void *, size_t);
  static copy_fn runtime_copy;
  if (runtime_copy == NULL) runtime_copy = (copy_fn)runtime("fakegpu_copy");
  if (bytes != 0 && to != NULL && from != NULL && to != from && runtime_copy != NULL) runtime_copy(to, from, bytes);
}

/* Every rank's slot of `to` gets `from`: what each peer would send, were it this rank. */
static void repeat(void *to, const void *from, size_t bytes, int nranks) {
  for (int r = 0; bytes != 0 && r < nranks; r++) copy((char *)to + (size_t)r * bytes, from, bytes);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)op, (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  if (ok == ncclSuccess) copy(recv, send, small(count, type));
  return ok;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int type, int op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  (void)op, (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  if (ok == ncclSuccess && comm->rank == root) copy(recv, send, small(count, type));
  return ok;
}

ncclResult_t ncclBcast(void *buff, size_t count, int type, int root, ncclComm_t comm, cudaStream_t stream) {
  (void)buff, (void)count, (void)type, (void)root, (void)stream;
  return connect_comm(__func__, comm);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  if (ok == ncclSuccess && comm->rank == root) copy(recv, send, small(count, type));
  return ok;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm,
                               cudaStream_t stream) {
  (void)op, (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  size_t bytes = small(count, type);
  if (ok == ncclSuccess && send != NULL) copy(recv, (const char *)send + (size_t)comm->rank * bytes, bytes);
  return ok;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int type, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  if (ok == ncclSuccess) repeat(recv, send, small(count, type), comm->nranks);
  return ok;
}

ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, int type, ncclComm_t comm,
                          cudaStream_t stream) {
  (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  size_t bytes = small(count, type);
  if (ok == ncclSuccess && send != NULL) {
    repeat(recv, (const char *)send + (size_t)comm->rank * bytes, bytes, comm->nranks);
  }
  return ok;
}

ncclResult_t ncclGather(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  if (ok == ncclSuccess && comm->rank == root) repeat(recv, send, small(count, type), comm->nranks);
  return ok;
}

ncclResult_t ncclScatter(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  (void)stream;
  ncclResult_t ok = connect_comm(__func__, comm);
  size_t bytes = small(count, type);
  if (ok == ncclSuccess && comm->rank == root && send != NULL) {
    copy(recv, (const char *)send + (size_t)comm->rank * bytes, bytes);
  }
  return ok;
}

ncclResult_t ncclSend(const void *send, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t stream) {
  (void)send, (void)count, (void)type, (void)peer, (void)stream;
  return connect_comm(__func__, comm);
}

ncclResult_t ncclRecv(void *recv, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t stream) {
  (void)recv, (void)count, (void)type, (void)peer, (void)stream;
  return connect_comm(__func__, comm);
}

/* Referenced by PyTorch, not served. */
#define UNIMPLEMENTED(name) \
  ncclResult_t name() { return unimplemented(#name); }
UNIMPLEMENTED(ncclCommGetUniqueId)
UNIMPLEMENTED(ncclCommGrow)
UNIMPLEMENTED(ncclCommShrink)
UNIMPLEMENTED(ncclCommRevoke)
UNIMPLEMENTED(ncclCommSuspend)
UNIMPLEMENTED(ncclCommResume)
UNIMPLEMENTED(ncclDevCommCreate)
UNIMPLEMENTED(ncclDevCommDestroy)
UNIMPLEMENTED(ncclGetLsaMultimemDevicePointer)
UNIMPLEMENTED(ncclGetPeerDevicePointer)
UNIMPLEMENTED(ncclPutSignal)
UNIMPLEMENTED(ncclSignal)
UNIMPLEMENTED(ncclWaitSignal)
