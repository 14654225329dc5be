// Python face of DeviceMemory (core/device_memory/device_memory.h): a device's streams,
// private pools and capture rules, driven on a SimDevice by the tests.
#include <pybind11/stl.h>

#include <set>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/device_memory/device_memory.h"
#include "core/policy/native/caching_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

void* to_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// A route's filter: the given streams, or every stream when None.
DeviceMemory::Filter stream_filter(const std::optional<std::vector<Stream>>& streams) {
  if (!streams) return [](Stream) { return true; };
  std::set<Stream> set(streams->begin(), streams->end());
  return [set](Stream s) { return set.count(s) != 0; };
}

}  // namespace

void bind_device_memory(py::module_& m) {
  using DM = DeviceMemory;
  py::class_<DM, std::shared_ptr<DM>>(m, "DeviceMemory",
                                      "One device's memory policy: streams, private pools, capture rules.")
      .def(py::init([](std::shared_ptr<Device> device, const std::string& conf) {
             if (!device) throw py::type_error("DeviceMemory needs a device");
             return std::make_shared<DM>(*device, AllocatorConfig::parse(conf));
           }),
           py::arg("device"), py::arg("conf") = "", py::keep_alive<1, 2>())
      .def(
          "allocate",
          [](DM& d, size_t size, Stream stream, std::shared_ptr<Allocator> thread_allocator) {
            return reinterpret_cast<uintptr_t>(d.allocate(size, stream, thread_allocator));
          },
          py::arg("size"), py::arg("stream") = 0, py::arg("thread_allocator") = nullptr,
          py::call_guard<py::gil_scoped_release>())
      .def("free", [](DM& d, uintptr_t p) { return d.free(to_ptr(p)); }, py::arg("ptr"),
           py::call_guard<py::gil_scoped_release>())
      .def("owns", [](const DM& d, uintptr_t p) { return d.owns(to_ptr(p)); }, py::arg("ptr"))
      .def("record_stream", [](DM& d, uintptr_t p, Stream s) { return d.record_stream(to_ptr(p), s); },
           py::arg("ptr"), py::arg("stream"))
      .def_property_readonly("pending_frees", &DM::pending_frees)
      .def("empty_cache", &DM::empty_cache)
      .def("empty_pool_cache", &DM::empty_pool_cache, py::arg("pool"))
      .def("set_memory_fraction", &DM::set_memory_fraction, py::arg("fraction"))
      .def_property_readonly("memory_fraction", &DM::memory_fraction)
      .def("create_or_incref_pool", &DM::create_or_incref_pool, py::arg("pool"))
      .def(
          "begin_allocate_to_pool",
          [](DM& d, PoolId id, std::optional<std::vector<Stream>> streams, bool capture) {
            d.begin_allocate_to_pool(id, stream_filter(streams), capture);
          },
          py::arg("pool"), py::arg("streams") = py::none(), py::arg("capture") = false,
          "Route allocations on `streams` (None: every stream) to the pool; capture=True: a CUDA graph capture.")
      .def("end_allocate_to_pool", &DM::end_allocate_to_pool, py::arg("pool"))
      .def("release_pool", &DM::release_pool, py::arg("pool"))
      .def("set_use_on_oom", &DM::set_use_on_oom, py::arg("pool"), py::arg("use_on_oom"))
      .def("pool_use_count", &DM::pool_use_count, py::arg("pool"))
      .def_property_readonly("pool_count", &DM::pool_count)
      .def_property_readonly("capture_underway", &DM::capture_underway)
      .def("add_routed", &DM::add_routed, py::arg("allocator"))
      .def("drop_unused_routed", &DM::drop_unused_routed)
      .def("stats", [](const DM& d) { return stats_to_dict(d.stats()); })
      .def("reset_peak_stats", &DM::reset_peak_stats)
      .def("reset_accumulated_stats", &DM::reset_accumulated_stats)
      .def("largest_free_block", &DM::largest_free_block)
      .def(
          "segments",
          [](const DM& d) {
            py::list out;
            for (auto& [id, a] : d.allocators()) {
              py::list segs = segments_to_list(a->segments());
              for (auto seg : segs) seg.cast<py::dict>()["pool"] = py::make_tuple(id.first, id.second);
              for (auto seg : segs) out.append(seg);
            }
            return out;
          },
          "Segments of the main allocator and the pools, each with its pool id (0, 0 for the main one).")
      .def("history",
           [](const DM& d) {
             py::list out;
             for (auto& [id, a] : d.allocators()) {
               for (auto e : trace_to_list(a->history_entries())) out.append(e);
             }
             return out;
           })
      .def("enable_history",
           [](DM& d, size_t max_entries, bool clear) { d.enable_history(max_entries, nullptr, clear); },
           py::arg("max_entries"), py::arg("clear") = false)
      .def("reconfigure", [](DM& d, const std::string& conf) { return d.reconfigure(AllocatorConfig::parse(conf)); },
           py::arg("conf"))
      .def_property_readonly("config", [](const DM& d) { return d.config().to_string(); })
      .def_property_readonly("main", [](const DM& d) { return std::dynamic_pointer_cast<CachingAllocator>(d.main()); })
      .def("check_invariants", &DM::check_invariants);
}

}  // namespace torchmem::bindings
