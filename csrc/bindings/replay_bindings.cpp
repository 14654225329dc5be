// Python face of the trace replayer: numpy columns in, plain data out.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/replay/replayer.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

template <typename T>
using Column = py::array_t<T, py::array::c_style | py::array::forcecast>;

py::dict oom_to_dict(const ReplayOom& oom) {
  py::dict d;
  d["index"] = oom.index;
  d["size"] = oom.info.requested;
  d["allocated"] = oom.info.allocated;
  d["reserved"] = oom.info.reserved;
  d["reserved_but_free"] = oom.info.reserved - oom.info.allocated;
  d["largest_free"] = oom.info.largest_free;
  d["device_free"] = oom.info.device_free;
  d["message"] = oom.message;
  d["recorded"] = oom.recorded;
  return d;
}

py::dict fidelity_to_dict(const ReplayFidelity& f) {
  py::dict d;
  d["placements_matched"] = f.placements_matched;
  d["placements_differed"] = f.placements_differed;
  d["first_difference"] = f.first_difference < 0 ? py::object(py::none()) : py::object(py::int_(f.first_difference));
  d["segments_followed"] = f.segments_followed;
  d["segments_missed"] = f.segments_missed;
  d["empty_cache_calls"] = f.empty_cache_calls;
  d["releases_made"] = f.releases_made;
  d["releases_missed"] = f.releases_missed;
  d["failed_alloc_succeeded"] =
      f.failed_alloc_succeeded < 0 ? py::object(py::none()) : py::object(py::int_(f.failed_alloc_succeeded));
  return d;
}

}  // namespace

