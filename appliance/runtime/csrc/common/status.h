// Errors of the collective core.
//
// Two kinds, as the house rules demand. Recoverable failures (a peer lost, a timeout, a
// cross-rank mismatch, a corrupt frame, a refused handshake) are `Error` exceptions that
// carry a `Status`: a code, the rank where the failure originated, that rank's host and a
// text. The engine turns them into failed handles on every rank; Python sees them as
// HorovodInternalError (peer lost, protocol, auth, aborted) or as a RuntimeError for a
// mismatch. Invariant violations are APPLIANCE_ASSERT, which names file:line.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace appliance {

enum class Code : uint8_t {
  kOk = 0,
  kPeerLost = 1,     // a peer closed, reset or stopped answering heartbeats
  kTimeout = 2,      // a bounded wait ran out (rendezvous, store, connect)
  kMismatch = 3,     // ranks disagree on a collective (dtype, shape, op, root...)
  kProtocol = 4,     // a frame or message failed validation
  kAuth = 5,         // a peer could not prove the job secret
  kInvalid = 6,      // bad argument from the caller
  kAborted = 7,      // the job is being torn down because of another failure
  kInternal = 8,     // everything else
  kShutdown = 9,     // the runtime was shut down while the operation was pending
  kStalled = 10,     // a tensor waited on some ranks past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
};

const char* code_name(Code c);

struct Status {
  Code code = Code::kOk;
  int origin_rank = -1;  // rank the failure is about (the lost peer, the rank that aborted)
  std::string host;      // that rank's host, when known
  std::string message;

  bool ok() const { return code == Code::kOk; }
  static Status Ok() { return {}; }
  // "peer lost: rank 2 (hostB): connection reset while receiving" style text.
  std::string to_string() const;
};

class Error : public std::runtime_error {
 public:
  explicit Error(Status s);
  Error(Code code, std::string message, int origin_rank = -1, std::string host = {});
  const Status& status() const { return status_; }

 private:
  Status status_;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace appliance

#define APPLIANCE_ASSERT(cond, msg)                                              \
  do {                                                                           \
    if (!(cond)) ::appliance::assert_fail(#cond, __FILE__, __LINE__, (msg));     \
  } while (0)
