// Test hook for benchmarks/scale.py's virtual ranks: what one cached operation costs a
// negotiation protocol, measured on a VirtualJob (tests/cpp/virtual) in this process. Not an API.
#include <pybind11/pybind11.h>

#include "hooks/hooks.h"
#include "virtual/virtual_job.h"

namespace py = pybind11;

namespace appliance {

void bind_negotiation_hooks(py::module_& m) {
  m.def(
      "negotiation_model",
      [](const std::string& protocol, int ranks, int ops, int tensors) {
        NegotiationCost c = [&] {
          py::gil_scoped_release release;
          return measure_cached_ops(protocol, ranks, ops, tensors);
        }();
        py::dict d;
        d["rank0_ns"] = c.rank0_ns;
        d["rank0_msgs"] = c.rank0_msgs;
        d["max_msgs"] = c.max_msgs;
        d["hops"] = c.hops;
        return d;
      },
      "What one cached operation costs a negotiation protocol (\"tree\" or \"star\") at `ranks` ranks, "
      "measured on that many negotiators in this process, wired in memory: rank0_ns, rank0_msgs, max_msgs, hops "
      "(see tests/cpp/virtual/virtual_job.h).",
      py::arg("protocol"), py::arg("ranks"), py::arg("ops") = 20, py::arg("tensors") = 1);
}

}  // namespace appliance
