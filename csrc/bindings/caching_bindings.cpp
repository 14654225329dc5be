// Python types for the device layer and the device allocators (native and stitch).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/policy_registry.h"
#include "core/devices/host_device.h"
#include "core/devices/sim_device.h"
#include "core/policy/native/caching_allocator.h"
#include "core/policy/stitch/stitch_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_caching(py::module_& m) {
  register_out_of_memory();
  m.def("parse_size", &parse_size, py::arg("text"));
  m.def("parse_config", [](const std::string& text) { return AllocatorConfig::parse(text).to_string(); },
        py::arg("text"), "Validate a config string; returns it normalised.");
  m.def("format_size", &format_size, py::arg("bytes"));

  py::class_<Device, std::shared_ptr<Device>>(m, "Device")
      .def_property_readonly("name", &Device::name)
      .def_property_readonly("total_bytes", &Device::total_bytes)
      .def_property_readonly("free_bytes", &Device::free_bytes);
  py::class_<HostDevice, Device, std::shared_ptr<HostDevice>>(m, "HostDevice")
      .def(py::init<size_t>(), py::arg("capacity") = 0);
  py::class_<SimDevice, Device, std::shared_ptr<SimDevice>>(m, "SimDevice")
      .def(py::init<size_t, size_t, size_t>(), py::arg("capacity"), py::arg("page_size") = 2u << 20,
           py::arg("in_use_by_others") = 0)
      .def_property_readonly("live_segments", &SimDevice::live_segments)
      .def("set_manual_events", &SimDevice::set_manual_events, py::arg("manual"),
           "Events complete only when complete_events()/complete_all_events() or a synchronize says so.")
      .def("complete_events", &SimDevice::complete_events, py::arg("stream"))
      .def("complete_all_events", &SimDevice::complete_all_events)
      .def("set_capturing", &SimDevice::set_capturing, py::arg("capturing"),
           "While set, calls that would invalidate a CUDA graph capture raise (free, unmap, events).")
      .def_property_readonly("live_events", &SimDevice::live_events)
      .def_property_readonly("events_recorded", &SimDevice::events_recorded)
      .def_property_readonly("synchronizations", &SimDevice::synchronizations)
      .def_property_readonly("map_calls", &SimDevice::map_calls)
      .def_property_readonly("unmap_calls", &SimDevice::unmap_calls);

  py::class_<Allocator, std::shared_ptr<Allocator>>(m, "Allocator")
      .def("owns", [](const Allocator& a, uintptr_t p) { return a.owns(reinterpret_cast<void*>(p)); });

  // The methods every device policy offers (device_allocator.h); the
  // native and the stitch policy are subclasses, so a DeviceAllocator from
  // make_device_allocator() arrives in Python as its own class.
  py::class_<DeviceAllocator, Allocator, std::shared_ptr<DeviceAllocator>>(m, "DeviceAllocator")
      .def("allocate",
           [](DeviceAllocator& a, size_t size, Stream stream) { return reinterpret_cast<uintptr_t>(a.allocate(size, stream)); },
           py::arg("size"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>())
      .def("deallocate", [](DeviceAllocator& a, uintptr_t p) { a.deallocate(reinterpret_cast<void*>(p)); },
           py::arg("ptr"), py::call_guard<py::gil_scoped_release>())
      .def("empty_cache", &DeviceAllocator::empty_cache)
      .def("set_memory_fraction", &DeviceAllocator::set_memory_fraction, py::arg("fraction"))
      .def("stats", [](const DeviceAllocator& a) { return stats_to_dict(a.stats()); })
      .def("reset_peak_stats", &DeviceAllocator::reset_peak_stats)
      .def("reset_accumulated_stats", &DeviceAllocator::reset_accumulated_stats)
      .def("largest_free_block", &DeviceAllocator::largest_free_block)
      .def("segments", [](const DeviceAllocator& a) { return segments_to_list(a.segments()); })
      .def("check_invariants", &DeviceAllocator::check_invariants)
      .def("enable_history", [](DeviceAllocator& a, size_t max_entries) { a.enable_history(max_entries); },
           py::arg("max_entries"))
      .def("history", [](const DeviceAllocator& a) { return trace_to_list(a.history_entries()); })
      .def_property_readonly("config", [](const DeviceAllocator& a) { return a.config().to_string(); })
      .def_property_readonly(
          "allocator_settings", [](const DeviceAllocator& a) { return config_to_settings(a.config()); },
          "The config in the layout of a PyTorch snapshot's allocator_settings.")
      .def_property_readonly("policy", [](const DeviceAllocator& a) { return a.config().policy; })
      .def_property_readonly("device", [](DeviceAllocator& a) { return a.device().name(); });

  py::class_<CachingAllocator, DeviceAllocator, std::shared_ptr<CachingAllocator>>(m, "CachingAllocator")
      .def(py::init([](std::shared_ptr<Device> device, const std::string& conf) {
             if (!device) throw py::type_error("CachingAllocator needs a device (HostDevice or SimDevice), not None");
             return std::make_shared<CachingAllocator>(*device, AllocatorConfig::parse(conf));
           }),
           py::arg("device"), py::arg("conf") = "", py::keep_alive<1, 2>());

  py::class_<StitchAllocator, DeviceAllocator, std::shared_ptr<StitchAllocator>>(m, "StitchAllocator")
      .def(py::init([](std::shared_ptr<Device> device, const std::string& conf) {
             if (!device) throw py::type_error("StitchAllocator needs a device (HostDevice or SimDevice), not None");
             return std::make_shared<StitchAllocator>(*device, AllocatorConfig::parse(conf));
           }),
           py::arg("device"), py::arg("conf") = "", py::keep_alive<1, 2>())
      .def("counters", [](const StitchAllocator& a) { return stitch_counters_to_dict(a.counters()); },
           "Page maps and unmaps (device calls), reclaims under pressure, ranges reserved, placements on cached pages.")
      .def_property_readonly("ranges", &StitchAllocator::ranges);

  m.def(
      "device_allocator",
      [](std::shared_ptr<Device> device, const std::string& conf) {
        if (!device) throw py::type_error("device_allocator needs a device (HostDevice or SimDevice), not None");
        return make_device_allocator(*device, AllocatorConfig::parse(conf));
      },
      py::arg("device"), py::arg("conf") = "", py::keep_alive<0, 1>(),
      "The allocator the config's policy asks for (policy:native, the default, or policy:stitch) on `device`.");

  m.def(
      "policies",
      [] {
        std::vector<std::string> names;
        for (const PolicyRegistration& p : registered_policies()) names.emplace_back(p.name);
        return names;
      },
      "The names a config's policy:NAME may give, the default first (csrc/core/policy/policies.cpp).");
}

}  // namespace torchmem::bindings
