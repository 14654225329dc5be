// torchmem._core: the C++ core's Python face. It links no torch, so the
// command line's replay, advise, plan, stats, plot and viz run without
// importing torch.
#include "bindings/bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "torchmem's C++ core";
  torchmem::bindings::bind_caching(m);
  torchmem::bindings::bind_replay(m);
  torchmem::bindings::bind_rules(m);
  torchmem::bindings::bind_jsonl(m);
  torchmem::bindings::bind_pickle_scan(m);
  torchmem::bindings::bind_planned(m);
  torchmem::bindings::bind_planner(m);
  torchmem::bindings::bind_arena(m);
  torchmem::bindings::bind_paged(m);
  torchmem::bindings::bind_history(m);
  torchmem::bindings::bind_device_memory(m);
}
