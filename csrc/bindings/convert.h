// Conversions from core structs to Python objects shared by the bindings.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/history.h"
#include "core/base/stats.h"
#include "core/policy/native/block.h"
#include "core/policy/stitch/stitch_allocator.h"

namespace torchmem::bindings {

// {"allocation": {"all": {"current":..,"peak":..,"allocated":..,"freed":..},
//  "small_pool": {...}, "large_pool": {...}}, ..., "num_ooms": n, ...}:
// the nested form of torch.cuda.memory_stats() before flattening.
pybind11::dict stats_to_dict(const DeviceStats& stats);
pybind11::list segments_to_list(const std::vector<SegmentInfo>& segments);
pybind11::list trace_to_list(const std::vector<TraceEntry>& entries);
// A config in the layout of a PyTorch snapshot's "allocator_settings":
// PYTORCH_CUDA_ALLOC_CONF (the config string), max_split_size (bytes, -1 for
// no limit), max_non_split_rounding (bytes), garbage_collection_threshold,
// expandable_segments, roundup_power2_divisions ({"1": n, "2": n, ...,
// "32768": n}, keyed by the interval's size in MiB as the config grammar).
// Under policy:stitch it also has "policy": "stitch".
pybind11::dict config_to_settings(const AllocatorConfig& config);
// {"page_maps", "page_unmaps", "reclaims", "ranges_reserved", "placements_on_cached"}.
pybind11::dict stitch_counters_to_dict(const StitchAllocator::Counters& counters);

// Whether the interpreter is up and not finalizing (Python may be called).
bool python_alive();

// Registers the translation of torchmem::OutOfMemory to torch.OutOfMemoryError,
// imported when the first one is raised (MemoryError where torch is missing).
void register_out_of_memory();

}  // namespace torchmem::bindings
