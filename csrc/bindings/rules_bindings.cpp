// PyTorch's allocator rules as the core holds them (core/base/alloc_config.h,
// core/replay/replayer.h): the Python replay reads them here, never copies them.
#include <limits>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/base/alloc_config.h"
#include "core/replay/replayer.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_rules(py::module_& m) {
  py::module_ rules = m.def_submodule("rules", "PyTorch's allocator rules, from torchmem's core");
  rules.attr("MIN_BLOCK_SIZE") = kMinBlockSize;
  rules.attr("SMALL_SIZE") = kSmallSize;
  rules.attr("SMALL_BUFFER") = kSmallBuffer;
  rules.attr("LARGE_BUFFER") = kLargeBuffer;
  rules.attr("MIN_LARGE_ALLOC") = kMinLargeAlloc;
  rules.attr("ROUND_LARGE") = kRoundLarge;
  rules.def("allocation_size", &allocation_size, py::arg("size"), py::arg("large_segment_size") = kLargeBuffer,
            "What PyTorch asks the device for to serve a rounded request (get_allocation_size).");
  rules.def(
      "round_sizes",
      [](const std::vector<size_t>& sizes, const std::string& conf) {
        const AllocatorConfig c = AllocatorConfig::parse(conf);
        std::vector<size_t> out;
        out.reserve(sizes.size());
        for (size_t size : sizes) out.push_back(round_request(size, c));
        return out;
      },
      py::arg("sizes"), py::arg("conf") = "",
      "The block each request of these sizes takes under a settings string (PyTorch's round_size).");
  rules.def(
      "expandable_range_size",
      [](size_t device_bytes, size_t page) { return expandable_pages(device_bytes, page) * page; },
      py::arg("device_bytes"), py::arg("page"),
      "The address range of one expandable segment on a device of that many bytes: 9/8 of it, in whole pages.");
  rules.def("config_items", &config_items, py::arg("text"),
            "The top-level items of a settings string, as the core splits it: ValueError for an empty item "
            "or unbalanced brackets.");
  rules.def(
      "config_fields",
      [](const std::string& text) {
        const AllocatorConfig c = AllocatorConfig::parse(text);
        py::dict d;
        d["large_segment_size"] = c.large_segment_size;
        d["max_split_size"] = c.max_split_size == std::numeric_limits<size_t>::max() ? py::object(py::none())
                                                                                      : py::object(py::int_(c.max_split_size));
        d["expandable_segments"] = c.expandable_segments;
        d["garbage_collection_threshold"] = c.garbage_collection_threshold;
        d["per_process_memory_fraction"] = c.per_process_memory_fraction;
        d["policy"] = c.policy;
        return d;
      },
      py::arg("text"),
      "A settings string read as the core reads it (AllocatorConfig::parse): ValueError for a bad one.");
  py::dict ops;
  ops["ALLOC"] = static_cast<int>(ReplayOp::kAlloc);
  ops["FREE"] = static_cast<int>(ReplayOp::kFree);
  ops["EMPTY_CACHE"] = static_cast<int>(ReplayOp::kEmptyCache);
  ops["SEGMENT_ADDRESS"] = static_cast<int>(ReplayOp::kSegmentAddress);
  ops["FAILED_ALLOC"] = static_cast<int>(ReplayOp::kFailedAlloc);
  ops["RELEASE_SEGMENT"] = static_cast<int>(ReplayOp::kReleaseSegment);
  ops["SURVIVED_FAILED_ALLOC"] = static_cast<int>(ReplayOp::kSurvivedFailedAlloc);
  ops["POOL"] = static_cast<int>(ReplayOp::kPool);
  ops["FREE_REQUESTED"] = static_cast<int>(ReplayOp::kFreeRequested);
  ops["RANGE_OFFER"] = static_cast<int>(ReplayOp::kRangeOffer);
  ops["RECORDED_RETRY"] = static_cast<int>(ReplayOp::kRecordedRetry);
  ops["FREE_AT_SYNC"] = static_cast<int>(ReplayOp::kFreeAtSync);
  ops["REQUEST_RELEASE"] = static_cast<int>(ReplayOp::kRequestRelease);
  rules.attr("REPLAY_OPS") = ops;
}

}  // namespace torchmem::bindings
