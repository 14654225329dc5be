// torchmem._C.planner: the static memory planner (csrc/core/planner).
// Buffers cross as three equal-length int lists (lower, upper, size).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "bindings/bindings.h"
#include "bindings/planner_convert.h"
#include "core/planner/lower_bound.h"
#include "core/planner/planner.h"
#include "core/planner/scheduling.h"
#include "core/planner/validate.h"

namespace py = pybind11;

namespace torchmem::bindings {

using planner::Buffer;

void bind_planner(py::module_& m) {
  py::module_ p = m.def_submodule("planner", "Static memory planner");
  p.def("methods", &planner::method_names);
  p.def(
      "solve",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size,
         const std::string& method, double time_limit, int64_t alignment, py::object progress) {
        std::vector<Buffer> buffers = to_buffers(lower, upper, size);
        planner::SolveOptions options;
        options.method = method;
        options.time_limit = time_limit;
        options.alignment = alignment;
        if (!progress.is_none()) {
          options.progress = [progress](const planner::Progress& pr) {
            py::gil_scoped_acquire gil;
            progress(pr.seconds, pr.height, pr.lower_bound, pr.phase);
          };
        }
        planner::Solution s;
        {
          py::gil_scoped_release release;
          s = planner::solve(buffers, options);
        }
        return solution_to_dict(s);
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"), py::arg("method") = "auto",
      py::arg("time_limit") = planner::kDefaultTimeLimit, py::arg("alignment") = 1,
      py::arg("progress") = py::none());
  p.def(
      "lower_bound",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size) {
        return planner::lower_bound(to_buffers(lower, upper, size));
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"));
  p.def(
      "validate",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size,
         const std::vector<int64_t>& offsets) {
        const planner::Validation v = planner::validate(to_buffers(lower, upper, size), offsets);
        return py::make_tuple(v.ok, v.first, v.second, v.message);
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"), py::arg("offsets"));
  p.def(
      "schedule",
      [](int64_t num_nodes, const std::vector<std::pair<int64_t, int64_t>>& edges,
         const std::vector<int64_t>& out_bytes, const std::vector<std::vector<int64_t>>& frees_after_users,
         const std::vector<int64_t>& initial_order) {
        planner::Graph g;
        g.num_nodes = num_nodes;
        g.edges = edges;
        g.out_bytes = out_bytes;
        g.users = frees_after_users;
        planner::ScheduleResult r;
        {
          py::gil_scoped_release release;
          r = planner::schedule(g, initial_order);
        }
        return py::make_tuple(r.order, r.peak_before, r.peak_after);
      },
      py::arg("num_nodes"), py::arg("edges"), py::arg("out_bytes"), py::arg("users"), py::arg("initial_order"));
  bind_planner_streams(p);
}

}  // namespace torchmem::bindings
