// Python face of allocation history: enabling it on a caching allocator, with
// an optional context provider that tags each allocation with the Python
// stack that made it.
//
// Stacks are interned: a code object is turned into (file, function) once and
// kept alive, a (code, line) pair becomes a frame id once, and a sequence of
// frame ids becomes a stack id once. Capturing a stack that was seen before
// walks the frames and does hash lookups, with no Python object created.
//
// Thread safety: the provider runs on whatever thread allocates, usually with
// the GIL released (PyTorch releases it around operators), so it takes the
// GIL itself; the tables are only touched with the GIL held, which is their
// lock. The allocator calls the provider before taking its own lock, so
// waiting for the GIL here cannot deadlock against the allocator.
#include <Python.h>
#include <frameobject.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/policy/native/caching_allocator.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

struct VectorHash {
  size_t operator()(const std::vector<uint32_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Interned Python stacks. Stack id 0 means "no Python frames".
class StackTable {
 public:
  explicit StackTable(size_t max_depth) : max_depth_(max_depth) {}
  StackTable(const StackTable&) = delete;
  StackTable& operator=(const StackTable&) = delete;

  ~StackTable() {
    if (!python_alive()) return;  // leak the code objects rather than touch a dead interpreter
    PyGILState_STATE state = PyGILState_Ensure();
    for (auto& kv : codes_) Py_DECREF(kv.first);
    PyGILState_Release(state);
  }

  // The current thread's Python stack, innermost frame first. GIL held.
  uint64_t capture() {
    scratch_.clear();
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    while (frame != nullptr && scratch_.size() < max_depth_) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      scratch_.push_back(frame_id(code, frame));
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
    if (scratch_.empty()) return 0;
    auto it = stack_ids_.find(scratch_);
    if (it != stack_ids_.end()) return it->second;
    const uint64_t id = stacks_.size() + 1;
    stacks_.push_back(scratch_);
    stack_ids_.emplace(scratch_, id);
    return id;
  }

  // [{"filename", "line", "name"}, ...] innermost first; [] for 0 or unknown ids.
  py::list frames(uint64_t stack_id) const {
    py::list out;
    if (stack_id == 0 || stack_id > stacks_.size()) return out;
    for (uint32_t f : stacks_[stack_id - 1]) {
      const Frame& fr = frames_[f];
      py::dict d;
      d["filename"] = strings_[fr.file];
      d["line"] = fr.line;
      d["name"] = strings_[fr.name];
      out.append(std::move(d));
    }
    return out;
  }

  size_t num_stacks() const { return stacks_.size(); }
  size_t num_frames() const { return frames_.size(); }
  size_t max_depth() const { return max_depth_; }

 private:
  struct Frame {
    uint32_t file;
    uint32_t name;
    int line;
  };
  struct CodeInfo {
    uint32_t file;
    uint32_t name;
  };

  uint32_t intern_string(PyObject* obj) {
    std::string s;
    if (obj != nullptr && PyUnicode_Check(obj)) {
      Py_ssize_t n = 0;
      const char* data = PyUnicode_AsUTF8AndSize(obj, &n);
      if (data != nullptr) s.assign(data, static_cast<size_t>(n));
      else PyErr_Clear();
    }
    auto it = string_ids_.find(s);
    if (it != string_ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(strings_.size());
    strings_.push_back(s);
    string_ids_.emplace(std::move(s), id);
    return id;
  }

  const CodeInfo& code_info(PyCodeObject* code) {
    PyObject* key = reinterpret_cast<PyObject*>(code);
    auto it = codes_.find(key);
    if (it != codes_.end()) return it->second;
    PyObject* file = PyObject_GetAttrString(key, "co_filename");
    PyObject* name = PyObject_GetAttrString(key, "co_name");  // PyTorch's frames carry co_name too
    if (file == nullptr || name == nullptr) PyErr_Clear();
    CodeInfo info{intern_string(file), intern_string(name)};
    Py_XDECREF(file);
    Py_XDECREF(name);
    Py_INCREF(key);  // the pointer is the key: keep the code object alive
    return codes_.emplace(key, info).first->second;
  }

  // Frames are keyed by (code, instruction offset): the offset is a field
  // read, while the line number costs a walk of the code's line table, so
  // it is computed once per new key only.
  uint32_t frame_id(PyCodeObject* code, PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030B0000
    const int position = PyFrame_GetLasti(frame);
#else
    const int position = PyFrame_GetLineNumber(frame);
#endif
    const uint64_t key = (reinterpret_cast<uintptr_t>(code) << 20) ^ static_cast<uint32_t>(position);
    auto range = frame_ids_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it) {
      const auto& [c, p, id] = it->second;
      if (c == code && p == position) return id;
    }
    const int line = PyFrame_GetLineNumber(frame);
    uint32_t id = 0;
    auto by_line = line_ids_.find({code, line});  // several offsets on one line share a frame
    if (by_line != line_ids_.end()) {
      id = by_line->second;
    } else {
      const CodeInfo& info = code_info(code);
      id = static_cast<uint32_t>(frames_.size());
      frames_.push_back(Frame{info.file, info.name, line});
      line_ids_.emplace(std::make_pair(code, line), id);
    }
    frame_ids_.emplace(key, std::make_tuple(code, position, id));
    return id;
  }

  struct PairHash {
    size_t operator()(const std::pair<PyCodeObject*, int>& p) const noexcept {
      return std::hash<const void*>()(p.first) ^ (static_cast<size_t>(p.second) * 0x9E3779B97F4A7C15ull);
    }
  };

  size_t max_depth_;
  std::vector<uint32_t> scratch_;
  std::unordered_map<PyObject*, CodeInfo> codes_;
  std::vector<std::string> strings_;
  std::unordered_map<std::string, uint32_t> string_ids_;
  std::vector<Frame> frames_;
  std::unordered_multimap<uint64_t, std::tuple<PyCodeObject*, int, uint32_t>> frame_ids_;  // (code, offset)
  std::unordered_map<std::pair<PyCodeObject*, int>, uint32_t, PairHash> line_ids_;          // (code, line)
  std::vector<std::vector<uint32_t>> stacks_;
  std::unordered_map<std::vector<uint32_t>, uint64_t, VectorHash> stack_ids_;
};

History::ContextProvider python_stack_provider(std::shared_ptr<StackTable> table) {
  return [table = std::move(table)]() -> uint64_t {
    if (!python_alive()) return 0;
    // A thread Python never ran on (an intra-op worker) has no Python stack:
    // answer without making it a thread state for the GIL.
    if (PyGILState_GetThisThreadState() == nullptr) return 0;
    PyGILState_STATE state = PyGILState_Ensure();
    uint64_t id = 0;
    try {
      id = table->capture();
    } catch (...) {
      id = 0;  // out of memory while interning: the allocation goes on untagged
    }
    if (PyErr_Occurred()) PyErr_Clear();
    PyGILState_Release(state);
    return id;
  };
}

}  // namespace

void bind_history(py::module_& m) {
  py::class_<StackTable, std::shared_ptr<StackTable>>(
      m, "StackTable", "Interned Python stacks; ids are the `context` of history entries.")
      .def(py::init<size_t>(), py::arg("max_depth") = 64)
      .def("capture", &StackTable::capture, "Intern the calling thread's Python stack; returns its id (0: none).")
      .def("frames", &StackTable::frames, py::arg("stack_id"),
           "Frames of a stack id, innermost first: [{'filename', 'line', 'name'}]; [] for 0 or an unknown id.")
      .def_property_readonly("num_stacks", &StackTable::num_stacks)
      .def_property_readonly("num_frames", &StackTable::num_frames)
      .def_property_readonly("max_depth", &StackTable::max_depth)
      .def("__len__", &StackTable::num_stacks);

  m.def(
      "enable_history",
      [](DeviceAllocator& a, size_t max_entries, std::shared_ptr<StackTable> stacks) {
        a.enable_history(max_entries, stacks ? python_stack_provider(std::move(stacks)) : nullptr);  // under its lock
      },
      py::arg("allocator"), py::arg("max_entries"), py::arg("stacks") = nullptr,
      "Record the last max_entries allocator events (0 turns recording off and clears it); with a "
      "StackTable, each allocation's context is the id of the Python stack that made it.");
  m.def(
      "history_enabled", [](DeviceAllocator& a) { return a.history_enabled(); }, py::arg("allocator"));
  m.def(
      "history_entries", [](const DeviceAllocator& a) { return trace_to_list(a.history_entries()); },
      py::arg("allocator"),
      "History entries oldest first: {'action', 'addr', 'size', 'stream', 'time_us', 'context'}.");
  m.def(
      "time_malloc_free",
      [](DeviceAllocator& a, size_t size, size_t pairs) {
        // For benchmarks: `pairs` cached allocate+deallocate pairs from C++,
        // with the GIL released (as around PyTorch's operators); ns per pair.
        py::gil_scoped_release release;
        a.deallocate(a.allocate(size));  // warm the cache
        const auto start = std::chrono::steady_clock::now();
        for (size_t i = 0; i < pairs; ++i) a.deallocate(a.allocate(size));
        const auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
        return ns / static_cast<double>(std::max<size_t>(pairs, 1));
      },
      py::arg("allocator"), py::arg("size"), py::arg("pairs"));
}

}  // namespace torchmem::bindings
