// Python face of the JSON-lines trace reader: numpy columns out.
//
// read() parses with the GIL released; a lock keeps two threads from using
// one reader at once. Bad lines raise ValueError ("line 3: ..."); files that
// cannot be opened or read raise OSError (FileNotFoundError, ...).
#include <pybind11/numpy.h>

#include <cerrno>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

#include "bindings/bindings.h"
#include "core/replay/replayer.h"
#include "core/traces/jsonl_reader.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

struct LockedJsonlReader {
  std::string path;
  std::mutex mutex;
  std::unique_ptr<JsonlReader> reader;
};

// Raises the OSError subclass for the errno, naming the file.
[[noreturn]] void raise_os_error(const std::system_error& e, const std::string& path) {
  errno = e.code().value();
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  throw py::error_already_set();
}

// A numpy array that owns the column's storage (no copy).
template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& column) {
  auto* owner = new std::vector<T>(std::move(column));
  py::capsule release(owner, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owner->size()), owner->data(), release);
}

static_assert(static_cast<uint8_t>(ReplayOp::kAlloc) == 0 && static_cast<uint8_t>(ReplayOp::kFree) == 1,
              "JsonlReader writes ops as 0 alloc, 1 free");

}  // namespace

void bind_jsonl(py::module_& m) {
  py::class_<LockedJsonlReader>(m, "JsonlReader")
      .def(py::init([](const std::string& path, size_t buffer_bytes, bool skip_bad_lines) {
             auto self = std::make_unique<LockedJsonlReader>();
             self->path = path;
             try {
               self->reader = std::make_unique<JsonlReader>(path, buffer_bytes, skip_bad_lines);
             } catch (const std::system_error& e) {
               raise_os_error(e, path);
             }
             return self;
           }),
           py::arg("path"), py::arg("buffer_bytes") = JsonlReader::kDefaultBufferBytes,
           py::arg("skip_bad_lines") = false)
      .def(
          "read",
          [](LockedJsonlReader& self, size_t max_events) {
            EventColumns columns;
            try {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(self.mutex);
              self.reader->read(max_events, columns);
            } catch (const std::system_error& e) {
              raise_os_error(e, self.path);
            }
            return py::make_tuple(to_numpy(std::move(columns.ops)), to_numpy(std::move(columns.ids)),
                                  to_numpy(std::move(columns.sizes)), to_numpy(std::move(columns.streams)));
          },
          py::arg("max_events"),
          "The next events, at most max_events, as (ops, ids, sizes, streams) numpy arrays; empty at the end")
      .def_property_readonly("lines", [](LockedJsonlReader& self) {
        std::lock_guard<std::mutex> lock(self.mutex);
        return self.reader->lines();
      })
      .def_property_readonly("skipped_lines", [](LockedJsonlReader& self) {
        std::lock_guard<std::mutex> lock(self.mutex);
        return self.reader->skipped_lines();
      })
      .def_property_readonly("first_skipped", [](LockedJsonlReader& self) {
        std::lock_guard<std::mutex> lock(self.mutex);
        return self.reader->first_skipped();
      })
      .def_property_readonly_static("DEFAULT_BUFFER_BYTES",
                                    [](py::object) { return JsonlReader::kDefaultBufferBytes; });
}

}  // namespace torchmem::bindings
