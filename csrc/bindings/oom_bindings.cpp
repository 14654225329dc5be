// Python face of out-of-memory observers (csrc/core/base/oom_observers.h) on the
// CPU install and, in a CUDA build, on the CUDA install.
//
// A Python observer is called as fn(device: int, info: dict) and returns a
// note (str) for the error message, or None. info holds OomInfo's fields:
// requested, allocated, reserved, largest_free, device_total, device_free,
// allowed (bytes).
//
// GIL: the observer runs on the thread that ran out of memory, usually with
// the GIL released (PyTorch releases it around operators), so the adapter
// takes it. On a thread that never ran Python (an intra-op worker) it does
// not: making such a thread wait for the GIL could deadlock against a
// Python thread that waits for it, so the observer is skipped and the note
// says so. While the interpreter is finalizing, observers are skipped.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/base/oom_observers.h"
#include "torch/cpu_allocator.h"
#ifdef TORCHMEM_WITH_CUDA
#include "torch/cuda_allocator.h"
#endif

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

py::dict oom_info_to_dict(const OomInfo& info) {
  py::dict d;
  d["requested"] = info.requested;
  d["allocated"] = info.allocated;
  d["reserved"] = info.reserved;
  d["largest_free"] = info.largest_free;
  d["device_total"] = info.device_total;
  d["device_free"] = info.device_free;
  d["allowed"] = info.allowed;
  return d;
}

// The callable is released with the GIL held, whichever thread drops the last copy.
std::shared_ptr<py::object> hold(py::function fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* obj) {
    if (python_alive()) {
      py::gil_scoped_acquire gil;
      delete obj;
    } else {
      obj->release();  // leak rather than touch a dead interpreter
      delete obj;
    }
  });
}

OomObservers::Observer python_observer(py::function fn) {
  return [held = hold(std::move(fn))](int device, const OomInfo& info) -> std::string {
    if (!python_alive()) return {};
    if (PyGILState_GetThisThreadState() == nullptr) {
      return "torchmem: out-of-memory observers were skipped: the allocation ran on a thread that never ran "
             "Python (an intra-op worker thread)";
    }
    py::gil_scoped_acquire gil;
    try {
      py::object note = (*held)(device, oom_info_to_dict(info));
      return note.is_none() ? std::string() : py::str(note).cast<std::string>();
    } catch (py::error_already_set& e) {
      std::string what = e.what();  // pybind11 adds the traceback ("\n\nAt:\n  file(line): fn ...")
      what.erase(what.find_last_not_of(" \n") + 1);
      return "torchmem: an out-of-memory observer failed: " + what;
    }
  };
}

}  // namespace

void bind_oom(py::module_& m) {
  using glue::CpuAllocator;
  m.def(
      "cpu_add_oom_observer",
      [](py::function fn) { return CpuAllocator::instance().oom_observers().add(python_observer(std::move(fn))); },
      py::arg("fn"),
      "Call fn(device, info) when the CPU install raises an out-of-memory error, before it is raised; a str it "
      "returns ends the error's message. Returns an id for cpu_remove_oom_observer().");
  m.def(
      "cpu_remove_oom_observer", [](uint64_t id) { return CpuAllocator::instance().oom_observers().remove(id); },
      py::arg("id"), "Forget an observer; False when the id is not (or no longer) registered.");
#ifdef TORCHMEM_WITH_CUDA
  using glue::CudaAllocator;
  m.def(
      "cuda_add_oom_observer",
      [](py::function fn) { return CudaAllocator::instance()->oom_observers().add(python_observer(std::move(fn))); },
      py::arg("fn"),
      "Call fn(device, info) when the CUDA install raises torch.cuda.OutOfMemoryError, after PyTorch's own "
      "observers; a str it returns ends the error's message. Returns an id for cuda_remove_oom_observer().");
  m.def(
      "cuda_remove_oom_observer", [](uint64_t id) { return CudaAllocator::instance()->oom_observers().remove(id); },
      py::arg("id"), "Forget an observer; False when the id is not (or no longer) registered.");
#endif
}

}  // namespace torchmem::bindings
