// Python bindings of the core: appliance.runtime._core. Bindings only; every blocking call
// releases the GIL. Test-only hooks live in testing_*.cc under the _core._testing submodule.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace appliance {
void bind_testing_dataplane(py::module_& m);
void bind_testing_bootstrap(py::module_& m);
}  // namespace appliance

PYBIND11_MODULE(_core, m) {
  m.doc() = "Collective core of the appliance (C++17).";
  m.attr("WIRE_VERSION") = 1;
  auto testing = m.def_submodule("_testing", "Hooks for the test-suite; not an API.");
  appliance::bind_testing_dataplane(testing);
  appliance::bind_testing_bootstrap(testing);
}
