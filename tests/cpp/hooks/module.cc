// appliance.runtime._core_testing: the test-only extension (see hooks.h). CORE_UNITS is the
// path of the C++ unit test binary built beside it (tests/cpp/units), which
// tests/cpp/test_core_units.py runs; "" when GoogleTest was not found at configure time.
#include <pybind11/pybind11.h>

#include "hooks/hooks.h"

PYBIND11_MODULE(_core_testing, m) {
  m.doc() = "Hooks for the test-suite; not an API. Built only with APPLIANCE_BUILD_TESTS=ON.";
  appliance::bind_dataplane_hooks(m);
  appliance::bind_bootstrap_hooks(m);
  appliance::bind_devices_hooks(m);
  appliance::bind_negotiation_hooks(m);
  appliance::bind_hops_hooks(m);
  m.attr("CORE_UNITS") = APPLIANCE_CORE_UNITS;
}
