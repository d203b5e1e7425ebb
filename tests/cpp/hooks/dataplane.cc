// Test hooks for the data plane (frames, codec, channels, collectives, reduce kernels), in
// appliance.runtime._core_testing. Not an API: names and shapes follow the tests' needs.
// Errors from the core surface as _core_testing.CoreError with .code (int), .code_name,
// .origin_rank, .host and .status_message. Every call that may block releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <functional>
#include <optional>

#include "collectives/reduce.h"
#include "collectives/reduce_simd.h"
#include "hooks/dataplane_harness.h"
#include "hooks/hooks.h"
#include "transport/channel.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/tcp_link.h"
#include "wire/codec.h"
#include "wire/frame.h"

namespace py = pybind11;

namespace appliance {

namespace {

[[noreturn]] void raise_core(const py::object& exc, const Status& s) {
  py::object e = exc(s.to_string());
  e.attr("code") = static_cast<int>(s.code);
  e.attr("code_name") = code_name(s.code);
  e.attr("origin_rank") = s.origin_rank;
  e.attr("host") = s.host;
  e.attr("status_message") = s.message;
  PyErr_SetObject(exc.ptr(), e.ptr());
  throw py::error_already_set();
}

// Run f without the GIL; an Error becomes CoreError once the GIL is back.
void nogil(const py::object& exc, const std::function<void()>& f) {
  std::optional<Status> err;
  {
    py::gil_scoped_release release;
    try {
      f();
    } catch (const Error& e) {
      err = e.status();
    }
  }
  if (err) raise_core(exc, *err);
}

py::dict status_dict(const Status& s) {
  py::dict d;
  d["code"] = static_cast<int>(s.code);
  d["code_name"] = code_name(s.code);
  d["origin_rank"] = s.origin_rank;
  d["host"] = s.host;
  d["message"] = s.message;
  d["text"] = s.to_string();
  return d;
}

const char* decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kNone: return "none";
    case DecodeError::kBadMagic: return "bad_magic";
    case DecodeError::kBadVersion: return "bad_version";
    case DecodeError::kBadCrc: return "bad_crc";
    case DecodeError::kBadType: return "bad_type";
    case DecodeError::kReserved: return "reserved";
    case DecodeError::kTooLong: return "too_long";
    case DecodeError::kBadSeq: return "bad_seq";
  }
  return "?";
}

py::buffer_info writable(py::buffer& b) {
  py::buffer_info i = b.request(true);
  return i;
}

