// What both negotiators (star, tree) keep for rank 0's side of negotiation: the Coordinator they
// build from their options, and the size of every registered process set (a plan names its set
// by id; its decoder needs the set's size).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "coordinator/coordinator.h"
#include "engine/negotiator.h"

namespace appliance {

// Rank 0's coordinator, configured from the negotiator's options.
std::unique_ptr<Coordinator> make_coordinator(const NegotiatorOptions& o);

// Every registered process set -> its number of ranks; the coordinator (rank 0's, else null)
// registers the same sets in the same order.
class ProcessSetSizes {
 public:
  void add(Coordinator* coord, int32_t id, const std::vector<int>& members);
  void remove(Coordinator* coord, int32_t id);
  int size_of(int32_t id) const;  // 0 for a set not registered here

 private:
  std::map<int32_t, int> sizes_;
};

}  // namespace appliance
