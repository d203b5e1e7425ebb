// The fault report: one JSON object a rank writes, once, when its runtime first fails the job
// (peer lost or silent, stall shutdown, an abort from another rank, any fatal error), at the
// path the launcher gave in APPLIANCE_FAULT_FILE (RuntimeConfig::fault_file). The launcher
// reads it after the rank exits to tell the user which rank failed first and why.
//
//   {"rank": R, "host": "H", "origin_rank": O|null, "origin_host": "OH", "kind": K,
//    "message": "...", "time": unix seconds}
//   kind: "peer_lost" | "stall" | "aborted" | "error", from the failing Status's code.
//
// Written atomically (a temporary file in the same directory, then rename). Any write
// failure is ignored: reporting a fault must never crash a rank.
#pragma once

#include <string>

#include "common/status.h"

namespace appliance {

struct FaultReport {
  int rank = 0;
  std::string host;
  int origin_rank = -1;  // -1 = unknown (null in the JSON)
  std::string origin_host;
  std::string kind;
  std::string message;
  double time = 0;  // unix time
};

// "peer_lost", "stall", "aborted" or "error".
const char* fault_kind(Code code);

// The report as one line of JSON (strings escaped).
std::string fault_json(const FaultReport& f);

// Writes fault_json(f) to `path` atomically; false (and nothing else) on any failure.
bool write_fault_file(const std::string& path, const FaultReport& f);

}  // namespace appliance
