/* The log and version query shared by the fake cuBLAS and cuBLASLt (common.h). */
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

/* fakegpu/build.py passes cuBLAS's CUBLAS_VER_* from a cublas_api.h beside the runtime headers (the header
   itself is not included: CUDA 13's includes CCCL headers the wheels lack). Without one: the CUDA release
   of the runtime headers the set is built with. */
#ifndef CUBLAS_VER_MAJOR
#define CUBLAS_VER_MAJOR (CUDART_VERSION / 1000)
#define CUBLAS_VER_MINOR (CUDART_VERSION % 1000 / 10)
#define CUBLAS_VER_PATCH 0
#endif

size_t fg_blas_cudart_version(void) { return CUDART_VERSION; }

int fg_blas_unimplemented(const char *name) {
  char line[512];
  int n = snprintf(line, sizeof line, "torchmem fake GPU: unimplemented %s (pid %d)\n", name, (int)getpid());
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  if (write(2, line, (size_t)n) < 0) { /* nothing to do */ }
  const char *log = getenv("TORCHMEM_FAKEGPU_LOG");
  if (log != NULL && log[0] != '\0') {
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (write(fd, line, (size_t)n) < 0) { /* nothing to do */ }
      close(fd);
    }
  }
  return FG_CUBLAS_NOT_SUPPORTED;
}

int fg_blas_version(void) {
  const char *given = getenv("TORCHMEM_FAKEGPU_CUBLAS_VERSION");
  if (given != NULL && given[0] != '\0') {
    int major = 0, minor = 0, patch = 0;
    if (sscanf(given, "%d.%d.%d", &major, &minor, &patch) >= 2) return major * 10000 + minor * 100 + patch;
  }
  return CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH;
}
