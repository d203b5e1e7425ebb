// One diagnostic line on stderr in a single write() (see log.h).
#include "common/log.h"

#include <unistd.h>

namespace appliance {
void log_line(int rank, const std::string& text) {
  std::string s = "[appliance rank " + std::to_string(rank) + "] " + text + "\n";
  (void)!write(2, s.data(), s.size());
}
}  // namespace appliance
