/* A host-only crt/host_defines.h for building the fake GPU's CUDA 12 set.
 *
 * The nvidia-cuda-runtime-cu12 wheels ship cuda_runtime_api.h, which includes
 * "crt/host_defines.h", but not that file (it comes with nvcc). The Makefile
 * puts this folder after the real include folder (-idirafter), so a CUDA 12
 * toolkit's own file wins. Compiled by a host C compiler, CUDA's execution
 * space qualifiers mean nothing and the layout qualifiers are GCC attributes.
 */
#ifndef TORCHMEM_FAKEGPU_CRT_HOST_DEFINES_H
#define TORCHMEM_FAKEGPU_CRT_HOST_DEFINES_H
#ifndef __HOST_DEFINES_H__
#define __HOST_DEFINES_H__

#if defined(__CUDACC__) || !defined(__GNUC__)
#error "fakegpu/include/crt12 serves a host GCC or Clang build of the fake GPU only"
#endif

#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __align__(n)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define __launch_bounds__(...)
#define __specialization_static
#define CUDARTAPI
#define CUDARTAPI_CDECL

#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __grid_constant__
#define __nv_pure__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __cluster_dims__(...)
#define __maxnreg__(n)

#endif
#endif
