// Python face of scan_plain_pickle (core/pickle_scan.h): bytes in, a verdict out.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "core/pickle_scan.h"

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
      "offset and what was refused (core/pickle_scan.h)");
}

}  // namespace torchmem::bindings
