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
  if (out == NULL) return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "handle=NULL");
  handle_t h = calloc(1, sizeof *h);
  if (h == NULL) return BLAS_FAIL(FG_CUBLAS_ALLOC_FAILED, "handle=%p", (void *)out);
  h->magic = FG_BLAS_MAGIC;
  *out = h;
  return FG_CUBLAS_SUCCESS;
}

int cublasDestroy_v2(handle_t h) {
  if (!valid(h)) return BLAS_FAIL(FG_CUBLAS_NOT_INITIALIZED, "handle=%p", (void *)h);
  h->magic = 0;
  free(h);
  return FG_CUBLAS_SUCCESS;
}

#define SETTER(name, field, type)                                                      \
  int name(handle_t h, type value) {                                                   \
    if (!valid(h)) return BLAS_FAIL(FG_CUBLAS_NOT_INITIALIZED, "handle=%p", (void *)h); \
    h->field = value;                                                                  \
    return FG_CUBLAS_SUCCESS;                                                          \
  }
#define GETTER(name, field, type)                                                                     \
  int name(handle_t h, type *value) {                                                                 \
    if (!valid(h) || value == NULL)                                                                   \
      return BLAS_FAIL(valid(h) ? FG_CUBLAS_INVALID_VALUE : FG_CUBLAS_NOT_INITIALIZED,                \
                       "handle=%p, value=%p", (void *)h, (void *)value);                              \
    *value = h->field;                                                                                \
    return FG_CUBLAS_SUCCESS;                                                                         \
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
  if (!valid(h))
    return BLAS_FAIL(FG_CUBLAS_NOT_INITIALIZED, "handle=%p, workspace=%p, size=%zu", (void *)h, workspace, size);
  h->workspace = workspace;
  h->workspace_size = size;
  return FG_CUBLAS_SUCCESS;
}

int cublasGetVersion_v2(handle_t h, int *version) {
  if (version == NULL) return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "handle=%p, version=NULL", (void *)h);
  *version = fg_blas_version();
  return FG_CUBLAS_SUCCESS;
}

int cublasGetProperty(int type, int *value) {
  if (value == NULL) return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "type=%d, value=NULL", type);
  int v = fg_blas_version();
  switch (type) {
    case 0: *value = v / 10000; return FG_CUBLAS_SUCCESS;       /* MAJOR_VERSION */
    case 1: *value = v / 100 % 100; return FG_CUBLAS_SUCCESS;   /* MINOR_VERSION */
    case 2: *value = v % 100; return FG_CUBLAS_SUCCESS;         /* PATCH_LEVEL */
    default: return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "type=%d, value=%p", type, (void *)value);
  }
}

size_t cublasGetCudartVersion(void) { return fg_blas_cudart_version(); }

const char *cublasGetStatusName(int status) { return fg_blas_status_name(status); }
const char *cublasGetStatusString(int status) { return fg_blas_status_name(status); }
