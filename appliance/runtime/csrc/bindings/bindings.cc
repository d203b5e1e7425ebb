// Python bindings of the core: appliance.runtime._core. Bindings only; every blocking call
// releases the GIL. Operations go through the C door's work (capi/door.h), as the TensorFlow op
// library's do: this file reads Python's arguments and builds Python's results, nothing between. Test hooks are not here: they are a separate, test-only extension
// (tests/cpp/hooks, appliance.runtime._core_testing).
#include <pybind11/native_enum.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <optional>

#include "backends/cuda/cuda_api.h"
#include "backends/nccl/nccl_api.h"
#include "capi/capi.h"
#include "capi/door.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace appliance {

namespace {

// Deletes a Python object from any thread (the background thread drops outputs too).
void gil_deleter(py::object* o) {
  if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
  py::gil_scoped_acquire gil;
  delete o;
}

// Python's enum member names for the core's codes: "float32" -> "FLOAT32".
std::string upper(const char* name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

int64_t to_int(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// The per-op arguments (a name and a tuple of ints) are read with the C API rather than through
// pybind11's generic casters: every gradient of a backward pass crosses here.
std::string name_of(py::handle name) {
  if (name.is_none()) return std::string();  // the core names it "<kind>.noname.<n>"
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(name.ptr(), &n);
  if (!p) throw py::error_already_set();
  return std::string(p, static_cast<size_t>(n));
}

// A tensor as Python describes it: (data, dtype, shape[, out[, device[, stream]]]), or None
// for an operation without data (barrier, join). `out` is where the result goes (0: none, or
// the core allocates it); it has the input's dtype, shape, device and stream.
void read_tensor(py::handle t, TensorDesc* in, TensorDesc* out) {
  if (t.is_none()) return;
  PyObject* o = t.ptr();
  const Py_ssize_t n = PyTuple_Check(o) ? PyTuple_GET_SIZE(o) : 0;
  if (n < 3 || n > 6)
    throw py::type_error("a tensor is described as (data, dtype, shape[, out[, device[, stream]]]), got " +
                         std::string(py::str(t)));
  in->ptr = static_cast<uint64_t>(to_int(PyTuple_GET_ITEM(o, 0)));
  const int64_t dt = to_int(PyTuple_GET_ITEM(o, 1));
  if (dt < 0 || !dtype_valid(static_cast<uint8_t>(dt))) throw std::invalid_argument("unknown dtype code " + std::to_string(dt));
  in->dtype = static_cast<DataType>(dt);
  PyObject* shape = PyTuple_GET_ITEM(o, 2);  // torch.Size and numpy shapes are tuples
  if (PyTuple_Check(shape)) {
    const Py_ssize_t dims = PyTuple_GET_SIZE(shape);
    in->shape.resize(static_cast<size_t>(dims));
    for (Py_ssize_t i = 0; i < dims; ++i) in->shape[i] = to_int(PyTuple_GET_ITEM(shape, i));
  } else {
    in->shape = py::reinterpret_borrow<py::object>(shape).cast<std::vector<int64_t>>();
  }
  if (n > 4) in->device = static_cast<int32_t>(to_int(PyTuple_GET_ITEM(o, 4)));
  if (n > 5) in->stream = static_cast<uint64_t>(to_int(PyTuple_GET_ITEM(o, 5)));
  *out = *in;
  out->ptr = n > 3 ? static_cast<uint64_t>(to_int(PyTuple_GET_ITEM(o, 3))) : 0;
}

struct CoreResult {
  bool ok = true;
  std::string code, origin_host, message;
  int origin_rank = -1;
  py::object output = py::none();
  std::vector<int64_t> shape;
  std::optional<std::vector<int64_t>> splits;
  std::optional<int64_t> value;
};

// Whether a successful op hands something back beyond the caller's own memory.
bool hands_back(const OpState& op) {
  switch (op.req.sig.kind) {
    case OpKind::kAllgather:
    case OpKind::kAlltoall:
    case OpKind::kReducescatter:
    case OpKind::kJoin: return true;
    default: return false;
  }
}

// `finished` false: the op's device work may still run (wait_on_stream); it has not failed.
CoreResult to_result(const OpPtr& op, bool finished) {
  CoreResult r;
  r.ok = !finished || op->status.ok();
  if (!r.ok) {
    appliance_core_status st;
    door::status(*op, &r.message, &st);
    r.code = st.code_name;
    r.origin_rank = st.origin_rank;
    r.origin_host = st.origin_host;
    return r;
  }
  if (op->device_output) {  // a CUDA tensor from the adapter's allocator (NCCL path): the door's outputs are host
    r.output = *static_cast<py::object*>(op->device_output.get());  // memory, and its device work may still run
    r.shape = op->out_shape;
    if (op->req.sig.kind == OpKind::kAlltoall) r.splits = op->recv_splits;
  } else {
    appliance_core_output o;
    door::output(*op, &o);
    if (o.data) {  // the array's capsule holds the operation: dropping it recycles the memory
      py::capsule owner(new OpPtr(op), [](void* q) { delete static_cast<OpPtr*>(q); });
      r.output = py::array_t<uint8_t>({static_cast<py::ssize_t>(o.bytes)}, {1}, static_cast<const uint8_t*>(o.data), owner);
      r.shape.assign(o.shape, o.shape + o.ndim);
    }
    if (op->req.sig.kind == OpKind::kAlltoall) r.splits = std::vector<int64_t>(o.splits, o.splits + o.nsplits);
    if (op->req.sig.kind == OpKind::kJoin) r.value = o.value;
  }
  return r;
}

// What wait() gives back for one op: None (done, nothing to hand back), or a Result (its
// outputs, or its failure).
py::object result_of(const OpPtr& op, bool finished) {
  if ((finished && !op->status.ok()) || hands_back(*op)) return py::cast(to_result(op, finished));
  return py::none();
}

// One operation, or (names a list) the members of a new group, through the door (capi/door.h):
// see Runtime.submit in _core.pyi.
py::object submit(Runtime& rt, const Request& req, py::handle name, py::handle tensor) {
  if (!PyList_Check(name.ptr())) {
    Request q = req;
    q.name = name_of(name);
    TensorDesc in, out;
    read_tensor(tensor, &in, &out);
    int h = 0;
    std::string err;
    if (door::submit(rt, &q, &in, &out, 1, false, &h, &err) != 1) throw std::invalid_argument(err);
    return py::int_(h);
  }
  const Py_ssize_t n = PyList_GET_SIZE(name.ptr());
  if (!PyList_Check(tensor.ptr()) || PyList_GET_SIZE(tensor.ptr()) != n)
    throw py::type_error("a group is submitted as a list of names and a list of as many tensors");
  std::vector<Request> qs(static_cast<size_t>(n), req);
  std::vector<TensorDesc> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {  // every member is read before any is enqueued
    qs[i].name = name_of(PyList_GET_ITEM(name.ptr(), i));
    read_tensor(PyList_GET_ITEM(tensor.ptr(), i), &ins[i], &outs[i]);
  }
  std::vector<int> handles(static_cast<size_t>(n));
  std::string err;
  const int32_t enqueued = door::submit(rt, qs.data(), ins.data(), outs.data(), static_cast<int32_t>(n), true,
                                        handles.data(), &err);
  handles.resize(static_cast<size_t>(enqueued));
  if (enqueued < n) {
    // ValueError naming the refused member, carrying the members enqueued before it: their
    // memory must stay alive until the core is done with them.
    py::object e = py::reinterpret_steal<py::object>(PyObject_CallFunction(PyExc_ValueError, "s", err.c_str()));
    if (!e) throw py::error_already_set();
    e.attr("handles") = py::cast(handles);
    PyErr_SetObject(PyExc_ValueError, e.ptr());
    throw py::error_already_set();
  }
  return py::cast(handles);
}

// Waits for one handle, or for every handle of a list (the GIL released once), through the
// door: see Runtime.wait in _core.pyi.
py::object wait(Runtime& rt, py::handle handles, int64_t stream) {
  std::string refused;
  if (PyLong_Check(handles.ptr())) {
    const int h = static_cast<int>(to_int(handles.ptr()));
    OpPtr op;
    char finished = 1;
    {
      py::gil_scoped_release nogil;
      door::wait(rt, &h, 1, stream, &op, &finished, &refused);
    }
    if (!op) throw std::invalid_argument(refused);
    return result_of(op, finished);
  }
  const std::vector<int> hs = handles.cast<std::vector<int>>();
  const int32_t n = static_cast<int32_t>(hs.size());
  std::vector<OpPtr> ops(hs.size());
  std::vector<char> finished(hs.size(), 1);
  int32_t first_bad;  // the first op that failed or was refused
  {
    py::gil_scoped_release nogil;
    first_bad = door::wait(rt, hs.data(), n, stream, ops.data(), finished.data(), &refused);
  }
  if (first_bad < n) {
    if (!ops[first_bad]) throw std::invalid_argument(refused);
    return py::cast(to_result(ops[first_bad], true));
  }
  bool any = false;
  for (const OpPtr& op : ops) any = any || hands_back(*op);
  if (!any) return py::none();
  py::list out;
  for (size_t i = 0; i < ops.size(); ++i) out.append(result_of(ops[i], finished[i]));
  return std::move(out);
}

}  // namespace
}  // namespace appliance

PYBIND11_MODULE(_core, m) {
  using namespace appliance;
  m.doc() = "Collective core of the appliance (C++17). Its API is described in _core.pyi.";
  m.attr("WIRE_VERSION") = kWireVersion;
  py::register_exception<Error>(m, "CoreError", PyExc_RuntimeError);

  // The core's codes as Python IntEnums, named after common/types.h's names (the values are
  // the core's: nothing is written twice).
  py::native_enum<DataType> dtypes(m, "DataType", "enum.IntEnum", "Element types of tensors.");
  for (int i = 0; i < kNumDataTypes; ++i) dtypes.value(upper(dtype_name(static_cast<DataType>(i))).c_str(), static_cast<DataType>(i));
  dtypes.finalize();
  py::native_enum<ReduceOp> ops(m, "ReduceOp", "enum.IntEnum", "Reductions, with Horovod's values (hvd.Average == 0...).");
  for (int i = 0; reduce_op_valid(static_cast<uint8_t>(i)); ++i)
    ops.value(upper(reduce_op_name(static_cast<ReduceOp>(i))).c_str(), static_cast<ReduceOp>(i));
  ops.finalize();
  py::native_enum<OpKind> kinds(m, "OpKind", "enum.IntEnum", "Kinds of collective operation.");
  for (int i = 0; op_kind_valid(static_cast<uint8_t>(i)); ++i)
    kinds.value(upper(op_kind_name(static_cast<OpKind>(i))).c_str(), static_cast<OpKind>(i));
  kinds.finalize();

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

  py::class_<Request>(m, "Request", "What every rank must agree on for an operation, less its name and tensor.")
      .def(py::init([](OpKind kind, ReduceOp op, double prescale, double postscale, int32_t root,
                       std::vector<int64_t> splits, int32_t process_set) {
             Request q;
             q.sig.kind = kind;
             q.sig.op = op;
             q.sig.prescale = prescale;
             q.sig.postscale = postscale;
             q.sig.root = root;
             q.sig.process_set = process_set;
             q.splits = std::move(splits);
             return q;
           }),
           py::arg("kind"), py::arg("op") = ReduceOp::kSum, py::arg("prescale") = 1.0, py::arg("postscale") = 1.0,
           py::arg("root") = 0, py::arg("splits") = std::vector<int64_t>{}, py::arg("process_set") = 0)
      .def_property_readonly("kind", [](const Request& q) { return q.sig.kind; })
      .def_property_readonly("op", [](const Request& q) { return q.sig.op; })
      .def_property_readonly("prescale", [](const Request& q) { return q.sig.prescale; })
      .def_property_readonly("postscale", [](const Request& q) { return q.sig.postscale; })
      .def_property_readonly("root", [](const Request& q) { return q.sig.root; })
      .def_property_readonly("splits", [](const Request& q) { return q.splits; })
      .def_property_readonly("process_set", [](const Request& q) { return q.sig.process_set; })
      .def("__repr__", [](const Request& q) {
        return std::string("Request(") + op_kind_name(q.sig.kind) + ", " + reduce_op_name(q.sig.op) +
               ", prescale=" + std::to_string(q.sig.prescale) + ", postscale=" + std::to_string(q.sig.postscale) +
               ", root=" + std::to_string(q.sig.root) + ", splits=" + shape_str(q.splits) +
               ", process_set=" + std::to_string(q.sig.process_set) + ")";
      });

  py::class_<CoreResult>(m, "Result")
      .def_readonly("ok", &CoreResult::ok)
      .def_readonly("code", &CoreResult::code)
      .def_readonly("origin_rank", &CoreResult::origin_rank)
      .def_readonly("origin_host", &CoreResult::origin_host)
      .def_readonly("message", &CoreResult::message)
      .def_readonly("output", &CoreResult::output)
      .def_property_readonly("shape", [](const CoreResult& r) {
        py::tuple t(r.shape.size());
        for (size_t i = 0; i < r.shape.size(); ++i) t[i] = py::int_(r.shape[i]);
        return t;
      })
      .def_readonly("splits", &CoreResult::splits)
      .def_readonly("value", &CoreResult::value);

  py::class_<Runtime, std::shared_ptr<Runtime>>(m, "Runtime")
      .def(py::init<RuntimeConfig>(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &Runtime::rank)
      .def_property_readonly("size", &Runtime::size)
      .def_property_readonly("local_rank", [](const Runtime& r) { return r.topology().local_rank; })
      .def_property_readonly("local_size", [](const Runtime& r) { return r.topology().local_size; })
      .def_property_readonly("cross_rank", [](const Runtime& r) { return r.topology().cross_rank; })
      .def_property_readonly("cross_size", [](const Runtime& r) { return r.topology().cross_size; })
      .def("host_of", &Runtime::host_of)
      .def("link_kind", &Runtime::link_kind)
      .def("submit", &submit, py::arg("request"), py::arg("name"), py::arg("tensor") = py::none())
      .def("wait", &wait, py::arg("handle"), py::arg("stream") = -1)
      .def("poll",
           [](Runtime& rt, py::handle handles) {
             if (PyLong_Check(handles.ptr())) return door::poll(rt, static_cast<int>(to_int(handles.ptr())));
             for (int h : handles.cast<std::vector<int>>())
               if (!door::poll(rt, h)) return false;
             return true;
           },
           py::arg("handle"))
      .def("add_process_set", &Runtime::add_process_set, py::arg("id"), py::arg("ranks"))
      .def("remove_process_set", &Runtime::remove_process_set, py::arg("id"))
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
             d["ctrl_in"] = s.ctrl_in.load();
             d["ctrl_out"] = s.ctrl_out.load();
             d["carried"] = s.carried.load();
             d["data_frames"] = rt.data_frames();
             d["negotiation_ns"] = rt.profile().ns();
             d["negotiation_turns"] = rt.profile().turns();
             d["store_requests"] = rt.store_requests();
             d["store_served"] = rt.store_served();
             d["outputs_reused"] = rt.output_pool().reused();
             d["outputs_idle_bytes"] = rt.output_pool().idle_bytes();
             return d;
           })
      .def("metrics",
           [](const Runtime& rt) {
             // Cumulative since start: see Runtime::Metrics (seconds as floats, the rest ints).
             static const char* kNames[Runtime::Metrics::kKinds] = {"allreduce", "allgather", "broadcast",
                                                                   "alltoall", "reducescatter"};
             const auto& m = rt.metrics();
             py::dict ops;
             for (int k = 0; k < Runtime::Metrics::kKinds; ++k) {
               const uint64_t n = m.kinds[k].n.load(std::memory_order_relaxed);
               if (!n) continue;
               py::dict one;
               one["n"] = n;
               one["bytes"] = m.kinds[k].bytes.load(std::memory_order_relaxed);
               one["s"] = m.kinds[k].ns.load(std::memory_order_relaxed) * 1e-9;
               ops[kNames[k]] = one;
             }
             py::dict d;
             d["ops"] = ops;
             d["busy_s"] = m.busy_ns.load(std::memory_order_relaxed) * 1e-9;
             d["wait_s"] = m.wait_ns.load(std::memory_order_relaxed) * 1e-9;
             d["late_s"] = m.late_ns.load(std::memory_order_relaxed) * 1e-9;
             return d;
           })
      .def("set_profiling", &Runtime::set_profiling, py::arg("on"))
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

  // The C door (capi/appliance_core.h): its table as a capsule, and the runtime it reaches.
  m.def("c_api", [] {
    return py::capsule(static_cast<const void*>(core_api()), APPLIANCE_CORE_CAPSULE);
  });
  m.def("set_process_runtime", [](py::object rt) {
    std::shared_ptr<Runtime> old = set_process_runtime(rt.is_none() ? nullptr : rt.cast<std::shared_ptr<Runtime>>());
    py::gil_scoped_release nogil;  // the last reference may go here: ~Runtime joins threads
    old.reset();
  }, py::arg("runtime"));

  // Address of a contiguous buffer (a numpy array), cheaper than numpy's .ctypes.data, which
  // the per-op path would otherwise pay twice per operation.
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
}
