// Acceptor: the listening side of build_mesh. A thread polls the listener and every accepted
// connection still in its handshake at once, so a silent stranger never stalls the rest, and
// matches the connections that proved the job secret by the (rank, channel) their HELLO
// named, in whatever order they come. Strangers, failed handshakes and unexpected or duplicate
// connections are dropped and logged to stderr, rate-limited per source (common/log_limit.h).
//
// Failure modes: finish() throws Error(kTimeout) naming the ranks and channels that never
// connected by the deadline (each connection's handshake is bounded on its own, too), or what
// the thread itself failed with. stop() ends the thread early (build_mesh failed elsewhere).
#pragma once

#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/mesh.h"
#include "common/log_limit.h"
#include "transport/auth.h"
#include "transport/tcp/socket.h"

namespace appliance {

using PairKey = std::pair<int, int>;  // (peer rank, channel)

const char* channel_name(int ch);    // "data" or "control"
std::string fmt_seconds(int64_t ms);  // "12.0 s", for timeout messages

class Acceptor {
 public:
  // Starts the thread; `expected` are the (rank, channel) pairs that connect to this rank.
  Acceptor(const Listener& l, const MeshOptions& o, std::set<PairKey> expected, Deadline d);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  void stop();
  // Waits for the thread to finish by itself (all expected connections or the deadline);
  // the caller owns the returned fds.
  std::map<PairKey, int> finish();

 private:
  struct Handshaking {  // an accepted connection whose handshake is not over
    int fd;
    std::unique_ptr<AcceptorHandshake> hs;
    Deadline deadline;
  };

  void log(const std::string& msg);
  // A line about a connection from `addr`, rate-limited per source.
  void log_conn(const std::string& addr, const std::string& msg);
  void run();
  void step(Handshaking& h);  // drive one handshake; sets h.fd = -1 once it is over

  const Listener& listener_;
  const MeshOptions& opts_;
  std::set<PairKey> expected_;
  Deadline deadline_;
  int stop_fd_ = -1;
  std::thread thread_;
  std::exception_ptr error_;
  std::map<PairKey, int> got_;
  std::vector<Handshaking> handshaking_;
  LogLimiter limiter_;
};

}  // namespace appliance
