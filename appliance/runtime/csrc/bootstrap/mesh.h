// build_mesh: every link of this rank opened at once (bootstrap/links.h), for a job that wants
// them all now: data (channel 0) to every peer, control (channel 1) between rank 0 and each
// other rank. The engine opens its links on first use instead; this is the all-pairs mesh, for
// tests and tools. Failure modes: those of Links and Links::open.
#pragma once

#include <vector>

#include "bootstrap/links.h"

namespace appliance {

struct Mesh {
  std::vector<PeerInfo> peers;       // indexed by rank
  std::vector<LinkPtr> data;         // indexed by rank; null for self
  std::vector<LinkPtr> control;      // rank 0: indexed by rank (null for self); others: [0] only
  Topology topo;
};

Mesh build_mesh(Store& store, const MeshOptions& opts);

}  // namespace appliance
