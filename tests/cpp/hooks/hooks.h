// The test-only extension appliance.runtime._core_testing: hooks that reach the core's units
// from Python (crypto, frames, channels, collectives over threads, the store, the mesh, the
// device decisions, the negotiation protocols' cost on a simulated job, the shm ring's hops between two cores). Built only with APPLIANCE_BUILD_TESTS=ON (tests/cpp/CMakeLists.txt), from
// the same static core library as _core, so the product never carries it. Not an API: names
// and shapes follow the tests' needs.
#pragma once

#include <pybind11/pybind11.h>

namespace appliance {

void bind_bootstrap_hooks(pybind11::module_& m);  // bootstrap.cc
void bind_dataplane_hooks(pybind11::module_& m);  // dataplane.cc
void bind_devices_hooks(pybind11::module_& m);    // devices.cc
void bind_negotiation_hooks(pybind11::module_& m);  // negotiation.cc
void bind_hops_hooks(pybind11::module_& m);         // hops.cc

}  // namespace appliance
