// TcpStoreClient: one authenticated connection to the store, shared by any number of
// threads. Each call sends a request with a fresh id (under a send lock) and waits for the
// reply with that id. Whichever waiting thread finds nobody reading becomes the reader: it
// polls the socket (no lock held), reads whole reply frames and hands each to its owner, so a
// GET parked on the server never holds back another thread's SET. A reply that nobody waits
// for any more (its caller timed out) is dropped. A broken connection fails every call, now
// and later, with the same Error.
#include <poll.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "common/status.h"
#include "store/store.h"

#include <chrono>
#include <thread>
#include "store/store_protocol.h"
#include "transport/frame_io.h"
#include "transport/tcp/socket.h"
#include "wire/codec.h"

namespace appliance {

using namespace store_proto;

namespace {
// Extra time the client grants the server past a GET/WAIT timeout before it gives up on the
// reply (the server itself answers at the timeout), and the budget for SET/ADD replies.
constexpr int64_t kReplyGraceMs = 5000;
constexpr int64_t kRpcTimeoutMs = 30000;
// Once the first byte of a reply is there, the rest must follow within this.
constexpr int64_t kFrameTimeoutMs = 30000;

const char* op_name(Op op) {
  switch (op) {
    case kSet: return "set";
    case kGet: return "get";
    case kWait: return "wait";
    case kAdd: return "add";
  }
  return "?";
}
}  // namespace

struct TcpStoreClient::Impl {
  int fd = -1;
  std::string where;  // "the store at host:port"
  std::string host;
  int port = 0;
  AuthParams auth;
  TcpStoreClient* owner = nullptr;
  std::recursive_mutex connect_mu;  // one (re)connection at a time (its own add() re-enters)
  std::mutex send_mu;
  uint32_t send_seq = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  uint64_t next_id = 1;
  uint32_t recv_seq = 0;
  bool reading = false;
  std::map<uint64_t, Frame> replies;
  std::set<uint64_t> waiting;
  std::unique_ptr<Error> broken;

  // Send a request and return the payload of its reply, positioned after id and code.
  Frame call(Op op, Writer& body, Deadline reply_deadline);
  // Connects and authenticates (retrying until `d`: rank 0 may start later than us); the
  // caller holds connect_mu and no call is in flight.
  void connect(Deadline d, TcpStoreClient* self);
  void ensure_connected(TcpStoreClient* self);
  void become_reader(std::unique_lock<std::mutex>& lk, Deadline until);
};

void TcpStoreClient::Impl::become_reader(std::unique_lock<std::mutex>& lk, Deadline until) {
  reading = true;
  lk.unlock();
  std::unique_ptr<Error> failure;
  Frame f;
  bool got = false;
  try {
    if (wait_fd(fd, POLLIN, until)) {
      f = recv_frame_fd(fd, recv_seq, kMaxFrame, deadline_after_ms(kFrameTimeoutMs), "receiving from " + where);
      got = true;
    }
  } catch (const Error& e) {
    Status s = e.status();
    s.message = where + ": " + s.message;
    failure.reset(new Error(s));
  }
  lk.lock();
  reading = false;
  if (failure) {
    broken = std::move(failure);
  } else if (got) {
    ++recv_seq;
    if (f.type != FrameType::kStoreReply || f.payload.size() < 9) {
      broken.reset(new Error(Code::kProtocol, where + " sent a malformed reply"));
    } else {
      Reader r(f.payload.data(), f.payload.size(), "store reply");
      uint64_t id = r.u64();
      if (waiting.count(id)) replies.emplace(id, std::move(f));  // else: its caller gave up
    }
  }
  cv.notify_all();
}

Frame TcpStoreClient::Impl::call(Op op, Writer& body, Deadline reply_deadline) {
  TcpStoreClient* self = owner;
  uint64_t id;
  {
    std::unique_lock<std::mutex> lk(mu);
    while (fd < 0 && !broken) {  // released: connect again (release() closes only while nothing waits)
      lk.unlock();
      ensure_connected(self);
      lk.lock();
    }
    if (broken) throw *broken;
    id = next_id++;
    waiting.insert(id);
  }
  Writer w;
  w.u64(id);
  w.u8(op);
  w.buffer().insert(w.buffer().end(), body.buffer().begin(), body.buffer().end());
  try {
    std::lock_guard<std::mutex> lk(send_mu);
    send_frame_fd(fd, FrameType::kStoreRequest, send_seq++, w.buffer().data(), w.buffer().size(),
                  deadline_after_ms(kRpcTimeoutMs), std::string("sending a ") + op_name(op) + " to " + where);
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lk(mu);
    waiting.erase(id);
    if (!broken) broken.reset(new Error(e.status()));  // a half-sent frame ruins the stream
    throw;
  }
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    auto it = replies.find(id);
    if (it != replies.end()) {
      Frame f = std::move(it->second);
      replies.erase(it);
      waiting.erase(id);
      return f;
    }
    if (broken) {
      waiting.erase(id);
      throw *broken;
    }
    if (Clock::now() >= reply_deadline) {
      waiting.erase(id);
      throw Error(Code::kTimeout, where + " did not answer a " + op_name(op) + " in time (is the store host alive?)");
    }
    if (!reading) {
      become_reader(lk, reply_deadline);
    } else {
      cv.wait_until(lk, reply_deadline);
    }
  }
}

