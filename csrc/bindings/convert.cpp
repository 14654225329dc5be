#include "bindings/convert.h"

#include "core/base/out_of_memory.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

py::dict stat_to_dict(const Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_to_dict(const StatArray& a) {
  py::dict d;
  d["all"] = stat_to_dict(a[kAggregate]);
  d["small_pool"] = stat_to_dict(a[kSmallPool]);
  d["large_pool"] = stat_to_dict(a[kLargePool]);
  return d;
}

}  // namespace

py::dict stats_to_dict(const DeviceStats& s) {
  py::dict d;
  d["allocation"] = stat_array_to_dict(s.allocation);
  d["segment"] = stat_array_to_dict(s.segment);
  d["active"] = stat_array_to_dict(s.active);
  d["inactive_split"] = stat_array_to_dict(s.inactive_split);
  d["allocated_bytes"] = stat_array_to_dict(s.allocated_bytes);
  d["reserved_bytes"] = stat_array_to_dict(s.reserved_bytes);
  d["active_bytes"] = stat_array_to_dict(s.active_bytes);
  d["inactive_split_bytes"] = stat_array_to_dict(s.inactive_split_bytes);
  d["requested_bytes"] = stat_array_to_dict(s.requested_bytes);
  d["oversize_allocations"] = stat_to_dict(s.oversize_allocations);
  d["oversize_segments"] = stat_to_dict(s.oversize_segments);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["max_split_size"] = s.max_split_size;
  return d;
}

py::list segments_to_list(const std::vector<SegmentInfo>& segments) {
  py::list out;
  for (const SegmentInfo& seg : segments) {
    py::dict d;
    d["address"] = seg.addr;
    d["total_size"] = seg.total_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.is_small ? "small" : "large";
    d["allocated_size"] = seg.allocated_size;
    d["requested_size"] = seg.requested_size;
    d["is_expandable"] = seg.is_expandable;
    py::list blocks;
    for (const BlockInfo& b : seg.blocks) {
      py::dict bd;
      bd["address"] = b.addr;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["allocated"] = b.allocated;
      bd["active"] = b.active;
      bd["mapped"] = b.mapped;
      blocks.append(bd);
    }
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
}

py::list trace_to_list(const std::vector<TraceEntry>& entries) {
  py::list out;
  for (const TraceEntry& e : entries) {
    py::dict d;
    d["action"] = action_name(e.action);
    d["addr"] = e.addr;
    d["size"] = e.size;
    d["stream"] = e.stream;
    d["time_us"] = e.time_us;
    d["context"] = e.context;
    out.append(d);
  }
  return out;
}

py::dict config_to_settings(const AllocatorConfig& config) {
  py::dict d;
  d["PYTORCH_CUDA_ALLOC_CONF"] = config.to_string();
  d["max_split_size"] = config.max_split_size == AllocatorConfig{}.max_split_size
                            ? int64_t{-1}
                            : static_cast<int64_t>(config.max_split_size);
  d["max_non_split_rounding"] = config.max_non_split_rounding;
  d["garbage_collection_threshold"] = config.garbage_collection_threshold;
  d["expandable_segments"] = config.expandable_segments;
  py::dict divisions;
  for (size_t i = 0; i < config.roundup_power2_divisions.size(); ++i) {
    divisions[py::str(std::to_string(size_t(1) << i))] = config.roundup_power2_divisions[i];
  }
  d["roundup_power2_divisions"] = divisions;
  if (config.policy != kNativePolicy) d["policy"] = config.policy;
  return d;
}

py::dict stitch_counters_to_dict(const StitchAllocator::Counters& c) {
  py::dict d;
  d["page_maps"] = c.page_maps;
  d["page_unmaps"] = c.page_unmaps;
  d["reclaims"] = c.reclaims;
  d["ranges_reserved"] = c.ranges_reserved;
  d["placements_on_cached"] = c.placements_on_cached;
  return d;
}

bool python_alive() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsFinalizing();
#else
  return !_Py_IsFinalizing();
#endif
}

void register_out_of_memory() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
      // torch is imported here, not at the module's import, so the core loads without it.
      py::object type;
      try {
        type = py::module_::import("torch").attr("OutOfMemoryError");
      } catch (py::error_already_set&) {
        PyErr_Clear();
        type = py::reinterpret_borrow<py::object>(PyExc_MemoryError);
      }
      PyErr_SetString(type.ptr(), e.what());
    }
  });
}

}  // namespace torchmem::bindings
