#include "bindings/planner_convert.h"

#include <pybind11/stl.h>

#include <stdexcept>

namespace py = pybind11;

namespace torchmem::bindings {

std::vector<planner::Buffer> to_buffers(const std::vector<int64_t>& lower, const std::vector<int64_t>& upper,
                                        const std::vector<int64_t>& size) {
  if (lower.size() != upper.size() || lower.size() != size.size()) {
    throw std::invalid_argument("lower, upper and size must have the same length");
  }
  std::vector<planner::Buffer> out(lower.size());
  for (size_t i = 0; i < lower.size(); ++i) out[i] = {int64_t(i), lower[i], upper[i], size[i]};
  return out;
}

py::dict solution_to_dict(const planner::Solution& s) {
  py::dict d;
  d["offsets"] = s.offsets;
  d["height"] = s.height;
  d["lower_bound"] = s.lower_bound;
  d["method"] = s.method;
  d["optimal"] = s.optimal;
  d["seconds"] = s.seconds;
  d["nodes"] = s.nodes;
  d["sharing"] = s.sharing;
  return d;
}

}  // namespace torchmem::bindings
