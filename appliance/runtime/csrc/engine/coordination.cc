// Rank 0's coordinator and the process sets' sizes, shared by the negotiators (see coordination.h).
#include "engine/coordination.h"

#include <string>

#include "common/status.h"

namespace appliance {

std::unique_ptr<Coordinator> make_coordinator(const NegotiatorOptions& o) {
  return std::make_unique<Coordinator>(static_cast<const CoordinatorOptions&>(o));
}

void ProcessSetSizes::add(Coordinator* coord, int32_t id, const std::vector<int>& members) {
  if (coord) {
    std::string why = coord->add_process_set(id, members);
    APPLIANCE_ASSERT(why.empty(), why);
  }
  sizes_[id] = static_cast<int>(members.size());
}

void ProcessSetSizes::remove(Coordinator* coord, int32_t id) {
  if (coord) coord->remove_process_set(id);
  sizes_.erase(id);
}

int ProcessSetSizes::size_of(int32_t id) const {
  auto it = sizes_.find(id);
  return it == sizes_.end() ? 0 : it->second;
}

}  // namespace appliance