TcpStoreClient::TcpStoreClient(const std::string& host, int port, AuthParams auth, int64_t connect_timeout_ms)
    : impl_(new Impl) {
  impl_->where = "the store at " + host + ":" + std::to_string(port);
  impl_->owner = this;
  impl_->host = host;
  impl_->port = port;
  impl_->auth = std::move(auth);
  std::lock_guard<std::recursive_mutex> g(impl_->connect_mu);
  impl_->connect(deadline_after_ms(connect_timeout_ms), this);
}

void TcpStoreClient::Impl::connect(Deadline d, TcpStoreClient* self) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu);
      fd = connect_tcp(host, port, d, "the store");
      broken.reset();
      replies.clear();
      waiting.clear();
      send_seq = recv_seq = 0;
    }
    try {
      // A slow store host still gets a few seconds for the handshake itself.
      auth_connect(fd, auth, kStoreServerRank, kStoreChannel, std::max(d, deadline_after_ms(5000)));
      // One round trip before anyone relies on the connection: a store that is going away
      // (the previous generation of this job, while a rank re-initialises faster than rank 0)
      // can accept and then close, which surfaces here, where a retry is still harmless.
      self->add("__connected__", 0);
      return;
    } catch (const Error& e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        ::close(fd);
        fd = -1;
      }
      // A store of another job id answered, or one that is going away reset us: the previous
      // generation of this job (a rank re-initialised faster than rank 0). Wait for the
      // current one until the deadline.
      const Code c = e.status().code;
      if ((c != Code::kMismatch && c != Code::kPeerLost) || Clock::now() >= d) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void TcpStoreClient::Impl::ensure_connected(TcpStoreClient* self) {
  {
    std::lock_guard<std::mutex> lk(mu);
    if (fd >= 0) return;
  }
  std::lock_guard<std::recursive_mutex> g(connect_mu);
  {
    std::lock_guard<std::mutex> lk(mu);
    if (fd >= 0) return;
  }
  connect(deadline_after_ms(kRpcTimeoutMs), self);
}

void TcpStoreClient::release() {
  std::lock_guard<std::recursive_mutex> g(impl_->connect_mu);
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->fd < 0 || !impl_->waiting.empty() || impl_->reading) return;
  ::close(impl_->fd);
  impl_->fd = -1;
}

TcpStoreClient::~TcpStoreClient() {
  if (impl_->fd >= 0) ::close(impl_->fd);
}

