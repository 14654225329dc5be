// One function per concept registers its Python types on the module.
// Bindings convert types only; logic lives in csrc/core and csrc/torch.
//
// Two modules: torchmem._core (core_module.cpp) binds the core and links no
// torch; torchmem._C (module.cpp) binds the glue that needs torch (marked
// "glue" below) and links _core for the core's code and types.
#pragma once

#include <pybind11/pybind11.h>

namespace torchmem::bindings {

void bind_caching(pybind11::module_& m);
void bind_cpu_install(pybind11::module_& m);  // glue
void bind_replay(pybind11::module_& m);
void bind_rules(pybind11::module_& m);  // the _C.rules submodule
void bind_jsonl(pybind11::module_& m);
void bind_pickle_scan(pybind11::module_& m);
void bind_planned(pybind11::module_& m);
void bind_planner(pybind11::module_& m);
void bind_arena(pybind11::module_& m);
void bind_planner_streams(pybind11::module_& planner);  // on the planner submodule
void bind_paged(pybind11::module_& m);
void bind_history(pybind11::module_& m);
void bind_oom(pybind11::module_& m);  // glue
void bind_device_memory(pybind11::module_& m);
void bind_cuda(pybind11::module_& m);  // glue; CUDA builds only (TORCHMEM_WITH_CUDA)

}  // namespace torchmem::bindings
