// The engine's tunable options, declared once: name, type, default and meaning, one X row each,
// grouped by the concern that reads them. Each group is one struct below, made from its rows, so
// a concern is handed its own slice (the negotiators and rank 0's coordinator NegotiationOptions,
// the links LinkOptions, the collectives CollectiveKnobs...) and a default is written only here.
// EngineOptions is every slice at once: the engine's RuntimeConfig (engine/options.h) derives from
// it, and bindings/bindings.cc makes each row a read-write property of _core.RuntimeConfig and an
// entry of _core.ENGINE_OPTIONS (APPLIANCE_ENGINE_OPTIONS: every group's rows).
//
// A knob of appliance/common/knobs.py feeds an option by naming it (`Knob(..., core="name")`);
// appliance/runtime/config.py and engine.py copy every such knob without naming it, and
// tests/runtime/test_core_api.py checks that each knob's default is the option's. So a new engine
// knob is one row here, one row in the knob table, and its use.
//
// On the ground floor (it needs nothing), so that every floor of the core can read its slice. The
// job's layout and bootstrap (rank, size, hosts, store, secret, job id, library search lists) are
// not options: engine/options.h's RuntimeConfig declares them, and the caller sets them.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>

// X(type, name, default): one option. Keep the comment beside each row: it is the option's
// meaning inside the core (the user-facing text is the knob's doc in knobs.py).

// Negotiation (engine/negotiator.h, coordinator/): what runs next, when, and stalls.
#define APPLIANCE_NEGOTIATION_OPTIONS(X)                                                                \
  /* bytes of small allreduces fused into one entry (0: no fusion) */                                   \
  X(size_t, fusion_threshold, size_t{128} << 20)                                                       \
  /* the largest host allreduce fused with others (0: any below fusion_threshold); larger ones run */  \
  /* in place, without the two copies through the fusion buffer (CUDA tensors: no limit) */             \
  X(size_t, fusion_member_bytes, size_t{256} << 10)                                                    \
  /* milliseconds the coordinator waits for more tensors to fuse while some are still coming; */        \
  /* also how long the background thread stays parked after a caller drove (engine/scheduler.h) */      \
  X(double, cycle_time_ms, 1.0)                                                                        \
  /* response cache entries (0: every readiness travels in full) */                                     \
  X(size_t, cache_capacity, 1024)                                                                      \
  /* cached allreduces of at most this many bytes carry their data through the tree negotiation */     \
  /* (engine/negotiator.h's Carry; 0: none does) */                                                     \
  X(size_t, carry_bytes, 0)                                                                            \
  /* the negotiation protocol (engine/negotiator.h): "tree" (cached ops agreed up and down a tree */   \
  /* without rank 0's coordinator) or "star" (every rank talks to rank 0's coordinator) */              \
  X(std::string, negotiation, "tree")                                                                  \
  /* no stall warnings at all (HOROVOD_STALL_CHECK_DISABLE) */                                          \
  X(bool, stall_check_disable, false)                                                                  \
  /* seconds a tensor may wait for some ranks before a warning */                                       \
  X(double, stall_check_s, 60.0)                                                                       \
  /* seconds a tensor may wait for some ranks before the job fails (0: never) */                        \
  X(double, stall_shutdown_s, 300.0)                                                                   \
  /* seconds every rank of a group may wait, nothing moving, on operations that can never match */    \
  /* before the job fails as deadlocked (coordinator/deadlock.h; 0: never) */                           \
  X(double, deadlock_s, 5.0)

// Scheduling (engine/scheduler.h): which thread does the engine's work.
#define APPLIANCE_SCHEDULE_OPTIONS(X)                                                                   \
  /* the scheduler's one policy (engine/scheduler.h): a caller waiting for a host operation drives */  \
  /* the engine for up to this many microseconds, and the background thread polls as long after */      \
  /* work; 0 = nothing spins or drives, the background thread does everything */                        \
  X(int, spin_us, 100)

// Links (bootstrap/, engine/control.h): joining the job and keeping the peers.
#define APPLIANCE_LINK_OPTIONS(X)                                                                       \
  /* seconds every rank waits for the others at init (rendezvous, links, CUDA setup) */                  \
  X(double, start_timeout_s, 60.0)                                                                     \
  /* seconds of silence after which a peer is declared lost (0: no heartbeats) */                       \
  X(double, heartbeat_timeout_s, 10.0)                                                                 \
  /* shared memory links between ranks of one machine (false: TCP for every pair) */                    \
  X(bool, shm, true)