namespace {
// Reader over a reply; throws the server's error when the code is not ok.
Reader open_reply(const Frame& f, const std::string& where) {
  Reader r(f.payload.data(), f.payload.size(), "store reply from " + where);
  r.u64();
  uint8_t code = r.u8();
  if (code != static_cast<uint8_t>(Code::kOk)) {
    std::string msg = r.str();
    if (code > static_cast<uint8_t>(Code::kStalled)) code = static_cast<uint8_t>(Code::kInternal);
    throw Error(static_cast<Code>(code), where + ": " + msg);
  }
  return r;
}

void check_key(const std::string& key) {
  if (key.size() > kMaxKey) throw Error(Code::kInvalid, "store key of " + std::to_string(key.size()) + " bytes (max " + std::to_string(kMaxKey) + ")");
}

void check_timeout(int64_t timeout_ms) {
  if (timeout_ms < 0) throw Error(Code::kInvalid, "store timeout must not be negative, got " + std::to_string(timeout_ms));
}

// The body of a request naming several keys and a timeout (WAIT, GET_MANY); `doing` words the
// refusal of too many keys ("waiting for", "reading").
Writer keys_request(const std::vector<std::string>& keys, int64_t timeout_ms, const char* doing) {
  check_timeout(timeout_ms);
  if (keys.size() > kMaxWaitKeys) throw Error(Code::kInvalid, std::string(doing) + " " + std::to_string(keys.size()) + " store keys at once");
  Writer b;
  b.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    b.str(k);
  }
  b.i64(timeout_ms);
  return b;
}
}  // namespace

void TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  check_key(key);
  if (value.size() > kMaxValue)
    throw Error(Code::kInvalid, "store value for '" + key + "' has " + std::to_string(value.size()) + " bytes (max " + std::to_string(kMaxValue) + ")");
  Writer b;
  b.str(key);
  b.bytes(value.data(), value.size());
  Frame f = impl_->call(kSet, b, deadline_after_ms(kRpcTimeoutMs));
  open_reply(f, impl_->where).expect_done();
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key, int64_t timeout_ms) {
  check_key(key);
  check_timeout(timeout_ms);
  Writer b;
  b.str(key);
  b.i64(timeout_ms);
  Frame f = impl_->call(kGet, b, deadline_after_ms(timeout_ms + kReplyGraceMs));
  Reader r = open_reply(f, impl_->where);
  std::vector<uint8_t> v = r.bytes(kMaxValue);
  r.expect_done();
  return v;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  Writer b = keys_request(keys, timeout_ms, "waiting for");
  Frame f = impl_->call(kWait, b, deadline_after_ms(timeout_ms + kReplyGraceMs));
  open_reply(f, impl_->where).expect_done();
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  check_key(key);
  Writer b;
  b.str(key);
  b.i64(delta);
  Frame f = impl_->call(kAdd, b, deadline_after_ms(kRpcTimeoutMs));
  Reader r = open_reply(f, impl_->where);
  int64_t v = r.i64();
  r.expect_done();
  return v;
}

std::vector<std::vector<uint8_t>> TcpStoreClient::get_many(const std::vector<std::string>& keys, int64_t timeout_ms) {
  Writer b = keys_request(keys, timeout_ms, "reading");
  Frame f = impl_->call(kGetMany, b, deadline_after_ms(timeout_ms + kReplyGraceMs));
  Reader r(f.payload.data(), f.payload.size(), "store reply from " + impl_->where);
  r.u64();
  const uint8_t code = r.u8();
  if (code == static_cast<uint8_t>(Code::kTimeout)) {
    std::string msg = r.str();
    const uint32_t n = r.u32();
    if (n > keys.size()) r.fail("more missing keys than asked for");
    std::vector<std::string> missing;
    for (uint32_t i = 0; i < n; ++i) missing.push_back(r.str(kMaxKey));
    throw StoreTimeout(Status{Code::kTimeout, -1, "", impl_->where + ": " + msg}, std::move(missing));
  }
  Reader ok = open_reply(f, impl_->where);
  const uint32_t n = ok.u32();
  if (n != keys.size()) ok.fail(std::to_string(n) + " values for " + std::to_string(keys.size()) + " keys");
  std::vector<std::vector<uint8_t>> values(n);
  for (auto& v : values) v = ok.bytes(kMaxValue);
  ok.expect_done();
  return values;
}

uint64_t TcpStoreClient::requests() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->next_id - 1;
}

}  // namespace appliance
