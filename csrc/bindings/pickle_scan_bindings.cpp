// Python face of scan_plain_pickle (core/traces/pickle_scan.h): bytes in, a verdict out; and of
// strip_pickle_key (core/traces/pickle_strip.h): bytes in, bytes (or None) out.
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "bindings/bindings.h"
#include "core/traces/pickle_scan.h"
#include "core/traces/pickle_strip.h"

namespace py = pybind11;

namespace torchmem::bindings {

void bind_pickle_scan(py::module_& m) {
  m.def(
      "scan_plain_pickle",
      [](py::buffer data) {
        py::buffer_info info = data.request();
        if (info.ndim != 1 || info.itemsize != 1) throw py::type_error("scan_plain_pickle takes bytes");
        PickleScan scan;
        {
          py::gil_scoped_release release;
          scan = scan_plain_pickle(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size));
        }
        return py::make_tuple(scan.plain, scan.offset, scan.problem);
      },
      py::arg("data"),
      "(plain, offset, problem): whether the pickle holds plain data only up to its STOP; else the byte "
      "offset and what was refused (core/traces/pickle_scan.h)");
  m.def(
      "strip_pickle_key",
      [](py::buffer data, const std::string& key) -> py::object {
        py::buffer_info info = data.request();
        if (info.ndim != 1 || info.itemsize != 1) throw py::type_error("strip_pickle_key takes bytes");
        std::optional<std::string> out;
        {
          py::gil_scoped_release release;
          out = strip_pickle_key(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size), key);
        }
        if (!out) return py::none();
        return py::bytes(*out);
      },
      py::arg("data"), py::arg("key"),
      "The plain pickle `data` with every value of dict key `key` made an empty list, or None when that "
      "cannot be done safely (core/traces/pickle_strip.h); `data` must have passed scan_plain_pickle");
}

}  // namespace torchmem::bindings
