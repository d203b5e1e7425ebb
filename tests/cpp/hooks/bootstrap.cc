// Test hooks for bootstrap (crypto, frames, auth handshake, sockets, store, mesh, topology),
// in appliance.runtime._core_testing. Not an API. Every blocking call releases the GIL.
// Core errors surface as _core_testing.BootstrapError (a RuntimeError) with attributes `code`
// (code_name(), e.g. "timeout"), `origin_rank` and `text` (the Status message).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <poll.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "bootstrap/mesh.h"
#include "common/crypto.h"
#include "common/status.h"
#include "hooks/hooks.h"
#include "store/store.h"
#include "transport/auth.h"
#include "transport/frame_io.h"
#include "transport/tcp/socket.h"

namespace py = pybind11;

namespace appliance {
namespace {

[[noreturn]] void raise_core(const Error& e) {
  py::object cls = py::module_::import("appliance.runtime._core_testing").attr("BootstrapError");
  py::object exc = cls(e.what());
  exc.attr("code") = code_name(e.status().code);
  exc.attr("origin_rank") = e.status().origin_rank;
  exc.attr("text") = e.status().message;
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

// Run f without the GIL; translate core errors.
template <class F>
auto nogil(F&& f) -> decltype(f()) {
  try {
    py::gil_scoped_release release;
    return f();
  } catch (const Error& e) {
    raise_core(e);
  }
}

std::string to_string(const py::bytes& b) { return std::string(b); }
std::vector<uint8_t> to_vec(const py::bytes& b) {
  std::string s(b);
  return std::vector<uint8_t>(s.begin(), s.end());
}
py::bytes from_vec(const std::vector<uint8_t>& v) { return py::bytes(reinterpret_cast<const char*>(v.data()), v.size()); }
py::bytes from_digest(const Digest& d) { return py::bytes(reinterpret_cast<const char*>(d.data()), d.size()); }

AuthParams make_auth(const py::bytes& secret, const std::string& job_id, int rank) {
  AuthParams a;
  a.secret = to_string(secret);
  a.job_id = job_id;
  a.rank = rank;
  return a;
}

py::dict topo_dict(const Topology& t) {
  py::dict d;
  d["local_rank"] = t.local_rank;
  d["local_size"] = t.local_size;
  d["cross_rank"] = t.cross_rank;
  d["cross_size"] = t.cross_size;
  return d;
}

// Move `n` bytes over a link (poll on its handle) before the deadline.
void link_io(Link& l, void* p, size_t n, bool send, Deadline d) {
  uint8_t* b = static_cast<uint8_t*>(p);
  size_t off = 0;
  while (off < n) {
    size_t k = send ? l.send_some(b + off, n - off) : l.recv_some(b + off, n - off);
    off += k;
    if (off < n && k == 0 && !wait_fd(l.wait_handle(), send ? POLLOUT : POLLIN, d))
      throw Error(Code::kTimeout, std::string("smoke exchange with rank ") + std::to_string(l.peer()) + " timed out");
  }
}

struct SmokeResult {
  std::vector<PeerInfo> peers;
  Topology topo;
  std::vector<std::tuple<int, std::string, std::string, std::string>> received;  // peer, channel, kind, text
};

// build_mesh, then every link carries one length-prefixed greeting each way.
SmokeResult mesh_smoke(const std::string& store_host, int store_port, const AuthParams& auth, int size,
                       const std::string& host, const std::string& bind_addr, int64_t timeout_ms, int peer_timeout_ms,
                       bool allow_shm) {
  TcpStoreClient store(store_host, store_port, auth, timeout_ms);
  MeshOptions o;
  o.rank = auth.rank;
  o.size = size;
  o.host = host;
  o.bind_addr = bind_addr;
  o.store_host = store_host;
  o.timeout_ms = timeout_ms;
  o.peer_timeout_ms = peer_timeout_ms;
  o.allow_shm = allow_shm;
  o.auth = auth;
  Mesh m = build_mesh(store, o);
  SmokeResult res;
  res.peers = m.peers;
  res.topo = m.topo;
  const Deadline d = deadline_after_ms(timeout_ms);
  std::vector<std::pair<Link*, std::string>> links;
  for (auto& l : m.data)
    if (l) links.push_back({l.get(), "data"});
  for (auto& l : m.control)
    if (l) links.push_back({l.get(), "control"});
  for (auto& [l, ch] : links) {  // greetings are tiny: sending all first cannot block
    std::string msg = "hello from rank " + std::to_string(auth.rank) + " on " + ch;
    uint32_t len = static_cast<uint32_t>(msg.size());
    link_io(*l, &len, 4, true, d);
    link_io(*l, msg.data(), msg.size(), true, d);
  }
  for (auto& [l, ch] : links) {
    uint32_t len = 0;
    link_io(*l, &len, 4, false, d);
    if (len > 4096) throw Error(Code::kProtocol, "smoke greeting too long");
    std::string msg(len, '\0');
    link_io(*l, msg.data(), len, false, d);
    res.received.emplace_back(l->peer(), ch, l->kind(), msg);
  }
  return res;
}

py::dict handshake_pair(const AuthParams& conn, int expect_rank, int channel, const AuthParams& acc, int64_t timeout_ms) {
  std::string conn_err, acc_err, conn_code, acc_code;
  PeerHello hello;
  {
    py::gil_scoped_release release;
    Listener l = listen_tcp("127.0.0.1", 0);
    const Deadline d = deadline_after_ms(timeout_ms);
    std::thread t([&] {
      int fd = accept_tcp(l, d);
      if (fd < 0) {
        acc_err = "no connection";
        return;
      }
      try {
        hello = auth_accept(fd, acc, d);
      } catch (const Error& e) {
        acc_err = e.what();
        acc_code = code_name(e.status().code);
      }
      ::close(fd);
    });
    try {
      int fd = connect_tcp("127.0.0.1", l.port, d, "the test acceptor");
      try {
        auth_connect(fd, conn, expect_rank, channel, d);
      } catch (const Error& e) {
        conn_err = e.what();
        conn_code = code_name(e.status().code);
      }
      ::close(fd);
    } catch (const Error& e) {
      conn_err = e.what();
    }
    t.join();
  }
  py::dict r;
  r["connector_error"] = conn_err.empty() ? py::object(py::none()) : py::object(py::str(conn_err));
  r["connector_code"] = conn_code;
  r["acceptor_error"] = acc_err.empty() ? py::object(py::none()) : py::object(py::str(acc_err));
  r["acceptor_code"] = acc_code;
  r["peer"] = py::make_tuple(hello.rank, hello.channel);
  return r;
}

py::dict peer_dict(const PeerInfo& p) {
  py::dict d;
  d["rank"] = p.rank;
  d["host"] = p.host;
  d["host_key"] = p.host_key;
  d["addr"] = p.addr;
  d["port"] = p.port;
  return d;
}

}  // namespace

void bind_bootstrap_hooks(py::module_& m) {
  m.attr("BootstrapError") = py::reinterpret_steal<py::object>(
      PyErr_NewException("appliance.runtime._core_testing.BootstrapError", PyExc_RuntimeError, nullptr));

  // ---- crypto, frames ----
  m.def("sha256", [](const py::bytes& b) { return from_digest(nogil([s = to_string(b)] { return sha256(s.data(), s.size()); })); });
  m.def("hmac_sha256", [](const py::bytes& key, const py::bytes& msg) {
    std::string k = key, s = msg;
    return from_digest(nogil([&] { return hmac_sha256(k.data(), k.size(), s.data(), s.size()); }));
  });
  m.def("digest_equal", [](const py::bytes& a, const py::bytes& b) {
    std::string x = a, y = b;
    if (x.size() != 32 || y.size() != 32) throw py::value_error("digests are 32 bytes");
    Digest da, db;
    std::copy(x.begin(), x.end(), da.begin());
    std::copy(y.begin(), y.end(), db.begin());
    return digest_equal(da, db);
  });
  m.def("random_bytes", [](size_t n) { return from_vec(nogil([n] { return random_bytes(n); })); });
  m.def("encode_frame", [](int type, uint32_t seq, const py::bytes& payload) {
    std::string p = payload;
    return from_vec(encode_frame(static_cast<FrameType>(type), seq, p.data(), p.size()));
  }, "Header + payload of one frame (for tests that speak the protocol by hand).");

  // ---- sockets, handshake ----
  m.def("connect_tcp", [](const std::string& host, int port, int64_t timeout_ms) {
    nogil([&] {
      int fd = connect_tcp(host, port, deadline_after_ms(timeout_ms), "the test target");
      ::close(fd);
      return 0;
    });
  }, "Connect (retrying until the timeout) and close at once.");
  m.def("handshake_pair", [](const py::bytes& c_secret, const std::string& c_job, int c_rank, int expect_rank,
                             int channel, const py::bytes& a_secret, const std::string& a_job, int a_rank,
                             int64_t timeout_ms) {
    return handshake_pair(make_auth(c_secret, c_job, c_rank), expect_rank, channel, make_auth(a_secret, a_job, a_rank),
                          timeout_ms);
  }, "auth_connect against auth_accept over loopback TCP; both outcomes in a dict.");
  m.def("auth_probe", [](const std::string& host, int port, const py::bytes& secret, const std::string& job_id, int rank,
                         int expect_rank, int channel, int64_t timeout_ms) {
    AuthParams a = make_auth(secret, job_id, rank);
    nogil([&] {
      Deadline d = deadline_after_ms(timeout_ms);
      int fd = connect_tcp(host, port, d, "the probed peer");
      try {
        auth_connect(fd, a, expect_rank, channel, d);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      return 0;
    });
  }, "Connect and run the connector handshake against any acceptor (a store, a mesh rank).");

  // ---- store ----
  py::class_<TcpStoreServer>(m, "StoreServer")
      .def(py::init([](const std::string& host, int port, const py::bytes& secret, const std::string& job_id) {
             AuthParams a = make_auth(secret, job_id, kStoreServerRank);
             return nogil([&] { return new TcpStoreServer(host, port, a); });
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"), py::arg("job_id"))
      .def_property_readonly("port", &TcpStoreServer::port);
  py::class_<TcpStoreClient>(m, "StoreClient")
      .def(py::init([](const std::string& host, int port, const py::bytes& secret, const std::string& job_id, int rank,
                       int64_t connect_timeout_ms) {
             AuthParams a = make_auth(secret, job_id, rank);
             return nogil([&] { return new TcpStoreClient(host, port, a, connect_timeout_ms); });
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"), py::arg("job_id"), py::arg("rank") = -1,
           py::arg("connect_timeout_ms") = 10000)
      .def("set", [](TcpStoreClient& c, const std::string& k, const py::bytes& v) {
        auto val = to_vec(v);
        nogil([&] { c.set(k, val); return 0; });
      })
      .def("get", [](TcpStoreClient& c, const std::string& k, int64_t timeout_ms) {
        return from_vec(nogil([&] { return c.get(k, timeout_ms); }));
      })
      .def("wait", [](TcpStoreClient& c, const std::vector<std::string>& keys, int64_t timeout_ms) {
        nogil([&] { c.wait(keys, timeout_ms); return 0; });
      })
      .def("add", [](TcpStoreClient& c, const std::string& k, int64_t delta) {
        return nogil([&] { return c.add(k, delta); });
      });

  // ---- mesh, topology ----
  m.def("compute_topology", [](const std::vector<std::string>& hosts, int rank) {
    if (rank < 0 || rank >= static_cast<int>(hosts.size())) throw py::value_error("rank outside the host list");
    return topo_dict(compute_topology(hosts, rank));
  });
  m.def("host_key", [] { return local_host_key(); });
  m.def("choose_listen_address", [](const std::string& bind_addr, const std::string& store_host) {
    MeshOptions o;
    o.bind_addr = bind_addr;
    o.store_host = store_host;
    return choose_listen_address(o);
  });
  m.def("shm_possible", [](const std::string& key_a, const std::string& key_b) {
    PeerInfo a, b;
    a.host_key = key_a;
    b.host_key = key_b;
    return shm_possible(a, b);
  });
  m.def("mesh_smoke", [](const std::string& store_host, int store_port, const py::bytes& secret,
                         const std::string& job_id, int rank, int size, const std::string& host,
                         const std::string& bind_addr, int64_t timeout_ms, int peer_timeout_ms, bool allow_shm) {
    AuthParams a = make_auth(secret, job_id, rank);
    SmokeResult r = nogil([&] {
      return mesh_smoke(store_host, store_port, a, size, host, bind_addr, timeout_ms, peer_timeout_ms, allow_shm);
    });
    py::dict out;
    out["topology"] = topo_dict(r.topo);
    py::list peers;
    for (const auto& p : r.peers) peers.append(peer_dict(p));
    out["peers"] = peers;
    py::list rec;
    for (const auto& [peer, ch, kind, text] : r.received) rec.append(py::make_tuple(peer, ch, kind, text));
    out["received"] = rec;
    return out;
  }, py::arg("store_host"), py::arg("store_port"), py::arg("secret"), py::arg("job_id"), py::arg("rank"),
     py::arg("size"), py::arg("host") = "", py::arg("bind_addr") = "", py::arg("timeout_ms") = 10000,
     py::arg("peer_timeout_ms") = 10000, py::arg("allow_shm") = false,
     "build_mesh through a store client, then one greeting each way on every link.");
}

}  // namespace appliance
