// Python bindings of the core: appliance.runtime._core. Bindings only; every blocking call
// releases the GIL. Test-only hooks live in testing_*.cc under the _core._testing submodule.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/runtime.h"

namespace py = pybind11;

namespace appliance {
void bind_testing_dataplane(py::module_& m);
void bind_testing_bootstrap(py::module_& m);
void bind_testing_devices(py::module_& m);

namespace {

// (ptr, dtype code, shape, device, stream) as built by appliance/runtime/api.py.
using DescTuple = std::tuple<uint64_t, int, std::vector<int64_t>, int, uint64_t>;

// Deletes a Python object from any thread (the background thread drops outputs too).
void gil_deleter(py::object* o) {
  if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
  py::gil_scoped_acquire gil;
  delete o;
}

// The request of one operation, its arguments checked as enqueue() expects them.
Request make_request(int kind, const std::string& name, int op, double prescale, double postscale, int root,
                     uint32_t group_id, uint32_t group_size, int32_t process_set) {
  if (!op_kind_valid(static_cast<uint8_t>(kind))) throw std::invalid_argument("unknown operation kind");
  if (!reduce_op_valid(static_cast<uint8_t>(op))) throw std::invalid_argument("unknown reduce op " + std::to_string(op));
  Request q;
  q.name = name;
  q.sig.kind = static_cast<OpKind>(kind);
  q.sig.op = static_cast<ReduceOp>(op);
  q.sig.prescale = prescale;
  q.sig.postscale = postscale;
  q.sig.root = root;
  q.sig.group_id = group_id;
  q.sig.group_size = group_size;
  q.sig.process_set = process_set;
  return q;
}

TensorDesc to_desc(const DescTuple& t) {
  TensorDesc d;
  d.ptr = std::get<0>(t);
  int dt = std::get<1>(t);
  if (!dtype_valid(static_cast<uint8_t>(dt))) throw std::invalid_argument("unknown dtype code " + std::to_string(dt));
  d.dtype = static_cast<DataType>(dt);
  d.shape = std::get<2>(t);
  d.device = std::get<3>(t);
  d.stream = std::get<4>(t);
  return d;
}

// enqueue() of an allreduce of host memory over every rank (out_ptr may be ptr).
int enqueue_host_allreduce(Runtime& rt, const std::string& name, uint64_t ptr, uint64_t out_ptr, int dtype,
                           std::vector<int64_t> shape, int op, double prescale, double postscale, uint32_t group_id,
                           uint32_t group_size) {
  Request q = make_request(static_cast<int>(OpKind::kAllreduce), name, op, prescale, postscale, 0, group_id, group_size, 0);
  TensorDesc in = to_desc(DescTuple{ptr, dtype, std::move(shape), -1, 0});
  TensorDesc out = in;
  out.ptr = out_ptr;
  return rt.enqueue(std::move(q), std::move(in), std::move(out));
}

struct CoreResult {
  bool ok = true;
  std::string code, origin_host, message;
  int origin_rank = -1;
  py::object output = py::none();
  std::vector<int64_t> shape, splits;
  bool has_splits = false, has_value = false;
  int64_t value = -1;
};

// `finished` false: the op's device work may still run (wait_on_stream); it has not failed.
CoreResult to_result(OpState& op, bool finished = true) {
  CoreResult r;
  r.ok = !finished || op.status.ok();
  if (!r.ok) {
    r.code = code_name(op.status.code);
    r.origin_rank = op.status.origin_rank;
    r.origin_host = op.status.host;
    r.message = op.status.to_string();
    return r;
  }
  if (op.device_output) {  // a CUDA tensor from the adapter's allocator (NCCL path)
    r.output = *static_cast<py::object*>(op.device_output.get());
    r.shape = op.out_shape;
  } else if (op.output) {
    OutputPool::Block* b = op.output.release();  // the array's capsule owns it: dropping it recycles the memory
    py::capsule owner(b, [](void* q) { delete static_cast<OutputPool::Block*>(q); });
    r.output = py::array_t<uint8_t>({static_cast<py::ssize_t>(op.output_bytes)}, {1}, b->data(), owner);
    r.shape = op.out_shape;
  }
  if (op.req.sig.kind == OpKind::kAlltoall) {
    r.has_splits = true;
    r.splits = op.recv_splits;
  }
  if (op.req.sig.kind == OpKind::kJoin) {
    r.has_value = true;
    r.value = op.value;
  }
  return r;
}

}  // namespace
}  // namespace appliance

