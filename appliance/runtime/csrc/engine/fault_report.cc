// The fault report's JSON, written once (see fault_report.h).
#include "engine/fault_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

namespace appliance {

namespace {
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}
}  // namespace

const char* fault_kind(Code code) {
  switch (code) {
    case Code::kPeerLost: return "peer_lost";
    case Code::kStalled: return "stall";
    case Code::kAborted:
    case Code::kShutdown: return "aborted";
    default: return "error";
  }
}

std::string fault_json(const FaultReport& f) {
  char t[64];
  std::snprintf(t, sizeof(t), "%.6f", f.time);
  return "{\"rank\": " + std::to_string(f.rank) + ", \"host\": " + quote(f.host) +
         ", \"origin_rank\": " + (f.origin_rank < 0 ? std::string("null") : std::to_string(f.origin_rank)) +
         ", \"origin_host\": " + quote(f.origin_host) + ", \"kind\": " + quote(f.kind) +
         ", \"message\": " + quote(f.message) + ", \"time\": " + t + "}\n";
}

bool write_fault_file(const std::string& path, const FaultReport& f) {
  if (path.empty()) return false;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string body = fault_json(f);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < body.size()) {
    ssize_t k = ::write(fd, body.data() + off, body.size() - off);
    if (k <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    off += static_cast<size_t>(k);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace appliance
