// Python types for the paged block pool (core/allocators/paged_block_pool.h). Block ids
// cross as ints; batches as lists.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "core/allocators/paged_block_pool.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

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

}  // namespace

void bind_paged(py::module_& m) {
  // Registered after bind_caching's OutOfMemory translator, so tried first.
  py::register_exception<OutOfBlocks>(m, "OutOfBlocksError", PyExc_MemoryError);

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
