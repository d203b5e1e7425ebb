// LogLimiter: bounds the log lines that strangers can cause (refused, garbage or
// unauthenticated connections to the store and to the data-plane listener). Within each
// interval every source (an address without its port) gets its first `per_source` lines and
// all sources together at most `total` lines; the rest are counted, and when the interval
// ends one summary line says how many were left out and from where. Pure logic: time is
// passed in; the caller prints what it is given. Not thread-safe (each listener thread owns
// one).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace appliance {

class LogLimiter {
 public:
  using Time = std::chrono::steady_clock::time_point;

  LogLimiter(int per_source = 3, int total = 20, std::chrono::milliseconds interval = std::chrono::seconds(60))
      : per_source_(per_source), total_(total), interval_(interval) {}

  // Lines to print now for `line` about `source`: the line itself unless it is over the
  // limits, preceded by the summary of the previous interval when that one has ended.
  std::vector<std::string> admit(const std::string& source, const std::string& line, Time now);
  // The summary of the current interval when it has ended and something was left out.
  std::vector<std::string> flush(Time now);
  // When flush() has something to say (Time::max() when nothing was left out).
  Time next_flush() const;
  // The summary of what was left out so far, whether or not the interval has ended (for a
  // listener that closes).
  std::vector<std::string> drain(Time now);

  // "a.b.c.d:port" -> "a.b.c.d".
  static std::string source_of(const std::string& addr);

 private:
  void roll(Time now, std::vector<std::string>* out);
  std::string summary(Time now) const;

  int per_source_, total_;
  std::chrono::milliseconds interval_;
  bool open_ = false;
  Time start_{};
  int printed_ = 0;
  std::map<std::string, int> printed_by_, dropped_by_;
  long dropped_ = 0;
};

}  // namespace appliance
