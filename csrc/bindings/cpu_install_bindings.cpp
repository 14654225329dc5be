// Python face of the CPU install (csrc/torch/cpu_allocator.h).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/base/alloc_config.h"
#include "torch/cpu_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_cpu_install(py::module_& m) {
  using glue::CpuAllocator;
  m.def("cpu_install", [](const std::string& conf) { CpuAllocator::instance().install(AllocatorConfig::parse(conf)); },
        py::arg("conf") = "");
  m.def("cpu_uninstall", [] { CpuAllocator::instance().uninstall(); });
  m.def("cpu_installed", [] { return CpuAllocator::instance().installed(); });
  m.def("cpu_caching_allocator", [] { return CpuAllocator::instance().caching(); },
        "The caching allocator behind the CPU install (None before the first install).");
  m.def("push_thread_allocator", &CpuAllocator::push_thread_allocator, py::arg("allocator"),
        "Route this thread's CPU allocations to `allocator` until pop_thread_allocator().");
  m.def("pop_thread_allocator", &CpuAllocator::pop_thread_allocator);
}

}  // namespace torchmem::bindings
