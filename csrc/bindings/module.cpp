// torchmem._C: the glue that needs torch (the CPU install, out-of-memory
// observers, and in a CUDA build the CUDA install). It links libtorch and
// torchmem._core, whose types it hands to Python: _core is imported first, so
// those types are registered before any of these functions returns one.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchmem's torch glue (the core's types live in torchmem._core)";
  pybind11::module_::import("torchmem._core");
  torchmem::bindings::bind_cpu_install(m);
  torchmem::bindings::bind_oom(m);
#ifdef TORCHMEM_WITH_CUDA
  torchmem::bindings::bind_cuda(m);
#endif
}
