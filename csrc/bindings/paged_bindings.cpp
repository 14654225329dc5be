// Python types for the arena (core/arena.h) and the paged block pool
// (core/block_pool.h). Pointers cross as integers (uintptr_t); block ids as
// ints; batches as lists.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "core/arena.h"
#include "core/block_pool.h"

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
  d["allocations"] = s.allocations;
  d["resets"] = s.resets;
  d["fallback_allocations"] = s.fallback_allocations;
  d["fallback_bytes"] = s.fallback_bytes;
  d["fallback_live"] = s.fallback_live;
  d["reset_pending"] = s.reset_pending;
  return d;
}

py::dict pool_stats_to_dict(const PagedBlockPoolStats& s) {
  py::dict d;
  d["allocations"] = s.allocations;
  d["releases"] = s.releases;
  d["copies"] = s.copies;
  d["cache_hits"] = s.cache_hits;
  d["cache_misses"] = s.cache_misses;
  d["evictions"] = s.evictions;
  return d;
}

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

void bind_paged(py::module_& m) {
  // Registered after bind_caching's OutOfMemory translator, so tried first.
  py::register_exception<OutOfBlocks>(m, "OutOfBlocksError", PyExc_MemoryError);

  py::class_<Arena, Allocator, std::shared_ptr<Arena>>(m, "Arena")
      .def(py::init([](std::shared_ptr<Device> device, size_t capacity, size_t alignment,
                       std::shared_ptr<Allocator> fallback) {
             if (!device) throw py::type_error("Arena needs a device (torchmem._C.HostDevice or SimDevice), not None");
             ArenaOptions options;
             options.capacity = capacity;
             options.default_alignment = alignment;
             return std::make_shared<Arena>(std::move(device), options, std::move(fallback));
           }),
           py::arg("device"), py::arg("capacity"), py::arg("alignment") = 64, py::arg("fallback") = nullptr,
           // The fallback's Python object may own what the fallback needs (its device).
           py::keep_alive<1, 5>())
      .def(
          "allocate",
          [](Arena& a, size_t size, size_t alignment) {
            return reinterpret_cast<uintptr_t>(alignment ? a.allocate_aligned(size, alignment) : a.allocate(size));
          },
          py::arg("size"), py::arg("alignment") = 0)
      .def("deallocate", [](Arena& a, uintptr_t p) { a.deallocate(as_ptr(p)); }, py::arg("ptr"))
      .def("owns", [](const Arena& a, uintptr_t p) { return a.owns(as_ptr(p)); }, py::arg("ptr"))
      .def("reset", &Arena::reset)
      .def("reset_when_unused", &Arena::reset_when_unused)
      .def("reset_peak", &Arena::reset_peak)
      .def("stats", [](const Arena& a) { return arena_stats_to_dict(a.stats()); })
      .def("check_invariants", &Arena::check_invariants)
      .def_property_readonly("capacity", &Arena::capacity)
      .def_property_readonly("used", &Arena::used)
      .def_property_readonly("peak", &Arena::peak)
      .def_property_readonly("live_allocations", &Arena::live_allocations)
      .def_property_readonly("base", &Arena::base)
      .def_property_readonly("device", [](Arena& a) { return a.device().name(); });

  py::class_<PagedBlockPool, std::shared_ptr<PagedBlockPool>>(m, "PagedBlockPool")
      .def(py::init<int32_t>(), py::arg("num_blocks"))
      .def_property_readonly("num_blocks", &PagedBlockPool::num_blocks)
      .def_property_readonly("num_free", &PagedBlockPool::num_free)
      .def_property_readonly("num_parked", &PagedBlockPool::num_parked)
      .def_property_readonly("num_used", &PagedBlockPool::num_used)
      .def("ref_count", &PagedBlockPool::ref_count, py::arg("block"))
      .def("allocate", &PagedBlockPool::allocate)
      .def("try_allocate", &PagedBlockPool::try_allocate, "A block id, or -1 when none is free.")
      .def("release", &PagedBlockPool::release, py::arg("block"))
      .def("retain", &PagedBlockPool::retain, py::arg("block"))
      .def(
          "allocate_n",
          [](PagedBlockPool& p, size_t n) {
            std::vector<BlockId> out(n);
            p.allocate_n(n, out.data());
            return out;
          },
          py::arg("n"))
      .def(
          "try_allocate_n",
          [](PagedBlockPool& p, size_t n) -> py::object {
            std::vector<BlockId> out(n);
            if (!p.try_allocate_n(n, out.data())) return py::none();
            return py::cast(out);
          },
          py::arg("n"), "A list of n block ids, or None (nothing allocated) when fewer are free.")
      .def("release_n", [](PagedBlockPool& p, const std::vector<BlockId>& ids) { p.release_n(ids.data(), ids.size()); },
           py::arg("blocks"))
      .def("retain_n", [](PagedBlockPool& p, const std::vector<BlockId>& ids) { p.retain_n(ids.data(), ids.size()); },
           py::arg("blocks"))
      .def("make_writable", &PagedBlockPool::make_writable, py::arg("block"), py::arg("copy"),
           "copy(src, dst) is called when the block is shared; returns the writable block.")
      .def(
          "allocate_and_make_writable",
          [](PagedBlockPool& p, size_t n_new, std::vector<BlockId> last) {
            std::vector<BlockId> fresh(n_new);
            std::vector<PagedBlockPool::Copy> copies;
            p.allocate_and_make_writable(n_new, fresh.data(), last.data(), last.size(), &copies);
            return std::make_tuple(std::move(fresh), std::move(last), std::move(copies));
          },
          py::arg("n_new"), py::arg("last"),
          "Returns (new blocks, writable last blocks, [(src, dst) copies to perform]); all or nothing.")
      .def("set_hash", &PagedBlockPool::set_hash, py::arg("block"), py::arg("hash"))
      .def("acquire_cached", &PagedBlockPool::acquire_cached, py::arg("hash"))
      .def("lookup", &PagedBlockPool::lookup, py::arg("hash"))
      .def("has_hash", &PagedBlockPool::has_hash, py::arg("block"))
      .def("stats", [](const PagedBlockPool& p) { return pool_stats_to_dict(p.stats()); })
      .def("check_invariants", &PagedBlockPool::check_invariants);
}

}  // namespace torchmem::bindings
