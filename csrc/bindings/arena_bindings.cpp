// Python type for the arena (core/allocators/arena.h). Pointers cross as integers
// (uintptr_t); a stream of None is kAnyStream.
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "bindings/bindings.h"
#include "core/allocators/arena.h"
#include "core/policy/native/caching_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

py::dict arena_stats_to_dict(const ArenaStats& s) {
  py::dict d;
  d["capacity"] = s.capacity;
  d["used"] = s.used;
  d["peak"] = s.peak;
  d["live_allocations"] = s.live_allocations;
  d["live_bytes"] = s.live_bytes;
  d["holes"] = s.holes;
  d["hole_bytes"] = s.hole_bytes;
  d["holes_skipped"] = s.holes_skipped;
  d["allocations"] = s.allocations;
  d["rewinds"] = s.rewinds;
  d["wraps"] = s.wraps;
  d["resets"] = s.resets;
  d["fallback_allocations"] = s.fallback_allocations;
  d["fallback_bytes"] = s.fallback_bytes;
  d["other_stream_allocations"] = s.other_stream_allocations;
  d["fallback_live"] = s.fallback_live;
  d["fallback_live_bytes"] = s.fallback_live_bytes;
  d["block_peak"] = s.block_peak;
  d["block_allocations"] = s.block_allocations;
  d["block_holes"] = s.block_holes;
  d["block_hole_bytes"] = s.block_hole_bytes;
  d["block_holes_skipped"] = s.block_holes_skipped;
  d["block_fallback_allocations"] = s.block_fallback_allocations;
  d["block_fallback_bytes"] = s.block_fallback_bytes;
  return d;
}

ArenaOptions options(size_t capacity, size_t alignment, std::optional<Stream> stream) {
  ArenaOptions o;
  o.capacity = capacity;
  o.default_alignment = alignment;
  o.stream = stream.value_or(kAnyStream);
  return o;
}

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

void bind_arena(py::module_& m) {
  py::class_<Arena, Allocator, std::shared_ptr<Arena>>(m, "Arena")
      .def(py::init([](std::shared_ptr<Device> device, size_t capacity, size_t alignment,
                       std::shared_ptr<Allocator> fallback, std::optional<Stream> stream,
                       std::shared_ptr<Allocator> other_streams) {
             if (!device) throw py::type_error("Arena needs a device (torchmem._C.HostDevice or SimDevice), not None");
             return std::make_shared<Arena>(ArenaOwners{std::move(device), nullptr, std::move(fallback), std::move(other_streams)},
                                            options(capacity, alignment, stream));
           }),
           py::arg("device"), py::arg("capacity"), py::arg("alignment") = 64, py::arg("fallback") = nullptr,
           py::arg("stream") = py::none(), py::arg("other_streams") = nullptr,
           // The allocators' Python objects may own what they need (their devices).
           py::keep_alive<1, 5>(), py::keep_alive<1, 7>())
      .def_static(
          "over",
          [](std::shared_ptr<DeviceAllocator> source, size_t capacity, size_t alignment,
             std::shared_ptr<Allocator> fallback, std::optional<Stream> stream, std::shared_ptr<Allocator> other_streams) {
            if (!source) throw py::type_error("Arena.over needs a device allocator (CachingAllocator or StitchAllocator), not None");
            std::shared_ptr<Device> device(source, &source->device());
            return std::make_shared<Arena>(ArenaOwners{device, source, std::move(fallback), std::move(other_streams)},
                                           options(capacity, alignment, stream));
          },
          py::arg("source"), py::arg("capacity"), py::arg("alignment") = 64, py::arg("fallback") = nullptr,
          py::arg("stream") = py::none(), py::arg("other_streams") = nullptr,
          py::keep_alive<0, 1>(), py::keep_alive<0, 4>(), py::keep_alive<0, 6>(),
          "An arena whose region is one allocation of `source` (on `stream`), returned to it when the arena goes.")
      .def(
          "allocate",
          [](Arena& a, size_t size, size_t alignment, std::optional<Stream> stream) {
            void* p = alignment ? a.allocate_aligned(size, alignment) : a.allocate(size, stream.value_or(0));
            return reinterpret_cast<uintptr_t>(p);
          },
          py::arg("size"), py::arg("alignment") = 0, py::arg("stream") = py::none())
      .def("deallocate", [](Arena& a, uintptr_t p) { a.deallocate(as_ptr(p)); }, py::arg("ptr"))
      .def("owns", [](const Arena& a, uintptr_t p) { return a.owns(as_ptr(p)); }, py::arg("ptr"))
      .def("rewind", &Arena::rewind)
      .def("reset", &Arena::reset)
      .def("reset_peak", &Arena::reset_peak)
      .def("stats", [](const Arena& a) { return arena_stats_to_dict(a.stats()); })
      .def("check_invariants", &Arena::check_invariants)
      .def_property_readonly("capacity", &Arena::capacity)
      .def_property_readonly("used", &Arena::used)
      .def_property_readonly("peak", &Arena::peak)
      .def_property_readonly("live_allocations", &Arena::live_allocations)
      .def_property_readonly("base", &Arena::base)
      .def_property_readonly("stream",
                             [](const Arena& a) -> std::optional<Stream> {
                               if (a.stream() == kAnyStream) return std::nullopt;
                               return a.stream();
                             })
      .def_property_readonly("device", [](Arena& a) { return a.device().name(); });
}

}  // namespace torchmem::bindings
