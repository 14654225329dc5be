#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchmem's C++ core";
  torchmem::bindings::bind_caching(m);
  torchmem::bindings::bind_cpu_install(m);
  torchmem::bindings::bind_replay(m);
  torchmem::bindings::bind_rules(m);
  torchmem::bindings::bind_jsonl(m);
  torchmem::bindings::bind_pickle_scan(m);
  torchmem::bindings::bind_planned(m);
  torchmem::bindings::bind_planner(m);
  torchmem::bindings::bind_arena(m);
  torchmem::bindings::bind_paged(m);
  torchmem::bindings::bind_history(m);
  torchmem::bindings::bind_oom(m);
  torchmem::bindings::bind_device_memory(m);
#ifdef TORCHMEM_WITH_CUDA
  torchmem::bindings::bind_cuda(m);
#endif
}
