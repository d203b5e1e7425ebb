// What each part of the engine is handed from the RuntimeConfig (see options.h).
#include "engine/options.h"

namespace appliance {

NegotiatorOptions RuntimeConfig::negotiator() const {
  NegotiatorOptions o;
  static_cast<NegotiationOptions&>(o) = *this;
  o.size = size;
  o.rank = rank;
  return o;
}

SchedulePolicy RuntimeConfig::schedule() const { return SchedulePolicy{spin_us, cycle_us()}; }

MeshOptions RuntimeConfig::mesh() const {
  MeshOptions o;
  o.rank = rank;
  o.size = size;
  o.host = host;
  o.bind_addr = data_addr;
  o.store_host = store_host;
  o.allow_shm = shm;
  o.timeout_ms = start_timeout_ms();
  o.peer_timeout_ms = heartbeat_timeout_ms();
  o.auth = AuthParams{secret, job_id, rank};
  return o;
}

BackendOptions RuntimeConfig::backends(const std::vector<std::string>& hosts) const {
  BackendOptions o;
  static_cast<DeviceOptions&>(o) = *this;
  o.rank = rank;
  o.size = size;
  o.host = host;
  o.hosts = hosts;
  o.exchange_timeout_ms = start_timeout_ms();
  o.collectives = CollectiveOptions(*this);
  o.verbose = verbose;
  o.nccl_candidates = nccl_candidates;
  o.cudart_candidates = cudart_candidates;
  return o;
}

}  // namespace appliance
