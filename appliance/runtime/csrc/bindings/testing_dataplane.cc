// Test hooks for the data plane (frames, channels, comm, collectives, reduce kernels).
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace appliance {
void bind_testing_dataplane(py::module_& m) {}
}  // namespace appliance
