// Python face of the CUDA install (csrc/torch/cuda_allocator.h). Compiled
// only in a CUDA build (setup.py defines TORCHMEM_WITH_CUDA).
#ifdef TORCHMEM_WITH_CUDA

#include <c10/core/Allocator.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

#include "bindings/bindings.h"
#include "core/base/alloc_config.h"
#include "core/policy/stitch/stitch_allocator.h"
#include "cuda/cuda_device.h"
#include "torch/cuda_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

// A stitch allocator on a CudaDevice of its own, outside the installed glue:
// for the GPU check's measurements and tests of the policy on cuMem* calls.
struct StitchOnCuda {
  StitchOnCuda(int index, const AllocatorConfig& config) : device(index), allocator(device, config) {}
  cuda::CudaDevice device;
  StitchAllocator allocator;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Microseconds per page of the device calls the stitch policy makes: map()
// and unmap() of one page per call, and of `pages` pages in one call.
py::dict time_page_calls(int index, size_t pages, size_t rounds) {
  std::vector<double> map_one, unmap_one, map_run, unmap_run;
  size_t page = 0;
  {
    py::gil_scoped_release release;
    cuda::CudaDevice device(index);
    page = device.page_size();
    const uintptr_t base = device.reserve(pages * page);
    if (base == 0) throw std::runtime_error("cuda_time_page_calls: could not reserve the address range");
    using clock = std::chrono::steady_clock;
    auto us_per_page = [&](clock::time_point a, clock::time_point b) {
      return std::chrono::duration<double, std::micro>(b - a).count() / static_cast<double>(pages);
    };
    try {
      for (size_t r = 0; r < rounds; ++r) {
        auto t0 = clock::now();
        for (size_t i = 0; i < pages; ++i) {
          if (!device.map(base + i * page, page)) throw std::runtime_error("cuda_time_page_calls: out of memory");
        }
        auto t1 = clock::now();
        for (size_t i = 0; i < pages; ++i) device.unmap(base + i * page, page);
        auto t2 = clock::now();
        if (!device.map(base, pages * page)) throw std::runtime_error("cuda_time_page_calls: out of memory");
        auto t3 = clock::now();
        device.unmap(base, pages * page);
        auto t4 = clock::now();
        map_one.push_back(us_per_page(t0, t1));
        unmap_one.push_back(us_per_page(t1, t2));
        map_run.push_back(us_per_page(t2, t3));
        unmap_run.push_back(us_per_page(t3, t4));
      }
    } catch (...) {
      device.release(base, pages * page);
      throw;
    }
    device.release(base, pages * page);
  }
  py::dict d;
  d["page_size"] = page;
  d["pages"] = pages;
  d["rounds"] = rounds;
  d["map_us_per_page"] = median(map_one);
  d["unmap_us_per_page"] = median(unmap_one);
  d["map_run_us_per_page"] = median(map_run);
  d["unmap_run_us_per_page"] = median(unmap_run);
  return d;
}

}  // namespace

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
  m.def(
      "cuda_stitch_allocator",
      [](int device, const std::string& conf) {
        auto holder = std::make_shared<StitchOnCuda>(device, AllocatorConfig::parse(conf));
        return std::shared_ptr<StitchAllocator>(holder, &holder->allocator);
      },
      py::arg("device"), py::arg("conf") = "policy:stitch",
      "A StitchAllocator on its own CudaDevice (cuMem* pages), outside the installed allocator: for "
      "measurements and tests. Its memory is not PyTorch's; wrap it with __cuda_array_interface__ to use it.");
  m.def("cuda_time_page_calls", &time_page_calls, py::arg("device"), py::arg("pages") = 128, py::arg("rounds") = 5,
        "Median microseconds per 2 MiB page of CudaDevice::map/unmap, one page per call and all pages in one call.");
}

}  // namespace torchmem::bindings

#endif  // TORCHMEM_WITH_CUDA