void bind_replay(py::module_& m) {
  // The replay operation codes this build knows (ReplayOp: 0 .. replay_op_count - 1).
  m.attr("replay_op_count") = static_cast<int>(ReplayOp::kRequestRelease) + 1;
  py::class_<Replayer>(m, "Replayer")
      .def(py::init([](size_t capacity, size_t others, const std::string& conf, uint64_t sample_every, bool skip,
                       bool follow) {
             return std::make_unique<Replayer>(capacity, others, AllocatorConfig::parse(conf), sample_every, skip, follow);
           }),
           py::arg("capacity"), py::arg("in_use_by_others") = 0, py::arg("conf") = "", py::arg("sample_every") = 1,
           py::arg("skip_bad_events") = false, py::arg("follow_recording") = false)
      .def(
          "run",
          [](Replayer& r, Column<uint8_t> ops, Column<uint64_t> ids, Column<uint64_t> sizes, Column<uint64_t> streams,
             std::optional<Column<uint64_t>> addrs) {
            const size_t n = static_cast<size_t>(ops.size());
            if (ids.size() != ops.size() || sizes.size() != ops.size() || streams.size() != ops.size() ||
                (addrs && addrs->size() != ops.size())) {
              throw std::invalid_argument("replay: event columns differ in length");
            }
            const uint64_t* addr_data = addrs ? addrs->data() : nullptr;
            py::gil_scoped_release release;
            return r.run(ops.data(), ids.data(), sizes.data(), streams.data(), addr_data, n);
          },
          py::arg("ops"), py::arg("ids"), py::arg("sizes"), py::arg("streams"), py::arg("addrs") = py::none())
      .def(
          "restore",
          [](Replayer& r, uintptr_t addr, size_t size, Stream stream, bool is_small,
             const std::vector<std::tuple<uintptr_t, size_t, size_t>>& blocks, const std::vector<uint64_t>& ids,
             size_t pool) {
            RecordedSegment seg;
            seg.addr = addr;
            seg.size = size;
            seg.stream = stream;
            seg.is_small = is_small;
            for (const auto& [block_addr, block_size, requested] : blocks) {
              seg.live_blocks.push_back(RecordedBlock{block_addr, block_size, requested});
            }
            r.restore(seg, ids, pool);
          },
          py::arg("addr"), py::arg("size"), py::arg("stream"), py::arg("is_small"), py::arg("blocks"), py::arg("ids"),
          py::arg("pool") = 0)
      .def(
          "enter_pool",
          [](Replayer& r, uint64_t index, uint64_t id_first, uint64_t id_second) {
            r.enter_pool(index, ReplayPoolId{id_first, id_second});
          },
          py::arg("index"), py::arg("id_first"), py::arg("id_second"),
          "Allocations go to private pool `index` (made when it is the next one; 0: the default pool).")
      .def(
          "restore_expandable",
          [](Replayer& r, uintptr_t base, Stream stream, bool is_small, const std::vector<std::pair<uintptr_t, size_t>>& runs,
             const std::vector<std::tuple<uintptr_t, size_t, size_t>>& blocks, const std::vector<uint64_t>& ids,
             size_t pool) {
            RecordedRange range;
            range.base = base;
            range.stream = stream;
            range.is_small = is_small;
            for (const auto& [addr, size] : runs) range.mapped.push_back(SegmentRange{addr, size});
            for (const auto& [block_addr, block_size, requested] : blocks) {
              range.live_blocks.push_back(RecordedBlock{block_addr, block_size, requested});
            }
            r.restore_expandable(range, ids, pool);
          },
          py::arg("base"), py::arg("stream"), py::arg("is_small"), py::arg("runs"), py::arg("blocks"), py::arg("ids"),
          py::arg("pool") = 0)
      .def("set_address_floor", &Replayer::set_address_floor, py::arg("floor"))
      .def_property_readonly("fidelity", [](const Replayer& r) { return fidelity_to_dict(r.fidelity()); })
      .def_property_readonly("stopped", &Replayer::stopped)
      .def_property_readonly("events", &Replayer::events)
      .def_property_readonly("skipped", &Replayer::skipped)
      .def_property_readonly("oom", [](const Replayer& r) -> py::object {
        return r.oom() ? py::object(oom_to_dict(*r.oom())) : py::none();
      })
      .def_property_readonly("recorded_ooms",
                             [](const Replayer& r) {
                               py::list out;
                               for (const ReplayOom& oom : r.recorded_ooms()) out.append(oom_to_dict(oom));
                               return out;
                             })
      .def("timeline",
           [](const Replayer& r) {
             const auto& t = r.timeline();
             py::array_t<int64_t> out({static_cast<py::ssize_t>(t.size()), py::ssize_t(3)});
             auto view = out.mutable_unchecked<2>();
             for (size_t i = 0; i < t.size(); ++i) {
               view(i, 0) = static_cast<int64_t>(t[i].index);
               view(i, 1) = t[i].allocated;
               view(i, 2) = t[i].reserved;
             }
             return out;
           })
      .def("stats", [](Replayer& r) { return stats_to_dict(r.stats()); })
      .def_property_readonly("start_age_guesses", &Replayer::start_age_guesses,
                             "Allocations that a tie between two segments of the start state decided (their ages "
                             "are not in a snapshot: Note [Start segments' ages]).")
      .def_property_readonly("first_start_age_guess", &Replayer::first_start_age_guess,
                             "The event index of the first such allocation, or -1.")
      .def("segments",
           [](Replayer& r) {
             py::list out;
             for (size_t i = 0; i < r.pool_count(); ++i) {
               const ReplayPoolId id = r.pool_id(i);
               for (py::handle seg : segments_to_list(r.pool_allocator(i).segments())) {
                 seg.cast<py::dict>()["segment_pool_id"] = py::make_tuple(id.first, id.second);
                 out.append(seg);
               }
             }
             return out;
           },
           "The final segments of every pool, each with its segment_pool_id ((0, 0): the default pool).")
      .def("largest_free_block", &Replayer::largest_free_block)
      .def("check_invariants", &Replayer::check_invariants)
      .def("enable_history", &Replayer::enable_history, py::arg("max_entries"))
      .def("history", [](Replayer& r) { return trace_to_list(r.history()); })
      .def_property_readonly("policy", [](Replayer& r) { return r.allocator().config().policy; })
      .def(
          "counters",
          [](Replayer& r) -> py::object {
            const auto counters = r.allocator().policy_counters();
            if (counters.empty()) return py::none();
            py::dict d;
            for (const auto& [name, value] : counters) d[name] = value;
            return d;
          },
          "The policy's own counters (policy:stitch: page maps and unmaps, reclaims), or None for a policy without "
          "any (the native one).");
}

}  // namespace torchmem::bindings
