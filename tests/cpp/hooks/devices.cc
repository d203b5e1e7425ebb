// Test hooks for the device decisions (backends/cuda/device_plan.h): pure functions, reached
// from Python so the tests can walk their truth tables. Not an API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "backends/cuda/device_plan.h"
#include "hooks/hooks.h"

namespace py = pybind11;

namespace appliance {

void bind_devices_hooks(py::module_& m) {
  // ranks: [(host, machine, gpu, nccl_version, why)] -> ("nccl" | "staging", reason)
  m.def("decide_cuda_path", [](const std::vector<std::tuple<std::string, std::string, std::string, int, std::string>>& ranks) {
    std::vector<DeviceReport> reports;
    for (const auto& t : ranks) {
      DeviceReport d;
      std::tie(d.host, d.machine, d.gpu, d.nccl_version, d.why) = t;
      // Through the wire encoding, as ranks exchange them.
      reports.push_back(DeviceReport::decode(d.encode(), "test"));
    }
    CudaDecision c = decide_cuda_path(reports);
    return py::make_tuple(c.path == CudaPath::kNccl ? "nccl" : "staging", c.reason);
  });
  // One CUDA entry under the NCCL path -> ("nccl" | "staging", why)
  m.def("select_cuda_backend", [](int kind, int dtype, int op, double prescale, double postscale, int size) {
    PlanEntry e;
    e.kind = static_cast<OpKind>(kind);
    Signature s;
    s.kind = e.kind;
    s.dtype = static_cast<DataType>(dtype);
    s.op = static_cast<ReduceOp>(op);
    s.prescale = prescale;
    s.postscale = postscale;
    s.device = 0;
    e.sigs.push_back(s);
    e.names.push_back("t");
    std::string why;
    CudaPath p = select_cuda_backend(e, CudaPath::kNccl, size, &why);
    return py::make_tuple(p == CudaPath::kNccl ? "nccl" : "staging", why);
  }, py::arg("kind"), py::arg("dtype"), py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("size") = 2);
  m.def("nccl_premul_factor", [](int op, double prescale, double postscale, int size) {
    Signature s;
    s.op = static_cast<ReduceOp>(op);
    s.prescale = prescale;
    s.postscale = postscale;
    return nccl_premul_factor(s, size);
  });
  m.def("float_to_half_bits", &float_to_half_bits);
  m.def("float_to_bf16_bits", &float_to_bf16_bits);
}

}  // namespace appliance
