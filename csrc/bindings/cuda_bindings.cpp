// Python face of the CUDA install (csrc/torch/cuda_allocator.h). Compiled
// only in a CUDA build (setup.py defines TORCHMEM_WITH_CUDA).
#ifdef TORCHMEM_WITH_CUDA

#include <c10/core/Allocator.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/alloc_config.h"
#include "torch/cuda_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_cuda(py::module_& m) {
  using glue::CudaAllocator;
  m.attr("has_cuda_glue") = true;
  m.def(
      "cuda_install", [](const std::string& conf) { CudaAllocator::install(AllocatorConfig::parse(conf)); },
      py::arg("conf") = "",
      "Make torchmem PyTorch's CUDA allocator. Raises RuntimeError when CUDA is already initialised.");
  m.def("cuda_installed", &CudaAllocator::installed);
  m.def(
      "cuda_is_c10_allocator",
      [] { return c10::GetAllocator(c10::kCUDA) == static_cast<c10::Allocator*>(CudaAllocator::instance().get()); },
      "Whether c10::GetAllocator(kCUDA), behind torch.accelerator's memory functions, is torchmem's.");
  m.def(
      "cuda_caching_allocator", [](int device) { return CudaAllocator::instance()->caching(device); },
      py::arg("device"), "The caching allocator of a device's default pool (made on first use).");
  m.def(
      "cuda_pending_frees", [](int device) { return CudaAllocator::instance()->pending_frees(device); },
      py::arg("device"), "Frees waiting for events of streams the blocks were used on.");
  m.def(
      "cuda_pool_count", [](int device) { return CudaAllocator::instance()->pool_count(device); },
      py::arg("device"), "Private pools (CUDA graphs, torch.cuda.MemPool) alive on a device.");
  m.def("cuda_push_thread_allocator", &CudaAllocator::push_thread_allocator, py::arg("device"), py::arg("allocator"),
        "Route this thread's allocations on a CUDA device to `allocator` (a torchmem Allocator: PlannedSlab, "
        "RecordingAllocator, ...) until cuda_pop_thread_allocator(device). A CUDA graph capture or "
        "torch.cuda.use_mem_pool still takes its stream's allocations.");
  m.def("cuda_pop_thread_allocator", &CudaAllocator::pop_thread_allocator, py::arg("device"),
        "Undo this thread's innermost cuda_push_thread_allocator for `device` (RuntimeError without one).");
}

}  // namespace torchmem::bindings

#endif  // TORCHMEM_WITH_CUDA
