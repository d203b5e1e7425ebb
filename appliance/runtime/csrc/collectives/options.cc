// CollectiveOptions made from the engine's options (see collectives.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "collectives/collectives.h"

namespace appliance {

namespace {
CollectiveOptions::Hierarchy hierarchy(const std::string& v, const char* knob) {
  if (v == "auto") return CollectiveOptions::Hierarchy::kAuto;
  if (v == "on") return CollectiveOptions::Hierarchy::kOn;
  if (v == "off") return CollectiveOptions::Hierarchy::kOff;
  throw std::invalid_argument(std::string(knob) + " must be auto, on or off, not '" + v + "'");
}
}  // namespace

CollectiveOptions::CollectiveOptions(const CollectiveKnobs& k)
    : chunk_bytes(std::max<size_t>(1, k.chunk_bytes)),
      hierarchical_allreduce(hierarchy(k.hierarchical_allreduce, "HOROVOD_HIERARCHICAL_ALLREDUCE")),
      hierarchical_allgather(hierarchy(k.hierarchical_allgather, "HOROVOD_HIERARCHICAL_ALLGATHER")) {}

}  // namespace appliance
