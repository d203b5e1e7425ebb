// LogLimiter: per-source and total limits on the lines strangers cause, and the summary of
// what was left out (see log_limit.h).
#include "common/log_limit.h"

#include <algorithm>

namespace appliance {

std::string LogLimiter::source_of(const std::string& addr) {
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? addr : addr.substr(0, colon);
}

std::string LogLimiter::summary(Time now) const {
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(now - start_).count();
  std::vector<std::pair<long, std::string>> top;
  for (const auto& kv : dropped_by_) top.push_back({kv.second, kv.first});
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s = "left out " + std::to_string(dropped_) + " more such line(s) in the last " +
                  std::to_string(secs) + " s, from " + std::to_string(top.size()) + " source(s):";
  for (size_t i = 0; i < top.size() && i < 5; ++i) s += " " + top[i].second + " (" + std::to_string(top[i].first) + ")";
  if (top.size() > 5) s += " ...";
  return s;
}

void LogLimiter::roll(Time now, std::vector<std::string>* out) {
  if (open_ && now < start_ + interval_) return;
  if (open_ && dropped_ > 0 && out) out->push_back(summary(now));
  open_ = true;
  start_ = now;
  printed_ = 0;
  dropped_ = 0;
  printed_by_.clear();
  dropped_by_.clear();
}

std::vector<std::string> LogLimiter::admit(const std::string& source, const std::string& line, Time now) {
  std::vector<std::string> out;
  roll(now, &out);
  int& mine = printed_by_[source];
  if (mine < per_source_ && printed_ < total_) {
    ++mine;
    ++printed_;
    out.push_back(line);
  } else {
    if (printed_by_.size() > 4096 && mine == 0) printed_by_.erase(source);  // bound the map under a flood of sources
    ++dropped_;
    if (dropped_by_.size() < 4096 || dropped_by_.count(source)) ++dropped_by_[source];
  }
  return out;
}

std::vector<std::string> LogLimiter::flush(Time now) {
  std::vector<std::string> out;
  if (open_ && dropped_ > 0 && now >= start_ + interval_) roll(now, &out);
  return out;
}

LogLimiter::Time LogLimiter::next_flush() const { return open_ && dropped_ > 0 ? start_ + interval_ : Time::max(); }

std::vector<std::string> LogLimiter::drain(Time now) {
  std::vector<std::string> out;
  if (open_ && dropped_ > 0) out.push_back(summary(now));
  open_ = false;
  dropped_ = 0;
  dropped_by_.clear();
  printed_by_.clear();
  printed_ = 0;
  return out;
}

}  // namespace appliance
