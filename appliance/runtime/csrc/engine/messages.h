// Control messages between each rank's engine and rank 0's coordinator (CONTROL frames).
//
//   READY   rank -> 0   {epoch, full requests, cache ids}   names this rank is ready for
//   PLAN    0 -> ranks  {seq, entries}                       what everyone runs next, in order
//   RESEND  0 -> rank   {cache ids}                          ids the coordinator no longer knows
//   BYE     both ways   {}                                   orderly shutdown of the sender
//   NOTICE  0 -> ranks  {text lines}                         diagnostics every rank prints (stall report)
//
// Plan entries whose names are all cached with the same signature travel as cache ids; a
// receiver resolves the whole plan against its cache before applying any of it, which is the
// state the coordinator encoded it against (ranks apply plans in the same order).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "coordinator/request.h"
#include "coordinator/response_cache.h"

namespace appliance {

enum class CtrlType : uint8_t { kReady = 1, kPlan = 2, kResend = 3, kBye = 4, kNotice = 5 };

struct ReadyMsg {
  uint64_t epoch = 0;  // plans applied by the sender so far
  std::vector<Request> full;
  std::vector<uint32_t> ids;
};

CtrlType peek_ctrl_type(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_ready(const ReadyMsg& m);
ReadyMsg decode_ready(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_plan(const Plan& p, const ResponseCache& cache);
// set_size(id): ranks in process set `id` (<= 0 when unknown); sizes of its entries are checked against it.
Plan decode_plan(const std::vector<uint8_t>& payload, const ResponseCache& cache, int size, const std::string& from,
                 const std::function<int(int32_t)>& set_size = nullptr);

std::vector<uint8_t> encode_resend(const std::vector<uint32_t>& ids);
std::vector<uint32_t> decode_resend(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_bye();

std::vector<uint8_t> encode_notice(const std::vector<std::string>& lines);
std::vector<std::string> decode_notice(const std::vector<uint8_t>& payload, const std::string& from);

}  // namespace appliance