PYBIND11_MODULE(_core, m) {
  using namespace appliance;
  m.doc() = "Collective core of the appliance (C++17).";
  m.attr("WIRE_VERSION") = kWireVersion;
  py::register_exception<Error>(m, "CoreError", PyExc_RuntimeError);

  py::class_<RuntimeConfig> cfg(m, "RuntimeConfig");
  cfg.def(py::init<>())
      .def_readwrite("rank", &RuntimeConfig::rank)
      .def_readwrite("size", &RuntimeConfig::size)
      .def_readwrite("host", &RuntimeConfig::host)
      .def_readwrite("store_host", &RuntimeConfig::store_host)
      .def_readwrite("store_port", &RuntimeConfig::store_port)
      .def_property("secret", [](const RuntimeConfig& c) { return py::bytes(c.secret); },
                    [](RuntimeConfig& c, py::bytes b) { c.secret = std::string(b); })
      .def_readwrite("job_id", &RuntimeConfig::job_id)
      .def_readwrite("data_addr", &RuntimeConfig::data_addr)
      .def_readwrite("nccl_candidates", &RuntimeConfig::nccl_candidates)
      .def_readwrite("cudart_candidates", &RuntimeConfig::cudart_candidates);
  py::dict options;  // engine option -> its default
  const EngineOptions defaults;
#define APPLIANCE_BIND_OPTION(type, name, default_value) \
  cfg.def_readwrite(#name, &RuntimeConfig::name);        \
  options[#name] = defaults.name;
  APPLIANCE_ENGINE_OPTIONS(APPLIANCE_BIND_OPTION)
#undef APPLIANCE_BIND_OPTION
  m.attr("ENGINE_OPTIONS") = options;

  py::class_<CoreResult>(m, "Result")
      .def_readonly("ok", &CoreResult::ok)
      .def_readonly("code", &CoreResult::code)
      .def_readonly("origin_rank", &CoreResult::origin_rank)
      .def_readonly("origin_host", &CoreResult::origin_host)
      .def_readonly("message", &CoreResult::message)
      .def_readonly("output", &CoreResult::output)
      .def_readonly("shape", &CoreResult::shape)
      .def_readonly("splits", &CoreResult::splits)
      .def_readonly("has_splits", &CoreResult::has_splits)
      .def_readonly("value", &CoreResult::value)
      .def_readonly("has_value", &CoreResult::has_value);

  py::class_<Runtime>(m, "Runtime")
      .def(py::init<RuntimeConfig>(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &Runtime::rank)
      .def_property_readonly("size", &Runtime::size)
      .def_property_readonly("local_rank", [](const Runtime& r) { return r.topology().local_rank; })
      .def_property_readonly("local_size", [](const Runtime& r) { return r.topology().local_size; })
      .def_property_readonly("cross_rank", [](const Runtime& r) { return r.topology().cross_rank; })
      .def_property_readonly("cross_size", [](const Runtime& r) { return r.topology().cross_size; })
      .def("host_of", &Runtime::host_of)
      .def("link_kind", &Runtime::link_kind)
      .def("enqueue",
           [](Runtime& rt, int kind, const std::string& name, const DescTuple& in, const DescTuple& out, int op,
              double prescale, double postscale, int root, std::vector<int64_t> splits, uint32_t group_id,
              uint32_t group_size, int32_t process_set) {
             Request q = make_request(kind, name, op, prescale, postscale, root, group_id, group_size, process_set);
             q.splits = std::move(splits);
             return rt.enqueue(std::move(q), to_desc(in), to_desc(out));
           },
           py::arg("kind"), py::arg("name"), py::arg("inp"), py::arg("out"), py::arg("op"), py::arg("prescale"),
           py::arg("postscale"), py::arg("root"), py::arg("splits"), py::arg("group_id"), py::arg("group_size"),
           py::arg("process_set") = 0)
      .def("allreduce_host",
           // enqueue() of an allreduce of host memory over every rank (out_ptr may be ptr), with
           // plain arguments: what a backward pass issues per gradient, so its cost counts.
           [](Runtime& rt, const std::string& name, uint64_t ptr, uint64_t out_ptr, int dtype, std::vector<int64_t> shape,
              int op, double prescale, double postscale, uint32_t group_id, uint32_t group_size) {
             return enqueue_host_allreduce(rt, name, ptr, out_ptr, dtype, std::move(shape), op, prescale, postscale,
                                           group_id, group_size);
           })
      .def("allreduce_host_group",
           // allreduce_host() in place of every member of one group (grouped_allreduce of host
           // tensors), in one call: (handles, None), or, when a member is refused, the handles of
           // the members enqueued before it and why (their memory must stay alive until waited).
           [](Runtime& rt, const std::vector<std::string>& names, const std::vector<uint64_t>& ptrs,
              const std::vector<int>& dtypes, const std::vector<std::vector<int64_t>>& shapes, int op, double prescale,
              double postscale, uint32_t group_id) -> py::tuple {
             const size_t n = names.size();
             if (ptrs.size() != n || dtypes.size() != n || shapes.size() != n)
               throw std::invalid_argument("allreduce_host_group: names, ptrs, dtypes and shapes differ in length");
             std::vector<int> handles;
             handles.reserve(n);
             try {
               for (size_t i = 0; i < n; ++i)
                 handles.push_back(enqueue_host_allreduce(rt, names[i], ptrs[i], ptrs[i], dtypes[i], shapes[i], op,
                                                          prescale, postscale, group_id, static_cast<uint32_t>(n)));
             } catch (const std::invalid_argument& e) {
               return py::make_tuple(handles, std::string(e.what()));
             }
             return py::make_tuple(handles, py::none());
           })
      .def("add_process_set", &Runtime::add_process_set, py::arg("id"), py::arg("ranks"))
      .def("remove_process_set", &Runtime::remove_process_set, py::arg("id"))
      .def("poll", &Runtime::poll)
      .def("stats",
           [](const Runtime& rt) {
             const auto& s = rt.stats();
             py::dict d;
             d["plans"] = s.plans.load();
             d["entries"] = s.entries.load();
             d["tensors"] = s.tensors.load();
             d["fused_entries"] = s.fused_entries.load();
             d["ready_full"] = s.ready_full.load();
             d["ready_ids"] = s.ready_ids.load();
             d["driven_plans"] = s.driven_plans.load();
             d["outputs_reused"] = rt.output_pool().reused();
             d["outputs_idle_bytes"] = rt.output_pool().idle_bytes();
             return d;
           })
      .def("wait",
           [](Runtime& rt, int handle, int64_t stream) {
             // stream >= 0: the caller's CUDA stream may wait for device work instead of the host.
             OpPtr op;
             bool finished = true;
             {
               py::gil_scoped_release nogil;
               op = stream < 0 ? rt.wait(handle) : rt.wait_on_stream(handle, static_cast<uint64_t>(stream), &finished);
             }
             return to_result(*op, finished);
           },
           py::arg("handle"), py::arg("stream") = -1)
      .def("wait_host",
           // wait() for an operation with nothing to hand back (allreduce_host's): None when it
           // succeeded, its failed Result otherwise.
           [](Runtime& rt, int handle) -> py::object {
             OpPtr op;
             {
               py::gil_scoped_release nogil;
               op = rt.wait(handle);
             }
             if (op->status.ok()) return py::none();
             return py::cast(to_result(*op));
           })
      .def("wait_host_all",
           // wait_host() of several operations in one call: every one is waited for, even after
           // one failed (their memory stays in use until then); None, or the first failed Result.
           [](Runtime& rt, const std::vector<int>& handles) -> py::object {
             OpPtr failed;
             std::string refused;
             {
               py::gil_scoped_release nogil;
               for (int h : handles) {
                 try {
                   OpPtr op = rt.wait(h);
                   if (!op->status.ok() && !failed && refused.empty()) failed = op;
                 } catch (const std::invalid_argument& e) {
                   if (!failed && refused.empty()) refused = e.what();
                 }
               }
             }
             if (!refused.empty()) throw std::invalid_argument(refused);
             if (failed) return py::cast(to_result(*failed));
             return py::none();
           })
      .def("set_device_allocator",
           [](Runtime& rt, py::object fn) {
             // fn(device, nbytes, stream) -> (data_ptr, owner): called on the background thread.
             auto shared = std::shared_ptr<py::object>(new py::object(std::move(fn)), gil_deleter);
             rt.set_device_allocator([shared](int device, size_t bytes, uint64_t stream) {
               py::gil_scoped_acquire gil;
               py::tuple t = (*shared)(device, bytes, stream);
               DeviceBlock b;
               b.ptr = t[0].cast<uint64_t>();
               b.owner = std::shared_ptr<void>(new py::object(t[1]), gil_deleter);
               return b;
             });
           })
      .def("cuda_path",
           [](const Runtime& rt) {
             std::string why;
             std::string path = rt.cuda_path(&why);
             return py::make_tuple(path, why);
           })
      .def("start_timeline", &Runtime::start_timeline, py::arg("path"), py::arg("mark_cycles") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("stop_timeline", &Runtime::stop_timeline, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &Runtime::shutdown, py::call_guard<py::gil_scoped_release>());

  // Address of a contiguous buffer (a numpy array): ~10x cheaper than numpy's .ctypes.data,
  // which the per-op path would otherwise pay twice per operation.
  m.def("address", [](py::handle obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) throw py::error_already_set();
    const uint64_t p = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(view.buf));
    PyBuffer_Release(&view);
    return p;
  });

  // What executes here, loaded the way a Runtime loads it (not cached: Python caches).
  m.def("capabilities", [](const std::string& nccl_library, const std::vector<std::string>& nccl_candidates,
                           const std::vector<std::string>& cudart_candidates) {
    CudaApi cuda;
    NcclApi nccl;
    {
      py::gil_scoped_release nogil;
      cuda = load_cuda_api(cudart_candidates);
      nccl = load_nccl_api(nccl_library, nccl_candidates);
    }
    py::dict d;
    d["cuda"] = cuda.usable();
    d["cuda_devices"] = cuda.device_count;
    d["cuda_runtime"] = cuda.library;
    d["cuda_runtime_version"] = cuda.runtime_version;
    d["nccl"] = cuda.usable() && nccl.usable();
    d["nccl_version"] = nccl.version;
    d["nccl_library"] = nccl.library;
    std::string why = cuda.usable() ? nccl.why : cuda.why;
    if (cuda.usable() && nccl.usable()) why = "";
    else if (!cuda.usable() && !nccl.usable()) why = cuda.why + "; " + nccl.why;
    d["why"] = why;
    return d;
  }, py::arg("nccl_library"), py::arg("nccl_candidates"), py::arg("cudart_candidates"));  // lists: runtime/devices.py

  auto testing = m.def_submodule("_testing", "Hooks for the test-suite; not an API.");
  bind_testing_dataplane(testing);
  bind_testing_bootstrap(testing);
  bind_testing_devices(testing);
}