// Collectives (collectives/collectives.h: CollectiveOptions is made from these).
#define APPLIANCE_COLLECTIVE_OPTIONS(X)                                                                 \
  /* pipelining grain of the ring algorithms, in bytes (0 counts as 1) */                              \
  X(size_t, chunk_bytes, size_t{1} << 20)                                                              \
  /* hierarchical allreduce / allgather with several hosts of several ranks (collectives/ */            \
  /* hierarchical.cc): "auto" (where its cost model wins), "on" or "off" */                              \
  X(std::string, hierarchical_allreduce, "auto")                                                       \
  X(std::string, hierarchical_allgather, "auto")

// Devices (backends/registry.h).
#define APPLIANCE_DEVICE_OPTIONS(X)                                                                     \
  /* explicit path of libnccl.so.2 ("" = search nccl_candidates) */                                    \
  X(std::string, nccl_library, "")

// Reports (the engine's logs, fault report and timeline).
#define APPLIANCE_REPORT_OPTIONS(X)                                                                     \
  /* rank 0 logs the layout and links at init, and the CUDA decision */                                 \
  X(bool, verbose, false)                                                                              \
  /* where the fault report goes when the job first fails ("" = nowhere; engine/fault_report.h) */     \
  X(std::string, fault_file, "")                                                                       \
  /* rank 0 records a timeline into this file from init ("" or "DYNAMIC": not from init) */            \
  X(std::string, timeline, "")                                                                         \
  /* the timeline started at init marks each wake of rank 0's background thread */                      \
  X(bool, timeline_mark_cycles, false)

// Every option.
#define APPLIANCE_ENGINE_OPTIONS(X) \
  APPLIANCE_NEGOTIATION_OPTIONS(X)  \
  APPLIANCE_SCHEDULE_OPTIONS(X)     \
  APPLIANCE_LINK_OPTIONS(X)         \
  APPLIANCE_COLLECTIVE_OPTIONS(X)   \
  APPLIANCE_DEVICE_OPTIONS(X)       \
  APPLIANCE_REPORT_OPTIONS(X)

#define APPLIANCE_OPTION_FIELD(type, name, default_value) type name = default_value;

namespace appliance {

struct NegotiationOptions {
  APPLIANCE_NEGOTIATION_OPTIONS(APPLIANCE_OPTION_FIELD)
  // The stall warning's period (0: no warnings).
  double stall_warning_s() const { return stall_check_disable ? 0.0 : stall_check_s; }
  int64_t cycle_us() const { return static_cast<int64_t>(cycle_time_ms * 1000); }
  // A rank tells rank 0 that its callers wait after half the deadlock time (0: never).
  double wait_report_s() const { return deadlock_s > 0 ? deadlock_s / 2 : 0.0; }
};

struct ScheduleOptions {
  APPLIANCE_SCHEDULE_OPTIONS(APPLIANCE_OPTION_FIELD)
};

struct LinkOptions {
  APPLIANCE_LINK_OPTIONS(APPLIANCE_OPTION_FIELD)
  int64_t start_timeout_ms() const { return static_cast<int64_t>(start_timeout_s * 1000); }
  int heartbeat_timeout_ms() const { return static_cast<int>(heartbeat_timeout_s * 1000); }
};

struct CollectiveKnobs {
  APPLIANCE_COLLECTIVE_OPTIONS(APPLIANCE_OPTION_FIELD)
};

struct DeviceOptions {
  APPLIANCE_DEVICE_OPTIONS(APPLIANCE_OPTION_FIELD)
};

struct ReportOptions {
  APPLIANCE_REPORT_OPTIONS(APPLIANCE_OPTION_FIELD)
  // Whether `timeline` names a file to record into from init ("DYNAMIC", any case, is Horovod's
  // word for "only between start_timeline and stop_timeline").
  bool timeline_at_init() const {
    static const char kDynamic[] = "dynamic";
    if (timeline.size() != sizeof(kDynamic) - 1) return !timeline.empty();
    for (size_t i = 0; i < timeline.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(timeline[i])) != kDynamic[i]) return true;
    return false;
  }
};

// Every slice: what the caller sets (engine/options.h's RuntimeConfig adds the job's layout).
struct EngineOptions : NegotiationOptions, ScheduleOptions, LinkOptions, CollectiveKnobs, DeviceOptions, ReportOptions {};

}  // namespace appliance

#undef APPLIANCE_OPTION_FIELD
