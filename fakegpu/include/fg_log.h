/* The fake GPU's log lines, shared by its libraries (each .so compiles its own
 * copy of these static functions; docs/fakegpu.md):
 *
 *   torchmem fake GPU: unimplemented NAME (pid N)                to stderr and the log
 *   torchmem fake GPU: failed NAME(ARGS) = ERROR[: WHY] (pid N)  to the log only
 *
 * The log is the file TORCHMEM_FAKEGPU_LOG names; without one, only the
 * unimplemented lines are written, to stderr. ARGS are name=value pairs, with
 * a null pointer written NULL. A failed line stays on the log alone: PyTorch
 * retries cudaMalloc after an out-of-memory error, and that must stay quiet.
 */
#ifndef TORCHMEM_FAKEGPU_LOG_H
#define TORCHMEM_FAKEGPU_LOG_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Appends line (n bytes) to the file at path, when path names one, and to stderr when to_stderr. */
static inline void fg_log_write(const char *path, const char *line, int n, int to_stderr) {
  if (n <= 0) return;
  if (to_stderr && write(2, line, (size_t)n) < 0) { /* nothing to do */ }
  if (path == NULL || path[0] == '\0') return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) < 0) { /* nothing to do */ }
  close(fd);
}

/* Writes the line of an entry point the library does not implement; prefix is "" or, say, "libcuda ". */
static inline void fg_log_unimplemented_line(const char *path, const char *prefix, const char *name) {
  char line[512];
  int n = snprintf(line, sizeof line, "torchmem fake GPU: unimplemented %s%s (pid %d)\n", prefix, name, (int)getpid());
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  fg_log_write(path, line, n, 1);
}

/* Writes the line of a failed call of `entry` to path: error is the result's name, why NULL or a reason, and
 * fmt with args the arguments. */
static inline void fg_log_failed_line(const char *path, const char *entry, const char *error, const char *why,
                                      const char *fmt, va_list args) {
  if (path == NULL || path[0] == '\0') return;
  char text[640];
  vsnprintf(text, sizeof text, fmt, args);
  for (char *nil = strstr(text, "(nil)"); nil != NULL; nil = strstr(nil, "(nil)")) { /* %p of NULL */
    memcpy(nil, "NULL", 4);
    memmove(nil + 4, nil + 5, strlen(nil + 5) + 1);
  }
  char line[1024];
  int n = snprintf(line, sizeof line, "torchmem fake GPU: failed %s(%s) = %s%s%s (pid %d)\n", entry, text, error,
                   why ? ": " : "", why ? why : "", (int)getpid());
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  fg_log_write(path, line, n, 0);
}

#ifdef CUDA_VERSION /* cuda.h was included */
/* A driver result's name, as cuGetErrorName gives it. */
static inline const char *fg_cu_error_name(CUresult result) {
#define FG_CU_NAME(e) \
  case e:             \
    return #e
  switch (result) {
    FG_CU_NAME(CUDA_SUCCESS);
    FG_CU_NAME(CUDA_ERROR_INVALID_VALUE);
    FG_CU_NAME(CUDA_ERROR_OUT_OF_MEMORY);
    FG_CU_NAME(CUDA_ERROR_NOT_INITIALIZED);
    FG_CU_NAME(CUDA_ERROR_INVALID_DEVICE);
    FG_CU_NAME(CUDA_ERROR_INVALID_CONTEXT);
    FG_CU_NAME(CUDA_ERROR_INVALID_HANDLE);
    FG_CU_NAME(CUDA_ERROR_NOT_FOUND);
    FG_CU_NAME(CUDA_ERROR_NOT_READY);
    FG_CU_NAME(CUDA_ERROR_LAUNCH_FAILED);
    FG_CU_NAME(CUDA_ERROR_NOT_SUPPORTED);
    FG_CU_NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    default: return "CUDA_ERROR_UNKNOWN";
  }
#undef FG_CU_NAME
}
#endif

#endif
