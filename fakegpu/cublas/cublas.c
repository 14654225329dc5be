/* The fake libcublas.so.13 and .so.12: handles and their settings (common.h says what
 * the stand-in is). The compute routines are generated stubs that succeed
 * (gen_stubs.py). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct fg_blas_handle {
  void *stream;
  void *workspace;
  size_t workspace_size;
  int math_mode;
  int pointer_mode;
  int atomics_mode;
  int sm_count_target;
  uint32_t magic;
};

#define FG_BLAS_MAGIC 0x626c6173u

typedef struct fg_blas_handle *handle_t;

static int valid(handle_t h) { return h != NULL && h->magic == FG_BLAS_MAGIC; }

int cublasCreate_v2(handle_t *out) {
  if (out == NULL) return FG_CUBLAS_INVALID_VALUE;
  handle_t h = calloc(1, sizeof *h);
  if (h == NULL) return 3; /* CUBLAS_STATUS_ALLOC_FAILED */
  h->magic = FG_BLAS_MAGIC;
  *out = h;
  return FG_CUBLAS_SUCCESS;
}

int cublasDestroy_v2(handle_t h) {
  if (!valid(h)) return FG_CUBLAS_NOT_INITIALIZED;
  h->magic = 0;
  free(h);
  return FG_CUBLAS_SUCCESS;
}

#define SETTER(name, field, type)                             \
  int name(handle_t h, type value) {                          \
    if (!valid(h)) return FG_CUBLAS_NOT_INITIALIZED;          \
    h->field = value;                                         \
    return FG_CUBLAS_SUCCESS;                                 \
  }
#define GETTER(name, field, type)                             \
  int name(handle_t h, type *value) {                         \
    if (!valid(h)) return FG_CUBLAS_NOT_INITIALIZED;          \
    if (value == NULL) return FG_CUBLAS_INVALID_VALUE;        \
    *value = h->field;                                        \
    return FG_CUBLAS_SUCCESS;                                 \
  }

SETTER(cublasSetStream_v2, stream, void *)
GETTER(cublasGetStream_v2, stream, void *)
SETTER(cublasSetMathMode, math_mode, int)
GETTER(cublasGetMathMode, math_mode, int)
SETTER(cublasSetPointerMode_v2, pointer_mode, int)
GETTER(cublasGetPointerMode_v2, pointer_mode, int)
SETTER(cublasSetAtomicsMode, atomics_mode, int)
GETTER(cublasGetAtomicsMode, atomics_mode, int)
SETTER(cublasSetSmCountTarget, sm_count_target, int)
GETTER(cublasGetSmCountTarget, sm_count_target, int)

int cublasSetWorkspace_v2(handle_t h, void *workspace, size_t size) {
  if (!valid(h)) return FG_CUBLAS_NOT_INITIALIZED;
  h->workspace = workspace;
  h->workspace_size = size;
  return FG_CUBLAS_SUCCESS;
}

int cublasGetVersion_v2(handle_t h, int *version) {
  (void)h;
  if (version == NULL) return FG_CUBLAS_INVALID_VALUE;
  *version = fg_blas_version();
  return FG_CUBLAS_SUCCESS;
}

int cublasGetProperty(int type, int *value) {
  if (value == NULL) return FG_CUBLAS_INVALID_VALUE;
  int v = fg_blas_version();
  switch (type) {
    case 0: *value = v / 10000; return FG_CUBLAS_SUCCESS;       /* MAJOR_VERSION */
    case 1: *value = v / 100 % 100; return FG_CUBLAS_SUCCESS;   /* MINOR_VERSION */
    case 2: *value = v % 100; return FG_CUBLAS_SUCCESS;         /* PATCH_LEVEL */
    default: return FG_CUBLAS_INVALID_VALUE;
  }
}

size_t cublasGetCudartVersion(void) { return fg_blas_cudart_version(); }

static const char *status_name(int status) {
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

const char *cublasGetStatusName(int status) { return status_name(status); }
const char *cublasGetStatusString(int status) { return status_name(status); }
