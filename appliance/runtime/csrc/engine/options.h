// RuntimeConfig: what a Runtime is made from (the job's layout and bootstrap, set by the caller,
// and the engine's options, common/options.h), and the slice of it each part of the engine is
// handed (engine/options.cc): the negotiator, the scheduler, the links, the collectives and the
// backends each get one struct, with the job's layout it needs. No default is written here: the
// options' are in common/options.h, and each part's struct takes its other fields' from there.
//
// Failure modes: backends() throws std::invalid_argument naming the knob of a hierarchy other than
// auto, on or off (collectives/collectives.h).
#pragma once

#include <string>
#include <vector>

#include "backends/registry.h"
#include "bootstrap/options.h"
#include "common/options.h"
#include "engine/negotiator.h"
#include "engine/scheduler.h"

namespace appliance {

struct RuntimeConfig : EngineOptions {
  int rank = 0, size = 1;
  std::string host;  // this rank's host name (HOROVOD_HOSTNAME or gethostname)
  std::string store_host;
  int store_port = 0;
  std::string secret, job_id, data_addr;
  // CUDA tensors (engine/devices.cc): where the CUDA runtime and NCCL may be found, in order
  // (appliance/runtime/devices.py builds these lists); nccl_library is the explicit knob.
  std::vector<std::string> nccl_candidates, cudart_candidates;

  // Each part's slice.
  NegotiatorOptions negotiator() const;
  SchedulePolicy schedule() const;
  MeshOptions mesh() const;
  // `hosts`: every rank's host name, known once the links are up.
  BackendOptions backends(const std::vector<std::string>& hosts) const;
};

}  // namespace appliance
