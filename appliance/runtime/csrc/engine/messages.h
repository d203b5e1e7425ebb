// Control messages between the ranks' negotiators (CONTROL frames).
//
// The star protocol (engine/star_negotiator.h), between each rank and rank 0:
//   READY   rank -> 0   {epoch, full requests, cache ids,   names this rank is ready for; and
//                        ms its callers waited}             whether they wait (deadlock check)
//   PLAN    0 -> ranks  {seq, entries, lateness}             what everyone runs next, in order; who
//                                                            the others waited for (Plan::late)
//   RESEND  0 -> rank   {cache ids}                          ids the coordinator no longer knows
//   NOTICE  0 -> ranks  {text lines}                         diagnostics every rank prints (stall report)
// The tree protocol (engine/tree_negotiator.h), between tree neighbours:
//   UP      child -> parent  {seq, ids complete in its subtree, full requests (rank, request,
//                             ms waited), ranks that left, ids pending for long (stale),
//                             per id the subtree's last member and its lag, and per id the
//                             subtree's combined input of a carried allreduce (or none),
//                             ranks whose callers wait: ms waited, their requests announced
//                             by cache id (the deadlock check)}
//   DOWN    parent -> child  {seq, slow?, ids evicted, lines to print, PLAN}: the root's
//                             decisions, forwarded down unchanged
//   GONE    parent -> child  {rank}: negotiation ended (that rank left in order)
// Both:
//   BYE     both ways   {}                                   orderly shutdown of the sender
//
// Plan entries whose names are all cached with the same signature travel as cache ids; an entry
// may carry its result (a carried allreduce: PlanEntry::result, one name, its signature's bytes); a
// receiver resolves the whole plan against its cache before applying any of it, which is the
// state the coordinator encoded it against (ranks apply plans in the same order).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "coordinator/request.h"
#include "coordinator/response_cache.h"

namespace appliance {

enum class CtrlType : uint8_t { kReady = 1, kPlan = 2, kResend = 3, kBye = 4, kNotice = 5, kUp = 6, kDown = 7, kGone = 8 };

struct ReadyMsg {
  uint64_t epoch = 0;  // plans applied by the sender so far
  std::vector<Request> full;
  std::vector<uint32_t> ids;
  int64_t waiting_ms = kNoNews;  // the sender's callers have waited this long (kNotWaiting: no longer)
  static constexpr int64_t kNoNews = -2, kNotWaiting = -1;
};

CtrlType peek_ctrl_type(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_ready(const ReadyMsg& m);
ReadyMsg decode_ready(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_plan(const Plan& p, const ResponseCache& cache);
void encode_plan_into(Writer& w, const Plan& p, const ResponseCache& cache);
// set_size(id): ranks in process set `id` (<= 0 when unknown); sizes of its entries are checked against it.
Plan decode_plan(const std::vector<uint8_t>& payload, const ResponseCache& cache, int size, const std::string& from,
                 const std::function<int(int32_t)>& set_size = nullptr);
Plan decode_plan(const uint8_t* payload, size_t n, const ResponseCache& cache, int size, const std::string& from,
                 const std::function<int(int32_t)>& set_size = nullptr);

std::vector<uint8_t> encode_resend(const std::vector<uint32_t>& ids);
std::vector<uint32_t> decode_resend(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_bye();

std::vector<uint8_t> encode_notice(const std::vector<std::string>& lines);
std::vector<std::string> decode_notice(const std::vector<uint8_t>& payload, const std::string& from);

struct UpMsg {
  struct Full {
    int32_t rank;
    Request req;
    int64_t waited_ms = 0;  // how long the rank has been ready for it already
  };
  uint64_t seq = 0;            // DOWN messages the sender had applied
  std::vector<uint32_t> ids;   // complete in the sender's subtree
  std::vector<Full> full;
  std::vector<int32_t> left;   // ranks that left in order
  std::vector<uint32_t> stale;  // ids some rank has waited on for long (the root evicts them)
  std::vector<Late> late;       // per id: the subtree's last member, and how long the rest waited for it (us; UINT32_MAX: nobody)
  std::vector<std::vector<uint8_t>> carried;  // per id: the subtree's combined input (empty: none; missing rows: none)
  struct Waiting {               // a rank of the subtree whose callers wait (coordinator/deadlock.h)
    int32_t rank = 0;
    int64_t ms = 0;              // waited so far (ReadyMsg::kNotWaiting: no longer waits)
    std::vector<Request> also;   // what it announced by cache id (rank 0's coordinator never saw it)
  };
  std::vector<Waiting> waiting;
};
std::vector<uint8_t> encode_up(const UpMsg& m);
UpMsg decode_up(const std::vector<uint8_t>& payload, int size, const std::string& from);

struct DownMsg {
  uint64_t seq = 0;
  bool slow = false;                // from here on every request goes to rank 0's coordinator
  std::vector<uint32_t> evict;      // cache ids forgotten, before the plan
  std::vector<std::string> lines;   // printed by every rank (a stall report)
  // Decoded: encode_plan's bytes inside the DOWN's payload (valid while it is; 0 bytes: no plan).
  const uint8_t* plan = nullptr;
  size_t plan_bytes = 0;
};
// `plan` (null or no entries: none) is encoded inside the DOWN, against `cache`.
std::vector<uint8_t> encode_down(const DownMsg& m, const Plan* plan = nullptr, const ResponseCache* cache = nullptr);
DownMsg decode_down(const std::vector<uint8_t>& payload, const std::string& from);

std::vector<uint8_t> encode_gone(int32_t rank);
int32_t decode_gone(const std::vector<uint8_t>& payload, int size, const std::string& from);

}  // namespace appliance
