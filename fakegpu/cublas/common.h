/* Shared by the fake cuBLAS and cuBLASLt (fakegpu/cublas/, docs/preflight.md).
 *
 * The stand-ins keep the real libraries' sonames and version nodes, so a
 * preloaded copy is the one PyTorch binds to: the real cuBLAS, which opens the
 * driver with calls the fake GPU does not answer, is never loaded. Entry points
 * that compute succeed without computing (device values are garbage anyway);
 * handles and descriptors are small host structures; every other export logs
 * "unimplemented NAME" like the fake runtime and returns
 * CUBLAS_STATUS_NOT_SUPPORTED. Thread safety: handles are per caller, as in
 * cuBLAS; the functions here keep no shared state beyond the log path.
 */
#ifndef TORCHMEM_FAKEGPU_CUBLAS_COMMON_H
#define TORCHMEM_FAKEGPU_CUBLAS_COMMON_H

#include <stddef.h>

enum {
  FG_CUBLAS_SUCCESS = 0,
  FG_CUBLAS_NOT_INITIALIZED = 1,
  FG_CUBLAS_ALLOC_FAILED = 3,
  FG_CUBLAS_INVALID_VALUE = 7,
  FG_CUBLAS_NOT_SUPPORTED = 15,
};

/* Logs "torchmem fake GPU: unimplemented NAME (pid P)" to stderr and to
 * $TORCHMEM_FAKEGPU_LOG, and returns FG_CUBLAS_NOT_SUPPORTED. */
int fg_blas_unimplemented(const char *name);

/* Every error return of an entry point here: logs "torchmem fake GPU: failed
 * NAME(ARGS) = CUBLAS_STATUS_...[: WHY] (pid P)" to $TORCHMEM_FAKEGPU_LOG only
 * (../include/fg_log.h) and returns status. BLAS_FAIL names the calling
 * function; a helper shared by entry points is given its caller's name. */
int fg_blas_fail(const char *entry, int status, const char *why, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define BLAS_FAIL(status, ...) fg_blas_fail(__func__, (status), NULL, __VA_ARGS__)

/* A status's name, as cublasGetStatusName gives it. */
const char *fg_blas_status_name(int status);

/* The cuBLAS version this stand-in reports (major*10000 + minor*100 + patch):
 * $TORCHMEM_FAKEGPU_CUBLAS_VERSION when set (the launcher sets the installed
 * nvidia-cublas wheel's), else the headers' it was built with. */
int fg_blas_version(void);

/* The CUDA runtime version the stand-in reports being built with (CUDART_VERSION of its headers). */
size_t fg_blas_cudart_version(void);

#endif
