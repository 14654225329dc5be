// Conversions from core structs to Python objects shared by the bindings.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "core/block.h"
#include "core/history.h"
#include "core/stats.h"

namespace torchmem::bindings {

// {"allocation": {"all": {"current":..,"peak":..,"allocated":..,"freed":..},
//  "small_pool": {...}, "large_pool": {...}}, ..., "num_ooms": n, ...}:
// the nested form of torch.cuda.memory_stats() before flattening.
pybind11::dict stats_to_dict(const DeviceStats& stats);
pybind11::list segments_to_list(const std::vector<SegmentInfo>& segments);
pybind11::list trace_to_list(const std::vector<TraceEntry>& entries);

// Registers the translation of torchmem::OutOfMemory to torch.OutOfMemoryError.
void register_out_of_memory(pybind11::module_& m);

}  // namespace torchmem::bindings
