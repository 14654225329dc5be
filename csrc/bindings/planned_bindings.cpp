// Python face of step recording and planned slabs (core/recording_allocator.h,
// core/planned_slab.h).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/planned_slab.h"
#include "core/recording_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_planned(py::module_& m) {
  py::class_<RecordingAllocator, Allocator, std::shared_ptr<RecordingAllocator>>(m, "RecordingAllocator")
      .def(py::init<std::shared_ptr<Allocator>>(), py::arg("target"))
      .def("events", [](const RecordingAllocator& r) {
        py::list out;
        for (const RecordedEvent& e : r.events()) {
          py::dict d;
          d["op"] = e.is_alloc ? "alloc" : "free";
          d["id"] = e.index;
          if (e.is_alloc) d["size"] = e.size;
          out.append(d);
        }
        return out;
      });

  py::class_<PlannedSlab, Allocator, std::shared_ptr<PlannedSlab>>(m, "PlannedSlab")
      .def(py::init<std::shared_ptr<Device>, std::vector<size_t>, std::vector<uint64_t>, size_t, std::shared_ptr<Allocator>>(),
           py::arg("device"), py::arg("sizes"), py::arg("offsets"), py::arg("height"), py::arg("fallback"))
      .def_property_readonly_static("UNPLANNED", [](py::object) { return PlannedSlab::kUnplanned; })
      .def("begin_step", &PlannedSlab::begin_step)
      .def("end_step", &PlannedSlab::end_step)
      .def("allocate", [](PlannedSlab& s, size_t n) { return reinterpret_cast<uintptr_t>(s.allocate(n)); }, py::arg("size"))
      .def("deallocate", [](PlannedSlab& s, uintptr_t p) { s.deallocate(reinterpret_cast<void*>(p)); }, py::arg("ptr"))
      .def("stats", [](const PlannedSlab& s) {
        const PlannedSlabStats st = s.stats();
        py::dict d;
        d["steps"] = st.steps;
        d["hits"] = st.hits;
        d["misses"] = st.misses;
        d["step_hits"] = st.step_hits;
        d["step_misses"] = st.step_misses;
        d["slab_bytes"] = st.slab_bytes;
        d["live_in_slab"] = st.live_in_slab;
        return d;
      });
}

}  // namespace torchmem::bindings
