// Test hooks for bootstrap (crypto, auth handshake, store, mesh, topology).
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace appliance {
void bind_testing_bootstrap(py::module_& m) {}
}  // namespace appliance
