/* The fake libcublasLt.so.13 and .so.12: descriptors, preferences and a heuristic that
 * always offers one algorithm needing no workspace (common.h says what the
 * stand-in is). cublasLtMatmul itself succeeds without computing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Layouts of cublasLt.h (the same in CUDA 12 and 13): the algorithm is 64 opaque bytes. */
typedef struct {
  uint64_t data[8];
} fg_lt_algo;

typedef struct {
  fg_lt_algo algo;
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
} fg_lt_heuristic;

/* Descriptors, layouts and preferences: attribute values are accepted and
 * forgotten; a get answers zeros. */
struct fg_lt_object {
  uint32_t magic;
  int kind;
};

#define FG_LT_MAGIC 0x4c746f62u

static int create(void **out, int kind) {
  if (out == NULL) return FG_CUBLAS_INVALID_VALUE;
  struct fg_lt_object *o = calloc(1, sizeof *o);
  if (o == NULL) return 3; /* CUBLAS_STATUS_ALLOC_FAILED */
  o->magic = FG_LT_MAGIC;
  o->kind = kind;
  *out = o;
  return FG_CUBLAS_SUCCESS;
}

static int destroy(void *object) {
  struct fg_lt_object *o = object;
  if (o == NULL) return FG_CUBLAS_SUCCESS;
  if (o->magic != FG_LT_MAGIC) return FG_CUBLAS_INVALID_VALUE;
  o->magic = 0;
  free(o);
  return FG_CUBLAS_SUCCESS;
}

static int set_attribute(void *object, const void *buf, size_t size) {
  if (object == NULL || (buf == NULL && size != 0)) return FG_CUBLAS_INVALID_VALUE;
  return FG_CUBLAS_SUCCESS;
}

static int get_attribute(void *buf, size_t size, size_t *written) {
  if (buf == NULL && size != 0) return FG_CUBLAS_INVALID_VALUE;
  if (buf != NULL) memset(buf, 0, size);
  if (written != NULL) *written = size;
  return FG_CUBLAS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return (size_t)fg_blas_version(); }
size_t cublasLtGetCudartVersion(void) { return fg_blas_cudart_version(); }

int cublasLtGetProperty(int type, int *value) {
  if (value == NULL) return FG_CUBLAS_INVALID_VALUE;
  int v = fg_blas_version();
  switch (type) {
    case 0: *value = v / 10000; return FG_CUBLAS_SUCCESS;
    case 1: *value = v / 100 % 100; return FG_CUBLAS_SUCCESS;
    case 2: *value = v % 100; return FG_CUBLAS_SUCCESS;
    default: return FG_CUBLAS_INVALID_VALUE;
  }
}

int cublasLtCreate(void **handle) { return create(handle, 0); }
int cublasLtDestroy(void *handle) { return destroy(handle); }

/* Destroy, SetAttribute and GetAttribute of one descriptor kind: attributes are accepted, and read back as zeros. */
#define FG_LT_DESCRIPTOR(Kind)                                                                      \
  int cublasLt##Kind##Destroy(void *obj) { return destroy(obj); }                                   \
  int cublasLt##Kind##SetAttribute(void *obj, int attr, const void *buf, size_t size) {             \
    (void)attr;                                                                                     \
    return set_attribute(obj, buf, size);                                                           \
  }                                                                                                 \
  int cublasLt##Kind##GetAttribute(void *obj, int attr, void *buf, size_t size, size_t *written) {  \
    (void)obj;                                                                                      \
    (void)attr;                                                                                     \
    return get_attribute(buf, size, written);                                                       \
  }

int cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type) {
  (void)compute_type;
  (void)scale_type;
  return create(desc, 1);
}
FG_LT_DESCRIPTOR(MatmulDesc)

int cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  (void)type;
  (void)rows;
  (void)cols;
  (void)ld;
  return create(layout, 2);
}
FG_LT_DESCRIPTOR(MatrixLayout)

int cublasLtMatmulPreferenceCreate(void **pref) { return create(pref, 3); }
FG_LT_DESCRIPTOR(MatmulPreference)

static void one_result(fg_lt_heuristic *result) {
  memset(result, 0, sizeof *result);
  result->workspaceSize = 0;
  result->state = FG_CUBLAS_SUCCESS;
  result->wavesCount = 1.0f;
}

int cublasLtMatmulAlgoGetHeuristic(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref,
                                   int requested, fg_lt_heuristic *results, int *returned) {
  (void)handle;
  (void)desc;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  (void)pref;
  if (requested < 1 || results == NULL || returned == NULL) return FG_CUBLAS_INVALID_VALUE;
  one_result(&results[0]);
  *returned = 1;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoInit(void *handle, int compute_type, int scale_type, int a_type, int b_type, int c_type,
                           int d_type, int algo_id, fg_lt_algo *algo) {
  (void)handle;
  (void)compute_type;
  (void)scale_type;
  (void)a_type;
  (void)b_type;
  (void)c_type;
  (void)d_type;
  if (algo == NULL) return FG_CUBLAS_INVALID_VALUE;
  memset(algo, 0, sizeof *algo);
  algo->data[0] = (uint64_t)(uint32_t)algo_id;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoCheck(void *handle, void *desc, void *a, void *b, void *c, void *d, const fg_lt_algo *algo,
                            fg_lt_heuristic *result) {
  (void)handle;
  (void)desc;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  if (algo == NULL || result == NULL) return FG_CUBLAS_INVALID_VALUE;
  one_result(result);
  result->algo = *algo;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoConfigSetAttribute(fg_lt_algo *algo, int attr, const void *buf, size_t size) {
  (void)attr;
  return set_attribute(algo, buf, size);
}
int cublasLtMatmulAlgoConfigGetAttribute(const fg_lt_algo *algo, int attr, void *buf, size_t size, size_t *written) {
  (void)algo;
  (void)attr;
  return get_attribute(buf, size, written);
}

static const char *status_name(int status) {
  return status == 0 ? "CUBLAS_STATUS_SUCCESS" : status == 15 ? "CUBLAS_STATUS_NOT_SUPPORTED" : "CUBLAS_STATUS_ERROR";
}
const char *cublasLtGetStatusName(int status) { return status_name(status); }
const char *cublasLtGetStatusString(int status) { return status_name(status); }
