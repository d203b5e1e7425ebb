// Status text, Error and assertion failures (see status.h).
#include "common/status.h"

#include <sstream>

namespace appliance {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kPeerLost: return "peer lost";
    case Code::kTimeout: return "timeout";
    case Code::kMismatch: return "mismatch";
    case Code::kProtocol: return "protocol error";
    case Code::kAuth: return "authentication failed";
    case Code::kInvalid: return "invalid argument";
    case Code::kAborted: return "aborted";
    case Code::kInternal: return "internal error";
    case Code::kShutdown: return "shut down";
    case Code::kStalled: return "stalled";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::ostringstream os;
  os << code_name(code);
  if (origin_rank >= 0) {
    os << ": rank " << origin_rank;
    if (!host.empty()) os << " (" << host << ")";
  }
  if (!message.empty()) os << ": " << message;
  return os.str();
}

Error::Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}

Error::Error(Code code, std::string message, int origin_rank, std::string host)
    : Error(Status{code, origin_rank, std::move(host), std::move(message)}) {}

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal invariant violated at " << file << ":" << line << ": " << expr;
  if (!msg.empty()) os << " (" << msg << ")";
  throw Error(Code::kInternal, os.str());
}

}  // namespace appliance
