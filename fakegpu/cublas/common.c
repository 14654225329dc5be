/* The log lines and version query shared by the fake cuBLAS and cuBLASLt (common.h). */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "../include/fg_log.h"

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
  fg_log_unimplemented_line(getenv("TORCHMEM_FAKEGPU_LOG"), "", name);
  return FG_CUBLAS_NOT_SUPPORTED;
}

int fg_blas_fail(const char *entry, int status, const char *why, const char *fmt, ...) {
  if (status == FG_CUBLAS_SUCCESS) return status;
  va_list args;
  va_start(args, fmt);
  fg_log_failed_line(getenv("TORCHMEM_FAKEGPU_LOG"), entry, fg_blas_status_name(status), why, fmt, args);
  va_end(args);
  return status;
}

const char *fg_blas_status_name(int status) {
  switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

int fg_blas_version(void) {
  const char *given = getenv("TORCHMEM_FAKEGPU_CUBLAS_VERSION");
  if (given != NULL && given[0] != '\0') {
    int major = 0, minor = 0, patch = 0;
    if (sscanf(given, "%d.%d.%d", &major, &minor, &patch) >= 2) return major * 10000 + minor * 100 + patch;
  }
  return CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH;
}