// Writer/Reader driven by a list of field kinds: u8 u32 u64 i32 i64 f64 str bytes i64s status.
py::bytes writer_script(const py::list& items) {
  Writer w;
  for (auto item : items) {
    auto t = item.cast<py::tuple>();
    std::string k = t[0].cast<std::string>();
    py::handle v = t[1];
    if (k == "u8") w.u8(v.cast<uint8_t>());
    else if (k == "u32") w.u32(v.cast<uint32_t>());
    else if (k == "u64") w.u64(v.cast<uint64_t>());
    else if (k == "i32") w.i32(v.cast<int32_t>());
    else if (k == "i64") w.i64(v.cast<int64_t>());
    else if (k == "f64") w.f64(v.cast<double>());
    else if (k == "str") w.str(v.cast<std::string>());
    else if (k == "bytes") { std::string s = v.cast<std::string>(); w.bytes(s.data(), s.size()); }
    else if (k == "i64s") w.i64s(v.cast<std::vector<int64_t>>());
    else if (k == "status") {
      auto st = v.cast<py::tuple>();
      w.status(Status{static_cast<Code>(st[0].cast<int>()), st[1].cast<int>(), st[2].cast<std::string>(),
                      st[3].cast<std::string>()});
    } else throw py::value_error("unknown field kind " + k);
  }
  auto& b = w.buffer();
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

py::list reader_script(const py::object& exc, const py::bytes& data, const std::vector<std::string>& ops) {
  std::string d = data;
  py::list out;
  try {
    Reader rd(reinterpret_cast<const uint8_t*>(d.data()), d.size(), "test message");
    for (const std::string& full : ops) {
      std::string k = full;
      size_t limit = 0;
      bool has_limit = false;
      auto colon = full.find(':');
      if (colon != std::string::npos) {
        k = full.substr(0, colon);
        limit = std::stoull(full.substr(colon + 1));
        has_limit = true;
      }
      if (k == "u8") out.append(rd.u8());
      else if (k == "u32") out.append(rd.u32());
      else if (k == "u64") out.append(rd.u64());
      else if (k == "i32") out.append(rd.i32());
      else if (k == "i64") out.append(rd.i64());
      else if (k == "f64") out.append(rd.f64());
      else if (k == "str") out.append(py::bytes(has_limit ? rd.str(limit) : rd.str()));
      else if (k == "bytes") {
        auto v = has_limit ? rd.bytes(limit) : rd.bytes();
        out.append(py::bytes(reinterpret_cast<const char*>(v.data()), v.size()));
      } else if (k == "i64s") out.append(has_limit ? rd.i64s(limit) : rd.i64s());
      else if (k == "status") {
        Status s = rd.status();
        out.append(py::make_tuple(static_cast<int>(s.code), s.origin_rank, s.host, s.message));
      } else if (k == "done") rd.expect_done();
      else throw py::value_error("unknown field kind " + k);
    }
  } catch (const Error& e) {
    raise_core(exc, e.status());
  }
  return out;
}

// A Channel over a dup of a Python socket's fd, to drive the message and streaming APIs.
class PyChannel {
 public:
  PyChannel(int fd, int peer, uint32_t max_payload, const std::string& host) {
    int own = ::dup(fd);
    if (own < 0) throw py::value_error("bad fd");
    ch_ = std::make_unique<Channel>(std::make_unique<TcpLink>(own, peer, host), max_payload);
  }
  Channel& ch() { return *ch_; }

 private:
  std::unique_ptr<Channel> ch_;
};

void bind_harness(py::module_& m, const py::object& exc) {
  m.def(
      "run_collective",
      [exc](const std::string& kind, int nranks, const std::vector<py::bytes>& inputs, int dtype, int op, int root,
            const std::vector<size_t>& counts, const std::vector<std::vector<size_t>>& send_bytes, size_t chunk_bytes,
            size_t max_frame, int broadcast_algo, int allreduce_algo, bool alias, int iterations, bool sync, int delay_rank,
            int delay_ms, int sockbuf, bool watch_fd, const py::dict& fault, int64_t timeout_ms,
            const std::string& transport, size_t shm_ring_bytes, int local_size) {
        testing::CollectiveSpec spec;
        if (local_size < 0 || (local_size > 0 && nranks % local_size != 0)) throw py::value_error("bad local_size");
        spec.local_size = local_size;
        spec.kind = kind;
        spec.nranks = nranks;
        if (!dtype_valid(static_cast<uint8_t>(dtype))) throw py::value_error("bad dtype code");
        if (!reduce_op_valid(static_cast<uint8_t>(op))) throw py::value_error("bad op code");
        spec.dtype = static_cast<DataType>(dtype);
        spec.op = static_cast<ReduceOp>(op);
        spec.root = root;
        spec.counts = counts;
        spec.send_bytes = send_bytes;
        spec.opts.chunk_bytes = chunk_bytes;
        spec.opts.broadcast_algo = static_cast<BroadcastAlgo>(broadcast_algo);
        if (allreduce_algo < 0 || allreduce_algo > 2) throw py::value_error("bad allreduce_algo");
        spec.opts.allreduce_algo = static_cast<AllreduceAlgo>(allreduce_algo);
        spec.max_frame = max_frame;
        spec.alias = alias;
        spec.iterations = iterations;
        spec.sync = sync;
        spec.delay_rank = delay_rank;
        spec.delay_ms = delay_ms;
        spec.sockbuf = sockbuf;
        spec.transport = transport;
        spec.shm_ring_bytes = shm_ring_bytes;
        spec.watch_fd = watch_fd;
        spec.timeout_ms = timeout_ms;
        if (fault.contains("rank")) spec.fault.rank = fault["rank"].cast<int>();
        if (fault.contains("peer")) spec.fault.peer = fault["peer"].cast<int>();
        if (fault.contains("close_after")) spec.fault.close_after = fault["close_after"].cast<int64_t>();
        if (fault.contains("corrupt_at")) spec.fault.corrupt_at = fault["corrupt_at"].cast<int64_t>();
        std::vector<std::vector<uint8_t>> in;
        for (auto& b : inputs) {
          std::string_view sv = b;
          in.emplace_back(sv.begin(), sv.end());
        }
        testing::HarnessResult hr;
        nogil(exc, [&] { hr = testing::run_collective(spec, in); });
        py::list outputs, errors, seconds, enter, exit;
        for (auto& rr : hr.ranks) {
          if (rr.error) {
            outputs.append(py::none());
            errors.append(status_dict(*rr.error));
          } else {
            outputs.append(py::bytes(reinterpret_cast<const char*>(rr.output.data()), rr.output.size()));
            errors.append(py::none());
          }
          seconds.append(rr.seconds);
          enter.append(rr.enter_s);
          exit.append(rr.exit_s);
        }
        py::dict d;
        d["outputs"] = outputs;
        d["errors"] = errors;
        d["seconds"] = seconds;
        d["enter"] = enter;
        d["exit"] = exit;
        d["wall"] = hr.wall_s;
        d["job_error"] = hr.job_error ? py::object(status_dict(*hr.job_error)) : py::object(py::none());
        return d;
      },
      py::arg("kind"), py::arg("nranks"), py::arg("inputs"), py::arg("dtype") = 7, py::arg("op") = 1,
      py::arg("root") = 0, py::arg("counts") = std::vector<size_t>{},
      py::arg("send_bytes") = std::vector<std::vector<size_t>>{}, py::arg("chunk_bytes") = 1 << 20,
      py::arg("max_frame") = 1 << 20, py::arg("broadcast_algo") = 0, py::arg("allreduce_algo") = 0, py::arg("alias") = false,
      py::arg("iterations") = 1, py::arg("sync") = false, py::arg("delay_rank") = -1, py::arg("delay_ms") = 0,
      py::arg("sockbuf") = 0, py::arg("watch_fd") = true, py::arg("fault") = py::dict(), py::arg("timeout_ms") = 20000,
      py::arg("transport") = "tcp", py::arg("shm_ring_bytes") = 1 << 20, py::arg("local_size") = 0,
      "Run one collective on nranks threads over socketpairs (or shm links); per-rank outputs, errors, timings.");
}

void bind_channel(py::module_& m, const py::object& exc) {
  py::class_<PyChannel>(m, "FrameChannel", "A Channel over a dup of a socket fd (test driver).")
      .def(py::init<int, int, uint32_t, const std::string&>(), py::arg("fd"), py::arg("peer"),
           py::arg("max_payload"), py::arg("host") = "local")
      .def("send_frame",
           [exc](PyChannel& c, int type, const py::bytes& payload, int64_t timeout_ms) {
             std::string p = payload;
             nogil(exc, [&] {
               c.ch().send_frame(static_cast<FrameType>(type), p.data(), p.size(), deadline_after_ms(timeout_ms));
             });
           })
      .def("recv_frame",
           [exc](PyChannel& c, int64_t timeout_ms) {
             Frame f;
             nogil(exc, [&] { f = c.ch().recv_frame(deadline_after_ms(timeout_ms)); });
             return py::make_tuple(static_cast<int>(f.type),
                                   py::bytes(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
           })
      .def("try_recv_frame",
           [exc](PyChannel& c) -> py::object {
             Frame f;
             bool got = false;
             nogil(exc, [&] { got = c.ch().try_recv_frame(f); });
             if (!got) return py::none();
             return py::make_tuple(static_cast<int>(f.type),
                                   py::bytes(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
           })
      .def("send_data",
           [exc](PyChannel& c, const py::bytes& payload, int64_t timeout_ms) {
             std::string p = payload;
             nogil(exc, [&] {
               Deadline d = deadline_after_ms(timeout_ms);
               c.ch().begin_send(p.data(), p.size());
               while (!c.ch().pump_send()) {
                 if (Clock::now() >= d) throw Error(Code::kTimeout, "send_data timed out");
                 c.ch().wait(false, true, d);
               }
             });
           })
      .def("recv_data",
           [exc](PyChannel& c, size_t len, int64_t timeout_ms) {
             std::string buf(len, '\0');
             nogil(exc, [&] {
               Deadline d = deadline_after_ms(timeout_ms);
               c.ch().begin_recv(buf.data(), len);
               while (!c.ch().pump_recv()) {
                 if (Clock::now() >= d) throw Error(Code::kTimeout, "recv_data timed out");
                 c.ch().wait(true, false, d);
               }
             });
             return py::bytes(buf);
           })
      .def("close", [](PyChannel& c) { c.ch().link().close(); });
  // A shm link pair whose side b raised its "waiting" flag and then went away: side a sends
  // `nbytes` in one piece (the wake it owes b meets a closed socket), then tries to send and
  // to receive once more. Returns the bytes the first send took and the two errors' texts.
  m.def("shm_send_after_peer_left", [exc](size_t nbytes) {
    size_t sent = 0;
    std::string send_error, recv_error;
    nogil(exc, [&] {
      auto pr = make_shm_link_pair(0, 1, 1 << 20);
      pr.second->arm_wait(true, false);
      pr.second.reset();
      std::vector<uint8_t> data(nbytes, 7);
      sent = pr.first->send_some(data.data(), nbytes);
      try {
        pr.first->send_some(data.data(), 1);
      } catch (const Error& e) {
        send_error = e.status().to_string();
      }
      try {
        uint8_t b;
        pr.first->recv_some(&b, 1);
      } catch (const Error& e) {
        recv_error = e.status().to_string();
      }
    });
    return py::make_tuple(sent, send_error, recv_error);
  }, py::arg("nbytes"));
}

void bind_kernels(py::module_& m, const py::object& exc) {
  m.def(
      "reduce_into",
      [exc](py::buffer dst, py::buffer src, int dtype, int op) {
        py::buffer_info d = writable(dst), s = src.request();
        if (!dtype_valid(static_cast<uint8_t>(dtype))) throw py::value_error("bad dtype code");
        size_t esz = dtype_size(static_cast<DataType>(dtype));
        size_t nb = static_cast<size_t>(d.size * d.itemsize);
        if (nb != static_cast<size_t>(s.size * s.itemsize) || nb % esz) throw py::value_error("size mismatch");
        nogil(exc, [&] { reduce_into(d.ptr, s.ptr, nb / esz, static_cast<DataType>(dtype), static_cast<ReduceOp>(op)); });
      },
      py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("op"));
  m.def(
      "scale",
      [exc](py::buffer buf, int dtype, double factor) {
        py::buffer_info b = writable(buf);
        if (!dtype_valid(static_cast<uint8_t>(dtype))) throw py::value_error("bad dtype code");
        size_t esz = dtype_size(static_cast<DataType>(dtype));
        size_t nb = static_cast<size_t>(b.size * b.itemsize);
        if (nb % esz) throw py::value_error("size not a multiple of the element size");
        nogil(exc, [&] { scale(b.ptr, nb / esz, static_cast<DataType>(dtype), factor); });
      },
      py::arg("buf"), py::arg("dtype"), py::arg("factor"));
  // Kernel choice: the CPU-specific 16-bit float kernels (when this CPU has them) or, forced,
  // the portable loops, so tests check both against the same references.
  m.def("kernels_available", &simd::kernels_available);
  m.def("use_portable_kernels", &simd::use_portable_kernels, py::arg("on"));
  // Bulk 16-bit float conversions: uint16 bits <-> float32 values, elementwise.
  m.def("widen16", [](py::buffer src, py::buffer dst, bool bf16) {
    py::buffer_info s = src.request(), d = writable(dst);
    if (s.size * s.itemsize * 2 != d.size * d.itemsize) throw py::value_error("dst must be float32[len(src)]");
    auto* in = static_cast<const uint16_t*>(s.ptr);
    auto* out = static_cast<float*>(d.ptr);
    for (py::ssize_t i = 0; i < s.size * s.itemsize / 2; ++i) out[i] = bf16 ? bfloat16_to_float(in[i]) : half_to_float(in[i]);
  });
  m.def("narrow16", [](py::buffer src, py::buffer dst, bool bf16) {
    py::buffer_info s = src.request(), d = writable(dst);
    if (s.size * s.itemsize != d.size * d.itemsize * 2) throw py::value_error("dst must be uint16[len(src)]");
    auto* in = static_cast<const float*>(s.ptr);
    auto* out = static_cast<uint16_t*>(d.ptr);
    for (py::ssize_t i = 0; i < s.size * s.itemsize / 4; ++i) out[i] = bf16 ? float_to_bfloat16(in[i]) : float_to_half(in[i]);
  });
}

void bind_wire(py::module_& m, const py::object& exc) {
  m.def(
      "encode_frame_header",
      [](int type, uint32_t length, uint32_t seq) {
        uint8_t out[kFrameHeaderSize];
        encode_frame_header(FrameHeader{static_cast<FrameType>(type), length, seq}, out);
        return py::bytes(reinterpret_cast<const char*>(out), kFrameHeaderSize);
      },
      py::arg("type"), py::arg("length"), py::arg("seq"));
  m.def(
      "decode_frame_header",
      [](const py::bytes& data, uint32_t expected_seq, uint32_t max_length) {
        std::string b = data;
        DecodeResult r = decode_frame_header(reinterpret_cast<const uint8_t*>(b.data()), b.size(), expected_seq,
                                             max_length);
        py::dict d;
        d["error"] = decode_error_name(r.error);
        d["describe"] = r.describe();
        d["type"] = static_cast<int>(r.header.type);
        d["length"] = r.header.length;
        d["seq"] = r.header.seq;
        d["got"] = r.got;
        d["want"] = r.want;
        return d;
      },
      py::arg("data"), py::arg("expected_seq"), py::arg("max_length"));
  m.def(
      "crc32c",
      [](const py::bytes& data, uint32_t seed) {
        std::string b = data;
        return crc32c(b.data(), b.size(), seed);
      },
      py::arg("data"), py::arg("seed") = 0);
  m.def("writer_script", &writer_script, "Encode [(kind, value)...] with Writer.");
  m.def(
      "reader_script",
      [exc](const py::bytes& data, const std::vector<std::string>& ops) { return reader_script(exc, data, ops); },
      "Decode with Reader: ops like 'u32', 'str:16', 'done'. Raises CoreError on malformed input.");
}

}  // namespace

void bind_dataplane_hooks(py::module_& m) {
  py::object exc = py::reinterpret_steal<py::object>(
      PyErr_NewException("appliance.runtime._core_testing.CoreError", PyExc_RuntimeError, nullptr));
  m.attr("CoreError") = exc;
  py::dict dtypes, ops, frames, codes;
  for (int i = 0; i < kNumDataTypes; ++i) dtypes[dtype_name(static_cast<DataType>(i))] = i;
  for (int i = 0; i <= static_cast<int>(ReduceOp::kProduct); ++i) ops[reduce_op_name(static_cast<ReduceOp>(i))] = i;
  for (int i = 1; i <= static_cast<int>(FrameType::kBye); ++i) frames[frame_type_name(static_cast<FrameType>(i))] = i;
  for (int i = 0; i <= static_cast<int>(Code::kStalled); ++i) codes[code_name(static_cast<Code>(i))] = i;
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("FRAME_TYPES") = frames;
  m.attr("CODES") = codes;
  m.attr("SMALL_FRAME") = Channel::kSmallFrame;
  bind_wire(m, exc);
  bind_kernels(m, exc);
  bind_channel(m, exc);
  bind_harness(m, exc);
}

}  // namespace appliance
