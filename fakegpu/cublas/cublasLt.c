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

/* The helpers of every create, destroy and attribute entry point: entry is the caller's name. */
static int create(const char *entry, void **out, int kind) {
  if (out == NULL) return fg_blas_fail(entry, FG_CUBLAS_INVALID_VALUE, NULL, "out=NULL");
  struct fg_lt_object *o = calloc(1, sizeof *o);
  if (o == NULL) return fg_blas_fail(entry, FG_CUBLAS_ALLOC_FAILED, NULL, "out=%p", (void *)out);
  o->magic = FG_LT_MAGIC;
  o->kind = kind;
  *out = o;
  return FG_CUBLAS_SUCCESS;
}

static int destroy(const char *entry, void *object) {
  struct fg_lt_object *o = object;
  if (o == NULL) return FG_CUBLAS_SUCCESS;
  if (o->magic != FG_LT_MAGIC)
    return fg_blas_fail(entry, FG_CUBLAS_INVALID_VALUE, "not a live object", "object=%p", object);
  o->magic = 0;
  free(o);
  return FG_CUBLAS_SUCCESS;
}

static int set_attribute(const char *entry, void *object, int attr, const void *buf, size_t size) {
  if (object == NULL || (buf == NULL && size != 0))
    return fg_blas_fail(entry, FG_CUBLAS_INVALID_VALUE, NULL, "object=%p, attr=%d, buf=%p, size=%zu", object, attr,
                        buf, size);
  return FG_CUBLAS_SUCCESS;
}

static int get_attribute(const char *entry, int attr, void *buf, size_t size, size_t *written) {
  if (buf == NULL && size != 0)
    return fg_blas_fail(entry, FG_CUBLAS_INVALID_VALUE, NULL, "attr=%d, buf=NULL, size=%zu", attr, size);
  if (buf != NULL) memset(buf, 0, size);
  if (written != NULL) *written = size;
  return FG_CUBLAS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return (size_t)fg_blas_version(); }
size_t cublasLtGetCudartVersion(void) { return fg_blas_cudart_version(); }

int cublasLtGetProperty(int type, int *value) {
  if (value == NULL) return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "type=%d, value=NULL", type);
  int v = fg_blas_version();
  switch (type) {
    case 0: *value = v / 10000; return FG_CUBLAS_SUCCESS;
    case 1: *value = v / 100 % 100; return FG_CUBLAS_SUCCESS;
    case 2: *value = v % 100; return FG_CUBLAS_SUCCESS;
    default: return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "type=%d, value=%p", type, (void *)value);
  }
}

int cublasLtCreate(void **handle) { return create(__func__, handle, 0); }
int cublasLtDestroy(void *handle) { return destroy(__func__, handle); }

/* Destroy, SetAttribute and GetAttribute of one descriptor kind: attributes are accepted, and read back as zeros. */
#define FG_LT_DESCRIPTOR(Kind)                                                                      \
  int cublasLt##Kind##Destroy(void *obj) { return destroy(__func__, obj); }                         \
  int cublasLt##Kind##SetAttribute(void *obj, int attr, const void *buf, size_t size) {             \
    return set_attribute(__func__, obj, attr, buf, size);                                           \
  }                                                                                                 \
  int cublasLt##Kind##GetAttribute(void *obj, int attr, void *buf, size_t size, size_t *written) {  \
    (void)obj;                                                                                      \
    return get_attribute(__func__, attr, buf, size, written);                                       \
  }

int cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type) {
  (void)compute_type;
  (void)scale_type;
  return create(__func__, desc, 1);
}
FG_LT_DESCRIPTOR(MatmulDesc)

int cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  (void)type;
  (void)rows;
  (void)cols;
  (void)ld;
  return create(__func__, layout, 2);
}
FG_LT_DESCRIPTOR(MatrixLayout)

int cublasLtMatmulPreferenceCreate(void **pref) { return create(__func__, pref, 3); }
FG_LT_DESCRIPTOR(MatmulPreference)

static void one_result(fg_lt_heuristic *result) {
  memset(result, 0, sizeof *result);
  result->workspaceSize = 0;
  result->state = FG_CUBLAS_SUCCESS;
  result->wavesCount = 1.0f;
}

int cublasLtMatmulAlgoGetHeuristic(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref,
                                   int requested, fg_lt_heuristic *results, int *returned) {
  (void)desc;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  (void)pref;
  if (requested < 1 || results == NULL || returned == NULL)
    return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "handle=%p, requested=%d, results=%p, returned=%p", handle, requested,
                     (void *)results, (void *)returned);
  one_result(&results[0]);
  *returned = 1;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoInit(void *handle, int compute_type, int scale_type, int a_type, int b_type, int c_type,
                           int d_type, int algo_id, fg_lt_algo *algo) {
  (void)compute_type;
  (void)scale_type;
  (void)a_type;
  (void)b_type;
  (void)c_type;
  (void)d_type;
  if (algo == NULL) return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "handle=%p, algo_id=%d, algo=NULL", handle, algo_id);
  memset(algo, 0, sizeof *algo);
  algo->data[0] = (uint64_t)(uint32_t)algo_id;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoCheck(void *handle, void *desc, void *a, void *b, void *c, void *d, const fg_lt_algo *algo,
                            fg_lt_heuristic *result) {
  (void)desc;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  if (algo == NULL || result == NULL)
    return BLAS_FAIL(FG_CUBLAS_INVALID_VALUE, "handle=%p, algo=%p, result=%p", handle, (const void *)algo,
                     (void *)result);
  one_result(result);
  result->algo = *algo;
  return FG_CUBLAS_SUCCESS;
}

int cublasLtMatmulAlgoConfigSetAttribute(fg_lt_algo *algo, int attr, const void *buf, size_t size) {
  return set_attribute(__func__, algo, attr, buf, size);
}
int cublasLtMatmulAlgoConfigGetAttribute(const fg_lt_algo *algo, int attr, void *buf, size_t size, size_t *written) {
  (void)algo;
  return get_attribute(__func__, attr, buf, size, written);
}

const char *cublasLtGetStatusName(int status) { return fg_blas_status_name(status); }
const char *cublasLtGetStatusString(int status) { return fg_blas_status_name(status); }
