// Python face of step recording and planned slabs (core/allocators/recording_allocator.h,
// core/allocators/planned_slab.h).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/allocators/planned_slab.h"
#include "core/allocators/recording_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_planned(py::module_& m) {
  py::class_<RecordingAllocator, Allocator, std::shared_ptr<RecordingAllocator>>(m, "RecordingAllocator")
      .def(py::init<std::shared_ptr<Allocator>>(), py::arg("target"), py::keep_alive<1, 2>())
      .def(
          "allocate", [](RecordingAllocator& r, size_t n, Stream stream) { return reinterpret_cast<uintptr_t>(r.allocate(n, stream)); },
          py::arg("size"), py::arg("stream") = 0)
      .def("deallocate", [](RecordingAllocator& r, uintptr_t p) { r.deallocate(reinterpret_cast<void*>(p)); }, py::arg("ptr"))
      .def("events", [](const RecordingAllocator& r) {
        py::list out;
        for (const RecordedEvent& e : r.events()) {
          py::dict d;
          d["op"] = e.is_alloc ? "alloc" : "free";
          d["id"] = e.index;
          if (e.is_alloc) {
            d["size"] = e.size;
            d["stream"] = e.stream;
          }
          out.append(d);
        }
        return out;
      });

  py::class_<PlannedSlab, Allocator, std::shared_ptr<PlannedSlab>>(m, "PlannedSlab")
      .def(py::init<std::shared_ptr<Allocator>>(), py::arg("fallback"), py::keep_alive<1, 2>())
      .def_property_readonly_static("UNPLANNED", [](py::object) { return PlannedSlab::kUnplanned; })
      .def(
          "add_plan",
          [](PlannedSlab& s, const std::vector<size_t>& sizes, const std::vector<uint64_t>& offsets,
             const std::vector<Stream>& streams, size_t height) {
            if (sizes.size() != offsets.size() || sizes.size() != streams.size()) {
              throw py::value_error("add_plan: sizes, offsets and streams differ in length");
            }
            std::vector<PlannedSlot> slots(sizes.size());
            for (size_t i = 0; i < sizes.size(); ++i) slots[i] = {sizes[i], offsets[i], streams[i]};
            return s.add_plan(std::move(slots), height);
          },
          py::arg("sizes"), py::arg("offsets"), py::arg("streams"), py::arg("height"))
      .def("remove_plan", &PlannedSlab::remove_plan, py::arg("plan"))
      .def("release_idle_region", &PlannedSlab::release_idle_region)
      .def("begin_step", &PlannedSlab::begin_step, py::arg("plan"))
      .def("end_step", &PlannedSlab::end_step)
      .def(
          "allocate", [](PlannedSlab& s, size_t n, Stream stream) { return reinterpret_cast<uintptr_t>(s.allocate(n, stream)); },
          py::arg("size"), py::arg("stream") = 0)
      .def("deallocate", [](PlannedSlab& s, uintptr_t p) { s.deallocate(reinterpret_cast<void*>(p)); }, py::arg("ptr"))
      .def("stats", [](const PlannedSlab& s) {
        const PlannedSlabStats st = s.stats();
        py::dict d;
        d["steps"] = st.steps;
        d["hits"] = st.hits;
        d["misses"] = st.misses;
        d["unplanned"] = st.unplanned;
        d["step_hits"] = st.step_hits;
        d["step_misses"] = st.step_misses;
        d["step_unplanned"] = st.step_unplanned;
        d["grow_failures"] = st.grow_failures;
        d["region_bytes"] = st.region_bytes;
        d["plans"] = st.plans;
        d["live_in_slab"] = st.live_in_slab;
        return d;
      });
}

}  // namespace torchmem::bindings
